# World-model credibility diagnostics (docs/protocol.md#model-error, paper App. G): the open-loop
# prediction error of every method with a world model, on ID and OOD rules, beside its success; and a
# one-hyperparameter sensitivity sweep (default: the DreamerV3 imagination horizon in {5, 10, 15, 20}).

WORLD_MODELS = [m for m in TRAINED if get_method(m).world_model]
SWEEP = config["diagnostics"]["sweep"]
SWEEP_VALUES = [int(v) for v in SWEEP["values"]]
SWEEP_SEEDS = list(range(SWEEP["seeds"]))


def model_error_params(wildcards):
    return dumps(model_error_slice(config))


def sweep_run_dir(split, value, seed):
    """A sweep point reuses the main run when it is the configured value of a method the pipeline runs."""
    method, field = SWEEP["method"], SWEEP["hyperparameter"]
    configured = getattr(build_config(method, config["agents"].get(method, {})), field)
    if method in METHODS and int(value) == int(configured) and int(seed) < config["seeds"]:
        return run_dir(split, method, seed)
    return f"results/sweeps/{split}/{method}/{field}{value}/seed{seed}"


def sweep_files(wildcards, name):
    return [f"{sweep_run_dir(wildcards.split, wildcards.value, s)}/{name}" for s in SWEEP_SEEDS]


rule model_error:
    input:
        split="results/splits/{split}.json",
        manifest="results/runs/{split}/{agent}/seed{seed}/train.json",
    output:
        "results/runs/{split}/{agent}/seed{seed}/model_error.parquet",
    wildcard_constraints:
        agent=one_of(WORLD_MODELS),
    params:
        slice=model_error_params,
        run_dir=lambda w: run_dir(w.split, w.agent, w.seed),
        H=config["env"]["H"],
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    log:
        "logs/model_error/{split}/{agent}/seed{seed}.log",
    conda:
        CONDA_ENV
    shell:
        "tapebench model-error --run {params.run_dir:q} --split {input.split:q} --H {params.H:q}"
        " --params {params.slice:q} --threads {threads:q} --device cpu --out {output:q} > {log:q} 2>&1"


rule aggregate_model_error:
    input:
        lambda w: [f"results/runs/{w.split}/{a}/seed{s}/model_error.parquet" for a in WORLD_MODELS for s in SEEDS],
    output:
        "results/aggregate/{split}/model_error.parquet",
    params:
        n_resamples=config["statistics"]["n_resamples"],
        ci=config["statistics"]["ci"],
        seed=config["statistics"]["seed"],
    log:
        "logs/aggregate/{split}/model_error.log",
    conda:
        CONDA_ENV
    shell:
        "tapebench aggregate-model-error --inputs {input:q} --n-resamples {params.n_resamples:q} --ci {params.ci:q}"
        " --seed {params.seed:q} --out {output:q} > {log:q} 2>&1"


rule render_model_error:
    input:
        errors=f"results/aggregate/{MAIN_SPLIT}/model_error.parquet",
        aggregate=f"results/aggregate/{MAIN_SPLIT}/aggregate.parquet",
    output:
        table="results/diagnostics/model_error.tex",
        pdf=report("results/figures/model_error.pdf", category="World models"),
        png=report("results/figures/model_error.png", category="World models"),
    params:
        split=MAIN_SPLIT,
        H=config["env"]["H"],
        depth=config["diagnostics"]["model_error"]["depth"],
        figure="results/figures/model_error",
    log:
        "logs/report/model_error.log",
    conda:
        CONDA_ENV
    shell:
        "tapebench render model-error --model-error {input.errors:q} --aggregate {input.aggregate:q}"
        " --split {params.split:q} --H {params.H:q} --depth {params.depth:q} --out {output.table:q}"
        " --figure {params.figure:q} > {log:q} 2>&1"


rule train_sweep:
    input:
        split="results/splits/{split}.json",
        health="results/splits/{split}.health.json",
    output:
        manifest="results/sweeps/{split}/{method}/{field}{value}/seed{seed}/train.json",
    wildcard_constraints:
        method=SWEEP["method"],
        field=SWEEP["hyperparameter"],
        value=r"\d+",
    params:
        slice=lambda w: dumps(sweep_train_slice(config, w.value)),
        run_dir=lambda w: f"results/sweeps/{w.split}/{w.method}/{w.field}{w.value}/seed{w.seed}",
        device=config["training"]["device"],
    threads: config["training"]["threads"]
    resources:
        gpu=config["training"]["gpus"],
        mem_mb=4000,
        runtime=240,
    log:
        "logs/sweep/{split}/{method}/{field}{value}/seed{seed}.train.log",
    conda:
        CONDA_ENV
    shell:
        "set -o pipefail; tapebench train --agent {wildcards.method:q} --split {input.split:q} --seed {wildcards.seed:q}"
        " --params {params.slice:q} --device {params.device:q} --threads {threads:q}"
        " --out {params.run_dir:q} 2>&1 | tee {log:q}"


