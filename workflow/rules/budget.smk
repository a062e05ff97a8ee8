# The budget study (docs/protocol.md#budget-study): each method trained for each budget (environment steps), its
# checkpoints spread as the main schedule's over its own budget, evaluated on the main split at its last K
# checkpoints; the main budget's points are the main runs. Constants and helper functions: helpers/budget.smk.


rule train_budget:
    input:
        split=layout.split_file("{split}"),
        health=layout.split_health("{split}"),
        verdict=ancient(layout.health("{split}")["verdict"]),
    output:
        manifest=layout.manifest(layout.budget_run_dir("{split}", "{method}", "{steps}", "{seed}")),
    log:
        f"{LOGS}/budgets/{{split}}/{{method}}/steps{{steps}}/seed{{seed}}.train.log",
    wildcard_constraints:
        method=one_of(BUDGET["methods"]),
        steps=r"\d+",
    conda:
        CONDA_ENV
    threads: config["training"]["threads"]
    resources:
        gpu=train_gpus,
        mem_mb=train_mem_mb,
        runtime=train_runtime,
    params:
        slice=budget_train_params,
        run_dir=lambda w: layout.budget_run_dir(w.split, w.method, w.steps, w.seed),
        device=config["training"]["device"],
    shell:
        "set -o pipefail; tapebench train --agent {wildcards.method:q} --split {input.split:q} --seed {wildcards.seed:q}"
        " --params {params.slice:q} --device {params.device:q} --threads {threads:q}"
        " --out {params.run_dir:q} 2>&1 | tee {log:q}"


rule evaluate_budget:
    input:
        split=layout.split_file("{split}"),
        manifest=layout.manifest(layout.budget_run_dir("{split}", "{method}", "{steps}", "{seed}")),
    output:
        layout.evaluation(layout.budget_run_dir("{split}", "{method}", "{steps}", "{seed}"), "{H}"),
    log:
        f"{LOGS}/budgets/{{split}}/{{method}}/steps{{steps}}/seed{{seed}}_H{{H}}.log",
    wildcard_constraints:
        method=one_of(BUDGET["methods"]),
        steps=r"\d+",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=eval_mem_mb,
        runtime=eval_runtime,
    params:
        slice=budget_eval_params,
        run_dir=lambda w: layout.budget_run_dir(w.split, w.method, w.steps, w.seed),
    shell:
        "tapebench evaluate --run {params.run_dir:q} --split {input.split:q} --H {wildcards.H:q}"
        " --params {params.slice:q} --threads {threads:q} --out {output:q} > {log:q} 2>&1"


rule aggregate_budget_point:
    input:
        budget_episode_files,
    output:
        layout.budget_point("{split}", "{method}", "{steps}"),
    log:
        f"{LOGS}/budgets/{{split}}/{{method}}_steps{{steps}}.aggregate.log",
    wildcard_constraints:
        method=one_of(BUDGET["methods"]),
        steps=r"\d+",
    conda:
        CONDA_ENV
    params:
        last_k=config["evaluation"]["last_k"],
    shell:
        "tapebench aggregate-seed --episodes {input:q} --last-k {params.last_k:q} --out {output:q} > {log:q} 2>&1"
