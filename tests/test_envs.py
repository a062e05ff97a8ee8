"""TapeEnv (Gymnasium) follows docs/protocol.md#environment; BatchedTapeEnv agrees with it step for step."""
from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import tapebench  # noqa: F401  (registers tapebench/Tape-v0)
from tapebench.ca import reference
from tapebench.envs import ENV_ID
from tapebench.envs.batched import BatchedTapeEnv
from tapebench.envs.tape_env import TapeEnv

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def one_hot(L: int, *cells: int) -> np.ndarray:
    tape = np.zeros(L, dtype=np.uint8)
    tape[list(cells)] = 1
    return tape


# --- TapeEnv --------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    dict(rule=30, L=32, H=32),
    dict(rule=110, L=3, H=2),   # (the checker itself rejects H = 1 as 'truncates after 1 step')
    dict(rule=0, L=64, H=5, goal=[1, 0] * 32, success_bonus=2.5),
    dict(rules=[0, 4, 30, 110, 204], L=16, H=16),
])
def test_gymnasium_make_passes_env_checker(kwargs):
    env = gymnasium.make(ENV_ID, **kwargs)
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=0)
    L = kwargs["L"]
    assert obs.dtype == np.float32 and obs.shape == (L + 1,)
    assert env.observation_space.contains(obs)
    assert env.action_space == gymnasium.spaces.Discrete(L)
    assert set(info) >= {"dist", "rule"}


def test_observation_is_tape_and_time_fraction():
    env = TapeEnv(rule=204, L=6, H=4)
    tape = np.array([1, 0, 1, 1, 0, 0], dtype=np.uint8)
    obs, info = env.reset(seed=0, options={"tape": tape})
    assert obs.tolist() == [1, 0, 1, 1, 0, 0, 0.0]
    assert info["dist"] == 0.5 and info["rule"] == 204
    obs, *_ = env.step(1)  # rule 204 is the identity: the flip stays
    assert obs.tolist() == [1, 1, 1, 1, 0, 0, np.float32(1 / 4)]
    assert env.unwrapped.t == 1


def test_reward_termination_and_truncation_follow_spec():
    env = TapeEnv(rule=204, L=5, H=3, success_bonus=2.0)
    env.reset(seed=0, options={"tape": one_hot(5, 1, 3)})
    obs, reward, terminated, truncated, info = env.step(1)   # one 1 left
    assert (reward, terminated, truncated, info["dist"]) == (-0.2, False, False, 0.2)
    obs, reward, terminated, truncated, info = env.step(3)   # the last 1 flipped: strict success
    assert (reward, terminated, truncated, info["dist"]) == (2.0, True, False, 0.0)
    assert obs[:5].tolist() == [0] * 5

    env.reset(seed=0, options={"tape": one_hot(5, 1, 3)})
    for t in range(1, 4):
        obs, reward, terminated, truncated, info = env.step(0)   # 0 -> 1 -> 0 -> 1
        assert not terminated
        assert truncated == (t == 3)
        assert reward == pytest.approx(-info["dist"])
    assert obs[-1] == 1.0


def test_success_on_the_last_step_is_terminated_not_truncated():
    env = TapeEnv(rule=204, L=4, H=1)
    env.reset(seed=0, options={"tape": one_hot(4, 2)})
    _, reward, terminated, truncated, _ = env.step(2)
    assert (reward, terminated, truncated) == (1.0, True, False)


def test_nonzero_goal_distance_and_success():
    goal = np.array([1, 1, 0, 0, 1], dtype=np.uint8)
    env = TapeEnv(rule=204, L=5, H=8, goal=goal)
    tape = goal.copy()
    tape[4] ^= 1
    _, info = env.reset(seed=0, options={"tape": tape})
    assert info["dist"] == 0.2
    _, reward, terminated, _, info = env.step(4)
    assert terminated and reward == 1.0 and info["dist"] == 0.0


def test_rule_set_is_sampled_at_every_reset_and_seeding_is_deterministic():
    rules = [3, 90, 200]
    env = TapeEnv(rules=rules, L=8, H=4)
    seen = set()
    for seed in range(60):
        obs, info = env.reset(seed=seed)
        seen.add(info["rule"])
        assert not np.array_equal(obs[:8], np.zeros(8))   # never starts at the goal
    assert seen == set(rules)
    a, _ = env.reset(seed=7)
    rule_a = env.unwrapped.rule
    b, _ = env.reset(seed=7)
    assert np.array_equal(a, b) and env.unwrapped.rule == rule_a


