# The rule set and split rules' helpers (splits.smk).
from tapebench.pipeline.config import is_grid_config
from tapebench.rule_family import config_family

GRID = is_grid_config(config)  # the 2D grid family (docs/protocol.md#grid): features by `tapebench grid-features`
RULE_SAMPLE = config["rule_set"].get("sample")  # a sampled rule set of a large family (or None)
FAMILY = config_family(config)


def rule_set_files(wildcards):
    """The sampled rule set the features are built from, if the config samples one of a tape family."""
    return [layout.rule_set()] if RULE_SAMPLE is not None and not GRID else []


def grid_features_args():
    """`tapebench grid-features` arguments of the grid config's rules (rule_set.rules), its sample, or none (the
    enumerated von Neumann family)."""
    section = config["rule_set"]
    if "rules" in section:
        return ["--rules", ",".join(str(r) for r in section["rules"])]
    if RULE_SAMPLE is None:
        return []
    args = ["--sample", str(RULE_SAMPLE["n"]), "--lambda-bins", lambda_bins_arg(RULE_SAMPLE)]
    args += ["--seed", str(RULE_SAMPLE["seed"])]
    return args + ([] if RULE_SAMPLE.get("b0", True) else ["--no-b0"])


def rule_set_flag(wildcards, input):
    return ["--rule-set", input.rule_set] if RULE_SAMPLE is not None else []


def lambda_bins_arg(sample):
    bins = sample["lambda_bins"]
    return str(bins) if isinstance(bins, int) else ",".join(repr(float(e)) for e in bins)
