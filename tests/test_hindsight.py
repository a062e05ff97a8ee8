"""Hindsight relabelling (methods/hindsight.py; DQN's her_strategy / her_k) in the multi-goal protocol: every
relabelled reward and termination is what the environment returns for the new goal, bit for bit; each relabelled
goal is a tape its episode reached at or after the transition; k copies per transition; refused with the fixed goal."""
from __future__ import annotations

import pytest
import torch

from tapebench.envs.batched import BatchedTapeEnv
from tapebench.episodes.sets import TrainingGoals
from tapebench.methods import dqn, hindsight
from tapebench.methods.contract import EnvSpec
from tapebench.training.loop import TrainSpec, train

pytestmark = pytest.mark.usefixtures("one_torch_thread")

L, H, K, RULE = 8, 8, 3, 30


def played_episodes(num_envs=3, steps=40, seed=4):
    """Rows of a derived-goal training env played with random flips: per row, its finished episodes as
    (obs (T, 2L+1), actions (T,), next_obs (T, 2L+1))."""
    env = BatchedTapeEnv(num_envs, L=L, H=H, rules=[RULE], seed=seed, goal_in_obs=True,
                         goal_sampler=TrainingGoals(seed, num_envs, goal_steps=4))
    obs = env.reset()
    current = [[] for _ in range(num_envs)]
    episodes = []
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        actions = torch.randint(0, L, (num_envs,), generator=generator)
        next_obs, reward, terminated, truncated, info = env.step(actions)
        final = info["final_obs"]
        for row in range(num_envs):
            current[row].append((obs[row], actions[row], final[row]))
            if terminated[row] or truncated[row]:
                o, a, n = zip(*current[row])
                episodes.append((torch.stack(o), torch.stack(a), torch.stack(n)))
                current[row] = []
        obs = next_obs
    return episodes


def environment_outcome(obs, actions, goals):
    """What the environment returns for these transitions played towards `goals`: (reward, terminated, next tape)."""
    env = BatchedTapeEnv(len(actions), L=L, H=H, rules=[RULE], autoreset=False, goal_in_obs=True)
    env.load(obs[:, :L].to(torch.uint8), [RULE] * len(actions), goals=goals.to(torch.uint8))
    next_obs, reward, terminated, _, _ = env.step(actions)
    return reward, terminated, next_obs[:, :L]


def test_relabelled_rewards_are_the_environments_for_goals_reached_later_in_the_same_episode():
    episodes = played_episodes()
    assert len(episodes) >= 6 and any(len(e[1]) > 1 for e in episodes)
    torch.manual_seed(0)
    relabels = 0
    for obs, actions, next_obs in episodes:
        T = len(actions)
        (r_obs, r_actions, r_rewards, r_next, r_terminated), reached = hindsight.future_relabels(
            obs, actions, next_obs, L, K, success_bonus=1.0)
        assert len(r_actions) == K * T                                    # k copies of each transition
        t = torch.arange(T).repeat_interleave(K)
        assert torch.equal(r_actions, actions[t]) and ((reached >= t) & (reached < T)).all()
        goals = next_obs[reached, :L]                                     # a tape the episode reached at j >= t
        assert torch.equal(r_obs[:, L:2 * L], goals) and torch.equal(r_next[:, L:2 * L], goals)
        # everything but the goal is the transition's own
        assert torch.equal(r_obs[:, :L], obs[t, :L]) and torch.equal(r_obs[:, -1], obs[t, -1])
        assert torch.equal(r_next[:, :L], next_obs[t, :L]) and torch.equal(r_next[:, -1], next_obs[t, -1])
        reward, terminated, next_tape = environment_outcome(obs[t], actions[t], goals)
        assert torch.equal(next_tape.float(), r_next[:, :L])              # the env reaches the stored tape
        assert torch.equal(r_rewards, reward) and torch.equal(r_terminated, terminated)   # exact equality
        assert r_terminated[torch.nonzero(reached == t).squeeze(1)].all()  # its own outcome: success
        relabels += len(r_actions)
    assert relabels >= 6 * K


def test_dqn_with_her_stores_k_relabels_of_each_finished_episodes_transitions_and_trains(tmp_path):
    spec = TrainSpec(agent="dqn", rules=(30, 204), seed=0, L=L, H=H, total_steps=256, eval_every=128,
                     hyperparameters={"num_envs": 4, "buffer_size": 5000, "learning_starts": 32, "batch_size": 16,
                                      "hidden_size": 16, "her_strategy": "future", "her_k": K},
                     goal="derived", goal_steps=4)
    config = dqn.Config(num_envs=4, buffer_size=5000, her_strategy="future", her_k=K)
    agent = dqn.make(config, spec.env_spec(), 256, "cpu")
    env = BatchedTapeEnv(4, L=L, H=H, rules=[30, 204], seed=1, goal_in_obs=True,
                         goal_sampler=TrainingGoals(1, 4, goal_steps=4))
    obs = env.reset()
    for _ in range(30):
        actions = agent.act(obs)
        next_obs, reward, terminated, truncated, info = env.step(actions)
        agent.observe(obs, actions, reward, info["final_obs"], terminated, truncated)
        obs = next_obs
    in_progress = sum(agent.hindsight.length)
    finished = agent.env_steps - in_progress
    assert finished > 0 and agent.replay.size == agent.env_steps + K * finished
    # the real transitions and their relabels: every stored reward is the env's for the stored goal
    n = agent.replay.size
    stored = agent.replay.obs[:n], agent.replay.actions[:n], agent.replay.next_obs[:n]
    goals = stored[2][:, L:2 * L]
    assert torch.equal(stored[0][:, L:2 * L], goals)     # a transition's goal is one goal, in o_t and o_{t+1}
    assert torch.equal(agent.replay.terminated[:n].bool(), (stored[2][:, :L] == goals).all(1))
    manifest = train(spec, tmp_path / "run", quiet=True)
    assert manifest["checkpoints"]


