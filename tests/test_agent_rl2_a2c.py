"""RL2-A2C: the shared contract (learning, SIGKILL resume, per-episode evaluation state) and the
method's own mechanics: the recurrent state of a row is reset exactly when its episode ends, the
update re-runs the core from the rollout's stored hidden state (its logits equal the acting ones),
GAE with truncation, and the evaluation policy's per-row recurrent state."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from agent_contract import assert_per_episode_policy, assert_sigkill_resume_bit_identical, learned_success

from tapebench.envs.batched import BatchedTapeEnv
from tapebench.episodes.sets import episode_set
from tapebench.evaluation.runner import run_episodes
from tapebench.methods.common import gae
from tapebench.methods.contract import EnvSpec
from tapebench.methods.rl2_a2c import policy_inputs
from tapebench.registry import build_config, get_method, make_agent
from tapebench.training import checkpoint as ckpt
from tapebench.training.loop import TrainSpec, train

SMALL = {"num_envs": 8, "num_steps": 16, "hidden_size": 16}


def small_agent(L=8, H=8, **overrides):
    torch.manual_seed(0)
    return make_agent("rl2_a2c", build_config("rl2_a2c", {**SMALL, **overrides}), EnvSpec.for_tape(L, H),
                      10_000, "cpu")



pytestmark = pytest.mark.usefixtures("one_torch_thread")

# --- registry and config -------------------------------------------------------------------------
def test_registered_as_task_inference():
    method = get_method("rl2_a2c")
    assert method.trains and method.family == "task_inference" and method.display_name == "RL2-A2C"


@pytest.mark.parametrize("overrides,needle", [
    ({"num_steps": 0}, "num_steps must be >= 1"),
    ({"gae_lambda": 1.5}, r"gae_lambda must be in \[0, 1\]"),
    ({"ent_coef": -0.1}, "ent_coef must be >= 0"),
    ({"learning_rate": 0.0}, "learning_rate and max_grad_norm must be > 0"),
])
def test_config_rejects_bad_values(overrides, needle):
    with pytest.raises(ValueError, match=needle):
        build_config("rl2_a2c", overrides)


# --- recurrent state in training ------------------------------------------------------------------
def test_recurrent_state_of_a_row_is_reset_exactly_when_its_episode_ends():
    agent = small_agent(num_envs=4, num_steps=5)
    env = BatchedTapeEnv(4, L=8, H=8, rules=[0, 4, 30, 90, 110], seed=3)
    obs = env.reset()
    ends = carries = 0
    for _ in range(60):
        actions = agent.act(obs)
        _, new_hidden, _, _ = agent._pending
        next_obs, rewards, terminated, truncated, info = env.step(actions)
        agent.observe(obs, actions, rewards, info["final_obs"], terminated, truncated)
        m = agent.memory
        for row in range(4):
            if terminated[row] or truncated[row]:
                ends += 1
                assert torch.equal(m.hidden[row], torch.zeros_like(m.hidden[row]))
                assert torch.equal(m.prev_action[row], torch.zeros(8))
                assert m.prev_reward[row] == 0 and m.first[row] == 1
            else:
                carries += 1
                assert torch.equal(m.hidden[row], new_hidden[row]) and bool(new_hidden[row].abs().sum() > 0)
                assert torch.equal(m.prev_action[row], F.one_hot(actions[row], 8).float())
                assert m.prev_reward[row] == rewards[row] and m.first[row] == 0
        agent.update()
        obs = next_obs
    assert ends >= 8 and carries >= 100


def test_update_replays_the_rollout_from_its_stored_hidden_state():
    # rollouts of 5 steps with episodes of up to 8: most rollouts start in the middle of episodes
    agent = small_agent(num_envs=4, num_steps=5)
    env = BatchedTapeEnv(4, L=8, H=8, rules=[0, 4, 30, 90, 110], seed=4)
    obs = env.reset()
    mid_episode_starts = 0
    for rollout in range(6):
        acting_logits = []
        for t in range(5):
            if t == 0:
                start = agent.memory.hidden.clone()
            with torch.no_grad():
                logits, _, _ = agent.network.step(agent.memory.inputs(obs), agent.memory.hidden)
            acting_logits.append(logits)
            actions = agent.act(obs)
            next_obs, rewards, terminated, truncated, info = env.step(actions)
            agent.observe(obs, actions, rewards, info["final_obs"], terminated, truncated)
            obs = next_obs
        r = agent.rollout
        assert torch.equal(r.start_hidden, start)
        replayed_logits, replayed_values = agent.replay_rollout()
        assert torch.equal(replayed_logits[0], acting_logits[0])          # first step: exactly
        assert torch.allclose(replayed_logits, torch.stack(acting_logits), atol=1e-6)
        assert torch.allclose(replayed_values, r.values, atol=1e-6)
        logprobs = torch.log_softmax(replayed_logits, dim=-1).gather(2, r.actions.unsqueeze(2)).squeeze(2)
        assert torch.allclose(logprobs, r.logprobs, atol=1e-5)
        mid = start.abs().sum(dim=1) > 0
        mid_episode_starts += int(mid.sum())
        if mid.any():   # the stored hidden state matters: replaying from zeros gives other logits
            r.start_hidden.zero_()
            assert not torch.allclose(agent.replay_rollout()[0][0][mid], replayed_logits[0][mid], atol=1e-4)
            r.start_hidden.copy_(start)
        assert agent.update()                                              # the rollout is full: it learns
    assert mid_episode_starts >= 8


def test_gae_with_truncation_matches_a_hand_computed_case():
    # one row, 3 steps; the episode is truncated at step 1 (its reward already carries γ·V(last obs) = 0.9·3)
    gamma, lam = 0.9, 0.8
    rewards = torch.tensor([[1.0], [2.0 + 0.9 * 3.0], [3.0]])
    values = torch.tensor([[0.5], [1.0], [2.0]])
    dones = torch.tensor([[0.0], [1.0], [0.0]])
    advantages, returns = gae(rewards, values, dones, torch.tensor([4.0]), gamma, lam)
    a2 = 3.0 + 0.9 * 4.0 - 2.0                     # new episode: bootstraps from the value after the rollout
    a1 = 2.0 + 2.7 - 1.0                           # truncated: no bootstrap from the next episode's value
    a0 = (1.0 + 0.9 * 1.0 - 0.5) + gamma * lam * a1
    assert torch.allclose(advantages, torch.tensor([[a0], [a1], [a2]]))
    assert torch.allclose(returns, advantages + values)


def test_truncated_steps_bootstrap_from_the_true_last_observation_and_terminated_ones_do_not():
    agent = small_agent(num_envs=3, num_steps=2, gamma=0.9, gae_lambda=0.8)
    gen = torch.Generator().manual_seed(0)
    obs = torch.randint(0, 2, (3, 9), generator=gen).float()
    last = torch.randint(0, 2, (3, 9), generator=gen).float()
    actions = agent.act(obs)
    _, hidden, _, _ = agent._pending
    rewards = torch.tensor([-0.25, 1.0, -0.5])
    terminated, truncated = torch.tensor([False, True, False]), torch.tensor([True, False, False])
    agent.observe(obs, actions, rewards, last, terminated, truncated)
    # row 0 truncated: + γ·V(after the core has read the last transition); row 1 terminated, row 2 goes on
    last_inputs = policy_inputs(last, F.one_hot(actions, 8).float(), rewards, torch.zeros(3))
    with torch.no_grad():
        _, last_values, _ = agent.network.step(last_inputs, hidden)
    stored = agent.rollout.rewards[0]
    assert torch.allclose(stored[0], rewards[0] + 0.9 * last_values[0])
    assert stored[1] == rewards[1] and stored[2] == rewards[2]
    assert torch.equal(agent.rollout.dones[0], torch.tensor([1.0, 1.0, 0.0]))
    # second step, then the agent's advantages against the recursion written out by hand
    obs2 = torch.randint(0, 2, (3, 9), generator=gen).float()
    actions2 = agent.act(obs2)
    next2 = torch.randint(0, 2, (3, 9), generator=gen).float()
    no = torch.zeros(3, dtype=torch.bool)
    agent.observe(obs2, actions2, torch.tensor([-0.1, -0.2, -0.3]), next2, no, no)
    with torch.no_grad():
        _, v_next, _ = agent.network.step(agent.memory.inputs(next2), agent.memory.hidden)
    advantages, _ = agent.advantages()
    r, v = agent.rollout.rewards, agent.rollout.values
    a1 = r[1] + 0.9 * v_next - v[1]
    a0 = r[0] - v[0] + torch.tensor([0.0, 0.0, 1.0]) * (0.9 * v[1, 2] + 0.9 * 0.8 * a1[2])
    assert torch.allclose(advantages[1], a1, atol=1e-6) and torch.allclose(advantages[0], a0, atol=1e-6)


# --- evaluation policy ----------------------------------------------------------------------------
def test_evaluation_policy_feeds_each_row_its_previous_action_and_reward():
    agent = small_agent()
    policy = agent.evaluation_policy()
    episodes = episode_set([30, 110], 2, 8, eval_seed=3)
    env = BatchedTapeEnv(4, L=8, H=8, rules=[30, 110], autoreset=False)
    for _ in range(2):   # twice through the same policy object: begin() resets every row
        obs = env.load(episodes.tapes, episodes.rules)
        policy.begin(episodes)
        hidden = torch.zeros(4, 32)
        prev_action, prev_reward, first = torch.zeros(4, 8), torch.zeros(4), torch.ones(4)
        for _ in range(6):
            with torch.no_grad():
                logits, _, hidden = agent.network.step(policy_inputs(obs, prev_action, prev_reward, first), hidden)
            actions = policy.act(obs)
            assert torch.equal(actions, logits.argmax(dim=1))
            next_obs, rewards, terminated, truncated, _ = env.step(actions)
            policy.observe(obs, actions, rewards, next_obs, terminated, truncated)
            prev_action, prev_reward, first = F.one_hot(actions, 8).float(), rewards, torch.zeros(4)
            obs = next_obs


@pytest.fixture(scope="module")
def briefly_trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("rl2_brief")
    spec = TrainSpec(agent="rl2_a2c", rules=(4, 30, 110), seed=1, hyperparameters=SMALL, L=8, H=8,
                     total_steps=1024, eval_every=1024)
    manifest = train(spec, run, quiet=True)
    agent, _ = ckpt.load_policy(run / manifest["checkpoints"][-1]["file"])
    return agent


def test_evaluation_policy_keeps_per_episode_state(briefly_trained):
    assert_per_episode_policy(lambda: briefly_trained.evaluation_policy())


def test_greedy_act_is_refused_in_favour_of_the_evaluation_policy(briefly_trained):
    with pytest.raises(ValueError, match="evaluation_policy"):
        briefly_trained.act(torch.zeros(2, 9), greedy=True)


# --- the shared contract --------------------------------------------------------------------------
def test_resume_after_sigkill_is_bit_identical(tmp_path):
    # 8 x 16 = 128-step rollouts straddle the checkpoints at 304, 600 and 904 steps: the resumed run
    # restarts mid-rollout with the stored hidden states, previous actions and rewards
    params = {"agent": SMALL, "env": {"L": 8, "H": 8}, "training": {"total_steps": 1200, "eval_every": 300}}
    assert_sigkill_resume_bit_identical("rl2_a2c", params, tmp_path)


def test_learns_fixed_rule_4(tmp_path):
    before, after = learned_success("rl2_a2c", 4, 16, 16, 20_480, tmp_path)
    assert before < 0.9
    assert after >= 0.9
