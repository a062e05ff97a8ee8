# The benchmark health report's helpers (health.smk); health_verdict is the input of the training jobs (train.smk).
from tapebench.rule_family import config_family


def health_reference(wildcards):
    """The reference records on the split's test side: the exact optimum at L <= 20, else true-dynamics MPC."""
    from tapebench.health.checks import reference_oracle

    H = config["env"]["H"]
    if reference_oracle(config["env"]["L"], config_family(config)) == "exact":
        return layout.exact_records(wildcards.split, "test", H)
    return layout.mpc_records(wildcards.split, "test", H)


def health_identifiability(wildcards):
    """The identifiability records of an elementary split; none for another rule family (the check is n/a)."""
    return [layout.identifiability(wildcards.split)] if config_family(config).elementary else []


def health_verdict(wildcards):
    """The health gate's verdict a training job waits for: the configured splits; the severity ladder is a study
    design (a deliberately small training set) and has its own split gate (distances, mirror safety) only."""
    if wildcards.split == LADDER_SPLIT:
        return []
    return ancient(layout.health(wildcards.split)["verdict"])


def health_random(wildcards):
    """The random policy's evaluation records on the split at the training horizon, every seed it runs."""
    return [
        layout.evaluation(run_dir(wildcards.split, "random", s), config["env"]["H"])
        for s in seeds_of("random", wildcards.split)
    ]


def health_rule_agnostic(wildcards):
    """The other rule-agnostic rows' evaluation records on the split at the training horizon, every seed: with
    the random policy, the candidates of the health report's rule-agnostic floor."""
    return [
        layout.evaluation(run_dir(wildcards.split, m, s), config["env"]["H"])
        for m in split_methods(wildcards.split)
        if m != "random" and get_method(m).rule_agnostic and not get_method(m).trains
        for s in seeds_of(m, wildcards.split)
    ]