@pytest.mark.parametrize("agent, relabels", [("dqn_her", True), ("dqn", False)])
def test_the_dqn_her_row_relabels_through_the_training_loop_and_dqn_does_not(tmp_path, monkeypatch, agent, relabels):
    """The row `dqn_her` is DQN with her_strategy "future" by default: a short derived-goal run through `train`
    relabels each finished episode (k copies of each of its transitions); the row `dqn` relabels nothing."""
    relabelled = []

    def counting_relabels(obs, actions, next_obs, L_, k, *args, **kwargs):
        result = future_relabels(obs, actions, next_obs, L_, k, *args, **kwargs)
        relabelled.append((len(actions), k, len(result[0][1])))
        return result

    future_relabels = hindsight.future_relabels
    monkeypatch.setattr(hindsight, "future_relabels", counting_relabels)
    spec = TrainSpec(agent=agent, rules=(30, 204), seed=0, L=L, H=H, total_steps=128, eval_every=128,
                     hyperparameters={"num_envs": 4, "buffer_size": 2000, "learning_starts": 32, "batch_size": 16,
                                      "hidden_size": 16}, goal="derived", goal_steps=4)
    manifest = train(spec, tmp_path / "run", quiet=True)
    assert manifest["checkpoints"]
    if relabels:
        assert len(relabelled) >= 4 and all(k == dqn.HERConfig().her_k and n == k * T for T, k, n in relabelled)
    else:
        assert relabelled == []


def test_her_is_refused_with_the_fixed_goal_and_bad_values_name_the_key(tmp_path):
    with pytest.raises(ValueError, match="her_strategy = 'future' relabels the goals of the multi-goal protocol"):
        dqn.make(dqn.Config(her_strategy="future"), EnvSpec.for_tape(L, H), 100, "cpu")
    with pytest.raises(ValueError, match=r"her_strategy must be one of \['none', 'future'\], got 'final'"):
        dqn.Config(her_strategy="final").check()
    with pytest.raises(ValueError, match="her_k must be an integer >= 1, got 0"):
        dqn.Config(her_strategy="future", her_k=0).check()
    with pytest.raises(ValueError, match="her_strategy"):
        train(TrainSpec(agent="rad_dqn", rules=(30,), seed=0, L=L, H=H, total_steps=16, eval_every=16,
                        hyperparameters={"her_strategy": "future"}), tmp_path / "run", quiet=True)
    with pytest.raises(ValueError, match="her_strategy = 'future' relabels the goals of the multi-goal protocol"):
        train(TrainSpec(agent="dqn_her", rules=(30,), seed=0, L=L, H=H, total_steps=16, eval_every=16),
              tmp_path / "fixed", quiet=True)


def test_a_resumed_her_agent_relabels_the_episodes_in_progress_as_the_uninterrupted_one():
    spec = EnvSpec.for_tape(L, H, goal_in_obs=True, success_bonus=1.0)
    config = dqn.Config(num_envs=2, buffer_size=2000, hidden_size=8, her_strategy="future", her_k=2)
    env = BatchedTapeEnv(2, L=L, H=H, rules=[30], seed=2, goal_in_obs=True, goal_sampler=TrainingGoals(2, 2, 4))
    obs, transitions = env.reset(), []
    generator = torch.Generator().manual_seed(5)
    for _ in range(17):
        actions = torch.randint(0, L, (2,), generator=generator)
        next_obs, reward, terminated, truncated, info = env.step(actions)
        transitions.append((obs, actions, reward, info["final_obs"], terminated, truncated))
        obs = next_obs

    def observe(agent, steps):
        for i in steps:
            torch.manual_seed(100 + i)          # the relabels' draws, the same for both at each step
            agent.observe(*transitions[i])

    torch.manual_seed(0)
    uninterrupted = dqn.make(config, spec, 100, "cpu")
    observe(uninterrupted, range(17))
    torch.manual_seed(0)
    interrupted = dqn.make(config, spec, 100, "cpu")
    observe(interrupted, range(5))
    assert any(interrupted.hindsight.length)           # an episode in progress at the interruption
    resumed = dqn.make(config, spec, 100, "cpu")
    resumed.load_state_dict(interrupted.state_dict())
    observe(resumed, range(5, 17))
    n = uninterrupted.replay.size
    assert n == resumed.replay.size and n > 17 * 2
    for name in dqn.ReplayBuffer.FIELDS:
        assert torch.equal(getattr(uninterrupted.replay, name)[:n], getattr(resumed.replay, name)[:n])
