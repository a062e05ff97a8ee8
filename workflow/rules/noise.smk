# The noise study (docs/protocol.md#noise): every method of `studies.noise.methods` (its main-split runs, no new
# training) evaluated on the stochastic dynamics at each noise level epsilon > 0, on the common-random-number
# episodes and noise realisation; per-seed values and a bootstrap per level. Epsilon = 0 reuses the noise-free
# per-seed tables (aggregate.smk). Every job belongs to one level, so adding a level runs only that level's jobs
# (and the table and figure).
# Constants and helper functions: helpers/noise.smk.


for seeds, splits in evaluation_blocks(EVALUATED_SPLITS):  # a job per seed, or per seed block (evaluate.smk)

    rule:
        name:
            block_name("evaluate_noise", seeds)
        input:
            split=layout.split_file("{split}"),
            trained=block_trained_runs(seeds),
        output:
            [layout.noise_eval("{split}", "{eps}", "{agent}", s, "{H}") for s in seeds],
        log:
            block_log("noise/{split}/eps{eps}/{agent}", seeds),
        wildcard_constraints:
            **block_constraints(NOISE_TRAINED, splits),
            eps=r"0\.\d*[1-9]",
        conda:
            CONDA_ENV
        threads: 1
        resources:
            mem_mb=eval_mem_mb,
            runtime=block_runtime(eval_runtime, seeds),
        params:
            slice=noise_eval_params,
            run=block_seed_args(seeds, "--run", lambda w, s: run_dir(w.split, w.agent, s)),
            out=block_out(lambda w, s: layout.noise_eval(w.split, w.eps, w.agent, s, w.H), seeds),
        shell:
            "tapebench evaluate {params.run:q} --split {input.split:q} --H {wildcards.H:q}"
            " --params {params.slice:q} --threads {threads:q} --out {params.out:q} > {log:q} 2>&1"


for seeds, splits, agents in NOISE_METHOD_BLOCKS:

    rule:
        name:
            block_name("evaluate_noise_method", seeds)
        input:
            split=layout.split_file("{split}"),
            health=layout.split_health("{split}"),
        output:
            [layout.noise_eval("{split}", "{eps}", "{agent}", s, "{H}") for s in seeds],
        log:
            block_log("noise/{split}/eps{eps}/{agent}", seeds),
        wildcard_constraints:
            **block_constraints(agents, splits),
            eps=r"0\.\d*[1-9]",
        conda:
            CONDA_ENV
        threads: 1
        resources:
            mem_mb=eval_mem_mb,
            runtime=block_runtime(eval_runtime, seeds),
        params:
            slice=noise_eval_params,
            seed=block_seed_args(seeds),
            out=block_out(lambda w, s: layout.noise_eval(w.split, w.eps, w.agent, s, w.H), seeds),
        shell:
            "NUMBA_NUM_THREADS={threads:q} tapebench evaluate --method {wildcards.agent:q} {params.seed:q}"
            " --split {input.split:q} --H {wildcards.H:q} --params {params.slice:q} --threads {threads:q}"
            " --out {params.out:q} > {log:q} 2>&1"


rule aggregate_seed_noise:
    input:
        noise_episode_files,
    output:
        layout.noise_level_per_seed("{split}", "{eps}", "{agent}", "{H}"),
    log:
        f"{LOGS}/noise/{{split}}/eps{{eps}}/{{agent}}_H{{H}}_aggregate_seed.log",
    wildcard_constraints:
        agent=one_of(NOISE["methods"]),
        eps=r"0\.\d*[1-9]",
    conda:
        CONDA_ENV
    params:
        last_k=config["evaluation"]["last_k"],
    shell:
        "tapebench aggregate-seed --episodes {input:q} --last-k {params.last_k:q} --out {output:q} > {log:q} 2>&1"


rule aggregate_noise:
    input:
        noise_per_seed_files,
    output:
        layout.noise_aggregate("{split}", "{eps}", "{H}"),
    log:
        f"{LOGS}/noise/{{split}}/eps{{eps}}/aggregate_H{{H}}.log",
    wildcard_constraints:
        eps=r"0|0\.\d*[1-9]",
    conda:
        CONDA_ENV
    params:
        n_resamples=config["statistics"]["n_resamples"],
        ci=config["statistics"]["ci"],
        seed=config["statistics"]["seed"],
    shell:
        "tapebench aggregate --per-seed {input:q} --n-resamples {params.n_resamples:q} --ci {params.ci:q}"
        " --seed {params.seed:q} --out {output:q} > {log:q} 2>&1"
