# The world test (docs/protocol.md#world-test): every method of `studies.worldtest.methods`, one job per seed and
# interaction budget on the main split (its ID and OOD rules); a method that trains answers with its main-split
# run of that seed (no new training). Adding a budget runs only that budget's jobs, the aggregate, table and figure.
# Constants and helper functions: helpers/worldtest.smk.


rule worldtest_trained:
    input:
        split=layout.split_file("{split}"),
        trained=trained_run,
    output:
        layout.worldtest_records("{split}", "{agent}", "{seed}", "{budget}"),
    log:
        f"{LOGS}/worldtest/{{split}}/{{agent}}/seed{{seed}}_B{{budget}}.log",
    wildcard_constraints:
        agent=one_of(WORLDTEST_TRAINED),
        budget=r"\d+",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=worldtest_mem_mb,
        runtime=60,
    params:
        slice=worldtest_params,
        run_dir=lambda w: run_dir(w.split, w.agent, w.seed),
    shell:
        "tapebench worldtest --method {wildcards.agent:q} --run {params.run_dir:q} --seed {wildcards.seed:q}"
        " --budget {wildcards.budget:q} --split {input.split:q} --params {params.slice:q} --threads {threads:q}"
        " --out {output:q} > {log:q} 2>&1"


rule worldtest_method:
    input:
        split=layout.split_file("{split}"),
        health=layout.split_health("{split}"),
    output:
        layout.worldtest_records("{split}", "{agent}", "{seed}", "{budget}"),
    log:
        f"{LOGS}/worldtest/{{split}}/{{agent}}/seed{{seed}}_B{{budget}}.log",
    wildcard_constraints:
        agent=one_of(WORLDTEST_UNTRAINED),
        budget=r"\d+",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=worldtest_mem_mb,
        runtime=60,
    params:
        slice=worldtest_params,
    shell:
        "NUMBA_NUM_THREADS={threads:q} tapebench worldtest --method {wildcards.agent:q} --seed {wildcards.seed:q}"
        " --budget {wildcards.budget:q} --split {input.split:q} --params {params.slice:q} --threads {threads:q}"
        " --out {output:q} > {log:q} 2>&1"


rule aggregate_worldtest:
    input:
        worldtest_files,
    output:
        layout.WORLDTEST_AGGREGATE,
    log:
        f"{LOGS}/worldtest/aggregate.log",
    conda:
        CONDA_ENV
    params:
        n_resamples=config["statistics"]["n_resamples"],
        ci=config["statistics"]["ci"],
        seed=config["statistics"]["seed"],
    shell:
        "tapebench aggregate-worldtest --inputs {input:q} --n-resamples {params.n_resamples:q} --ci {params.ci:q}"
        " --seed {params.seed:q} --out {output:q} > {log:q} 2>&1"
