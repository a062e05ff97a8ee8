"""The few-shot study (docs/protocol.md#few-shot): k = 0 is the zero-shot evaluation on the same episodes (a method
that does not train, one that adapts by gradient steps and one that adapts in context), the adaptation episodes are
not the test episodes, the Bayes filter's carried posterior does not lose success on rules it identifies, and the
aggregate is the mean over seeds of per-seed successes."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from agent_contract import toy_split as write_toy_split

from tapebench.cli import main
from tapebench.evaluation.evaluate import evaluate_untrained, side_protocols
from tapebench.evaluation.fewshot import FewShotSettings, _sides, adaptation_mode, run_fewshot
from tapebench.evaluation.runner import run_episodes
from tapebench.evaluation.trained_runs import evaluate_run
from tapebench.methods.bayes_filter import BayesFilterPolicy
from tapebench.methods.contract import EnvSpec, EpisodeBatch
from tapebench.registry import get_method
from tapebench.schemas import FEWSHOT_COLUMNS
from tapebench.splits.io import load_split, save_split
from tapebench.stats.fewshot import aggregate_fewshot

pytestmark = pytest.mark.usefixtures("one_torch_thread")

L = H = 8
EVAL = {"episodes_per_rule": 3, "eval_seed": 5}
RECORD = ["success", "final_dist", "auc_dist", "return", "steps"]
TINY_AGENT = {"num_envs": 4, "num_steps": 32, "hidden_size": 32}


def _same_as_evaluation(fewshot: pd.DataFrame, evaluation: pd.DataFrame) -> None:
    """Every k = 0 record equals the evaluation's record of the same episode (side, rule, episode index)."""
    k0 = fewshot[fewshot["shots"] == 0].set_index(["side", "rule", "episode"]).sort_index()
    reference = evaluation.set_index(["side", "rule", "episode"]).loc[k0.index]
    assert len(k0) and not reference.index.duplicated().any()
    pd.testing.assert_frame_equal(k0[RECORD], reference[RECORD])


def test_k0_is_the_zero_shot_evaluation_of_a_method_that_does_not_train(toy_split):
    records = run_fewshot(get_method("bayes_filter"), FewShotSettings(shots=(0, 2)), split=toy_split, seed=1, L=L, H=H,
                          **EVAL)
    assert list(records.columns) == list(FEWSHOT_COLUMNS) and set(records["adaptation"]) == {"context"}
    sides = side_protocols(L=L, H=H, split=toy_split, **EVAL)
    evaluation, _ = evaluate_untrained("bayes_filter", {}, 1, sides, train_rules=toy_split.train)
    _same_as_evaluation(records, evaluation)


@pytest.fixture(scope="module")
def trained_runs(tmp_path_factory):
    """A PPO run (gradient adaptation) and an RL2-A2C run (in context) of 256 steps on the toy split."""
    root = tmp_path_factory.mktemp("fewshot_runs")
    split_file = write_toy_split(root / "toy.json")
    params = {"env": {"L": L, "H": H}, "training": {"total_steps": 256, "eval_every": 128}, "agent": TINY_AGENT}
    for agent in ("ppo", "rl2_a2c"):
        assert main(["train", "--agent", agent, "--split", str(split_file), "--seed", "0", "--params",
                     json.dumps(params), "--out", str(root / agent), "--quiet"]) == 0
    return root, split_file


@pytest.mark.parametrize("agent, mode", [("ppo", "gradient"), ("rl2_a2c", "context")])
def test_k0_is_the_zero_shot_evaluation_of_a_trained_run(trained_runs, agent, mode):
    root, split_file = trained_runs
    out = root / f"{agent}_fewshot.parquet"
    params = {"env": {"L": L, "H": H}, "evaluation": EVAL, "fewshot": {"shots": [0, 1, 3]}, "agent": TINY_AGENT}
    assert main(["fewshot", "--method", agent, "--run", str(root / agent), "--seed", "0", "--split", str(split_file),
                 "--params", json.dumps(params), "--out", str(out), "--quiet"]) == 0
    records = pd.read_parquet(out)
    assert set(records["adaptation"]) == {mode} and sorted(records["shots"].unique()) == [0, 1, 3]
    evaluation, _ = evaluate_run(root / agent, H, split=load_split(split_file), **EVAL)
    final = evaluation[evaluation["checkpoint"] == evaluation["checkpoint"].max()]
    assert (records["checkpoint"] == final["checkpoint"].iloc[0]).all()
    _same_as_evaluation(records, final)
    if mode == "gradient":   # the adaptation episodes changed the policy (or the comparison above proves nothing)
        by_k = records.groupby("shots")[["final_dist", "return"]].mean()
        assert not np.allclose(by_k.loc[0], by_k.loc[3])


def test_adaptation_episodes_are_not_the_test_episodes(toy_split):
    for side in _sides(toy_split, FewShotSettings(shots=(0, 4)), L=16, H=16, success_bonus=1.0, noise=0.0,
                       goal_mode="zeros", goal_steps=8, **EVAL):
        for z in side.rules:
            test = side.test.tapes[side.test.rules == z]
            adapt = side.adapt.tapes[side.adapt.rules == z]
            assert len(adapt) == 4 and not any((a == t).all() for a in adapt for t in test)
        assert not set(side.adapt.keys.tolist()) & set(side.test.keys.tolist())


def test_a_method_without_adaptation_is_refused(toy_split):
    with pytest.raises(ValueError, match="dqn.*no few-shot adaptation.*FEWSHOT_ADAPTATION"):
        adaptation_mode(get_method("dqn"), object())
    assert adaptation_mode(get_method("mpc"), object()) == "none"
    assert adaptation_mode(get_method("live_leftmost"), object()) == "none"


