"""The few-shot study in the tiny DAG (docs/protocol.md#few-shot): its records, aggregate, table and figure, and the
k = 0 rows of each method equal to the pipeline's own evaluation records of the same episodes."""
from __future__ import annotations

import pandas as pd
import pytest

from tapebench import layout
from tapebench.utils.io import read_parquet_meta

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("tiny_build_2")]      # a tiny-DAG pipeline build

RECORD = ["success", "final_dist", "auc_dist", "return", "steps"]
MODES = {"ppo": "gradient", "bayes_filter": "context", "random": "none"}   # tests/data/tiny.yaml's study


def test_tiny_dag_builds_the_fewshot_study(tiny_build):
    aggregate = pd.read_parquet(tiny_build / layout.FEWSHOT_AGGREGATE)
    assert list(dict.fromkeys(aggregate["agent"])) == list(MODES)
    assert dict(zip(aggregate["agent"], aggregate["adaptation"])) == MODES
    assert len(aggregate) == len(MODES) * 2 * 3 and set(aggregate["shots"]) == {0, 1, 2}   # methods x sides x k
    assert (aggregate["n_rules"] == 1).all() and (aggregate["n_seeds"] == 1).all()
    text = (tiny_build / "results/fewshot.tex").read_text()
    for name in ("PPO", "Bayes filter (train)", "Random policy"):
        assert sum(line.startswith(name + " &") for line in text.splitlines()) == 1, name
    assert (tiny_build / "results/figures/fewshot.png").stat().st_size > 5_000
    for agent in MODES:
        path = tiny_build / layout.fewshot_records("main", agent, 0)
        meta = read_parquet_meta(path)
        assert meta["table"] == "fewshot" and meta["config"]["fewshot"]["shots"] == [0, 1, 2]
        if agent not in ("ppo", "random"):      # the tiny DAG evaluates its `methods` only
            continue
        records = pd.read_parquet(path)
        evaluation = pd.read_parquet(tiny_build / layout.evaluation(layout.run_dir("main", agent, 0), 8))
        evaluation = evaluation[evaluation["checkpoint"] == evaluation["checkpoint"].max()]
        k0 = records[records["shots"] == 0].set_index(["side", "rule", "episode"]).sort_index()
        same = evaluation.set_index(["side", "rule", "episode"]).loc[k0.index]
        pd.testing.assert_frame_equal(k0[RECORD], same[RECORD], obj=agent)