def test_initial_tape_is_never_the_goal():
    env = TapeEnv(rule=30, L=3, H=2, goal=[1, 0, 1])
    env.reset(seed=0)
    for _ in range(200):
        obs, _ = env.reset()
        assert obs[:3].tolist() != [1, 0, 1]


def test_tape_env_transition_is_the_reference_transition():
    env = TapeEnv(rule=110, L=11, H=50)
    obs, _ = env.reset(seed=3)
    rng = np.random.default_rng(0)
    tape = obs[:11].astype(np.uint8)
    for _ in range(20):
        a = int(rng.integers(11))
        tape = reference.transition(tape, a, 110)
        obs, *_ = env.step(np.int64(a))
        assert np.array_equal(obs[:11], tape)


# --- BatchedTapeEnv vs TapeEnv --------------------------------------------------------------

def _compare_step(tape_envs, results, batched_out):
    obs, reward, terminated, truncated, info = batched_out
    final_obs = info["final_obs"].cpu().numpy() if "final_obs" in info else obs.cpu().numpy()
    for i, (t_obs, t_reward, t_term, t_trunc, t_info) in enumerate(results):
        assert np.array_equal(final_obs[i], t_obs), i
        assert reward[i].item() == np.float32(t_reward), i
        assert bool(terminated[i]) == t_term and bool(truncated[i]) == t_trunc, i
        assert info["dist"][i].item() == np.float32(t_info["dist"]), i
        assert int(info["rule"][i]) == t_info["rule"] and int(info["t"][i]) == t_info["t"], i


@pytest.mark.parametrize("goal", [None, [0, 1, 1, 0, 0, 1, 0]])
@pytest.mark.parametrize("device", DEVICES)
def test_batched_env_agrees_with_tape_env_step_for_step(device, goal):
    L, H = 7, 5
    goal_tape = np.zeros(L, dtype=np.uint8) if goal is None else np.asarray(goal, dtype=np.uint8)
    rule_set = [0, 30, 90, 110, 204, 184]
    rng = np.random.default_rng(11)
    rules = [204, 0, 30, 110, 90, 184, 204, 30]
    tapes = rng.integers(0, 2, (len(rules), L), dtype=np.uint8)
    tapes[0] = goal_tape ^ one_hot(L, 3)     # row 0: rule 204, flipping cell 3 first succeeds
    tapes[(tapes == goal_tape).all(1), 0] ^= 1
    n = len(rules)
    batched = BatchedTapeEnv(n, L=L, H=H, rules=rule_set, goal=goal, device=device, seed=5,
                             success_bonus=1.5)
    obs = batched.load(tapes, rules)
    tape_envs = [TapeEnv(rule=r, L=L, H=H, rules=rule_set, goal=goal, success_bonus=1.5) for r in rules]
    for env, tape, rule, row in zip(tape_envs, tapes, rules, obs.cpu().numpy()):
        t_obs, _ = env.reset(seed=0, options={"tape": tape, "rule": rule})
        assert np.array_equal(t_obs, row)

    successes = truncations = resets = 0
    for step in range(40):
        actions = rng.integers(0, L, n)
        if step == 0:
            actions[0] = 3
        results = [env.step(int(a)) for env, a in zip(tape_envs, actions)]
        out = batched.step(torch.as_tensor(actions, device=device))
        _compare_step(tape_envs, results, out)
        obs, _, terminated, truncated, info = out
        done = (terminated | truncated).cpu().numpy()
        successes += int(terminated.sum())
        truncations += int(truncated.sum())
        new_tapes, new_rules = batched.tapes.cpu().numpy(), batched.rules.cpu().numpy()
        for i in np.flatnonzero(done):
            resets += 1
            # auto-reset: a fresh episode at t = 0 with a rule drawn from the set
            assert int(new_rules[i]) in rule_set and int(batched.t[i]) == 0
            assert obs[i, L].item() == 0.0
            assert not np.array_equal(new_tapes[i], goal_tape)
            t_obs, _ = tape_envs[i].reset(options={"tape": new_tapes[i], "rule": int(new_rules[i])})
            assert np.array_equal(obs[i].cpu().numpy(), t_obs)
        assert np.array_equal(obs[~done].cpu().numpy(), info["final_obs"][~done].cpu().numpy())
    assert successes > 0 and truncations > 0 and resets > n


