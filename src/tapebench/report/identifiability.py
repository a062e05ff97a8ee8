"""The identifiability table (docs/protocol.md#identifiability): per rule type, steps until the rule
tables consistent with the observed transitions are a single rule."""
from __future__ import annotations

from pathlib import Path

from tapebench.health.identifiability import one_step_probability, summary_rows
from tapebench.report.render import render_table
from tapebench.schemas import IDENTIFIABILITY_COLUMNS
from tapebench.utils.artifacts import read_table

TYPE_LABELS = {"stable": "Stable", "periodic": "Periodic", "chaotic": "Chaotic", "": "(untyped)", "all": "All"}


def render_identifiability(out, *, identifiability) -> str:
    """The per-type LaTeX table of an identifiability Parquet (template identifiability.tex.j2)."""
    path = Path(identifiability)
    if not path.is_file():
        raise FileNotFoundError(f"identifiability table not found: {path} (written by `tapebench identifiability`)")
    frame, meta = read_table(path, "identifiability")
    missing = [c for c in IDENTIFIABILITY_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{path} is not an identifiability table: missing columns {missing}")
    if frame.empty:
        raise ValueError(f"{path} holds no episodes")
    rows = [{**r, "label": TYPE_LABELS.get(r["type"], r["type"])} for r in summary_rows(frame)]
    config = meta.get("config", {})
    return render_table("identifiability.tex.j2", out, rows=rows, split=str(frame["split"].iloc[0]),
                        L=int(frame["L"].iloc[0]), H=int(frame["H"].iloc[0]),
                        episodes_per_rule=config.get("episodes_per_rule"),
                        p_one=one_step_probability(int(frame["L"].iloc[0])))
