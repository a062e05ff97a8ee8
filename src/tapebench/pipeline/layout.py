"""Where the pipeline writes its artifacts: the paths that more than one stage (or the report registry)
needs to name. The Snakemake rules write to these patterns (docs/protocol.md#outputs)."""
from __future__ import annotations

import re


REPORT_TEX = "results/report.tex"
REPORT_PDF = "results/report.pdf"


def split_file(split: str) -> str:
    return f"results/splits/{split}.json"


def run_dir(split: str, agent: str, seed) -> str:
    return f"results/runs/{split}/{agent}/seed{seed}"


def aggregate(split: str) -> str:
    return f"results/aggregate/{split}/aggregate.parquet"


def per_rule(split: str, agent: str, H) -> str:
    return f"results/aggregate/{split}/{agent}_H{H}.per_rule.parquet"


def curves(split: str, agent: str, H) -> str:
    return f"results/aggregate/{split}/{agent}_H{H}.curves.parquet"


def figure(name: str) -> str:
    """A figure's path stem: the render job writes <stem>.pdf and <stem>.png."""
    return f"results/figures/{name}"


def mpc_records(split: str, side: str, H) -> str:
    return f"results/oracle/{split}/mpc_{side}_H{H}.parquet"


def fixed_z(feasibility: dict, oracle: str) -> str:
    return f"results/oracle/fixed_z_L{feasibility['L']}_H{feasibility['H']}/{oracle}.parquet"


def feasibility(feasibility: dict) -> str:
    return f"results/oracle/feasibility_L{feasibility['L']}_H{feasibility['H']}.parquet"


def mpc_by_type(split: str) -> str:
    return f"results/oracle/{split}/mpc_by_type_eval.json"


def identifiability(split: str) -> str:
    return f"results/identifiability/{split}.parquet"


def model_error_aggregate(split: str) -> str:
    return f"results/aggregate/{split}/model_error.parquet"


def sweep_point(split: str, method: str, field: str, value) -> dict:
    stem = f"results/sweeps/{split}/{method}_{field}{value}"
    return {"per_seed": f"{stem}.per_seed.parquet", "model_error": f"{stem}.model_error.parquet"}


def rule_safe(name: str) -> str:
    """A name usable inside a Snakemake rule name."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)
