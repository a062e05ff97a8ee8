"""What the runs cost (docs/protocol.md#compute): per method, training throughput and wall time per run, and
the CPU-hours its training runs and evaluations took in this config. Pure functions on records; the report
builder (`report.compute`) reads them from the runs' train.json and the evaluations' Parquet metadata."""
from __future__ import annotations

import pandas as pd

from tapebench.schemas import COMPUTE_COLUMNS

HOUR = 3600.0


def compute_table(runs: list[dict], evaluations: list[dict], agents: list[str] | None = None) -> pd.DataFrame:
    """One row per method (columns `schemas.COMPUTE_COLUMNS`).

    `runs`: one dict per training run with agent, env_steps, wall_time_s, cpu_time_s, device_name;
    `evaluations`: one dict per evaluation job with agent, seconds, cpu_seconds. Methods that do not train have
    no runs: their steps/s and wall per run are NaN and their cost is their evaluations'. A record written before
    CPU time was recorded counts its wall time as CPU time (one thread per job)."""
    run_frame = pd.DataFrame(runs, columns=["agent", "env_steps", "wall_time_s", "cpu_time_s", "device_name"])
    eval_frame = pd.DataFrame(evaluations, columns=["agent", "seconds", "cpu_seconds"])
    run_frame["cpu_time_s"] = run_frame["cpu_time_s"].fillna(run_frame["wall_time_s"])
    eval_frame["cpu_seconds"] = eval_frame["cpu_seconds"].fillna(eval_frame["seconds"])
    order = agents or list(dict.fromkeys([*run_frame["agent"], *eval_frame["agent"]]))
    rows = []
    for agent in order:
        trained = run_frame[run_frame["agent"] == agent]
        evaluated = eval_frame[eval_frame["agent"] == agent]
        if trained.empty and evaluated.empty:
            continue
        train_cpu = float(trained["cpu_time_s"].sum()) / HOUR
        eval_cpu = float(evaluated["cpu_seconds"].sum()) / HOUR
        steps = float(trained["env_steps"].sum())
        wall = float(trained["wall_time_s"].sum())
        devices = sorted(set(trained["device_name"].dropna().astype(str)))
        rows.append({"agent": agent, "runs": len(trained),
                     "env_steps_per_s": steps / wall if wall > 0 else float("nan"),
                     "wall_per_run_s": wall / len(trained) if len(trained) else float("nan"),
                     "train_cpu_hours": train_cpu, "eval_jobs": len(evaluated), "eval_cpu_hours": eval_cpu,
                     "cpu_hours": train_cpu + eval_cpu, "device": "; ".join(devices) if devices else ""})
    return pd.DataFrame(rows, columns=COMPUTE_COLUMNS)
