# The few-shot study (docs/protocol.md#few-shot): every method of `studies.fewshot.methods`, one job per seed on the
# main split (its ID and OOD rules): success on a rule's evaluation episodes after k reward-bearing episodes of it. A
# method that trains adapts its main-split run of that seed (no new training); the k = 0 rows are its evaluation.
# Constants and helper functions: helpers/fewshot.smk.


rule fewshot_trained:
    input:
        split=layout.split_file("{split}"),
        trained=trained_run,
    output:
        layout.fewshot_records("{split}", "{agent}", "{seed}"),
    log:
        f"{LOGS}/fewshot/{{split}}/{{agent}}/seed{{seed}}.log",
    wildcard_constraints:
        agent=one_of(FEWSHOT_TRAINED),
        seed=r"\d+",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=eval_mem_mb,
        runtime=eval_runtime,
    params:
        slice=fewshot_params,
        run_dir=lambda w: run_dir(w.split, w.agent, w.seed),
    shell:
        "tapebench fewshot --method {wildcards.agent:q} --run {params.run_dir:q} --seed {wildcards.seed:q}"
        " --split {input.split:q} --params {params.slice:q} --threads {threads:q} --out {output:q} > {log:q} 2>&1"


rule fewshot_method:
    input:
        split=layout.split_file("{split}"),
        health=layout.split_health("{split}"),
    output:
        layout.fewshot_records("{split}", "{agent}", "{seed}"),
    log:
        f"{LOGS}/fewshot/{{split}}/{{agent}}/seed{{seed}}.log",
    wildcard_constraints:
        agent=one_of(FEWSHOT_UNTRAINED),
        seed=r"\d+",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=eval_mem_mb,
        runtime=eval_runtime,
    params:
        slice=fewshot_params,
    shell:
        "NUMBA_NUM_THREADS={threads:q} tapebench fewshot --method {wildcards.agent:q} --seed {wildcards.seed:q}"
        " --split {input.split:q} --params {params.slice:q} --threads {threads:q} --out {output:q} > {log:q} 2>&1"


rule aggregate_fewshot:
    input:
        fewshot_files,
    output:
        layout.FEWSHOT_AGGREGATE,
    log:
        f"{LOGS}/fewshot/aggregate.log",
    conda:
        CONDA_ENV
    params:
        n_resamples=config["statistics"]["n_resamples"],
        ci=config["statistics"]["ci"],
        seed=config["statistics"]["seed"],
    shell:
        "tapebench aggregate-fewshot --inputs {input:q} --n-resamples {params.n_resamples:q} --ci {params.ci:q}"
        " --seed {params.seed:q} --out {output:q} > {log:q} 2>&1"
