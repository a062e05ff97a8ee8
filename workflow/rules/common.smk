# Helpers shared by every stage: config validation, the config slices that become params, paths.
import json
import os
from pathlib import Path

from tapebench import layout
from tapebench.pipeline.config import (
    checkpoint_eval_slice,
    dumps,
    evaluation_job,
    training_job,
    worldtest_job,
    fixed_z_eval_slice,
    fixed_z_train_slice,
    ladder_split_slice,
    method_eval_slice,
    model_error_slice,
    noise_eval_slice,
    sweep_train_slice,
    train_slice,
    validate_config,
    worldtest_slice,
)
from tapebench.pipeline.reruns import check_every_job
from tapebench.registry import build_config, get_method
from tapebench.rule_family import config_family
from tapebench.settings import checkpoints_per_run, noise_study, worldtest_study

validate_config(
    config,
    workflow.source_path("../schemas/config.schema.yaml"),
    command_line=dict(workflow.config_settings.config),
)
check_every_job()  # jobs behind a training job's ancient() verdict are checked for reruns too (pipeline/reruns.py)


resource_scopes:
    gpu="local",


SEEDS = list(range(config["seeds"]))
METHODS = list(config["methods"])
LADDER = config["studies"]["ladder"]  # the severity ladder (studies.smk, docs/protocol.md#severity-ladders)
LADDER_SPLIT = LADDER["name"]
RUN_METHODS = list(dict.fromkeys([*METHODS, *LADDER["methods"]]))  # every method that runs on some split
TRAINED = [m for m in RUN_METHODS if get_method(m).trains]
UNTRAINED = [m for m in RUN_METHODS if not get_method(m).trains]
SPLIT_NAMES = list(config["splits"])
EVALUATED_UNTRAINED = UNTRAINED + ([] if "random" in UNTRAINED else ["random"])  # the health report's floor
HORIZONS = config["evaluation"]["horizons"]
MAIN_SPLIT = config["main_split"]
CONDA_ENV = "../../envs/tapebench.yaml"
PRESETS = [os.path.relpath(path) for path in workflow.overwrite_configfiles]  # --configfile, for the report


wildcard_constraints:
    split="[A-Za-z0-9][A-Za-z0-9_-]*",
    agent="[a-z][a-z0-9_]*",
    seed=r"\d+",
    H=r"\d+",


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


def for_report(path, **options):
    """`report(path, ...)` once the file exists, else the plain path: `snakemake --report` after a partial run (the
    quick start builds Table 3 only) reports the outputs that run built instead of stopping at the first missing one.
    The flag decides nothing else, so a later build marks the new outputs without rerunning anything."""
    return report(path, **options) if Path(path).exists() else path


def one_of(names):
    """A wildcard constraint matching exactly these method ids (none: matches nothing)."""
    return "|".join(names) if names else "(?!)"


def split_seeds(split):
    """Training seeds on a split: `seeds` on the main split, `studies.ladder.seeds` on the ladder,
    `studies.robustness.seeds` on the others."""
    if split == LADDER_SPLIT:
        return list(range(LADDER["seeds"]))
    return SEEDS if split == MAIN_SPLIT else list(range(config["studies"]["robustness"]["seeds"]))


def split_methods(split):
    """The methods run on a split: `studies.ladder.methods` on the ladder, `methods` on the others."""
    return list(LADDER["methods"]) if split == LADDER_SPLIT else METHODS


def split_horizons(split):
    """Evaluation horizons on a split: all of them on the main split, the training H on the others (Figure 5)."""
    return HORIZONS if split == MAIN_SPLIT else [config["env"]["H"]]


def seeds_of(method, split=None):
    """Evaluation seeds of a method on a split: one for deterministic methods (the exact optimum), else all."""
    if get_method(method).deterministic:
        return [0]
    return split_seeds(split) if split is not None else SEEDS


def run_dir(split, agent, seed):
    return layout.run_dir(split, agent, seed)


SEEDS_PER_JOB = config["training"]["seeds_per_job"]


def seed_block(split, seed):
    """(first, last): the seed block that trains `seed` on `split` (training.seeds_per_job)."""
    return layout.block_of(seed, len(split_seeds(split)), SEEDS_PER_JOB)


