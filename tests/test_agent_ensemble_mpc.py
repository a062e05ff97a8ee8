"""Ensemble MPC (± IG): the shared contract (learning, SIGKILL resume, per-episode evaluation state) and
the method's own mechanics: the training context of a row is reset exactly when its episode ends; the
planner with a perfect model plays exactly like the true-dynamics MPC (same candidates, scores, ties);
β = 0 turns the IG variant into the plain one; the disagreement is 0 iff the members agree; the
world-model rollout is shaped, bounded, deterministic, side-effect free and accurate on a learned rule."""
from __future__ import annotations

import inspect

import math
import random

import numpy as np
import pytest
import torch
from agent_contract import assert_per_episode_policy, assert_sigkill_resume_bit_identical, learned_success

from tapebench.ca import reference
from tapebench.envs.batched import BatchedTapeEnv
from tapebench.episodes.sets import episode_set
from tapebench.episodes.streams import candidate_actions, episode_keys, step_key
from tapebench.evaluation.runner import run_episodes
from tapebench.methods.contract import EnvSpec, EpisodeBatch
from tapebench.methods.ensemble_mpc import Config, IGConfig, candidate_sequences, disagreement, flip_cells
from tapebench.methods.mpc import MPCConfig, MPCPolicy
from tapebench.registry import build_config, get_method, make_agent
from tapebench.training import checkpoint as ckpt
from tapebench.training.loop import TrainSpec, train

SMALL = {"num_envs": 4, "ensemble_size": 3, "hidden_size": 16, "batch_size": 16, "learning_starts": 200,
         "buffer_size": 2000, "plan_horizon": 3, "candidates": 16}
PLANNER = {"plan_horizon": 4, "candidates": 48, "planner_seed": 5}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def fresh_agent(method="ensemble_mpc", L=8, H=8, **overrides):
    torch.manual_seed(0)
    return make_agent(method, build_config(method, {**SMALL, **overrides}), EnvSpec.for_tape(L, H), 10_000, "cpu")


class Recorder:
    """An evaluation policy wrapper that logs every action it plays."""

    def __init__(self, policy):
        self.policy, self.actions = policy, []

    def begin(self, batch):
        self.policy.begin(batch)

    def act(self, obs):
        actions = self.policy.act(obs)
        self.actions.append(actions.clone())
        return actions

    def observe(self, *transition):
        self.policy.observe(*transition)


def true_dynamics(rule: int, L: int, members: int = 1):
    """A perfect `member_probs`: every member returns the true successor of the post-action tape (the
    reference kernel, row by row)."""
    def member_probs(inputs):
        post = inputs[:, 2 * L + 1:].to(torch.uint8).numpy()
        successors = np.stack([reference.ca_step(row, rule) for row in post])
        return torch.from_numpy(successors).float().unsqueeze(0).expand(members, -1, -1)
    return member_probs


# --- registry and config -------------------------------------------------------------------------
def test_two_world_model_rows_from_one_module():
    plain, ig = get_method("ensemble_mpc"), get_method("ensemble_mpc_ig")
    for method in (plain, ig):
        assert method.trains and method.family == "world_model" and method.world_model
        assert not method.every_checkpoint
    assert (plain.display_name, ig.display_name) == ("Ensemble MPC", "Ensemble MPC + IG")
    assert inspect.unwrap(plain.make_agent) is inspect.unwrap(ig.make_agent)
    assert build_config("ensemble_mpc", {}).ig_weight == 0.0 and build_config("ensemble_mpc_ig", {}).ig_weight > 0
    defaults = build_config("ensemble_mpc", {})
    assert (defaults.ensemble_size, defaults.plan_horizon, defaults.candidates) == (5, 8, 512)


@pytest.mark.parametrize("method,overrides,needle", [
    ("ensemble_mpc", {"ensemble_size": 0}, "ensemble_size must be >= 1"),
    ("ensemble_mpc", {"candidates": 0}, "candidates must be >= 1"),
    ("ensemble_mpc_ig", {"ig_weight": -0.1}, r"ig_weight must be in \[0, 100\]"),
    ("ensemble_mpc", {"learning_rate": 0.0}, "learning_rate must be > 0"),
    ("ensemble_mpc", {"plan_rows": 100}, "plan_rows must be >= candidates"),
])
def test_config_rejects_bad_values(method, overrides, needle):
    with pytest.raises(ValueError, match=needle):
        build_config(method, overrides)


