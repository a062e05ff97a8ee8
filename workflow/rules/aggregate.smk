# Per-seed values (mean of the last K checkpoints) and bootstrap CIs over seeds (SPEC §9).


rule aggregate_seed:
    input:
        episode_files,
    output:
        per_seed="results/aggregate/{split}/{agent}_H{H}.per_seed.parquet",
        curves="results/aggregate/{split}/{agent}_H{H}.curves.parquet",
        per_rule="results/aggregate/{split}/{agent}_H{H}.per_rule.parquet",
    params:
        last_k=config["evaluation"]["last_k"],
    log:
        "logs/aggregate/{split}/{agent}_H{H}.log",
    conda:
        CONDA_ENV
    shell:
        "tapebench aggregate-seed --episodes {input} --last-k {params.last_k} --out {output.per_seed}"
        " --curves-out {output.curves} --per-rule-out {output.per_rule} > {log} 2>&1"


rule aggregate:
    input:
        per_seed_files,
    output:
        aggregate="results/aggregate/{split}/aggregate.parquet",
        tests="results/aggregate/{split}/tests.parquet",
    params:
        n_resamples=config["statistics"]["n_resamples"],
        ci=config["statistics"]["ci"],
        seed=config["statistics"]["seed"],
    log:
        "logs/aggregate/{split}/aggregate.log",
    conda:
        CONDA_ENV
    shell:
        "tapebench aggregate --per-seed {input} --n-resamples {params.n_resamples} --ci {params.ci}"
        " --seed {params.seed} --out {output.aggregate} --tests-out {output.tests} > {log} 2>&1"
