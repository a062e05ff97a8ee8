"""The evaluation runner scores episodes exactly as a hand-rolled TapeEnv loop does, and the
evaluation episodes are common random numbers: a pure function of (seed, key, side, rule, k)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tapebench.envs.tape_env import TapeEnv
from tapebench.episodes.sets import episode_set, episode_tape
from tapebench.evaluation.records import EPISODE_COLUMNS
from tapebench.evaluation.runner import episode_frame, run_episodes

RULES = [0, 4, 30, 90, 110, 204]


def first_one_policy(obs: torch.Tensor) -> torch.Tensor:
    """Flip the first set cell (cell 0 when the tape is empty)."""
    L = obs.shape[1] - 1
    return obs[:, :L].argmax(dim=1)


def hand_rolled(episodes, H: int, goal=None, success_bonus: float = 1.0) -> dict:
    out = {k: [] for k in ("success", "final_dist", "auc_dist", "return", "steps")}
    L = episodes.tapes.shape[1]
    for tape, rule in zip(episodes.tapes, episodes.rules):
        env = TapeEnv(rule=int(rule), L=L, H=H, goal=goal, success_bonus=success_bonus)
        obs, info = env.reset(seed=0, options={"tape": tape})
        total, dist_sum, steps, done = 0.0, 0.0, 0, False
        while not done:
            obs, reward, terminated, truncated, info = env.step(int(np.argmax(obs[:L])))
            total += reward
            dist_sum += info["dist"]
            steps += 1
            done = terminated or truncated
        out["success"].append(terminated)
        out["final_dist"].append(info["dist"])
        out["auc_dist"].append(dist_sum / H)   # steps after a success count as distance 0
        out["return"].append(total)
        out["steps"].append(steps)
    return {k: np.asarray(v) for k, v in out.items()}


@pytest.mark.parametrize("L,H,batch_size", [(8, 6, None), (8, 6, 5), (16, 12, None)])
def test_runner_matches_hand_rolled_tape_env_loop(L, H, batch_size):
    episodes = episode_set(RULES, 4, L, eval_seed=3, key=17, side="test")
    got = run_episodes(first_one_policy, episodes, H, batch_size=batch_size)
    want = hand_rolled(episodes, H)
    # L is a power of two: every distance k / L is exact in float32, so the match is exact
    for key in want:
        assert np.array_equal(got[key], want[key]), key
    assert got["success"].any() and not got["success"].all()
    assert (got["steps"][~got["success"]] == H).all()


def test_runner_matches_hand_rolled_loop_with_goal_bonus_and_odd_length():
    L, H = 5, 7
    goal = [1, 0, 0, 1, 0]
    episodes = episode_set(RULES, 3, L, eval_seed=1, side="rules", goal=goal)
    got = run_episodes(first_one_policy, episodes, H, goal=goal, success_bonus=3.0)
    want = hand_rolled(episodes, H, goal=goal, success_bonus=3.0)
    assert np.array_equal(got["success"], want["success"])
    assert np.array_equal(got["steps"], want["steps"])
    for key in ("final_dist", "auc_dist", "return"):   # float32 k/5 vs float64 k/5
        np.testing.assert_allclose(got[key], want[key], rtol=0, atol=1e-6)


def test_runner_calls_begin_and_observe_of_stateful_policies():
    calls = []

    class Policy:
        def begin(self, batch):
            calls.append(("begin", len(batch), batch.rules))

        def act(self, obs):
            return first_one_policy(obs)

        def observe(self, obs, actions, rewards, next_obs, terminated, truncated):
            calls.append(("observe", len(actions)))

    episodes = episode_set([30, 110], 3, 8)
    run_episodes(Policy(), episodes, 2, batch_size=4)
    assert calls == [("begin", 4, None), ("observe", 4), ("observe", 4), ("begin", 2, None), ("observe", 2),
                     ("observe", 2)]
    calls.clear()
    run_episodes(Policy(), episodes, 1, by_rule=True, reveal_rules=True)
    assert [c[1] for c in calls] == [3, 3, 3, 3]
    assert calls[0][2].tolist() == [30, 30, 30] and calls[2][2].tolist() == [110, 110, 110]


def test_batching_does_not_change_results_and_keys_are_per_episode():
    episodes = episode_set([30, 110, 4], 4, 8, eval_seed=2, side="test", key=3)
    whole = run_episodes(first_one_policy, episodes, 8)
    for kwargs in (dict(batch_size=5), dict(by_rule=True)):
        parts = run_episodes(first_one_policy, episodes, 8, **kwargs)
        for k in whole:
            assert np.array_equal(whole[k], parts[k]), (kwargs, k)
    alone = episode_set([110], 4, 8, eval_seed=2, side="test", key=3)
    assert np.array_equal(alone.keys, episodes.keys[episodes.rules == 110])
    assert len(set(episodes.keys.tolist())) == len(episodes)


def test_episode_frame_has_the_record_schema():
    episodes = episode_set([30, 204], 2, 8, side="train", key=5)
    results = run_episodes(first_one_policy, episodes, 8)
    df = episode_frame(results, episodes, H=8, split="diverse", rule_types={30: "chaotic"})
    assert list(df.columns) == list(EPISODE_COLUMNS)
    assert df["type"].tolist() == ["chaotic", "chaotic", "", ""]
    assert df["episode"].tolist() == [0, 1, 0, 1] and (df["split"] == "diverse").all()


# --- common random numbers ------------------------------------------------------------------

def test_episode_tapes_are_a_pure_function_of_seed_key_side_rule_and_index():
    small = episode_set([30], 3, 16, eval_seed=9, key=4, side="test")
    large = episode_set([0, 30, 110], 5, 16, eval_seed=9, key=4, side="test")
    again = episode_set([0, 30, 110], 5, 16, eval_seed=9, key=4, side="test")
    assert np.array_equal(large.tapes, again.tapes)
    rows_30 = large.tapes[large.rules == 30][:3]
    assert np.array_equal(small.tapes, rows_30)   # independent of the other rules and of E
    for z, k, tape in zip(large.rules, large.episodes, large.tapes):
        assert np.array_equal(tape, episode_tape(9, 4, "test", int(z), int(k), 16, np.zeros(16, np.uint8)))


@pytest.mark.parametrize("change", [dict(eval_seed=10), dict(key=5), dict(side="train")])
def test_episode_tapes_change_with_seed_key_and_side(change):
    base = dict(eval_seed=9, key=4, side="test")
    a = episode_set([30, 110], 8, 32, **base)
    b = episode_set([30, 110], 8, 32, **{**base, **change})
    assert not np.array_equal(a.tapes, b.tapes)


def test_episode_layout_is_rule_major():
    eps = episode_set([110, 30], 3, 8)
    assert eps.rules.tolist() == [110, 110, 110, 30, 30, 30]
    assert eps.episodes.tolist() == [0, 1, 2, 0, 1, 2]
    assert len(eps) == 6 and eps.tapes.shape == (6, 8) and eps.tapes.dtype == np.uint8


@pytest.mark.parametrize("goal", [None, [1, 0, 1]])
def test_episode_tapes_never_equal_the_goal(goal):
    eps = episode_set(range(256), 4, 3, eval_seed=0, goal=goal)   # 1 in 8 raw draws hits the goal
    target = np.zeros(3) if goal is None else np.asarray(goal)
    assert not (eps.tapes == target).all(axis=1).any()
    assert set(np.unique(eps.tapes)) <= {0, 1}


def test_episode_set_rejects_bad_arguments():
    with pytest.raises(ValueError, match="side must be one of"):
        episode_set([30], 1, 8, side="ood")
    with pytest.raises(ValueError, match="episodes_per_rule must be >= 1"):
        episode_set([30], 0, 8)
    with pytest.raises(ValueError, match="0..255"):
        episode_set([256], 1, 8)
    with pytest.raises(ValueError, match="3..64"):
        episode_set([30], 1, 2)