# --- training -------------------------------------------------------------------------------------
def test_training_actions_are_uniform_draws_from_the_global_generator_and_greedy_act_is_refused():
    agent = fresh_agent()
    torch.manual_seed(11)
    actions = agent.act(torch.zeros(500, 9))
    torch.manual_seed(11)
    assert torch.equal(actions, torch.randint(0, 8, (500,)))
    assert np.bincount(actions.numpy(), minlength=8).min() > 30
    with pytest.raises(ValueError, match="evaluation_policy"):
        agent.act(torch.zeros(2, 9), greedy=True)


def test_training_context_of_a_row_is_reset_exactly_when_its_episode_ends():
    agent = fresh_agent()
    env = BatchedTapeEnv(4, L=8, H=8, rules=[0, 4, 30, 90, 110], seed=3)
    obs = env.reset()
    ends = carries = 0
    for _ in range(60):
        actions = agent.act(obs)
        next_obs, rewards, terminated, truncated, info = env.step(actions)
        before_post, before_has = agent.ctx_post.clone(), agent.has_ctx.clone()
        slot = agent.replay.position
        agent.observe(obs, actions, rewards, info["final_obs"], terminated, truncated)
        # the replay holds this step's transition with the context the row had before it
        stored = (slot + torch.arange(4)) % agent.replay.capacity
        assert torch.equal(agent.replay.ctx_post[stored], before_post)
        assert torch.equal(agent.replay.has_ctx[stored], before_has)
        assert torch.equal(agent.replay.next_tape[stored], info["final_obs"][:, :8].to(torch.uint8))
        for row in range(4):
            if terminated[row] or truncated[row]:
                ends += 1
                assert agent.has_ctx[row] == 0 and int(agent.ctx_post[row].sum()) == 0
            else:
                carries += 1
                post = reference.flip(obs[row, :8].to(torch.uint8).numpy(), int(actions[row]))
                assert agent.has_ctx[row] == 1 and np.array_equal(agent.ctx_post[row].numpy(), post)
        agent.update()
        obs = next_obs
    assert ends >= 8 and carries >= 100


def test_members_start_different_and_each_draws_its_own_minibatch():
    agent = fresh_agent()
    first = agent.ensemble.net[0].weight
    assert all(not torch.equal(first[0], first[e]) for e in range(1, first.shape[0]))
    env = BatchedTapeEnv(4, L=8, H=8, rules=[30], seed=1)
    obs = env.reset()
    for _ in range(50):
        actions = agent.act(obs)
        next_obs, rewards, terminated, truncated, info = env.step(actions)
        agent.observe(obs, actions, rewards, info["final_obs"], terminated, truncated)
        obs = next_obs
    inputs, targets = agent.replay.sample(3, 16)
    assert inputs.shape == (3, 16, 25) and targets.shape == (3, 16, 8)
    assert not torch.equal(inputs[0], inputs[1]) and not torch.equal(inputs[1], inputs[2])


# --- the planner ----------------------------------------------------------------------------------
def test_candidate_sequences_are_the_true_dynamics_mpcs():
    keys = episode_keys(np.array([1, 2, 3**30], dtype=np.uint64), 5)
    got = candidate_sequences(keys, 7, 20, 4, 11)
    for i, key in enumerate(keys):
        assert np.array_equal(got[i], candidate_actions(np.uint64(step_key(key, 7)), 20, 4, 11))


