# The fixed-z study's helpers (fixed_z.smk): its runs at the study's own L, H.
from tapebench.pipeline.config import fixed_z_eval_slice, fixed_z_train_slice

FIXED_Z = config["studies"]["fixed_z"]
FIXED_Z_RULES = ",".join(str(z) for z in FIXED_Z["rules"])  # the representative rules (paper App. B; oracle.smk too)
FIXED_Z_SEEDS = list(range(FIXED_Z["seeds"]))
FIXED_Z_METHODS = sorted({m for t in ("table5", "table6") for m in FIXED_Z[t]["methods"]})
MULTI_RULE_METHODS = list(FIXED_Z["table6"]["multi_rule"])


def fixed_z_train_params(wildcards):
    return dumps(fixed_z_train_slice(config, wildcards.agent, wildcards.L, wildcards.H))


def fixed_z_eval_params(wildcards):
    return dumps(fixed_z_eval_slice(config, wildcards.agent, wildcards.L, wildcards.H))


def fixed_z_episode_files(wildcards):
    return [
        layout.evaluation(layout.fixed_z_run_dir(wildcards.L, wildcards.H, wildcards.agent, wildcards.rule, s))
        for s in FIXED_Z_SEEDS
    ]


def multi_rule_episode_files(wildcards):
    return [
        layout.evaluation(layout.multi_rule_run_dir(wildcards.L, wildcards.H, wildcards.split, wildcards.agent, s))
        for s in FIXED_Z_SEEDS
    ]


def multi_rule_per_seed_files(wildcards):
    return [layout.multi_rule_per_seed(wildcards.L, wildcards.H, wildcards.split, a) for a in MULTI_RULE_METHODS]
