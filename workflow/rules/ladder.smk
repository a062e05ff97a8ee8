# The severity ladder (docs/protocol.md#severity-ladders) needs only its split: its runs are the per-{split} train /
# evaluate / aggregate jobs on split `studies.ladder.name`, evaluated on the sides train, d1, d2, ...
# Constants and helper functions: helpers/ladder.smk.


rule ladder_split:
    input:
        features=layout.rule_features(),
    output:
        layout.split_file(LADDER_SPLIT),
    log:
        f"{LOGS}/splits/{LADDER_SPLIT}.log",
    conda:
        CONDA_ENV
    params:
        name=LADDER_SPLIT,
        args=ladder_split_args,
    shell:
        "tapebench ladder-split --features {input.features:q} --name {params.name:q} {params.args:q}"
        " --out {output:q} > {log:q} 2>&1"
