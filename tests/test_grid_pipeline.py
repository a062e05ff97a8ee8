"""The tiny 2D grid preset end to end (tests/data/grid_tiny.yaml over tests/data/tiny.yaml): grid features of six von
Neumann rules -> a split of the grid rule set -> the health gate -> DQN, PPO (on EnvSpec.for_grid), the Bayes filter,
the live-cell row, random and MPC on 4 x 4 grids through the one runner -> Table 3 and the per-type table naming the
family, Figure 3 and the grid rollouts."""
import json
import shutil

import pandas as pd
import pytest
import torch
from pipeline_helpers import REPO, make_workdir, snakemake

from tapebench.grid_rules import VON_NEUMANN

pytestmark = pytest.mark.slow       # a tiny-DAG pipeline build: `python3 -m pytest -m slow` (CI runs it)

GRID_TINY = REPO / "tests" / "data" / "grid_tiny.yaml"
METHODS = ("dqn", "ppo", "bayes_filter", "live_leftmost", "random", "mpc")


@pytest.fixture(scope="module")
def grid_run(tmp_path_factory):
    workdir = make_workdir(tmp_path_factory.mktemp("grid"))
    shutil.copy(GRID_TINY, workdir / "grid.yaml")
    result = snakemake(workdir, "results/table2.tex", "results/table3.tex", "results/table4.tex",
                       "results/table_types.tex", "results/figures/figure3_per_rule.png",
                       "results/figures/grid_rollouts.png", configfiles=("tiny.yaml", "grid.yaml"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return workdir


def test_the_split_divides_the_listed_grid_rules_and_passes_the_gate(grid_run):
    listed = [VON_NEUMANN.rule(r).id for r in ("B1/S12V", "B12/S0V", "B2/S012V", "B13/S1V", "B23/SV", "B14/S2V")]
    split = json.loads((grid_run / "results/splits/main.json").read_text())
    assert split["family"] == {"neighbourhood": "von_neumann"}
    assert sorted(split["train"] + split["test"]) == sorted(listed) and len(split["test"]) == 2
    report = json.loads((grid_run / "results/health/main.json").read_text())
    assert report["checks"]["identifiability"]["status"] == "n/a" and report["checks"]["leakage"]["value"] == 0.0
    assert json.loads((grid_run / "results/health/main.verdict.json").read_text())["split"] == "main"


def test_every_method_played_4x4_grids_of_the_split_s_rules(grid_run):
    split = json.loads((grid_run / "results/splits/main.json").read_text())
    for method in METHODS:
        records = pd.read_parquet(grid_run / f"results/runs/main/{method}/seed0/eval_H8.parquet")
        assert (records["L"] == 16).all(), method
        assert set(records.loc[records["side"] == "train", "rule"]) == set(split["train"]), method
        assert set(records.loc[records["side"] == "test", "rule"]) == set(split["test"]), method
    mpc = pd.read_parquet(grid_run / "results/runs/main/mpc/seed0/eval_H8.parquet")
    assert mpc["success"].all()          # MPC clears every 4 x 4 start of these rules in 8 steps (tests/data)


def test_the_networks_were_built_for_the_grid(grid_run):
    for method in ("dqn", "ppo"):
        last = sorted((grid_run / f"results/runs/main/{method}/seed0/checkpoints").glob("step_*.pt"))[-1]
        spec = torch.load(last, weights_only=False)["env_spec"]
        assert (spec["grid"], spec["L"], spec["obs_dim"], spec["num_actions"]) == (4, 16, 17, 16), method


def test_table3_names_the_family_and_has_a_row_per_method(grid_run):
    table3 = (grid_run / "results/table3.tex").read_text()
    assert "(outer-totalistic von Neumann rules on a 4 $\\times$ 4 torus, $H=8$)" in table3
    for name in ("DQN", "PPO", "Bayes filter (train)", "Flip lowest live cell", "Random policy",
                 "True-dynamics MPC"):
        assert f"\n{name} & 2 &" in table3, name
    assert "Rule-dependent headroom" in table3


def test_tables_2_and_4_name_the_family(grid_run):
    phrase = "outer-totalistic von Neumann rules on a 4 $\\times$ 4 torus"
    assert f"\\texttt{{main}} ({phrase}; evaluation horizons" in (grid_run / "results/table2.tex").read_text()
    assert f"\\texttt{{main}} at $H=8$ ({phrase}) over" in (grid_run / "results/table4.tex").read_text()


def test_the_per_type_table_names_the_family_and_the_figures_are_built(grid_run):
    types = (grid_run / "results/table_types.tex").read_text()
    assert "(outer-totalistic von Neumann rules on a 4 $\\times$ 4 torus) at $H=8$" in types
    assert "\nTrue-dynamics MPC & ID & 2" in types
    for stem in ("figure3_per_rule", "grid_rollouts"):
        assert (grid_run / f"results/figures/{stem}.png").stat().st_size > 5000, stem
