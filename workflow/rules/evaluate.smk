# Evaluation on the common-random-number episodes, ID (train side) and OOD (test side): every checkpoint
# of a trained run, or one seed (its own random stream) of a method that does not train.
# With training.seeds_per_job > 1 the seeds of a block are evaluated in one job (one process start-up): one rule
# per block (layout.block_rule), since a job names each seed's own file among its outputs
# (docs/protocol.md#seed-blocks); with 1, one job per seed.


for seeds, splits in evaluation_blocks(EVALUATED_SPLITS):

    rule:
        name:
            block_name("evaluate", seeds)
        input:
            split=layout.split_file("{split}"),
            trained=block_trained_runs(seeds),
        output:
            [layout.evaluation(layout.run_dir("{split}", "{agent}", s), "{H}") for s in seeds],
        log:
            block_log("evaluate/{split}/{agent}", seeds),
        wildcard_constraints:
            **block_constraints(TRAINED, splits),
        conda:
            CONDA_ENV
        threads: 1
        resources:
            mem_mb=eval_mem_mb,
            runtime=block_runtime(eval_runtime, seeds),
        params:
            slice=eval_params,
            run=block_seed_args(seeds, "--run", lambda w, s: run_dir(w.split, w.agent, s)),
            out=block_out(evaluation_file, seeds),
        shell:
            "tapebench evaluate {params.run:q} --split {input.split:q} --H {wildcards.H:q}"
            " --params {params.slice:q} --threads {threads:q} --out {params.out:q} > {log:q} 2>&1"


for seeds, splits, agents in METHOD_BLOCKS:

    rule:
        name:
            block_name("evaluate_method", seeds)
        input:
            split=layout.split_file("{split}"),
            health=layout.split_health("{split}"),
        output:
            [layout.evaluation(layout.run_dir("{split}", "{agent}", s), "{H}") for s in seeds],
        log:
            block_log("evaluate/{split}/{agent}", seeds),
        wildcard_constraints:
            **block_constraints(agents, splits),
        conda:
            CONDA_ENV
        threads: 1
        resources:
            mem_mb=eval_mem_mb,
            runtime=block_runtime(eval_runtime, seeds),
        params:
            slice=method_eval_params,
            seed=block_seed_args(seeds),
            out=block_out(evaluation_file, seeds),
        shell:
            "NUMBA_NUM_THREADS={threads:q} tapebench evaluate --method {wildcards.agent:q} {params.seed:q}"
            " --split {input.split:q} --H {wildcards.H:q} --params {params.slice:q} --threads {threads:q}"
            " --out {params.out:q} > {log:q} 2>&1"