def trained_run(wildcards):
    """What a job that reads a trained run needs: its train.json, or its seed block's record (seeds_per_job > 1)."""
    if SEEDS_PER_JOB == 1:
        return layout.manifest(run_dir(wildcards.split, wildcards.agent, wildcards.seed))
    return layout.seed_block(wildcards.split, wildcards.agent, *seed_block(wildcards.split, wildcards.seed))


# What a job declares to the scheduler (`resources: mem_mb, runtime`), estimated from its config slice
# (tapebench.pipeline.resources); validate_config has refused any config whose job would exceed resources.max_mem_mb
def _job_of(wildcards):
    """A training or evaluation job's method, L, H (wildcards where the rule has them) and hyperparameter overrides
    (a sweep point's value)."""
    w = dict(wildcards.items())
    overrides = {w["field"]: int(w["value"])} if "value" in w else None
    return w.get("agent", w.get("method")), w.get("L"), w.get("H"), overrides


def _schedule_of(wildcards):
    """(total_steps, eval_every) of the run a job trains or evaluates: the fixed-z study's at its own L, H."""
    part = config["studies"]["fixed_z"] if "L" in dict(wildcards.items()) else config["training"]
    return part["total_steps"], part["eval_every"]


def _training(wildcards):
    """A training job's estimate: one seed, or the seeds of its block (`train_block`: first..last)."""
    method, L, H, overrides = _job_of(wildcards)
    w = dict(wildcards.items())
    seeds = int(w["last"]) - int(w["first"]) + 1 if "first" in w else 1
    return training_job(
        config, method, L=L, H=H, overrides=overrides, total_steps=_schedule_of(wildcards)[0], seeds=seeds
    )


def _evaluation(wildcards):
    method, L, H, overrides = _job_of(wildcards)
    checkpoints = 1
    if get_method(method).trains:
        checkpoints = checkpoints_per_run(*_schedule_of(wildcards))
        if not get_method(method).every_checkpoint or "eps" in dict(wildcards.items()):  # noise: the last K
            checkpoints = min(checkpoints, config["evaluation"]["last_k"])
    split = dict(wildcards.items()).get("split", MAIN_SPLIT)
    return evaluation_job(config, method, split, L=L, H=H, overrides=overrides, checkpoints=checkpoints)


def train_mem_mb(wildcards):
    return _training(wildcards)[0].mb


def train_runtime(wildcards):
    return _training(wildcards)[1]


def eval_mem_mb(wildcards):
    return _evaluation(wildcards)[0].mb


def eval_runtime(wildcards):
    return _evaluation(wildcards)[1]


def worldtest_mem_mb(wildcards):
    """The world test's problems, and the method's agent or policy beside them."""
    return max(worldtest_job(config).mb, _evaluation(wildcards)[0].mb)


def split_params(wildcards):
    return dumps(config["splits"][wildcards.split])


def train_params(wildcards):
    return dumps(train_slice(config, wildcards.agent))


def eval_params(wildcards):
    return dumps(checkpoint_eval_slice(config, wildcards.agent))


def method_eval_params(wildcards):
    return dumps(method_eval_slice(config, wildcards.agent))


def episode_files(wildcards):
    return [
        layout.evaluation(run_dir(wildcards.split, wildcards.agent, s), wildcards.H)
        for s in seeds_of(wildcards.agent, wildcards.split)
    ]


def random_per_rule_files(wildcards):
    """The random policy's per-rule values at the training horizon, if it runs (Table 3's floor)."""
    if "random" not in METHODS:
        return []
    return [layout.per_rule(MAIN_SPLIT, "random", config["env"]["H"])]


def random_per_rule_flag(wildcards, input):
    files = [input.random_per_rule] if isinstance(input.random_per_rule, str) else list(input.random_per_rule)
    return ["--random-per-rule", *files] if files else []


def per_seed_files(wildcards):
    return [
        layout.per_seed(wildcards.split, a, h)
        for a in split_methods(wildcards.split)
        for h in split_horizons(wildcards.split)
    ]


# The benchmark health report (health.smk, docs/protocol.md#benchmark-health)
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


