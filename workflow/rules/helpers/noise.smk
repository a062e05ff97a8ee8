# The noise study's helpers (noise.smk): the main split's runs at each noise level.
from tapebench.pipeline.config import noise_eval_slice
from tapebench.settings import noise_study

NOISE = noise_study(config)
NOISE_TRAINED = [m for m in NOISE["methods"] if get_method(m).trains]
NOISE_UNTRAINED = [m for m in NOISE["methods"] if not get_method(m).trains]


def noise_eval_params(wildcards):
    return dumps(noise_eval_slice(config, wildcards.agent, wildcards.eps))


def noise_episode_files(wildcards):
    return [
        layout.noise_eval(wildcards.split, wildcards.eps, wildcards.agent, s, wildcards.H)
        for s in seeds_of(wildcards.agent, wildcards.split)
    ]


def noise_per_seed_files(wildcards):
    return [layout.noise_per_seed(wildcards.split, wildcards.eps, a, wildcards.H) for a in NOISE["methods"]]


# the untrained methods' evaluation jobs: per seed or per seed block (common.smk, METHOD_BLOCKS)
NOISE_METHOD_BLOCKS = [(s, on, [m for m in NOISE_UNTRAINED if m in agents]) for s, on, agents in METHOD_BLOCKS]