@pytest.mark.parametrize("method,members", [("ensemble_mpc", 1), ("ensemble_mpc_ig", 3)])
def test_planner_with_the_true_dynamics_plays_exactly_like_the_true_dynamics_mpc(method, members):
    # identical members: disagreement 0, so the IG variant also reduces to the true-dynamics MPC
    L = H = 8
    agent = fresh_agent(method, L, H, **PLANNER)
    steps = 0
    for rule in (30, 110, 4, 90, 54):
        episodes = episode_set([rule], 5, L, eval_seed=3, side="test", key=1)
        planner = agent.evaluation_policy()
        planner.member_probs = true_dynamics(rule, L, members)
        ours = Recorder(planner)
        mpc = Recorder(MPCPolicy(MPCConfig(horizon=4, candidates=48, seed=5)))
        got = run_episodes(ours, episodes, H, batch_size=3)
        expected = run_episodes(mpc, episodes, H, reveal_rules=True, batch_size=3)
        assert len(ours.actions) == len(mpc.actions)   # finished rows get action 0 from both
        assert all(torch.equal(a, b) for a, b in zip(ours.actions, mpc.actions)), rule
        for key in expected:
            assert np.array_equal(got[key], expected[key]), (rule, key)
        steps += int(expected["steps"].sum())
    assert steps > 60


def test_ig_variant_with_zero_weight_plays_like_the_plain_variant_and_a_positive_weight_changes_decisions():
    L = H = 8
    plain = fresh_agent("ensemble_mpc", L, H, **PLANNER)
    episodes = episode_set([30, 110, 4, 90], 4, L, eval_seed=2, side="test", key=3)
    runs = {}
    for name, weight in (("plain", None), ("ig0", 0.0), ("ig", 0.25)):
        agent = plain if weight is None else fresh_agent("ensemble_mpc_ig", L, H, **PLANNER, ig_weight=weight)
        agent.load_policy_state_dict(plain.policy_state_dict())
        recorder = Recorder(agent.evaluation_policy())
        run_episodes(recorder, episodes, H)
        runs[name] = torch.stack(recorder.actions)
    assert torch.equal(runs["plain"], runs["ig0"])
    assert not torch.equal(runs["plain"], runs["ig"])   # an untrained ensemble disagrees a lot


def test_disagreement_is_zero_iff_the_members_agree_and_is_measured_in_nats():
    gen = torch.Generator().manual_seed(0)
    p = torch.rand(1, 6, 8, generator=gen)
    assert torch.equal(disagreement(p.expand(4, -1, -1)), torch.zeros(6))
    q = p.repeat(4, 1, 1)
    q[2, 3, 5] = 1.0 - q[2, 3, 5] if abs(q[2, 3, 5] - 0.5) > 0.01 else 0.9
    d = disagreement(q)
    assert d[3] > 0 and torch.equal(d[[0, 1, 2, 4, 5]], torch.zeros(5))
    # two members certain of opposite values of one cell: the cell is a fair coin -> ln 2 nats
    sure = torch.zeros(2, 1, 8)
    sure[1, 0, 2] = 1.0
    assert torch.allclose(disagreement(sure), torch.tensor([math.log(2)]))


@pytest.fixture(scope="module")
def briefly_trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("ensemble_brief")
    spec = TrainSpec(agent="ensemble_mpc_ig", rules=(4, 30, 110), seed=1, hyperparameters=SMALL, L=8, H=8,
                     total_steps=600, eval_every=600)
    manifest = train(spec, run, quiet=True)
    agent, _ = ckpt.load_policy(run / manifest["checkpoints"][-1]["file"])
    return agent


def test_evaluation_policy_keeps_per_episode_state(briefly_trained):
    assert briefly_trained.config.ig_weight > 0
    assert_per_episode_policy(lambda: briefly_trained.evaluation_policy())


def test_evaluation_policy_context_is_the_rows_last_transition(briefly_trained):
    policy = briefly_trained.evaluation_policy()
    episodes = episode_set([30, 110], 2, 8, eval_seed=3)
    env = BatchedTapeEnv(4, L=8, H=8, rules=[30, 110], autoreset=False)
    for _ in range(2):   # twice through the same policy object: begin() resets every row
        obs = env.load(episodes.tapes, episodes.rules)
        policy.begin(EpisodeBatch(L=8, H=8, keys=episodes.keys, goal=np.zeros(8, np.uint8), success_bonus=1.0,
                                  device=torch.device("cpu")))
        assert int(policy.has_ctx.sum()) == 0 and int(policy.ctx_post.sum()) == 0
        for _ in range(3):
            actions = policy.act(obs)
            next_obs, rewards, terminated, truncated, _ = env.step(actions)
            policy.observe(obs, actions, rewards, next_obs, terminated, truncated)
            assert torch.equal(policy.ctx_post, flip_cells(obs[:, :8].to(torch.uint8), actions))
            assert int(policy.has_ctx.sum()) == 4
            obs = next_obs


