# LaTeX tables rendered with jinja2 by the one renderer (src/tapebench/report/render.py).


rule render_table3:
    input:
        aggregate=f"results/aggregate/{MAIN_SPLIT}/aggregate.parquet",
        split=f"results/splits/{MAIN_SPLIT}.json",
        random_per_rule=random_per_rule_files,
    output:
        "results/table3.tex",
    params:
        split=MAIN_SPLIT,
        H=config["env"]["H"],
        random=random_per_rule_flag,
    log:
        "logs/report/table3.log",
    conda:
        CONDA_ENV
    shell:
        "tapebench render table3 --aggregate {input.aggregate:q} --split {params.split:q} --H {params.H:q}"
        " --split-file {input.split:q} {params.random:q} --out {output:q} > {log:q} 2>&1"


rule render_table4:
    input:
        f"results/aggregate/{MAIN_SPLIT}/aggregate.parquet",
    output:
        "results/table4.tex",
    params:
        split=MAIN_SPLIT,
        H=config["env"]["H"],
    log:
        "logs/report/table4.log",
    conda:
        CONDA_ENV
    shell:
        "tapebench render table4 --aggregate {input:q} --split {params.split:q} --H {params.H:q}"
        " --out {output:q} > {log:q} 2>&1"


rule render_table2:
    input:
        f"results/aggregate/{MAIN_SPLIT}/aggregate.parquet",
    output:
        "results/table2.tex",
    params:
        split=MAIN_SPLIT,
    log:
        "logs/report/table2.log",
    conda:
        CONDA_ENV
    shell:
        "tapebench render table2 --aggregate {input:q} --split {params.split:q} --out {output:q} > {log:q} 2>&1"
