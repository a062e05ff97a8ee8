# The severity ladder's helpers (ladder.smk). LADDER and LADDER_SPLIT are in common.smk: every stage reads the
# ladder split's seeds, methods and health gate.
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
