# The few-shot study's helpers (fewshot.smk).
from tapebench.pipeline.config import fewshot_slice
from tapebench.settings import fewshot_study

FEWSHOT = fewshot_study(config)
FEWSHOT_TRAINED = [m for m in FEWSHOT["methods"] if get_method(m).trains]
FEWSHOT_UNTRAINED = [m for m in FEWSHOT["methods"] if not get_method(m).trains]


def fewshot_params(wildcards):
    return dumps(fewshot_slice(config, wildcards.agent))


def fewshot_files(wildcards):
    return [
        layout.fewshot_records(FEWSHOT["split"], a, s)
        for a in FEWSHOT["methods"]
        for s in ([0] if get_method(a).deterministic else range(FEWSHOT["seeds"]))
    ]
