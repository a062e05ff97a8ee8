"""The multi-goal protocol (docs/protocol.md#multi-goal): derived goals, the goal in the observation and the
contract, goal-conditioned oracles and rule-agnostic rows, and the unchanged default protocol."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from tapebench.envs.batched import BatchedTapeEnv
from tapebench.episodes.sets import derived_goal, episode_set
from tapebench.episodes.worldtest import transition
from tapebench.evaluation.evaluate import evaluate_untrained, play, side_protocols
from tapebench.evaluation.protocol import protocol_differences
from tapebench.evaluation.runner import run_episodes
from tapebench.methods.live_policy import live_actions
from tapebench.registry import get_method
from tapebench.validation import check_goal_mode

RULES = [0, 30, 90, 110, 204]


def test_derived_goals_are_reachable_differ_from_start_and_zero_and_are_deterministic():
    episodes = episode_set(RULES, 4, 16, eval_seed=3, key=5, side="test", goal_mode="derived", goal_steps=6)
    for i, (z, k, start) in enumerate(zip(episodes.rules, episodes.episodes, episodes.tapes)):
        goal, actions, found = derived_goal(3, 5, "test", int(z), int(k), start, 6)
        assert np.array_equal(goal, episodes.goals[i])
        assert 1 <= len(actions) <= 6
        tape = start
        for a in actions:   # replay the recorded random steps under the episode's rule
            tape = transition(tape[None], np.array([a]), np.array([z]))[0]
        assert np.array_equal(tape, goal)
        if z == 0:   # rule 0 reaches only 0...0: the last draw, found False
            assert not found and not goal.any()
        else:
            assert found and goal.any() and not np.array_equal(goal, start)
    again = episode_set(RULES, 4, 16, eval_seed=3, key=5, side="test", goal_mode="derived", goal_steps=6)
    other = episode_set(RULES, 4, 16, eval_seed=4, key=5, side="test", goal_mode="derived", goal_steps=6)
    assert np.array_equal(again.goals, episodes.goals)
    assert not np.array_equal(other.goals, episodes.goals)
    zeros = episode_set(RULES, 4, 16, eval_seed=3, key=5, side="test")
    assert zeros.goals is None and np.array_equal(zeros.tapes, episodes.tapes)   # paired starts


class Recorder:
    """Records what the contract hands a policy; flips cell 0."""

    def __init__(self):
        self.batches, self.first = [], []

    def begin(self, batch):
        self.batches.append(batch)

    def act(self, obs):
        if len(self.first) < len(self.batches):   # the batch's first observation
            self.first.append(obs.clone())
        return torch.zeros(len(obs), dtype=torch.long)

    def observe(self, *transition):
        pass


def test_every_method_sees_the_same_goals_in_the_batch_and_the_observation():
    episodes = episode_set(RULES, 3, 12, eval_seed=1, goal_mode="derived")
    seen = []
    for by_rule, reveal in ((False, False), (True, True)):
        recorder = Recorder()
        run_episodes(recorder, episodes, 4, by_rule=by_rule, reveal_rules=reveal)
        goals = np.concatenate([b.goals for b in recorder.batches])
        first = torch.cat(recorder.first)
        assert first.shape[1] == 2 * 12 + 1
        assert np.array_equal(first[:, 12:24].numpy().astype(np.uint8), goals)
        assert np.array_equal(first[:, :12].numpy().astype(np.uint8), episodes.tapes)
        seen.append(goals)
    assert np.array_equal(seen[0], episodes.goals) and np.array_equal(seen[1], episodes.goals)


def test_the_default_zeros_protocol_is_unchanged():
    """Records of a small evaluation, hashed before the multi-goal protocol existed."""
    sides = side_protocols(L=12, H=12, episodes_per_rule=3, eval_seed=7, rules=RULES)
    expected = {"mpc": "b34d3870e6bacac3", "live_leftmost": "a795eb452022d238", "bayes_filter": "e3279a8abe796572"}
    for method, digest in expected.items():
        records, summary = evaluate_untrained(method, {}, 0, sides, train_rules=(30, 90, 204))
        values = records[["success", "final_dist", "auc_dist", "return", "steps"]].to_numpy(np.float64)
        assert hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()[:16] == digest, method
        assert "goal_mode" not in summary["protocols"][0] and "goal_steps" not in summary["protocols"][0]


def test_mpc_and_exact_reach_derived_goals_of_an_easy_rule_and_success_is_to_the_goal():
    sides = side_protocols(L=12, H=12, episodes_per_rule=6, eval_seed=2, rules=[204], goal_mode="derived",
                           goal_steps=4)
    for method in ("mpc", "exact"):
        records, summary = evaluate_untrained(method, {}, 0, sides)
        assert records["success"].all(), method
        assert summary["protocols"][0]["goal_mode"] == "derived" and summary["protocols"][0]["goal_steps"] == 4
    # the goal-ignorant view of success (reach 0...0) would fail: the goals are not the all-zero tape
    episodes = sides[0][0]
    assert episodes.goals.any(axis=1).all()


def test_live_leftmost_flips_the_lowest_mismatching_cell():
    cells = np.array([[1, 0, 1, 1], [0, 0, 0, 0], [1, 1, 0, 0]], dtype=np.uint8)
    goals = np.array([[1, 0, 0, 1], [0, 0, 1, 0], [1, 1, 0, 0]], dtype=np.uint8)
    words = np.full(3, 2 ** 63, dtype=np.uint64)
    actions = live_actions(cells, words, "leftmost", goals)
    assert actions[:2].tolist() == [2, 2]                # the lowest cell that differs from the row's goal
    assert live_actions(cells, words, "leftmost")[:1].tolist() == [0]   # default goal: the lowest non-zero cell
    assert live_actions(cells, words, "random", goals)[:2].tolist() == [2, 2]   # the only mismatching cell


def test_goal_errors_name_the_key_and_what_is_allowed(goal_blind_method):
    with pytest.raises(ValueError, match=r"env.goal must be one of \['zeros', 'derived'\], got 'ones'"):
        check_goal_mode("ones", 8)
    with pytest.raises(ValueError, match=r"env.goal_steps must be an integer in 1..64, got 65"):
        check_goal_mode("derived", 65)
    env = BatchedTapeEnv(2, L=8, H=4, rules=[30])
    with pytest.raises(ValueError, match="autoreset=False"):
        env.load(np.ones((2, 8)), [30, 30], goals=np.zeros((2, 8)))
    sides = side_protocols(L=8, H=4, episodes_per_rule=1, eval_seed=0, rules=[30], goal_mode="derived")
    episodes, protocol, types = sides[0]
    with pytest.raises(ValueError, match="'goal_blind' does not take an episode's goal"):
        play(lambda obs: torch.zeros(len(obs), dtype=torch.long), get_method("goal_blind"), episodes, protocol, types)
    zeros = side_protocols(L=8, H=4, episodes_per_rule=1, eval_seed=0, rules=[30])[0][1]
    assert protocol_differences(zeros.as_dict(), protocol.as_dict()) == ["goal_mode ('zeros' vs 'derived')"]


def test_tape_env_with_a_goal_per_episode_agrees_with_the_batched_env_step_for_step():
    from tapebench.envs.tape_env import TapeEnv

    episodes = episode_set([30, 90, 110], 2, 10, eval_seed=9, goal_mode="derived", goal_steps=4)
    n, H = len(episodes), 6
    batched = BatchedTapeEnv(n, L=10, H=H, rules=[30, 90, 110], autoreset=False, goal_in_obs=True)
    obs = batched.load(episodes.tapes, episodes.rules, goals=episodes.goals).numpy()
    envs = [TapeEnv(rule=int(z), L=10, H=H, goal_in_obs=True) for z in episodes.rules]
    single = np.stack([env.reset(options={"tape": tape, "goal": goal, "rule": int(z)})[0] for env, tape, goal, z in
                       zip(envs, episodes.tapes, episodes.goals, episodes.rules)])
    assert obs.shape == (n, 21) and envs[0].observation_space.shape == (21,)
    assert np.array_equal(obs, single)
    rng = np.random.default_rng(0)
    for _ in range(H):
        actions = rng.integers(0, 10, n)
        obs, reward, terminated, truncated, info = batched.step(torch.as_tensor(actions))
        steps = [env.step(int(a)) for env, a in zip(envs, actions)]
        assert np.array_equal(obs.numpy(), np.stack([s[0] for s in steps]))
        assert np.allclose(reward.numpy(), [s[1] for s in steps])
        assert terminated.tolist() == [s[2] for s in steps]
        assert np.allclose(info["dist"].numpy(), [s[4]["dist"] for s in steps])
    # a reset without options["goal"] returns to the env's own goal (the all-zero tape)
    assert not envs[0].reset(seed=1)[0][10:20].any()
