# World-model diagnostics' helpers (diagnostics.smk): the model-error jobs and the hyperparameter sweep.
from tapebench.pipeline.config import model_error_slice, sweep_train_slice
from tapebench.registry import build_config

WORLD_MODELS = [m for m in METHODS if get_method(m).trains and get_method(m).world_model]
SWEEP = config["diagnostics"]["sweep"]
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
