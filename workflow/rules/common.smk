# Helpers shared by every stage: config validation, the config slices that become params, paths.
import json

from tapebench.pipeline.config import dumps, eval_slice, train_slice, validate_config

validate_config(config, workflow.source_path("../schemas/config.schema.yaml"))

resource_scopes:
    gpu="local",


SEEDS = list(range(config["seeds"]))
AGENTS = sorted(config["agents"])
HORIZONS = config["evaluation"]["horizons"]
MAIN_SPLIT = config["main_split"]
CONDA_ENV = "../../envs/tapebench.yaml"


wildcard_constraints:
    split="[A-Za-z0-9][A-Za-z0-9_-]*",
    agent="[a-z][a-z0-9_]*",
    seed=r"\d+",
    H=r"\d+",


def run_dir(split, agent, seed):
    return f"results/runs/{split}/{agent}/seed{seed}"


def split_params(wildcards):
    return dumps(config["splits"][wildcards.split])


def train_params(wildcards):
    return dumps(train_slice(config, wildcards.agent))


def eval_params(wildcards):
    return dumps(eval_slice(config))


def episode_files(wildcards):
    return [f"{run_dir(wildcards.split, wildcards.agent, s)}/eval_H{wildcards.H}.parquet" for s in SEEDS]


def per_seed_files(wildcards):
    return [f"results/aggregate/{wildcards.split}/{a}_H{h}.per_seed.parquet" for a in AGENTS for h in HORIZONS]


FIXED_Z_RULES = "0,4,108,204,30,110"  # the paper's representative rules (App. B)
FEAS = config["oracle"].get("feasibility", {"L": 16, "H": 16})


def planner_args(wildcards=None):
    o = config["oracle"]
    return ["--horizon", str(o["horizon"]), "--candidates", str(o["candidates"]), "--seed", str(o["seed"])]
