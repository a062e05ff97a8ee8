# The fixed-z study (paper App. B, Tables 5-6; docs/protocol.md#fixed-z): one training run per representative
# rule (no rule randomisation) at the study's own L, H and schedule, evaluated on that rule (side "rules");
# at Table 6's L, H also multi-rule runs on the main split's training rules and the oracle on both sides.
# The representative rules' oracle (fixed_z_oracle) is in oracle.smk: Table 1 reads it too.
# Constants and helper functions: helpers/fixed_z.smk.


rule train_fixed_z:
    output:
        manifest=layout.manifest(layout.fixed_z_run_dir("{L}", "{H}", "{agent}", "{rule}", "{seed}")),
    log:
        f"{LOGS}/fixed_z/L{{L}}_H{{H}}/{{agent}}/rule{{rule}}/seed{{seed}}_train.log",
    wildcard_constraints:
        agent=one_of(FIXED_Z_METHODS),
        L=r"\d+",
        rule=r"\d+",
    conda:
        CONDA_ENV
    threads: config["training"]["threads"]
    resources:
        gpu=train_gpus,
        mem_mb=train_mem_mb,
        runtime=train_runtime,
    params:
        slice=fixed_z_train_params,
        run_dir=lambda w: layout.fixed_z_run_dir(w.L, w.H, w.agent, w.rule, w.seed),
        device=config["training"]["device"],
    shell:
        "set -o pipefail; tapebench train --agent {wildcards.agent:q} --rules {wildcards.rule:q} --seed {wildcards.seed:q}"
        " --params {params.slice:q} --device {params.device:q} --threads {threads:q}"
        " --out {params.run_dir:q} 2>&1 | tee {log:q}"


rule evaluate_fixed_z:
    input:
        manifest=layout.manifest(layout.fixed_z_run_dir("{L}", "{H}", "{agent}", "{rule}", "{seed}")),
    output:
        layout.evaluation(layout.fixed_z_run_dir("{L}", "{H}", "{agent}", "{rule}", "{seed}")),
    log:
        f"{LOGS}/fixed_z/L{{L}}_H{{H}}/{{agent}}/rule{{rule}}/seed{{seed}}_evaluate.log",
    wildcard_constraints:
        agent=one_of(FIXED_Z_METHODS),
        L=r"\d+",
        rule=r"\d+",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=eval_mem_mb,
        runtime=eval_runtime,
    params:
        slice=fixed_z_eval_params,
        run_dir=lambda w: layout.fixed_z_run_dir(w.L, w.H, w.agent, w.rule, w.seed),
    shell:
        "tapebench evaluate --run {params.run_dir:q} --rules {wildcards.rule:q} --H {wildcards.H:q}"
        " --params {params.slice:q} --threads {threads:q} --out {output:q} > {log:q} 2>&1"


rule aggregate_fixed_z:
    input:
        fixed_z_episode_files,
    output:
        per_seed=layout.fixed_z_per_seed("{L}", "{H}", "{agent}", "{rule}"),
        curves=layout.fixed_z_curves("{L}", "{H}", "{agent}", "{rule}"),
        per_rule=layout.fixed_z_per_rule("{L}", "{H}", "{agent}", "{rule}"),
    log:
        f"{LOGS}/fixed_z/L{{L}}_H{{H}}/{{agent}}/rule{{rule}}_aggregate.log",
    wildcard_constraints:
        agent=one_of(FIXED_Z_METHODS),
        L=r"\d+",
        rule=r"\d+",
    conda:
        CONDA_ENV
    params:
        last_k=config["evaluation"]["last_k"],
    shell:
        "tapebench aggregate-seed --episodes {input:q} --last-k {params.last_k:q} --out {output.per_seed:q}"
        " --curves-out {output.curves:q} --per-rule-out {output.per_rule:q} > {log:q} 2>&1"


rule train_multi_rule:
    input:
        split=layout.split_file("{split}"),
        health=layout.split_health("{split}"),
        verdict=ancient(layout.health("{split}")["verdict"]),
    output:
        manifest=layout.manifest(layout.multi_rule_run_dir("{L}", "{H}", "{split}", "{agent}", "{seed}")),
    log:
        f"{LOGS}/fixed_z/L{{L}}_H{{H}}/multi_{{split}}/{{agent}}/seed{{seed}}_train.log",
    wildcard_constraints:
        agent=one_of(MULTI_RULE_METHODS),
        L=r"\d+",
    conda:
        CONDA_ENV
    threads: config["training"]["threads"]
    resources:
        gpu=train_gpus,
        mem_mb=train_mem_mb,
        runtime=train_runtime,
    params:
        slice=fixed_z_train_params,
        run_dir=lambda w: layout.multi_rule_run_dir(w.L, w.H, w.split, w.agent, w.seed),
        device=config["training"]["device"],
    shell:
        "set -o pipefail; tapebench train --agent {wildcards.agent:q} --split {input.split:q} --seed {wildcards.seed:q}"
        " --params {params.slice:q} --device {params.device:q} --threads {threads:q}"
        " --out {params.run_dir:q} 2>&1 | tee {log:q}"


