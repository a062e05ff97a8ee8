# What many stages share: config validation, the config's method, seed, split and horizon lists, run folders and
# seed blocks, the resources of training and evaluation jobs, the params and inputs of the per-split train /
# evaluate / aggregate jobs. A helper that one stage or one study uses lives in that stage's or study's .smk.
from pathlib import Path

import re

from tapebench.layout import ResultsFolder
from tapebench import jobserver
from tapebench import reference_sets
from tapebench.pipeline.config import (
    check_targets,
    checkpoint_eval_slice,
    foreign_target_regex,
    dumps,
    evaluation_job,
    method_eval_slice,
    train_slice,
    training_gpus,
    stated_config,
    training_job,
    validate_config,
)
from tapebench.pipeline.reruns import check_every_job
from tapebench.registry import get_method
from tapebench.settings import budget_schedule, checkpoints_per_run

validate_config(
    config,
    workflow.source_path("../schemas/config.schema.yaml"),
    command_line=dict(workflow.config_settings.config),
    note=logger.info,  # a study's methods this config does not run: left out, named once per run
    # every --configfile read as the CLI reads it (a key given twice is refused), and what it states checked
    stated=stated_config(workflow.config_settings.configfiles, dict(workflow.config_settings.config)),
)
check_every_job()  # jobs behind a training job's ancient() verdict are checked for reruns too (pipeline/reruns.py)

layout = ResultsFolder(config["results_dir"])  # tapebench.layout with every path in this config's results folder
LOGS = layout.logs  # the job logs: logs/ for results/, logs/<name> for results/<name>


def refuse_foreign_target(wildcards):
    """What foreign_target (integrity.smk) reads: nothing; it raises, naming the target to ask for instead."""
    check_targets([f"{layout.RESULTS_DIR}/{wildcards.foreign}"], layout.folder)
    return []


resource_scopes:
    gpu="local",


SEEDS = list(range(config["seeds"]))
METHODS = list(config["methods"])  # what runs: with a reference_set, the methods the set lacks
REFERENCE_SET = config["reference_set"]  # docs/protocol.md#reference-sets
HELD = reference_sets.reference_methods(config)  # their main-split tables come from the set's records
SHOWN = reference_sets.shown_methods(config)  # the rows of the main split's tables and figures
LADDER = config["studies"]["ladder"]  # the severity ladder (ladder.smk, docs/protocol.md#severity-ladders)
LADDER_SPLIT = LADDER["name"]
RUN_METHODS = list(dict.fromkeys([*METHODS, *LADDER["methods"]]))  # every method that runs on some split
TRAINED = [m for m in RUN_METHODS if get_method(m).trains]
UNTRAINED = [m for m in RUN_METHODS if not get_method(m).trains]
SPLIT_NAMES = list(config["splits"])
EVALUATED_UNTRAINED = UNTRAINED + ([] if "random" in UNTRAINED else ["random"])  # the health report's floor
HORIZONS = config["evaluation"]["horizons"]
MAIN_SPLIT = config["main_split"]
CONDA_ENV = "../../envs/tapebench.yaml"


wildcard_constraints:
    split="[A-Za-z0-9][A-Za-z0-9_-]*",
    agent="[a-z][a-z0-9_]*",
    seed=r"\d+",
    H=r"\d+",


JOB_SERVERS = []  # the job server of this run, once started (docs/compute.md#job-server)


def start_job_server():
    """A local run's jobs fork from one process that did their imports, where that cannot change a job's environment:
    no software deployment method, Linux (jobserver.why_off); other runs' jobs, and a run with fewer than
    jobserver.MIN_JOBS jobs to run, start their own."""
    run = jobserver.snakemake_run(workflow)
    off = jobserver.why_off(config["execution"]["job_server"], **run)
    if off is None:
        JOB_SERVERS.append(jobserver.start(log=logger.info))
    elif jobserver.why_off(config["execution"]["job_server"], **{**run, "deployment": []}, platform="linux") is None:
        logger.info(f"tapebench job server off: {off}")  # a run that would have one otherwise says why not


def stop_job_server():
    while JOB_SERVERS:
        jobserver.stop(JOB_SERVERS.pop())


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


# Evaluation jobs per seed, or per seed block (evaluate.smk, noise.smk; docs/protocol.md#seed-blocks)
PER_SEED = ["{seed}"]  # the seeds of a job with one seed per job: the {seed} wildcard


def evaluation_blocks(splits):
    """[(seeds, split constraint)]: the {seed} wildcard (seeds_per_job = 1), or each block of consecutive seeds with
    the splits whose seeds it covers."""
    if SEEDS_PER_JOB == 1:
        return [(PER_SEED, None)]
    blocks = {}
    for split in dict.fromkeys(splits):
        count = len(split_seeds(split))
        for seed in range(count):
            blocks.setdefault(layout.block_of(seed, count, SEEDS_PER_JOB), {})[split] = None
    return [([str(s) for s in range(first, last + 1)], list(on)) for (first, last), on in sorted(blocks.items())]


def block_name(rule, seeds):
    return rule if seeds == PER_SEED else layout.block_rule(rule, seeds[0], seeds[-1])


