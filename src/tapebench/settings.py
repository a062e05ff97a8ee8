"""Settings several layers derive from the config, defined once: the training schedule's checkpoint count,
the device a training job uses, and the studies' resolved settings (docs/protocol.md#schedule, #gpu, #noise,
#world-test, #few-shot, #budget-study)."""
from __future__ import annotations

import math

from tapebench import layout

MAX_CHECKPOINTS_PER_RUN = 1000


def checkpoints_per_run(total_steps: int, eval_every: int) -> int:
    """Checkpoints of a run: one every eval_every environment steps and one at the end."""
    return math.ceil(total_steps / eval_every)


def training_device(device: str, stacked: bool) -> str:
    """The device setting a training job runs with: "auto" stays "auto" (CUDA where available) for a stacked seed
    block and is "cpu" for seeds trained one at a time, whose stream of small kernels is slower on a GPU than on one
    CPU core (docs/protocol.md#gpu); any other setting as given. The pipeline requests GPUs by the same answer."""
    return "cpu" if str(device) == "auto" and not stacked else device


def sweep_runs(config: dict) -> bool:
    """Whether the hyperparameter sweep (diagnostics.sweep) is in the DAG: its method is one the config runs."""
    return config["diagnostics"]["sweep"]["method"] in config["methods"]


def noise_study(config: dict) -> dict:
    """The noise study's resolved settings: levels (sorted), methods (default: all of `methods`), horizon H
    (default: env.H), split (the main split)."""
    study = config["studies"]["noise"]
    return {"levels": sorted(float(x) for x in study["levels"]),
            "methods": list(study["methods"]) or list(config["methods"]),
            "H": int(study["horizon"] or config["env"]["H"]), "split": config["main_split"]}


def worldtest_study(config: dict) -> dict:
    """The world test's resolved settings: methods ([] = off), seeds, budgets (sorted), split (the main split) and
    the task section every job gets (`worldtest`: everything but methods, seeds and budgets)."""
    study = config["studies"]["worldtest"]
    tasks = {k: v for k, v in study.items() if k not in ("methods", "seeds", "budgets")}
    return {"methods": list(study["methods"]), "seeds": int(study["seeds"]),
            "budgets": sorted(int(b) for b in study["budgets"]), "split": config["main_split"], "worldtest": tasks}


def fewshot_study(config: dict) -> dict:
    """The few-shot study's resolved settings (docs/protocol.md#few-shot): methods ([] = off), seeds, the main split,
    and the task section every job gets (`fewshot`: shots sorted, rules_per_side; `adapt` stays per method)."""
    study = config["studies"]["fewshot"]
    return {"methods": list(study["methods"]), "seeds": int(study["seeds"]), "split": config["main_split"],
            "fewshot": {"shots": sorted(int(k) for k in study["shots"]), "rules_per_side": study["rules_per_side"]},
            "adapt": {m: dict(v or {}) for m, v in (study.get("adapt") or {}).items()}}


def budget_study(config: dict) -> dict:
    """The budget study's resolved settings (docs/protocol.md#budget-study): methods ([] = off), budgets (sorted),
    seeds, the main split and the horizon env.H it is evaluated at."""
    study = config["studies"]["budget"]
    return {"methods": list(study["methods"]), "budgets": sorted(int(b) for b in study["budgets"]),
            "seeds": int(study["seeds"]), "split": config["main_split"], "H": int(config["env"]["H"])}


def budget_schedule(config: dict, steps: int) -> tuple[int, int]:
    """(total_steps, eval_every) of a budget run: the main schedule's number of checkpoints spread over its `steps`,
    so its last K checkpoints cover the same share of training; the main budget keeps the main schedule; budget 0 is
    the untrained network, its initialisation the one checkpoint."""
    training = config["training"]
    if int(steps) == 0:
        return 0, 1
    if int(steps) == int(training["total_steps"]):
        return int(training["total_steps"]), int(training["eval_every"])
    return int(steps), math.ceil(int(steps) / checkpoints_per_run(training["total_steps"], training["eval_every"]))


def budget_reuses_main_run(config: dict, method: str, steps: int, seed: int) -> bool:
    """Whether a budget point's run is the main study's: the same method, budget and seed, run by this config."""
    return (method in config["methods"] and int(steps) == int(config["training"]["total_steps"])
            and int(seed) < int(config["seeds"]))


def budget_point_runs(config: dict, method: str, steps: int) -> list[str]:
    """The run folders of one budget point, one per seed of the study: the main study's run where it is that run
    (`budget_reuses_main_run`), else the budget study's own."""
    study = budget_study(config)
    return [layout.budget_run(study["split"], method, steps, seed,
                              reuses_main_run=budget_reuses_main_run(config, method, steps, seed))
            for seed in range(study["seeds"])]
