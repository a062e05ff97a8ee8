"""Compute reporting (docs/protocol.md#compute): every run records its cost, and the compute table sums it."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from tapebench.schemas import COMPUTE_COLUMNS
from tapebench.stats.compute import compute_table


def test_compute_table_by_hand():
    runs = [{"agent": "dqn", "env_steps": 1000, "wall_time_s": 10.0, "cpu_time_s": 12.0, "device_name": "cpu X"},
            {"agent": "dqn", "env_steps": 1000, "wall_time_s": 30.0, "cpu_time_s": None, "device_name": "cpu X"}]
    evaluations = [{"agent": "dqn", "seconds": 5.0, "cpu_seconds": 6.0},
                   {"agent": "random", "seconds": 3600.0, "cpu_seconds": None}]
    table = compute_table(runs, evaluations, ["random", "dqn", "ppo"])
    assert list(table.columns) == COMPUTE_COLUMNS
    assert table["agent"].tolist() == ["random", "dqn"]                  # config order; methods without records left out
    dqn = table.set_index("agent").loc["dqn"]
    assert dqn["runs"] == 2 and dqn["env_steps_per_s"] == pytest.approx(2000 / 40)
    assert dqn["wall_per_run_s"] == pytest.approx(20.0)
    assert dqn["train_cpu_hours"] == pytest.approx((12.0 + 30.0) / 3600)    # no CPU time recorded: its wall time
    assert dqn["eval_cpu_hours"] == pytest.approx(6.0 / 3600) and dqn["eval_jobs"] == 1
    assert dqn["cpu_hours"] == pytest.approx(48.0 / 3600) and dqn["device"] == "cpu X"
    rnd = table.set_index("agent").loc["random"]
    assert rnd["runs"] == 0 and math.isnan(rnd["env_steps_per_s"]) and rnd["cpu_hours"] == pytest.approx(1.0)


@pytest.mark.slow
@pytest.mark.xdist_group("tiny_build_2")
def test_every_run_records_its_cost_and_the_table_sums_it(tiny_build):
    from tapebench.utils.artifacts import read_json
    from tapebench.utils.io import read_parquet_meta

    manifest = read_json(tiny_build / "results/runs/main/dqn/seed0/train.json")
    assert manifest["cpu_time_s"] > 0 and manifest["wall_time_s"] > 0 and manifest["device_name"]
    meta = read_parquet_meta(tiny_build / "results/runs/main/random/seed0/eval_H8.parquet")
    assert meta["evaluation"]["cpu_seconds"] > 0
    table = pd.read_parquet(tiny_build / "results/compute.parquet")
    assert table["agent"].tolist() == ["dqn", "ppo", "random", "mpc", "exact"]    # tests/data/tiny.yaml's methods
    dqn = table.set_index("agent").loc["dqn"]
    assert dqn["runs"] == 2 and dqn["eval_jobs"] == 4                           # 2 seeds x H in {8, 16}
    assert table.set_index("agent").loc["exact", "eval_jobs"] == 2              # deterministic: one seed
    assert (table["cpu_hours"] > 0).all()
    assert "Total:" in (tiny_build / "results/compute.tex").read_text()
