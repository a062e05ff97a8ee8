"""`tapebench bench sb3 --learning`: the task list, SB3's policy through our runner, the statistics of the
side-by-side table, and bad options. Training both sides needs SB3 (an optional extra, never in CI): those
tests skip without it."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from tapebench.bench.sb3_learning import (FIXED_RULE_L, REPRESENTATIVE_RULES, RunPlan, evaluation_sets, parity_rows,
                                          parity_tasks, run_one, sb3_greedy_policy)
from tapebench.cli import main
from tapebench.episodes.sets import episode_set
from tapebench.evaluation.runner import run_episodes
from tapebench.methods.contract import StatelessPolicy
from tapebench.stats.bootstrap import difference_ci, percentile_ci


def test_representative_rules_are_the_fixed_z_studys():
    with open("config/config.yaml") as fh:
        assert tuple(yaml.safe_load(fh)["studies"]["fixed_z"]["rules"]) == REPRESENTATIVE_RULES


def test_tasks_fixed_rules_at_16_and_the_split_at_L_H(toy_split):
    tasks = parity_tasks(["fixed", "main"], (30, 110), toy_split, 32, 24)
    assert [(t.name, t.rules, t.L, t.H) for t in tasks] == [
        ("rule 30", (30,), FIXED_RULE_L, 16), ("rule 110", (110,), FIXED_RULE_L, 16), ("toy", (4, 12, 200), 32, 24)]
    with pytest.raises(ValueError, match=r"--tasks must name some of \['fixed', 'main'\], got \['both'\]"):
        parity_tasks(["both"], (30,), toy_split, 32, 32)


def test_evaluation_sides_are_id_and_ood_of_the_split_or_the_rule(toy_split):
    main_task, = parity_tasks(["main"], (), toy_split, 8, 8)
    sides = evaluation_sets(main_task, 3)
    assert [label for label, _ in sides] == ["ID", "OOD"]
    assert sorted(set(sides[0][1].rules.tolist())) == [4, 12, 200] and len(sides[1][1]) == 2 * 3
    rule_task, = parity_tasks(["fixed"], (30,), None, 8, 8)
    (label, episodes), = evaluation_sets(rule_task, 5)
    assert label == "rule" and set(episodes.rules.tolist()) == {30} and episodes.tapes.shape == (5, 16)


class _FirstOneModel:
    """Stands in for an SB3 model: `policy.predict(numpy obs, deterministic=True)` -> (numpy actions, None)."""

    def __init__(self):
        self.policy = self
        self.calls = 0

    def predict(self, obs, deterministic=False):
        assert isinstance(obs, np.ndarray) and deterministic
        self.calls += 1
        return np.argmax(obs[:, :-1] > 0.5, axis=1), None


def test_sb3_policy_plays_our_episodes_like_the_same_function_as_our_policy():
    episodes = episode_set([4, 30, 204], 10, 16, eval_seed=0, side="rules")
    model = _FirstOneModel()
    through_sb3 = run_episodes(sb3_greedy_policy(model), episodes, 16)
    ours = run_episodes(StatelessPolicy(lambda obs: torch.argmax((obs[:, :-1] > 0.5).int(), dim=1)), episodes, 16)
    assert model.calls > 0
    for key in ours:
        np.testing.assert_array_equal(through_sb3[key], ours[key])
    assert through_sb3["success"][episodes.rules == 204].all()   # flipping the first 1-cell clears rule 204's tape


def _result(side, agent, task, seed, **success):
    return {"side": side, "agent": agent, "task": task, "seed": seed, "success": success, "seconds": 1.0,
            "cpu_seconds": 1.0}


def test_parity_rows_match_the_bootstrap_of_each_side_and_the_difference():
    ours = {"rule 0": [1.0, 1.0, 0.9], "rule 4": [0.2, 0.4, 0.3]}
    sb3 = {"rule 0": [1.0, 1.0, 1.0], "rule 4": [0.9, 0.8, 1.0]}
    results = [_result(side, "dqn", task, seed, rule=values[task][seed])
               for side, values in (("ours", ours), ("sb3", sb3)) for task in ours for seed in range(3)]
    results += [_result(side, "dqn", "main", seed, ID=0.1 * seed, OOD=0.05) for side in ("ours", "sb3")
                for seed in range(3)]
    rows = {(r["task"], r["evaluation"]): r for r in parity_rows(results, 3)}
    assert set(rows) == {("rule 0", "rule"), ("rule 4", "rule"), ("2 rules (mean)", "rule"), ("main", "ID"),
                         ("main", "OOD")}
    rule4 = rows[("rule 4", "rule")]
    assert rule4["ours"]["mean"] == pytest.approx(0.3) and rule4["ours"] == percentile_ci([0.2, 0.4, 0.3]).__dict__
    assert rule4["difference"] == difference_ci([0.2, 0.4, 0.3], [0.9, 0.8, 1.0]).__dict__
    assert rule4["verdict"] == "ours lower"
    assert rows[("main", "ID")]["verdict"] == "within CI" and rows[("main", "ID")]["difference"]["mean"] == 0
    mean = rows[("2 rules (mean)", "rule")]
    assert mean["ours_per_seed"] == pytest.approx([0.6, 0.7, 0.6]) and mean["sb3_per_seed"] == pytest.approx(
        [0.95, 0.9, 1.0])


@pytest.mark.parametrize("options,needle", [
    (["--seeds", "1"], "--seeds must be >= 2"),
    (["--jobs", "0"], "--jobs must be >= 1"),
    (["--episodes-per-rule", "0"], "--episodes-per-rule must be >= 1"),
    (["--tasks", "main", "--split", "no-such-split"], "unknown split name 'no-such-split'"),
    (["--fixed-rules", "300", "--tasks", "fixed"], "300"),
])
def test_bad_learning_options_are_refused_before_anything_runs(options, needle, capsys):
    assert main(["bench", "sb3", "--learning", *options]) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("agent", ["dqn", "ppo"])
def test_both_sides_train_and_play_the_same_episodes(agent):
    """Only where SB3 is installed: one tiny run per side on rule 0 (any policy succeeds: the tape dies)."""
    pytest.importorskip("stable_baselines3")
    task, = parity_tasks(["fixed"], (0,), None, 16, 16)
    results = [run_one(RunPlan(side, agent, task, seed=0, steps=300, episodes_per_rule=4)) for side in ("ours", "sb3")]
    assert [r["success"] for r in results] == [{"rule": 1.0}, {"rule": 1.0}]
    assert results[0]["env_steps"] == results[1]["env_steps"] >= 300


def test_learning_is_an_option_of_sb3_only(capsys):
    assert main(["bench", "ca", "--learning"]) == 2
    assert "--learning is an option of ['sb3'], not of bench ca" in capsys.readouterr().err
