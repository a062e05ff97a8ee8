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


def per_seed(split: str, agent: str, H) -> str:
    return f"results/aggregate/{split}/{agent}_H{H}.per_seed.parquet"


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


# --- the fixed-z study (Tables 5-6): runs and tables under results/fixed_z/L{L}_H{H}/ ------------------------
def fixed_z_dir(L, H) -> str:
    return f"results/fixed_z/L{L}_H{H}"


def fixed_z_run_dir(L, H, agent: str, rule, seed) -> str:
    """A run trained on one rule (no rule randomisation)."""
    return f"{fixed_z_dir(L, H)}/{agent}/rule{rule}/seed{seed}"


def fixed_z_per_rule(L, H, agent: str, rule) -> str:
    return f"{fixed_z_dir(L, H)}/{agent}/rule{rule}.per_rule.parquet"


def multi_rule_run_dir(L, H, split: str, agent: str, seed) -> str:
    """A run trained with z ~ Unif(training rules of `split`) at the study's L, H."""
    return f"{fixed_z_dir(L, H)}/multi_{split}/{agent}/seed{seed}"


def multi_rule_aggregate(L, H, split: str) -> str:
    return f"{fixed_z_dir(L, H)}/multi_{split}/aggregate.parquet"


def multi_rule_oracle(L, H, split: str, oracle: str, side: str) -> str:
    """MPC (`mpc`) or exact-optimum (`exact`) records on one side of `split` at the study's L, H."""
    return f"{fixed_z_dir(L, H)}/multi_{split}/{oracle}_{side}.parquet"


# --- protocol comparison (docs/protocol.md#protocol-comparison) ---------------------------------------------
PROTOCOL_COMPARISON = {"comparison": "results/protocols/comparison.parquet",
                       "ranks": "results/protocols/ranks.parquet",
                       "reversals": "results/protocols/reversals.parquet"}


def rule_features() -> str:
    return "results/rules/features.parquet"


def rule_safe(name: str) -> str:
    """A name usable inside a Snakemake rule name."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)
