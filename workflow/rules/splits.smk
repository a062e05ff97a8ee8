# [Sampled rule set ->] rule features and operational types -> splits -> health gate; the 2D grid family's features
# come from `tapebench grid-features` (grid_rule_features, which then builds results/rules/features.parquet)
# (docs/protocol.md#rule-sets, #rule-types, #splits).
# The split-robustness study needs no rules of its own: train / evaluate / aggregate are per {split}.
# Constants and helper functions: helpers/splits.smk.


rule rule_set:
    output:
        layout.rule_set(),
    log:
        f"{LOGS}/rules/rule_set.log",
    conda:
        CONDA_ENV
    params:
        k=FAMILY.k,
        r=getattr(FAMILY, "r", 1),
        n=RULE_SAMPLE["n"] if RULE_SAMPLE else 0,
        bins=lambda_bins_arg(RULE_SAMPLE) if RULE_SAMPLE else "",
        subfamily=RULE_SAMPLE.get("subfamily", "all") if RULE_SAMPLE else "",
        seed=RULE_SAMPLE["seed"] if RULE_SAMPLE else 0,
    shell:
        "tapebench rule-set --k {params.k:q} --r {params.r:q} --n {params.n:q} --lambda-bins {params.bins:q}"
        " --subfamily {params.subfamily:q} --seed {params.seed:q} --out {output:q} > {log:q} 2>&1"


if GRID:

    rule grid_rule_features:
        output:
            layout.rule_features(),
        log:
            f"{LOGS}/rules/features.log",
        conda:
            CONDA_ENV
        params:
            family=FAMILY.name,
            rules=grid_features_args(),
            seed=config["features"]["seed"],
        shell:
            "tapebench grid-features --family {params.family:q} {params.rules:q} --feature-seed {params.seed:q}"
            " --out {output:q} > {log:q} 2>&1"

    ruleorder: grid_rule_features > rule_features


rule rule_features:
    input:
        rule_set=rule_set_files,
    output:
        layout.rule_features(),
    log:
        f"{LOGS}/rules/features.log",
    conda:
        CONDA_ENV
    params:
        rule_set=rule_set_flag,
        seed=config["features"]["seed"],
        L=config["features"]["L"],
        trials=config["features"]["trials"],
        steps=config["features"]["steps"],
    shell:
        "tapebench features --seed {params.seed:q} --L {params.L:q} --trials {params.trials:q}"
        " --steps {params.steps:q} --out {output:q} {params.rule_set:q} > {log:q} 2>&1"


rule split:
    input:
        features=layout.rule_features(),
    output:
        layout.split_file("{split}"),
    log:
        f"{LOGS}/splits/{{split}}.log",
    wildcard_constraints:
        split=one_of(SPLIT_NAMES),  # the ladder split has its own rule (ladder.smk)
    conda:
        CONDA_ENV
    params:
        method=lambda w: config["splits"][w.split]["method"],
        test_size=lambda w: config["splits"][w.split]["test_size"],
        seed=lambda w: config["splits"][w.split]["seed"],
        unit=lambda w: config["splits"][w.split]["unit"],
        rules=lambda w: config["splits"][w.split]["rules"],
    shell:
        "tapebench split --features {input.features:q} --name {wildcards.split:q} --method {params.method:q}"
        " --test-size {params.test_size:q} --seed {params.seed:q} --unit {params.unit:q} --rules {params.rules:q}"
        " --out {output:q} > {log:q} 2>&1"


rule split_health:
    input:
        layout.split_file("{split}"),
    output:
        layout.split_health("{split}"),
    log:
        f"{LOGS}/splits/{{split}}.health.log",
    conda:
        CONDA_ENV
    shell:
        "tapebench split-health {input:q} --out {output:q} > {log:q} 2>&1"
