# The budget study's helpers (budget.smk): a run per method, budget and seed; the main budget reuses the main runs.
from tapebench.pipeline.config import budget_train_slice, last_checkpoints_eval_slice
from tapebench.settings import budget_point_runs, budget_study

BUDGET = budget_study(config)


def budget_train_params(wildcards):
    return dumps(budget_train_slice(config, wildcards.method, wildcards.steps))


def budget_eval_params(wildcards):
    return dumps(last_checkpoints_eval_slice(config, wildcards.method))


def budget_episode_files(wildcards):
    """The evaluation records of every seed of a budget point, at the study's horizon."""
    return [layout.evaluation(run, BUDGET["H"]) for run in budget_point_runs(config, wildcards.method, wildcards.steps)]
