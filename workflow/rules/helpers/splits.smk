# The rule set and split rules' helpers (splits.smk).
from tapebench.rule_family import config_family

RULE_SAMPLE = config["rule_set"].get("sample")  # a sampled rule set of a large family (or None)
FAMILY = config_family(config)


def rule_set_files(wildcards):
    """The sampled rule set the features are built from, if the config samples one."""
    return [layout.rule_set()] if RULE_SAMPLE is not None else []


def rule_set_flag(wildcards, input):
    return ["--rule-set", input.rule_set] if RULE_SAMPLE is not None else []


def lambda_bins_arg(sample):
    bins = sample["lambda_bins"]
    return str(bins) if isinstance(bins, int) else ",".join(repr(float(e)) for e in bins)
