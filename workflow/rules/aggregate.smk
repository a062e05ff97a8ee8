# Per-seed values (mean of the last K checkpoints) and bootstrap CIs over seeds (docs/protocol.md#statistics).


rule aggregate_seed:
    input:
        episode_files,
    output:
        per_seed=layout.per_seed("{split}", "{agent}", "{H}"),
        curves=layout.curves("{split}", "{agent}", "{H}"),
        per_rule=layout.per_rule("{split}", "{agent}", "{H}"),
    log:
        f"{LOGS}/aggregate/{{split}}/{{agent}}_H{{H}}.log",
    conda:
        CONDA_ENV
    params:
        last_k=config["evaluation"]["last_k"],
    shell:
        "tapebench aggregate-seed --episodes {input:q} --last-k {params.last_k:q} --out {output.per_seed:q}"
        " --curves-out {output.curves:q} --per-rule-out {output.per_rule:q} > {log:q} 2>&1"


# With a reference_set, the main split's tables of the methods it holds come from its shipped records
# (`tapebench reference seed-tables`: the same code as aggregate-seed, from per-rule sums); nothing of them runs.
ruleorder: reference_seed_tables > aggregate_seed


rule reference_seed_tables:
    input:
        records=lambda w: f"{reference_sets.ROOT}/{REFERENCE_SET}/{reference_sets.records_file(w.agent)}",
        checksums=f"{reference_sets.ROOT}/{REFERENCE_SET}/{reference_sets.SUMS}",
    output:
        per_seed=layout.per_seed("{split}", "{agent}", "{H}"),
        curves=layout.curves("{split}", "{agent}", "{H}"),
        per_rule=layout.per_rule("{split}", "{agent}", "{H}"),
    log:
        f"{LOGS}/aggregate/{{split}}/{{agent}}_H{{H}}.reference.log",
    wildcard_constraints:
        split=re.escape(MAIN_SPLIT),
        agent=one_of(HELD),
    conda:
        CONDA_ENV
    params:
        root=lambda w, input: str(Path(input.checksums).parent.parent),
        name=REFERENCE_SET,
        last_k=config["evaluation"]["last_k"],
    shell:
        "tapebench reference --root {params.root:q} seed-tables {params.name:q} --method {wildcards.agent:q}"
        " --H {wildcards.H:q} --last-k {params.last_k:q} --out {output.per_seed:q}"
        " --curves-out {output.curves:q} --per-rule-out {output.per_rule:q} > {log:q} 2>&1"


rule aggregate:
    input:
        per_seed_files,
    output:
        aggregate=layout.aggregate("{split}"),
        tests=layout.aggregate_tests("{split}"),
    log:
        f"{LOGS}/aggregate/{{split}}/aggregate.log",
    conda:
        CONDA_ENV
    params:
        n_resamples=config["statistics"]["n_resamples"],
        ci=config["statistics"]["ci"],
        seed=config["statistics"]["seed"],
    shell:
        "tapebench aggregate --per-seed {input:q} --n-resamples {params.n_resamples:q} --ci {params.ci:q}"
        " --seed {params.seed:q} --out {output.aggregate:q} --tests-out {output.tests:q} > {log:q} 2>&1"