def test_batched_first_step_success_and_truncation_rows():
    env = BatchedTapeEnv(3, L=5, H=1, rules=[204, 0])
    env.load([one_hot(5, 2), one_hot(5, 0, 1), one_hot(5, 4)], [204, 204, 0])
    obs, reward, terminated, truncated, info = env.step(torch.tensor([2, 0, 1]))
    assert terminated.tolist() == [True, False, True]
    assert truncated.tolist() == [False, True, False]
    assert torch.equal(reward, torch.tensor([1.0, -0.2, 1.0]))
    assert info["final_obs"][:, -1].tolist() == [1.0, 1.0, 1.0]
    assert info["final_obs"][1, :5].tolist() == [0, 1, 0, 0, 0]
    assert obs[:, -1].tolist() == [0.0, 0.0, 0.0]
    assert env.t.tolist() == [0, 0, 0]


def test_batched_without_autoreset_keeps_stepping_the_same_episode():
    env = BatchedTapeEnv(2, L=4, H=2, rules=[204], autoreset=False)
    env.load([one_hot(4, 1), one_hot(4, 1, 2)], [204, 204])
    obs, _, terminated, truncated, info = env.step(torch.tensor([1, 1]))
    assert "final_obs" not in info
    assert terminated.tolist() == [True, False] and obs[:, :4].tolist() == [[0] * 4, [0, 0, 1, 0]]
    obs, _, terminated, truncated, info = env.step(torch.tensor([0, 0]))
    assert truncated.tolist() == [True, True] and env.t.tolist() == [2, 2]


def test_batched_reset_draws_rules_from_the_set_and_never_the_goal():
    env = BatchedTapeEnv(4096, L=3, H=2, rules=[3, 7, 200], goal=[0, 1, 1], seed=1)
    obs = env.reset()
    assert set(env.rules.tolist()) == {3, 7, 200}
    assert not (env.tapes == torch.tensor([0, 1, 1], dtype=torch.uint8)).all(dim=1).any()
    assert obs.shape == (4096, 4) and obs.dtype == torch.float32
    assert torch.equal(obs[:, :3], env.tapes.float()) and (obs[:, 3] == 0).all()
    for _ in range(6):   # auto-resets keep drawing from the set and avoiding the goal
        env.step(torch.randint(0, 3, (4096,)))
        assert set(env.rules.tolist()) <= {3, 7, 200}
    started = env.t == 0
    assert started.any()
    assert not (env.tapes[started] == torch.tensor([0, 1, 1], dtype=torch.uint8)).all(dim=1).any()


def test_batched_seeding_is_deterministic():
    def trajectory(seed):
        env = BatchedTapeEnv(64, L=9, H=4, rules=range(256), seed=seed)
        env.reset()
        gen = torch.Generator().manual_seed(0)
        rows = []
        for _ in range(10):
            obs, reward, *_ = env.step(torch.randint(0, 9, (64,), generator=gen))
            rows.append(torch.cat([obs.flatten(), reward, env.rules.float()]))
        return torch.stack(rows)

    assert torch.equal(trajectory(3), trajectory(3))
    assert not torch.equal(trajectory(3), trajectory(4))
    env = BatchedTapeEnv(8, L=9, H=4, rules=range(256), seed=0)
    assert torch.equal(env.reset(seed=12), env.reset(seed=12))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_batched_cuda_matches_cpu():
    outs = []
    for device in ("cpu", "cuda"):
        env = BatchedTapeEnv(256, L=16, H=8, rules=range(256), seed=2, device=device)
        env.reset()
        gen = torch.Generator().manual_seed(0)
        rows = []
        for _ in range(30):
            obs, reward, term, trunc, info = env.step(torch.randint(0, 16, (256,), generator=gen).to(device))
            rows.append(torch.cat([obs.flatten(), reward, info["final_obs"].flatten()]).cpu())
        outs.append(torch.stack(rows))
    assert torch.equal(outs[0], outs[1])
