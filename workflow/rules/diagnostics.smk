# World-model credibility diagnostics (docs/protocol.md#model-error, paper App. G): the open-loop
# prediction error of every method with a world model, on ID and OOD rules, beside its success; and a
# one-hyperparameter sensitivity sweep (default: the DreamerV3 imagination horizon in {5, 10, 15, 20}).
# Constants and helper functions: helpers/diagnostics.smk.


rule model_error:
    input:
        split=layout.split_file("{split}"),
        trained=trained_run,
    output:
        layout.model_error(layout.run_dir("{split}", "{agent}", "{seed}")),
    log:
        f"{LOGS}/model_error/{{split}}/{{agent}}/seed{{seed}}.log",
    wildcard_constraints:
        agent=one_of(WORLD_MODELS),
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        slice=model_error_params,
        run_dir=lambda w: run_dir(w.split, w.agent, w.seed),
        H=config["env"]["H"],
    shell:
        "tapebench model-error --run {params.run_dir:q} --split {input.split:q} --H {params.H:q}"
        " --params {params.slice:q} --threads {threads:q} --device cpu --out {output:q} > {log:q} 2>&1"


rule aggregate_model_error:
    input:
        lambda w: [layout.model_error(run_dir(w.split, a, s)) for a in WORLD_MODELS for s in SEEDS],
    output:
        layout.model_error_aggregate("{split}"),
    log:
        f"{LOGS}/aggregate/{{split}}/model_error.log",
    conda:
        CONDA_ENV
    params:
        n_resamples=config["statistics"]["n_resamples"],
        ci=config["statistics"]["ci"],
        seed=config["statistics"]["seed"],
    shell:
        "tapebench aggregate-model-error --inputs {input:q} --n-resamples {params.n_resamples:q} --ci {params.ci:q}"
        " --seed {params.seed:q} --out {output:q} > {log:q} 2>&1"


rule train_sweep:
    input:
        split=layout.split_file("{split}"),
        health=layout.split_health("{split}"),
        verdict=ancient(layout.health("{split}")["verdict"]),
    output:
        manifest=layout.manifest(layout.sweep_run_dir("{split}", "{method}", "{field}", "{value}", "{seed}")),
    log:
        f"{LOGS}/sweep/{{split}}/{{method}}/{{field}}{{value}}/seed{{seed}}.train.log",
    wildcard_constraints:
        method=SWEEP["method"],
        field=SWEEP["hyperparameter"],
        value=r"\d+",
    conda:
        CONDA_ENV
    threads: config["training"]["threads"]
    resources:
        gpu=train_gpus,
        mem_mb=train_mem_mb,
        runtime=train_runtime,
    params:
        slice=lambda w: dumps(sweep_train_slice(config, w.value)),
        run_dir=lambda w: layout.sweep_run_dir(w.split, w.method, w.field, w.value, w.seed),
        device=config["training"]["device"],
    shell:
        "set -o pipefail; tapebench train --agent {wildcards.method:q} --split {input.split:q} --seed {wildcards.seed:q}"
        " --params {params.slice:q} --device {params.device:q} --threads {threads:q}"
        " --out {params.run_dir:q} 2>&1 | tee {log:q}"


rule evaluate_sweep:
    input:
        split=layout.split_file("{split}"),
        manifest=layout.manifest(layout.sweep_run_dir("{split}", "{method}", "{field}", "{value}", "{seed}")),
    output:
        layout.evaluation(layout.sweep_run_dir("{split}", "{method}", "{field}", "{value}", "{seed}"), "{H}"),
    log:
        f"{LOGS}/sweep/{{split}}/{{method}}/{{field}}{{value}}/seed{{seed}}_H{{H}}.log",
    wildcard_constraints:
        method=SWEEP["method"],
        field=SWEEP["hyperparameter"],
        value=r"\d+",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=eval_mem_mb,
        runtime=eval_runtime,
    params:
        slice=lambda w: dumps(checkpoint_eval_slice(config, w.method)),
        run_dir=lambda w: layout.sweep_run_dir(w.split, w.method, w.field, w.value, w.seed),
    shell:
        "tapebench evaluate --run {params.run_dir:q} --split {input.split:q} --H {wildcards.H:q}"
        " --params {params.slice:q} --threads {threads:q} --out {output:q} > {log:q} 2>&1"


rule model_error_sweep:
    input:
        split=layout.split_file("{split}"),
        manifest=layout.manifest(layout.sweep_run_dir("{split}", "{method}", "{field}", "{value}", "{seed}")),
    output:
        layout.model_error(layout.sweep_run_dir("{split}", "{method}", "{field}", "{value}", "{seed}")),
    log:
        f"{LOGS}/sweep/{{split}}/{{method}}/{{field}}{{value}}/seed{{seed}}.model_error.log",
    wildcard_constraints:
        method=SWEEP["method"],
        field=SWEEP["hyperparameter"],
        value=r"\d+",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        slice=model_error_params,
        run_dir=lambda w: layout.sweep_run_dir(w.split, w.method, w.field, w.value, w.seed),
        H=config["env"]["H"],
    shell:
        "tapebench model-error --run {params.run_dir:q} --split {input.split:q} --H {params.H:q}"
        " --params {params.slice:q} --threads {threads:q} --device cpu --out {output:q} > {log:q} 2>&1"


rule aggregate_sweep_point:
    input:
        episodes=lambda w: sweep_files(w, lambda run: layout.evaluation(run, config["env"]["H"])),
        errors=lambda w: sweep_files(w, layout.model_error),
    output:
        per_seed=layout.sweep_point("{split}", "{method}", "{field}", "{value}")["per_seed"],
        errors=layout.sweep_point("{split}", "{method}", "{field}", "{value}")["model_error"],
    log:
        f"{LOGS}/sweep/{{split}}/{{method}}_{{field}}{{value}}.aggregate.log",
    wildcard_constraints:
        method=SWEEP["method"],
        field=SWEEP["hyperparameter"],
        value=r"\d+",
    conda:
        CONDA_ENV
    params:
        last_k=config["evaluation"]["last_k"],
        n_resamples=config["statistics"]["n_resamples"],
        ci=config["statistics"]["ci"],
        seed=config["statistics"]["seed"],
    shell:
        "(tapebench aggregate-seed --episodes {input.episodes:q} --last-k {params.last_k:q} --out {output.per_seed:q}"
        " && tapebench aggregate-model-error --inputs {input.errors:q} --n-resamples {params.n_resamples:q}"
        " --ci {params.ci:q} --seed {params.seed:q} --out {output.errors:q}) > {log:q} 2>&1"