def block_log(folder, seeds):
    """A job's log: per seed, or per block (seeds{first}-{last})."""
    if seeds == PER_SEED:
        return f"{LOGS}/{folder}/seed{{seed}}_H{{H}}.log"
    return f"{LOGS}/{folder}/seeds{seeds[0]}-{seeds[-1]}_H{{H}}.log"


def block_seed_args(seeds, flag="--seed", run_of=None):
    """The arguments naming a job's seeds: `--seed N` or `--run FOLDER` for one seed; for a block, `--seeds a-b`, with
    `--run PATTERN` (the folder with {seed}) for trained runs (`tapebench evaluate --seeds`)."""
    if seeds == PER_SEED:
        return lambda w: [flag, w.seed if run_of is None else run_of(w, w.seed)]
    block = ["--seeds", f"{seeds[0]}-{seeds[-1]}"]
    return lambda w: block if run_of is None else [flag, run_of(w, "{seed}"), *block]


def block_out(file_of, seeds):
    """--out: the seed's file, or the block's pattern with {seed}."""
    return lambda w: file_of(w, w.seed if seeds == PER_SEED else "{seed}")


def block_trained_runs(seeds):
    """What a block's evaluation reads: its run's train.json, or its training block's record."""
    if seeds == PER_SEED:
        return trained_run
    return lambda w: layout.seed_block(w.split, w.agent, seeds[0], seeds[-1])


def block_constraints(agents, splits):
    return {"agent": one_of(agents)} | ({} if splits is None else {"split": one_of(splits)})


def block_runtime(runtime, seeds):
    return lambda w: runtime(w) * len(seeds)


def evaluation_file(w, seed):
    return layout.evaluation(run_dir(w.split, w.agent, seed), w.H)


EVALUATED_SPLITS = [*SPLIT_NAMES, LADDER_SPLIT]
UNTRAINED_SEEDED = [m for m in EVALUATED_UNTRAINED if not get_method(m).deterministic]
UNTRAINED_ONE_SEED = [m for m in EVALUATED_UNTRAINED if get_method(m).deterministic]
# a deterministic method (the exact optimum) runs one seed: one job per seed whatever seeds_per_job says
METHOD_BLOCKS = [(s, on, UNTRAINED_SEEDED) for s, on in evaluation_blocks(EVALUATED_SPLITS)]
if SEEDS_PER_JOB == 1:
    METHOD_BLOCKS = [(PER_SEED, None, EVALUATED_UNTRAINED)]
elif UNTRAINED_ONE_SEED:
    METHOD_BLOCKS.append((PER_SEED, None, UNTRAINED_ONE_SEED))


# What a job declares to the scheduler (`resources: mem_mb, runtime`), estimated from its config slice
# (tapebench.pipeline.resources); validate_config has refused any config whose job would exceed resources.max_mem_mb
def _job_of(wildcards):
    """A training or evaluation job's method, L, H (wildcards where the rule has them) and hyperparameter overrides
    (a sweep point's value)."""
    w = dict(wildcards.items())
    overrides = {w["field"]: int(w["value"])} if "value" in w else None
    return w.get("agent", w.get("method")), w.get("L"), w.get("H"), overrides


def _schedule_of(wildcards):
    """(total_steps, eval_every) of the run a job trains or evaluates: the fixed-z study's at its own L, H; a budget
    run's over its own steps."""
    w = dict(wildcards.items())
    if "steps" in w:
        return budget_schedule(config, w["steps"])
    part = config["studies"]["fixed_z"] if "L" in w else config["training"]
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
        if not get_method(method).every_checkpoint or {"eps", "steps"} & set(dict(wildcards.items())):  # the last K
            checkpoints = min(checkpoints, config["evaluation"]["last_k"])
    split = dict(wildcards.items()).get("split", MAIN_SPLIT)
    return evaluation_job(config, method, split, L=L, H=H, overrides=overrides, checkpoints=checkpoints)


def _seeds_of_job(wildcards) -> int:
    """Seeds a training job trains: a seed block's, else one."""
    w = dict(wildcards.items())
    return int(w["last"]) - int(w["first"]) + 1 if "first" in w else 1


def train_gpus(wildcards):
    """GPUs a training job requests: training.gpus where it trains on CUDA (under device auto: stacked blocks)."""
    return training_gpus(config, _job_of(wildcards)[0], _seeds_of_job(wildcards))


def train_mem_mb(wildcards):
    return _training(wildcards)[0].mb


def train_runtime(wildcards):
    return _training(wildcards)[1]


def eval_mem_mb(wildcards):
    return _evaluation(wildcards)[0].mb


def eval_runtime(wildcards):
    return _evaluation(wildcards)[1]


def train_params(wildcards):
    return dumps(train_slice(config, wildcards.agent, _seeds_of_job(wildcards)))


def eval_params(wildcards):
    return dumps(checkpoint_eval_slice(config, wildcards.agent))


def method_eval_params(wildcards):
    return dumps(method_eval_slice(config, wildcards.agent))


def episode_files(wildcards):
    return [
        layout.evaluation(run_dir(wildcards.split, wildcards.agent, s), wildcards.H)
        for s in seeds_of(wildcards.agent, wildcards.split)
    ]


def per_seed_files(wildcards):
    shown = SHOWN if wildcards.split == MAIN_SPLIT else split_methods(wildcards.split)
    return [layout.per_seed(wildcards.split, a, h) for a in shown for h in split_horizons(wildcards.split)]
