"""The tiny k = 3, r = 1 family preset end to end (tests/data/family_k3r1_tiny.yaml over tests/data/tiny.yaml):
a sampled rule set -> features -> a mirror-safe split -> DQN, PPO, random, MPC -> Tables 1-4."""
import json
import shutil

import pandas as pd
import pytest
from pipeline_helpers import REPO, make_workdir, snakemake

from tapebench.rule_family import RuleFamily
from tapebench.rules.sampling import SampleSpec, sample_rule_set

pytestmark = pytest.mark.slow       # a tiny-DAG pipeline build: `python3 -m pytest -m slow` (CI runs it)

FAMILY_TINY = REPO / "tests" / "data" / "family_k3r1_tiny.yaml"
TABLES = [f"results/table{i}.tex" for i in (1, 2, 3, 4)]


@pytest.fixture(scope="module")
def family_run(tmp_path_factory):
    workdir = make_workdir(tmp_path_factory.mktemp("family"))
    shutil.copy(FAMILY_TINY, workdir / "family.yaml")
    result = snakemake(workdir, *TABLES, configfiles=("tiny.yaml", "family.yaml"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return workdir


def test_records_hold_exactly_the_sampled_k3r1_rules(family_run):
    family = RuleFamily(3, 1)
    sampled = sample_rule_set(family, SampleSpec(n=8, lambda_bins=4, seed=0))["rules"]
    split = json.loads((family_run / "results/splits/main.json").read_text())
    assert split["family"] == {"k": 3, "r": 1}
    assert sorted(split["train"] + split["test"]) == sampled
    for method in ("dqn", "ppo", "random", "mpc"):
        records = pd.read_parquet(family_run / f"results/runs/main/{method}/seed0/eval_H8.parquet")
        assert records["rule"].dtype == "int64"
        assert set(records.loc[records["side"] == "train", "rule"]) == set(split["train"])
        assert set(records.loc[records["side"] == "test", "rule"]) == set(split["test"])
    assert max(sampled) > 255      # rule numbers of the family, not elementary ones


def test_split_is_mirror_safe_and_passes_the_health_gate(family_run):
    family = RuleFamily(3, 1)
    split = json.loads((family_run / "results/splits/main.json").read_text())
    assert not {family.mirror_rule(r) for r in split["test"]} & set(split["train"])
    health = json.loads((family_run / "results/splits/main.health.json").read_text())
    assert health["ok"] and health["mirror_leaks"] == 0 and health["family"] == {"k": 3, "r": 1}
    report = json.loads((family_run / "results/health/main.json").read_text())
    assert report["protocol"]["reference"] == "mpc"                  # no exact optimum for k = 3
    assert report["checks"]["identifiability"]["status"] == "n/a" and report["checks"]["leakage"]["value"] == 0.0
    verdict = json.loads((family_run / "results/health/main.verdict.json").read_text())
    assert verdict["split"] == "main" and "identifiability" not in verdict["warnings"]


def test_tables_have_rows_for_the_family_methods(family_run):
    table3 = (family_run / "results/table3.tex").read_text()
    for name in ("DQN", "PPO", "Random policy", "True-dynamics MPC"):
        assert f"\n{name} & 2 &" in table3
    table1 = (family_run / "results/table1.tex").read_text()
    assert table1.count("True-dynamics MPC & $L=8, H=8$") == 2 and "Feasibility" not in table1.split("midrule")[1]
    assert "DQN" in (family_run / "results/table4.tex").read_text()
