# Per-seed values (mean of the last K checkpoints) and bootstrap CIs over seeds (docs/protocol.md#statistics).


rule aggregate_seed:
    input:
        episode_files,
    output:
        per_seed="results/aggregate/{split}/{agent}_H{H}.per_seed.parquet",
        curves="results/aggregate/{split}/{agent}_H{H}.curves.parquet",
        per_rule="results/aggregate/{split}/{agent}_H{H}.per_rule.parquet",
    log:
        "logs/aggregate/{split}/{agent}_H{H}.log",
    conda:
        CONDA_ENV
    params:
        last_k=config["evaluation"]["last_k"],
    shell:
        "tapebench aggregate-seed --episodes {input:q} --last-k {params.last_k:q} --out {output.per_seed:q}"
        " --curves-out {output.curves:q} --per-rule-out {output.per_rule:q} > {log:q} 2>&1"


rule aggregate:
    input:
        per_seed_files,
    output:
        aggregate="results/aggregate/{split}/aggregate.parquet",
        tests="results/aggregate/{split}/tests.parquet",
    log:
        "logs/aggregate/{split}/aggregate.log",
    conda:
        CONDA_ENV
    params:
        n_resamples=config["statistics"]["n_resamples"],
        ci=config["statistics"]["ci"],
        seed=config["statistics"]["seed"],
    shell:
        "tapebench aggregate --per-seed {input:q} --n-resamples {params.n_resamples:q} --ci {params.ci:q}"
        " --seed {params.seed:q} --out {output.aggregate:q} --tests-out {output.tests:q} > {log:q} 2>&1"
