# The severity ladder (docs/protocol.md#severity-ladders) needs only its split: its runs are the per-{split} train /
# evaluate / aggregate jobs on split `studies.ladder.name`, evaluated on the sides train, d1, d2, ...
# LADDER and LADDER_SPLIT are in common.smk: the split's seeds, methods and health gate are read by every stage.
from tapebench.pipeline.config import ladder_split_slice


def ladder_split_args(wildcards=None):
    """`tapebench ladder-split` arguments from the ladder's split slice (methods and seeds change only the runs)."""
    ladder = ladder_split_slice(config)
    args = [
        "--train-classes",
        str(ladder["train_classes"]),
        "--levels",
        ",".join(map(str, ladder["levels"])),
        "--level-size",
        str(ladder["level_size"]),
        "--seed",
        str(ladder["seed"]),
    ]
    if ladder["train"]:
        args += ["--train", ",".join(map(str, ladder["train"]))]
    if ladder["train_types"]:
        args += ["--train-types", ",".join(ladder["train_types"])]
    return args


rule ladder_split:
    input:
        features=layout.rule_features(),
    output:
        layout.split_file(LADDER_SPLIT),
    log:
        f"logs/splits/{LADDER_SPLIT}.log",
    conda:
        CONDA_ENV
    params:
        name=LADDER_SPLIT,
        args=ladder_split_args,
    shell:
        "tapebench ladder-split --features {input.features:q} --name {params.name:q} {params.args:q}"
        " --out {output:q} > {log:q} 2>&1"
