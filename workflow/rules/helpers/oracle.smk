# The oracle's helpers (oracle.smk); planner_args is also the fixed-z study's (fixed_z.smk: oracle_multi_rule).
LH = {"L": "{L}", "H": "{H}"}  # the wildcards of the oracle's L, H patterns (layout.feasibility, layout.fixed_z)


def planner_args(wildcards=None):
    o = config["oracle"]
    return ["--horizon", str(o["horizon"]), "--candidates", str(o["candidates"]), "--seed", str(o["seed"])]