def test_bayes_filter_success_does_not_drop_with_k_on_rules_it_identifies(tmp_path):
    """On its candidate rules (ID) the filter identifies the rule within an episode: after one episode the carried
    posterior sits on the true rule (checked below), and here no rule's success on its test episodes falls as k grows
    while rules 60, 90 and 150 gain. Not a law of a one-step greedy policy: with evaluation seed 3 rule 150 goes
    0.7 (k = 2) -> 0.3 (k = 4), as the last near-consistent candidates lose their weight and with it the
    information-gain term that happened to help; a regression test of a setting where carrying the posterior pays."""
    train = [2, 4, 12, 15, 34, 51, 60, 90, 128, 136, 150, 170, 184, 200, 204, 232]
    save_split(tmp_path / "hand2.json", {"name": "hand2", "train": train, "test": [0, 76], "types": {},
                                         "params": {"method": "hand"}, "unit": "rule"})
    split = load_split(tmp_path / "hand2.json")
    settings = FewShotSettings(shots=(0, 1, 2, 4, 8), rules_per_side=None)
    records = run_fewshot(get_method("bayes_filter"), settings, split=split, seed=0, L=L, H=H, episodes_per_rule=10,
                          eval_seed=2)
    success = records[records["side"] == "train"].pivot_table(index="rule", columns="shots", values="success")
    assert (success.diff(axis=1).iloc[:, 1:] >= 0).all().all(), success
    assert (success.loc[[60, 90, 150], 8] > success.loc[[60, 90, 150], 0]).all(), success

    side = _sides(split, settings, L=L, H=H, episodes_per_rule=1, eval_seed=1, success_bonus=1.0, noise=0.0,
                  goal_mode="zeros", goal_steps=8)[0]
    policy = BayesFilterPolicy(split.train)
    episodes = side.adaptation_rows(np.array([60, 150]), 0)
    run_episodes(policy, episodes, H)
    posterior = policy.posterior()
    policy.carry(EpisodeBatch(L=L, H=H, keys=episodes.keys, goal=np.zeros(L, np.uint8), success_bonus=1.0,
                              device=torch.device("cpu")))
    assert np.array_equal(policy.posterior(), posterior)          # carried, not reset to the uniform prior
    assert [int(policy.rules[i]) for i in posterior.argmax(axis=1)] == [60, 150]


def test_aggregate_is_the_mean_over_seeds_of_per_seed_success():
    def records(seed, successes):
        n = len(successes)
        return pd.DataFrame({"agent": "a", "seed": seed, "checkpoint": 0, "shots": 1, "adaptation": "context",
                             "split": "main", "side": "test", "rule": np.arange(n) % 2, "type": "",
                             "episode": np.arange(n) // 2, "L": 8, "H": 8, "success": successes, "final_dist": 0.0,
                             "auc_dist": 0.0, "return": 0.0, "steps": 1}).astype(FEWSHOT_COLUMNS)
    table = aggregate_fewshot(pd.concat([records(0, [True, True, False, False]), records(1, [True, False, False, False])]),
                              n_resamples=100)
    row = table.iloc[0]
    assert row["mean"] == pytest.approx((0.5 + 0.25) / 2) and row["n_seeds"] == 2 and row["n_rules"] == 2
    assert row["episodes"] == 8 and row["ci_low"] <= row["mean"] <= row["ci_high"]
    with pytest.raises(ValueError, match="twice"):
        aggregate_fewshot(pd.concat([records(0, [True]), records(0, [False])]))


@pytest.mark.parametrize("agent", ["rl2_a2c", "pearl_dqn"])
def test_in_context_policies_carry_their_context_and_restart_the_episode(agent):
    """After `carry` the context gathered since `begin` is still there (the GRU state; the context sums) and the
    per-episode bookkeeping starts over (first-step inputs; every row playing); `begin` clears the context."""
    method = get_method(agent)
    config = method.Config(**({"hidden_size": 16} if agent == "rl2_a2c" else {}))
    policy = method.make_agent(config, EnvSpec.for_tape(L, H), 256, "cpu").evaluation_policy()
    batch = EpisodeBatch(L=L, H=H, keys=np.arange(2, dtype=np.uint64), goal=np.zeros(L, np.uint8), success_bonus=1.0,
                         device=torch.device("cpu"))
    obs = torch.cat([torch.randint(0, 2, (2, L)).float(), torch.zeros(2, 1)], dim=1)
    policy.begin(batch)
    actions = policy.act(obs)
    done = torch.tensor([True, False])
    policy.observe(obs, actions, torch.tensor([-0.5, -0.25]), obs, done, torch.zeros(2, dtype=torch.bool))
    state = (lambda p: p.memory.hidden.clone()) if agent == "rl2_a2c" else (lambda p: p.precision_sum.clone())
    gathered = state(policy)
    assert gathered.abs().sum() > 0
    policy.carry(batch)
    assert torch.equal(state(policy), gathered)
    if agent == "rl2_a2c":
        assert (policy.memory.first == 1).all() and (policy.memory.prev_reward == 0).all()
    else:
        assert policy.active.all()
    with pytest.raises(ValueError, match="carry needs the 2 rows"):
        policy.carry(EpisodeBatch(L=L, H=H, keys=np.arange(3, dtype=np.uint64), goal=np.zeros(L, np.uint8),
                                  success_bonus=1.0, device=torch.device("cpu")))
    policy.begin(batch)
    assert state(policy).abs().sum() == 0