FIXED_Z = config["studies"]["fixed_z"]
FIXED_Z_RULES = ",".join(str(z) for z in FIXED_Z["rules"])  # the representative rules (paper App. B)
FEAS = config["oracle"].get("feasibility", {"L": 16, "H": 16})
LH = {"L": "{L}", "H": "{H}"}  # the wildcards of the oracle's L, H patterns (layout.feasibility, layout.fixed_z)


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


def planner_args(wildcards=None):
    o = config["oracle"]
    return ["--horizon", str(o["horizon"]), "--candidates", str(o["candidates"]), "--seed", str(o["seed"])]


# World-model diagnostics (diagnostics.smk)
WORLD_MODELS = [m for m in METHODS if get_method(m).trains and get_method(m).world_model]
SWEEP = config["diagnostics"]["sweep"]
SWEEP_VALUES = [int(v) for v in SWEEP["values"]]
SWEEP_SEEDS = list(range(SWEEP["seeds"]))


def model_error_params(wildcards):
    return dumps(model_error_slice(config))


def sweep_run_dir(split, value, seed):
    """A sweep point reuses the main run when it is the configured value of a method the pipeline runs."""
    method, field = SWEEP["method"], SWEEP["hyperparameter"]
    configured = getattr(build_config(method, config["agents"].get(method, {})), field)
    if method in METHODS and int(value) == int(configured) and int(seed) < config["seeds"]:
        return run_dir(split, method, seed)
    return layout.sweep_run_dir(split, method, field, value, seed)


def sweep_files(wildcards, file_of):
    """`file_of(run folder)` of every seed of a sweep point (layout.evaluation, layout.model_error)."""
    return [file_of(sweep_run_dir(wildcards.split, wildcards.value, s)) for s in SWEEP_SEEDS]


# The fixed-z study (studies.smk, docs/protocol.md#fixed-z): runs at the study's own L, H
FIXED_Z_SEEDS = list(range(FIXED_Z["seeds"]))
FIXED_Z_METHODS = sorted({m for t in ("table5", "table6") for m in FIXED_Z[t]["methods"]})
MULTI_RULE_METHODS = list(FIXED_Z["table6"]["multi_rule"])


def fixed_z_train_params(wildcards):
    return dumps(fixed_z_train_slice(config, wildcards.agent, wildcards.L, wildcards.H))


def fixed_z_eval_params(wildcards):
    return dumps(fixed_z_eval_slice(config, wildcards.agent, wildcards.L, wildcards.H))


def fixed_z_episode_files(wildcards):
    return [
        layout.evaluation(layout.fixed_z_run_dir(wildcards.L, wildcards.H, wildcards.agent, wildcards.rule, s))
        for s in FIXED_Z_SEEDS
    ]


def multi_rule_episode_files(wildcards):
    return [
        layout.evaluation(layout.multi_rule_run_dir(wildcards.L, wildcards.H, wildcards.split, wildcards.agent, s))
        for s in FIXED_Z_SEEDS
    ]


def multi_rule_per_seed_files(wildcards):
    return [layout.multi_rule_per_seed(wildcards.L, wildcards.H, wildcards.split, a) for a in MULTI_RULE_METHODS]


# The noise study (noise.smk, docs/protocol.md#noise): the main split's runs at each noise level
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


# The protocol comparison (protocols.smk, docs/protocol.md#protocol-comparison): the protocols come from the
# config in one function; each names the per-seed files it reads
from tapebench.stats.protocols import protocol_files, protocols as comparison_protocols

PROTOCOLS = comparison_protocols(config)


def protocol_comparison_params(wildcards=None):
    return dumps([p.to_dict() for p in PROTOCOLS])


def protocol_comparison_inputs(wildcards=None):
    return protocol_files(PROTOCOLS)


# --- the world test (docs/protocol.md#world-test) ---
WORLDTEST = worldtest_study(config)
WORLDTEST_TRAINED = [m for m in WORLDTEST["methods"] if get_method(m).trains]
WORLDTEST_UNTRAINED = [m for m in WORLDTEST["methods"] if not get_method(m).trains]


def worldtest_params(wildcards):
    return dumps(worldtest_slice(config, wildcards.agent))


def worldtest_files(wildcards):
    return [
        layout.worldtest_records(WORLDTEST["split"], a, s, b)
        for a in WORLDTEST["methods"]
        for s in range(WORLDTEST["seeds"])
        for b in WORLDTEST["budgets"]
    ]