# --- the world model --------------------------------------------------------------------------------
def rollout_inputs(N=6, C=3, D=5, L=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 2, (N, C + 1, L + 1), generator=gen).float(), torch.randint(0, L, (N, C), generator=gen),
            torch.randint(0, L, (N, D), generator=gen))


@pytest.mark.parametrize("C", [0, 3])
def test_world_model_rollout_is_shaped_bounded_deterministic_and_side_effect_free(briefly_trained, C):
    agent = briefly_trained
    obs_prefix, action_prefix, actions = rollout_inputs(C=C)
    states = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    weights = {k: v.clone() for k, v in agent.ensemble.state_dict().items()}
    first = agent.world_model_rollout(obs_prefix, action_prefix, actions)
    second = agent.world_model_rollout(obs_prefix, action_prefix, actions)
    assert first.shape == (6, 5, 8) and first.dtype == torch.float32
    assert not first.is_inference()   # callers may modify it in place
    assert bool(((first >= 0) & (first <= 1)).all())
    assert torch.equal(first, second)
    assert torch.equal(torch.get_rng_state(), states[0]) and np.array_equal(np.random.get_state()[1], states[1])
    assert random.getstate() == states[2]
    assert all(torch.equal(v, weights[k]) for k, v in agent.ensemble.state_dict().items())
    # the first step is the ensemble mean on [context, current tape, flag, post-action tape]
    tapes = obs_prefix[:, C, :8]
    if C:
        ctx, flag = flip_cells(obs_prefix[:, C - 1, :8], action_prefix[:, C - 1]), torch.ones(6, 1)
    else:
        ctx, flag = torch.zeros(6, 8), torch.zeros(6, 1)
    inputs = torch.cat([ctx, tapes, flag, flip_cells(tapes, actions[:, 0])], dim=1)
    assert torch.allclose(first[:, 0], agent.ensemble.probs(inputs).mean(0))


# --- the shared contract --------------------------------------------------------------------------
def test_resume_after_sigkill_is_bit_identical(tmp_path):
    # learning starts at 200 steps, before checkpoint 2 (600): the resumed run restarts with the replay,
    # the optimiser state and the per-row contexts
    params = {"agent": SMALL, "env": {"L": 8, "H": 8}, "training": {"total_steps": 1200, "eval_every": 300}}
    assert_sigkill_resume_bit_identical("ensemble_mpc", params, tmp_path)


def test_learns_fixed_rule_4_and_its_model_predicts_the_rule(tmp_path):
    before, after = learned_success("ensemble_mpc", 4, 16, 16, 2_000, tmp_path, {"plan_horizon": 4, "candidates": 64})
    assert before < 0.9
    assert after >= 0.9
    # one-step prediction error of the trained model on fresh transitions of rule 4, without context (C = 0)
    # and with the episode's previous transition as context (C = 1)
    agent, _ = ckpt.load_policy(sorted((tmp_path / "checkpoints").glob("*.pt"))[-1])
    gen = torch.Generator().manual_seed(5)
    acts = torch.randint(0, 16, (400, 2), generator=gen)
    tapes = [torch.randint(0, 2, (400, 16), generator=gen).to(torch.uint8)]
    for step in range(2):
        tapes.append(torch.from_numpy(np.stack([reference.transition(t.numpy(), int(a), 4)
                                                for t, a in zip(tapes[step], acts[:, step])])))
    obs = torch.cat([torch.stack(tapes, dim=1).float(), torch.zeros(400, 3, 1)], dim=2)
    for C in (0, 1):
        probs = agent.world_model_rollout(obs[:, :C + 1], acts[:, :C], acts[:, C:C + 1])[:, 0]
        error = float(((probs > 0.5).to(torch.uint8) != tapes[C + 1]).float().mean())
        assert error < 0.02, (C, error)
