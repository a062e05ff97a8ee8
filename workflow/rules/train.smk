# One training job per split x agent x seed (training.seeds_per_job = 1) or per seed block (> 1: `train_block`,
# docs/protocol.md#seed-blocks); checkpoints let a killed or preempted job resume.
# Its progress lines (steps, steps/s, ETA) go to the console and to the job's log (tee; Snakemake's
# bash runs with pipefail, so a failing `tapebench train` still fails the job).


rule train:
    input:
        split=layout.split_file("{split}"),
        health=layout.split_health("{split}"),
        verdict=health_verdict,
    output:
        manifest=layout.manifest(layout.run_dir("{split}", "{agent}", "{seed}")),
    log:
        f"{LOGS}/train/{{split}}/{{agent}}/seed{{seed}}.log",
    conda:
        CONDA_ENV
    threads: config["training"]["threads"]
    resources:
        gpu=train_gpus,
        mem_mb=train_mem_mb,
        runtime=train_runtime,
    params:
        slice=train_params,
        run_dir=lambda w: run_dir(w.split, w.agent, w.seed),
        device=config["training"]["device"],
    shell:
        "set -o pipefail; tapebench train --agent {wildcards.agent:q} --split {input.split:q} --seed {wildcards.seed:q}"
        " --params {params.slice:q} --device {params.device:q} --threads {threads:q}"
        " --out {params.run_dir:q} 2>&1 | tee {log:q}"


rule train_block:
    input:
        split=layout.split_file("{split}"),
        health=layout.split_health("{split}"),
        verdict=health_verdict,
    output:
        record=layout.seed_block("{split}", "{agent}", "{first}", "{last}"),
    log:
        f"{LOGS}/train/{{split}}/{{agent}}/seeds{{first}}-{{last}}.log",
    wildcard_constraints:
        first=r"\d+",
        last=r"\d+",
    conda:
        CONDA_ENV
    threads: config["training"]["threads"]
    resources:
        gpu=train_gpus,
        mem_mb=train_mem_mb,
        runtime=train_runtime,
    params:
        slice=train_params,
        runs=lambda w: run_dir(w.split, w.agent, "{seed}"),
        device=config["training"]["device"],
    shell:
        "set -o pipefail; tapebench train --agent {wildcards.agent:q} --split {input.split:q}"
        " --seeds {wildcards.first:q}-{wildcards.last:q} --params {params.slice:q} --device {params.device:q}"
        " --threads {threads:q} --out {params.runs:q} --block-record {output.record:q} 2>&1 | tee {log:q}"