rule evaluate_sweep:
    input:
        split="results/splits/{split}.json",
        manifest="results/sweeps/{split}/{method}/{field}{value}/seed{seed}/train.json",
    output:
        "results/sweeps/{split}/{method}/{field}{value}/seed{seed}/eval_H{H}.parquet",
    wildcard_constraints:
        method=SWEEP["method"],
        field=SWEEP["hyperparameter"],
        value=r"\d+",
    params:
        slice=lambda w: dumps(checkpoint_eval_slice(config, w.method)),
        run_dir=lambda w: f"results/sweeps/{w.split}/{w.method}/{w.field}{w.value}/seed{w.seed}",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=60,
    log:
        "logs/sweep/{split}/{method}/{field}{value}/seed{seed}_H{H}.log",
    conda:
        CONDA_ENV
    shell:
        "tapebench evaluate --run {params.run_dir:q} --split {input.split:q} --H {wildcards.H:q}"
        " --params {params.slice:q} --threads {threads:q} --out {output:q} > {log:q} 2>&1"


rule model_error_sweep:
    input:
        split="results/splits/{split}.json",
        manifest="results/sweeps/{split}/{method}/{field}{value}/seed{seed}/train.json",
    output:
        "results/sweeps/{split}/{method}/{field}{value}/seed{seed}/model_error.parquet",
    wildcard_constraints:
        method=SWEEP["method"],
        field=SWEEP["hyperparameter"],
        value=r"\d+",
    params:
        slice=model_error_params,
        run_dir=lambda w: f"results/sweeps/{w.split}/{w.method}/{w.field}{w.value}/seed{w.seed}",
        H=config["env"]["H"],
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    log:
        "logs/sweep/{split}/{method}/{field}{value}/seed{seed}.model_error.log",
    conda:
        CONDA_ENV
    shell:
        "tapebench model-error --run {params.run_dir:q} --split {input.split:q} --H {params.H:q}"
        " --params {params.slice:q} --threads {threads:q} --device cpu --out {output:q} > {log:q} 2>&1"


rule aggregate_sweep_point:
    input:
        episodes=lambda w: sweep_files(w, f"eval_H{config['env']['H']}.parquet"),
        errors=lambda w: sweep_files(w, "model_error.parquet"),
    output:
        per_seed="results/sweeps/{split}/{method}_{field}{value}.per_seed.parquet",
        errors="results/sweeps/{split}/{method}_{field}{value}.model_error.parquet",
    wildcard_constraints:
        method=SWEEP["method"],
        field=SWEEP["hyperparameter"],
        value=r"\d+",
    params:
        last_k=config["evaluation"]["last_k"],
        n_resamples=config["statistics"]["n_resamples"],
        ci=config["statistics"]["ci"],
        seed=config["statistics"]["seed"],
    log:
        "logs/sweep/{split}/{method}_{field}{value}.aggregate.log",
    conda:
        CONDA_ENV
    shell:
        "(tapebench aggregate-seed --episodes {input.episodes:q} --last-k {params.last_k:q} --out {output.per_seed:q}"
        " && tapebench aggregate-model-error --inputs {input.errors:q} --n-resamples {params.n_resamples:q}"
        " --ci {params.ci:q} --seed {params.seed:q} --out {output.errors:q}) > {log:q} 2>&1"


rule render_sweep:
    input:
        per_seed=expand("results/sweeps/{split}/{method}_{field}{value}.per_seed.parquet", split=MAIN_SPLIT,
                        method=SWEEP["method"], field=SWEEP["hyperparameter"], value=SWEEP_VALUES),
        errors=expand("results/sweeps/{split}/{method}_{field}{value}.model_error.parquet", split=MAIN_SPLIT,
                      method=SWEEP["method"], field=SWEEP["hyperparameter"], value=SWEEP_VALUES),
    output:
        table="results/diagnostics/sweep.tex",
        parquet="results/diagnostics/sweep.parquet",
        pdf=report("results/figures/sweep.pdf", category="World models"),
        png=report("results/figures/sweep.png", category="World models"),
    params:
        method=SWEEP["method"],
        field=SWEEP["hyperparameter"],
        values=SWEEP_VALUES,
        split=MAIN_SPLIT,
        H=config["env"]["H"],
        n_resamples=config["statistics"]["n_resamples"],
        ci=config["statistics"]["ci"],
        seed=config["statistics"]["seed"],
        figure="results/figures/sweep",
    log:
        "logs/report/sweep.log",
    conda:
        CONDA_ENV
    shell:
        "tapebench render sweep --method {params.method:q} --hyperparameter {params.field:q} --values {params.values:q}"
        " --per-seed {input.per_seed:q} --model-error {input.errors:q} --split {params.split:q} --H {params.H:q}"
        " --n-resamples {params.n_resamples:q} --ci {params.ci:q} --seed {params.seed:q} --out {output.table:q}"
        " --parquet {output.parquet:q} --figure {params.figure:q} > {log:q} 2>&1"


DIAGNOSTICS_TARGETS = (["results/diagnostics/model_error.tex"] if WORLD_MODELS else []) + (
    ["results/diagnostics/sweep.tex"] if SWEEP["method"] in METHODS else [])
