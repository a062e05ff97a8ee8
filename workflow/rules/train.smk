# One training job per split x agent x seed; checkpoints let a killed or preempted job resume.


rule train:
    input:
        split="results/splits/{split}.json",
        health="results/splits/{split}.health.json",
    output:
        manifest="results/runs/{split}/{agent}/seed{seed}/train.json",
    params:
        slice=train_params,
        run_dir=lambda w: run_dir(w.split, w.agent, w.seed),
        device=config["training"]["device"],
    threads: config["training"]["threads"]
    resources:
        gpu=config["training"]["gpus"],
        mem_mb=4000,
        runtime=240,
    log:
        "logs/train/{split}/{agent}/seed{seed}.log",
    conda:
        CONDA_ENV
    shell:
        "tapebench train --agent {wildcards.agent} --split {input.split} --seed {wildcards.seed}"
        " --params '{params.slice}' --device {params.device} --threads {threads}"
        " --out {params.run_dir} > {log} 2>&1"
