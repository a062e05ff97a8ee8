# Calibration (docs/protocol.md#oracle): true-dynamics MPC on the agents' own evaluation episodes, exact feasibility and
# the exact optimum where the state space can be enumerated, the by-type export, Tables 1 and 7.
# Constants and helper functions: helpers/oracle.smk.


rule mpc_split:
    input:
        split=layout.split_file("{split}"),
    output:
        layout.mpc_records("{split}", "{side}", "{H}"),
    log:
        f"{LOGS}/oracle/{{split}}/mpc_{{side}}_H{{H}}.log",
    wildcard_constraints:
        side="train|test",
    conda:
        CONDA_ENV
    threads: 2
    params:
        planner=planner_args,
        L=config["env"]["L"],
        episodes=config["evaluation"]["episodes_per_rule"],
        eval_seed=config["evaluation"]["eval_seed"],
    shell:
        "NUMBA_NUM_THREADS={threads:q} tapebench mpc --split {input.split:q} --side {wildcards.side:q} --episodes-per-rule {params.episodes:q}"
        " --L {params.L:q} --H {wildcards.H:q} --eval-seed {params.eval_seed:q} {params.planner:q}"
        " --out {output:q} > {log:q} 2>&1"


rule feasibility:
    output:
        layout.feasibility(LH),
    log:
        f"{LOGS}/oracle/feasibility_L{{L}}_H{{H}}.log",
    conda:
        CONDA_ENV
    threads: 2
    shell:
        "NUMBA_NUM_THREADS={threads:q} tapebench feasibility --rules 0-255 --L {wildcards.L:q} --H {wildcards.H:q} --out {output:q} > {log:q} 2>&1"


rule fixed_z_oracle:
    """MPC and the exact optimum on the same episodes of the representative rules (paper Table 6)."""
    input:
        features=layout.rule_features(),
    output:
        mpc=layout.fixed_z(LH, "mpc"),
        exact=layout.fixed_z(LH, "exact"),
        gap=layout.fixed_z(LH, "gap"),
    log:
        f"{LOGS}/oracle/fixed_z_L{{L}}_H{{H}}.log",
    conda:
        CONDA_ENV
    threads: 2
    params:
        rules=FIXED_Z_RULES,
        planner=planner_args,
        episodes=config["evaluation"]["episodes_per_rule"],
        eval_seed=config["evaluation"]["eval_seed"],
    shell:
        "(export NUMBA_NUM_THREADS={threads:q}; tapebench mpc --rules {params.rules:q} --features {input.features:q} --episodes-per-rule {params.episodes:q}"
        " --L {wildcards.L:q} --H {wildcards.H:q} --eval-seed {params.eval_seed:q} {params.planner:q} --out {output.mpc:q}"
        " && tapebench exact --rules {params.rules:q} --features {input.features:q}"
        " --episodes-per-rule {params.episodes:q} --L {wildcards.L:q} --H {wildcards.H:q}"
        " --eval-seed {params.eval_seed:q} --out {output.exact:q}"
        " && tapebench oracle-gap --mpc {output.mpc:q} --exact {output.exact:q} --out {output.gap:q}) > {log:q} 2>&1"


rule mpc_by_type:
    input:
        split=layout.split_file("{split}"),
    output:
        layout.mpc_by_type("{split}"),
    log:
        f"{LOGS}/oracle/{{split}}/mpc_by_type.log",
    conda:
        CONDA_ENV
    params:
        planner=planner_args,
        L=config["env"]["L"],
        H=config["env"]["H"],
        episodes=config["oracle"]["by_type_episodes_per_rule"],
        eval_seed=config["evaluation"]["eval_seed"],
    shell:
        "tapebench export-mpc-by-type --split {input.split:q} --side test --episodes-per-rule {params.episodes:q}"
        " --L {params.L:q} --H {params.H:q} --eval-seed {params.eval_seed:q} {params.planner:q}"
        " --out {output:q} > {log:q} 2>&1"
