"""The compute table (docs/protocol.md#compute): what each method's training runs and evaluations cost in this
config, from the runs' train.json and the evaluations' Parquet metadata; written as LaTeX and Parquet."""
from __future__ import annotations

import math

from tapebench import layout
from tapebench.report.render import render_table
from tapebench.report.tables import display_name
from tapebench.stats.compute import compute_table
from tapebench.utils.artifacts import read_json
from tapebench.utils.io import provenance, read_parquet_meta, write_parquet


def run_record(manifest: dict) -> dict:
    """A training run's cost from its train.json (runs written before CPU time was recorded have none)."""
    return {"agent": manifest["agent"], "env_steps": manifest["training"]["env_steps"],
            "wall_time_s": manifest["wall_time_s"], "cpu_time_s": manifest.get("cpu_time_s"),
            "device_name": manifest.get("device_name", manifest.get("device"))}


def evaluation_record(meta: dict) -> dict:
    """An evaluation job's cost from its Parquet metadata (a trained run's or a method's own evaluation)."""
    evaluation = meta.get("evaluation", {})
    who = evaluation.get("run") or evaluation.get("method") or {}
    return {"agent": who.get("agent", who.get("id")), "seconds": evaluation.get("seconds"),
            "cpu_seconds": evaluation.get("cpu_seconds")}


def compute_context(table, *, split: str) -> dict:
    def finite(x):
        return None if x is None or (isinstance(x, float) and math.isnan(x)) else x

    rows = [{"name": display_name(r.agent), "runs": r.runs, "steps": finite(r.env_steps_per_s),
             "wall": None if finite(r.wall_per_run_s) is None else r.wall_per_run_s / 60, "train": r.train_cpu_hours,
             "eval_jobs": r.eval_jobs, "eval": r.eval_cpu_hours, "device": r.device or "--"}
            for r in table.itertuples(index=False)]
    return {"split": split, "rows": rows, "total": float(table["cpu_hours"].sum())}


def run_manifests(paths) -> list:
    """The train.json files behind `paths`: each a run's train.json or a seed block's record (its runs' train.json)."""
    files = []
    for path in paths:
        if layout.SEED_BLOCK_RECORD.search(str(path)):
            files += [layout.manifest(run["run"]) for run in read_json(path, "a seed block's record", writer="tapebench train --block-record")["runs"]]
        else:
            files.append(path)
    return files


def render_compute_table(out, *, split, evaluations, manifests=None, agents=None, parquet=None) -> str:
    """The compute table at `out` (LaTeX) and, with `parquet`, its rows."""
    runs = [run_record(read_json(path, "a training run's train.json", writer="tapebench train")) for path in run_manifests(manifests or [])]
    evals = [evaluation_record(read_parquet_meta(path)) for path in evaluations]
    table = compute_table(runs, evals, list(agents) if agents else None)
    if parquet:
        write_parquet(parquet, table, meta={**provenance({"split": split}, None,
                                                         inputs=[str(p) for p in [*(manifests or []), *evaluations]]),
                                            "table": "compute"})
    return render_table("compute.tex.j2", out, **compute_context(table, split=split))