rule evaluate_multi_rule:
    input:
        split=layout.split_file("{split}"),
        manifest=layout.manifest(layout.multi_rule_run_dir("{L}", "{H}", "{split}", "{agent}", "{seed}")),
    output:
        layout.evaluation(layout.multi_rule_run_dir("{L}", "{H}", "{split}", "{agent}", "{seed}")),
    log:
        f"{LOGS}/fixed_z/L{{L}}_H{{H}}/multi_{{split}}/{{agent}}/seed{{seed}}_evaluate.log",
    wildcard_constraints:
        agent=one_of(MULTI_RULE_METHODS),
        L=r"\d+",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=eval_mem_mb,
        runtime=eval_runtime,
    params:
        slice=fixed_z_eval_params,
        run_dir=lambda w: layout.multi_rule_run_dir(w.L, w.H, w.split, w.agent, w.seed),
    shell:
        "tapebench evaluate --run {params.run_dir:q} --split {input.split:q} --H {wildcards.H:q}"
        " --params {params.slice:q} --threads {threads:q} --out {output:q} > {log:q} 2>&1"


rule aggregate_seed_multi_rule:
    input:
        multi_rule_episode_files,
    output:
        per_seed=layout.multi_rule_per_seed("{L}", "{H}", "{split}", "{agent}"),
        curves=layout.multi_rule_curves("{L}", "{H}", "{split}", "{agent}"),
        per_rule=layout.multi_rule_per_rule("{L}", "{H}", "{split}", "{agent}"),
    log:
        f"{LOGS}/fixed_z/L{{L}}_H{{H}}/multi_{{split}}/{{agent}}_aggregate_seed.log",
    wildcard_constraints:
        agent=one_of(MULTI_RULE_METHODS),
        L=r"\d+",
    conda:
        CONDA_ENV
    params:
        last_k=config["evaluation"]["last_k"],
    shell:
        "tapebench aggregate-seed --episodes {input:q} --last-k {params.last_k:q} --out {output.per_seed:q}"
        " --curves-out {output.curves:q} --per-rule-out {output.per_rule:q} > {log:q} 2>&1"


rule aggregate_multi_rule:
    input:
        multi_rule_per_seed_files,
    output:
        aggregate=layout.multi_rule_aggregate("{L}", "{H}", "{split}"),
        tests=layout.multi_rule_tests("{L}", "{H}", "{split}"),
    log:
        f"{LOGS}/fixed_z/L{{L}}_H{{H}}/multi_{{split}}/aggregate.log",
    wildcard_constraints:
        L=r"\d+",
    conda:
        CONDA_ENV
    params:
        n_resamples=config["statistics"]["n_resamples"],
        ci=config["statistics"]["ci"],
        seed=config["statistics"]["seed"],
    shell:
        "tapebench aggregate --per-seed {input:q} --n-resamples {params.n_resamples:q} --ci {params.ci:q}"
        " --seed {params.seed:q} --out {output.aggregate:q} --tests-out {output.tests:q} > {log:q} 2>&1"


rule oracle_multi_rule:
    """True-dynamics MPC and the exact optimum on the multi-rule runs' own episodes (both sides of the split)."""
    input:
        split=layout.split_file("{split}"),
    output:
        mpc=layout.multi_rule_oracle("{L}", "{H}", "{split}", "mpc", "{side}"),
        exact=layout.multi_rule_oracle("{L}", "{H}", "{split}", "exact", "{side}"),
    log:
        f"{LOGS}/fixed_z/L{{L}}_H{{H}}/multi_{{split}}/oracle_{{side}}.log",
    wildcard_constraints:
        side="train|test",
        L=r"\d+",
    conda:
        CONDA_ENV
    threads: 2
    params:
        planner=planner_args,
        episodes=config["evaluation"]["episodes_per_rule"],
        eval_seed=config["evaluation"]["eval_seed"],
    shell:
        "(export NUMBA_NUM_THREADS={threads:q}; tapebench mpc --split {input.split:q} --side {wildcards.side:q}"
        " --episodes-per-rule {params.episodes:q} --L {wildcards.L:q} --H {wildcards.H:q}"
        " --eval-seed {params.eval_seed:q} {params.planner:q} --out {output.mpc:q}"
        " && tapebench exact --split {input.split:q} --side {wildcards.side:q} --episodes-per-rule {params.episodes:q}"
        " --L {wildcards.L:q} --H {wildcards.H:q} --eval-seed {params.eval_seed:q} --out {output.exact:q})"
        " > {log:q} 2>&1"
