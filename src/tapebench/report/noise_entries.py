"""Registry entries of the noise study (docs/protocol.md#noise): the success-vs-epsilon table and figure.
Builders in report/noise.py."""
from __future__ import annotations

from tapebench import layout
from tapebench.report.registry import FIGURE, TABLE, Job, Option, Output
from tapebench.settings import noise_study


def _value(name, help, type=str, many=False, required=True) -> Option:
    return Option(name, help, file=False, type=type, many=many, required=required)


_OPTIONS = (Option("aggregate", "one aggregate table per noise level (`tapebench aggregate`), same order as --levels",
                   many=True),
            _value("levels", "the noise levels epsilon", float, many=True),
            _value("split", "split name"), _value("H", "evaluation horizon", int),
            _value("agents", "methods and their order (default: all, grouped by family)", many=True, required=False))


def _values(config) -> dict | None:
    study = noise_study(config)
    if not study["levels"]:
        return None
    split, H = study["split"], study["H"]
    return {"aggregate": [layout.noise_aggregate(split, x, H) for x in study["levels"]], "levels": study["levels"],
            "split": split, "H": H, "agents": study["methods"]}


def _table_jobs(config):
    values = _values(config)
    return [] if values is None else [Job("noise", "results/noise.tex", {**values, "parquet": "results/noise.parquet"})]


def _figure_jobs(config):
    values = _values(config)
    return [] if values is None else [Job("figure_noise", layout.figure("noise"), values)]


ENTRIES: list[Output] = [
    Output("noise", TABLE, "Strict success vs cell-update noise epsilon, ID / OOD, with bootstrap CIs",
           "tapebench.report.noise:render_noise_table",
           (*_OPTIONS, _value("parquet", "also write the summary table", required=False)), _table_jobs,
           category="Noise study", extra_outputs=lambda job: {"parquet": job.values["parquet"]}),
    Output("figure_noise", FIGURE, "Strict success vs cell-update noise epsilon per method, ID and OOD panels",
           "tapebench.report.noise:render_noise_figure", _OPTIONS, _figure_jobs, category="Noise study"),
]
