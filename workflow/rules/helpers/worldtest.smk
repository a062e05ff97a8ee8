# The world test's helpers (worldtest.smk).
from tapebench.pipeline.config import worldtest_job, worldtest_slice
from tapebench.settings import worldtest_study

WORLDTEST = worldtest_study(config)
WORLDTEST_TRAINED = [m for m in WORLDTEST["methods"] if get_method(m).trains]
WORLDTEST_UNTRAINED = [m for m in WORLDTEST["methods"] if not get_method(m).trains]


def worldtest_mem_mb(wildcards):
    """The world test's problems, and the method's agent or policy beside them."""
    return max(worldtest_job(config).mb, _evaluation(wildcards)[0].mb)


def worldtest_params(wildcards):
    return dumps(worldtest_slice(config, wildcards.agent))


def worldtest_files(wildcards):
    return [
        layout.worldtest_records(WORLDTEST["split"], a, s, b)
        for a in WORLDTEST["methods"]
        for s in range(WORLDTEST["seeds"])
        for b in WORLDTEST["budgets"]
    ]
