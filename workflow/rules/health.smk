# The benchmark health report per split (docs/protocol.md#benchmark-health): leakage, reference solvability,
# weak-baseline headroom, trivially solved rules, identifiability, on the split's test episodes at env.L / env.H.
# health_gate fails (naming the gate and the rules) when a fatal check fails; the training jobs wait for its
# verdict through ancient(), so recomputing the report (e.g. a new threshold) reruns only these jobs.
# Constants and helper functions: helpers/health.smk.


rule exact_split:
    input:
        split=layout.split_file("{split}"),
    output:
        layout.exact_records("{split}", "{side}", "{H}"),
    log:
        f"{LOGS}/oracle/{{split}}/exact_{{side}}_H{{H}}.log",
    wildcard_constraints:
        side="train|test",
    conda:
        CONDA_ENV
    threads: 2
    params:
        L=config["env"]["L"],
        episodes=config["evaluation"]["episodes_per_rule"],
        eval_seed=config["evaluation"]["eval_seed"],
    shell:
        "NUMBA_NUM_THREADS={threads:q} tapebench exact --split {input.split:q} --side {wildcards.side:q}"
        " --episodes-per-rule {params.episodes:q} --L {params.L:q} --H {wildcards.H:q}"
        " --eval-seed {params.eval_seed:q} --out {output:q} > {log:q} 2>&1"


rule benchmark_health:
    input:
        split=layout.split_file("{split}"),
        split_health=layout.split_health("{split}"),
        reference=health_reference,
        random=health_random,
        rule_agnostic=health_rule_agnostic,
        identifiability=health_identifiability,
    output:
        report=layout.health("{split}")["report"],
        per_rule=layout.health("{split}")["per_rule"],
    log:
        f"{LOGS}/health/{{split}}.log",
    conda:
        CONDA_ENV
    params:
        settings=dumps(config["health"]),
        statistics=dumps(config["statistics"]),
        L=config["env"]["L"],
        H=config["env"]["H"],
        rule_agnostic=lambda wildcards, input: (
            ["--rule-agnostic", *input.rule_agnostic] if input.rule_agnostic else []
        ),
        identifiability=lambda wildcards, input: (
            ["--identifiability", *input.identifiability] if input.identifiability else []
        ),
    shell:
        "tapebench benchmark-health --split {input.split:q} --split-health {input.split_health:q}"
        " --reference {input.reference:q} --random {input.random:q} {params.rule_agnostic:q}"
        " {params.identifiability:q}"
        " --settings {params.settings:q} --statistics {params.statistics:q} --L {params.L:q} --H {params.H:q}"
        " --out {output.report:q} --per-rule-out {output.per_rule:q} > {log:q} 2>&1"


rule health_gate:
    input:
        layout.health("{split}")["report"],
    output:
        layout.health("{split}")["verdict"],
    log:
        f"{LOGS}/health/{{split}}.verdict.log",
    conda:
        CONDA_ENV
    shell:
        "set -o pipefail; tapebench health-gate {input:q} --out {output:q} 2>&1 | tee {log:q}"
