# Evaluation on the common-random-number episodes, ID (train side) and OOD (test side): every checkpoint
# of a trained run, or one seed (its own random stream) of a method that does not train.


rule evaluate:
    input:
        split=layout.split_file("{split}"),
        trained=trained_run,
    output:
        layout.evaluation(layout.run_dir("{split}", "{agent}", "{seed}"), "{H}"),
    log:
        "logs/evaluate/{split}/{agent}/seed{seed}_H{H}.log",
    wildcard_constraints:
        agent=one_of(TRAINED),
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=eval_mem_mb,
        runtime=eval_runtime,
    params:
        slice=eval_params,
        run_dir=lambda w: run_dir(w.split, w.agent, w.seed),
    shell:
        "tapebench evaluate --run {params.run_dir:q} --split {input.split:q} --H {wildcards.H:q}"
        " --params {params.slice:q} --threads {threads:q} --out {output:q} > {log:q} 2>&1"


rule evaluate_method:
    input:
        split=layout.split_file("{split}"),
        health=layout.split_health("{split}"),
    output:
        layout.evaluation(layout.run_dir("{split}", "{agent}", "{seed}"), "{H}"),
    log:
        "logs/evaluate/{split}/{agent}/seed{seed}_H{H}.log",
    wildcard_constraints:
        agent=one_of(EVALUATED_UNTRAINED),
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=eval_mem_mb,
        runtime=eval_runtime,
    params:
        slice=method_eval_params,
    shell:
        "NUMBA_NUM_THREADS={threads:q} tapebench evaluate --method {wildcards.agent:q} --seed {wildcards.seed:q}"
        " --split {input.split:q} --H {wildcards.H:q} --params {params.slice:q} --threads {threads:q}"
        " --out {output:q} > {log:q} 2>&1"
