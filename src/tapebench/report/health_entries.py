"""Registry entry of the benchmark health table (docs/protocol.md#benchmark-health); builder in report/health.py."""
from __future__ import annotations

from tapebench import layout
from tapebench.report.registry import TABLE, Job, Option, Output


def _health_jobs(config):
    return [Job("health", "results/health/health.tex",
                {"reports": [layout.health(split)["report"] for split in config["splits"]]})]


ENTRIES: list[Output] = [
    Output("health", TABLE, "Benchmark health per split: leakage, reference solvability, headroom, trivially "
                            "solved rules, identifiability",
           "tapebench.report.health:render_health_cli", (
               Option("reports", "health reports (tapebench benchmark-health), one row each", many=True),),
           _health_jobs, category="Benchmark health"),
]
