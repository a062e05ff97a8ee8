"""The in-context world model and Context MPC: shift equivariance and order invariance of the model, the exact next
tape on every elementary rule from a context that shows every window (trained on a quarter of the rules), the same
on k = 3; the planner is the true-dynamics MPC's when the table is the true rule; per-episode evaluation state;
a resumed training state continues identically; the world tester matches exact reasoning once the rule is pinned."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from agent_contract import assert_per_episode_policy, tensors_equal

from tapebench.ca import reference
from tapebench.envs.batched import BatchedTapeEnv
from tapebench.evaluation.worldtest import WorldTestSettings, run_worldtest
from tapebench.methods.context_model import context_counts, increment, windows
from tapebench.methods.context_mpc import ContextPlanner, table_rules
from tapebench.methods.contract import EnvSpec, EpisodeBatch
from tapebench.methods.mpc import MPCConfig, MPCPolicy
from tapebench.registry import build_config, get_method, make_agent
from tapebench.rule_family import RuleFamily

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TRAIN_RULES = tuple(range(0, 256, 4))   # a quarter of the elementary rules
SMALL = {"num_envs": 8, "learning_starts": 100, "train_frequency": 8, "candidates": 32, "horizon": 4}


def trained(rules=TRAIN_RULES, steps: int = 300, L: int = 16, H: int = 16, family: RuleFamily | None = None,
            **overrides):
    """A Context MPC agent trained for `steps` batched steps of random cells on `rules` (under a second)."""
    torch.manual_seed(0)
    params = {**SMALL, **overrides}
    if family is not None:
        params.update(colours=family.k, radius=family.r)
    agent = make_agent("context_mpc", build_config("context_mpc", params), EnvSpec.for_tape(L, H), 10_000, "cpu")
    env = BatchedTapeEnv(params["num_envs"], L=L, H=H, rules=list(rules), seed=0, family=family)
    obs = env.reset(seed=0)
    for _ in range(steps):
        actions = agent.act(obs)
        following, rewards, terminated, truncated, info = env.step(actions)
        agent.observe(obs, actions, rewards, info["final_obs"], terminated, truncated)
        agent.update()
        obs = following
    return agent


@pytest.fixture(scope="module")
def agent():
    return trained()


def trajectories(rules, L: int, steps: int, seed: int = 0):
    """(N, steps+1, L) true tapes from random starts under random flips, and the (N, steps) flips."""
    rng = np.random.default_rng(seed)
    tapes = np.zeros((len(rules), steps + 1, L), dtype=np.uint8)
    tapes[:, 0] = rng.integers(0, 2, (len(rules), L))
    actions = rng.integers(0, L, (len(rules), steps))
    for i, rule in enumerate(rules):
        for t in range(steps):
            flipped = tapes[i, t].copy()
            flipped[actions[i, t]] ^= 1
            tapes[i, t + 1] = reference.ca_step(flipped, rule)
    return tapes, actions


def as_obs(tapes: np.ndarray) -> torch.Tensor:
    time = np.zeros(tapes.shape[:2] + (1,), dtype=np.float32)
    return torch.as_tensor(np.concatenate([tapes.astype(np.float32), time], axis=2))


def test_registered_as_an_any_family_world_model_with_its_own_world_tester():
    method = get_method("context_mpc")
    assert method.trains and method.world_model and method.family == "world_model" and not method.every_checkpoint
    assert method.any_rule_family and getattr(method.worldtest, "any_rule_family", False)


def test_rolling_every_context_tape_rolls_the_prediction(agent):
    L, C, D = 16, 3, 4
    tapes, actions = trajectories([30, 110, 45, 3, 154], L, C + D)
    probs = agent.world_model_rollout(as_obs(tapes[:, :C + 1]), torch.as_tensor(actions[:, :C]),
                                      torch.as_tensor(actions[:, C:]))
    for shift in (1, 5):
        rolled = agent.world_model_rollout(as_obs(np.roll(tapes[:, :C + 1], shift, axis=2)),
                                           torch.as_tensor((actions[:, :C] + shift) % L),
                                           torch.as_tensor((actions[:, C:] + shift) % L))
        assert torch.equal(rolled, torch.roll(probs, shift, dims=2))
    assert not torch.equal(probs, torch.roll(probs, 1, dims=2))


def test_permuting_the_context_transitions_leaves_the_table_unchanged(agent):
    L, T = 16, 6
    tapes, actions = trajectories([30, 90, 1, 200], L, T, seed=3)
    tapes, actions = torch.as_tensor(tapes).long(), torch.as_tensor(actions)
    posts = torch.stack([increment(tapes[:, t], actions[:, t], 2) for t in range(T)], dim=1)
    valid = torch.rand(len(posts), T, generator=torch.Generator().manual_seed(1)) < 0.4   # partial contexts
    table = agent.model.table(context_counts(posts, tapes[:, 1:], 2, 1, valid))
    order = torch.tensor([4, 0, 5, 2, 1, 3])
    permuted = agent.model.table(context_counts(posts[:, order], tapes[:, 1:][:, order], 2, 1, valid[:, order]))
    assert torch.equal(table, permuted)
    # the table is what the context says: a window shown only with next value v predicts v
    counts = context_counts(posts, tapes[:, 1:], 2, 1, valid)
    shown = counts.sum(-1) > 0
    assert torch.equal(table.argmax(-1)[shown], counts.argmax(-1)[shown])


DE_BRUIJN = np.array([0, 0, 0, 1, 0, 1, 1, 1], dtype=np.uint8)   # every 3-cell window once (cyclic)


def test_a_context_that_pins_the_rule_predicts_the_next_tape_exactly_on_every_elementary_rule(agent):
    L, D = 16, 3
    rules = np.arange(256)
    post = np.tile(DE_BRUIJN, 2)
    start = post.copy()
    start[0] ^= 1                                               # flipping cell 0 gives the de Bruijn tape
    prefix = np.stack([np.stack([start, reference.ca_step(post, int(z))]) for z in rules])
    following = np.random.default_rng(0).integers(0, L, (len(rules), D))
    probs = agent.world_model_rollout(as_obs(prefix), torch.zeros(len(rules), 1, dtype=torch.long),
                                      torch.as_tensor(following))
    for i, z in enumerate(rules):
        tape = prefix[i, 1].copy()
        for d in range(D):
            tape[following[i, d]] ^= 1
            tape = reference.ca_step(tape, int(z))
            assert np.array_equal((probs[i, d] > 0.5).numpy(), tape.astype(bool)), (z, d)
    # with no context the prior answers: the same table for every rule, so wrong on most of them
    blank = agent.world_model_rollout(as_obs(prefix[:, 1:]), torch.zeros(len(rules), 0, dtype=torch.long),
                                      torch.as_tensor(following[:, :1]))
    truth = np.stack([reference.ca_step(np.where(np.arange(L) == following[i, 0], 1 - prefix[i, 1], prefix[i, 1]),
                                     int(z)) for i, z in enumerate(rules)])
    assert ((blank[:, 0] > 0.5).numpy() == truth.astype(bool)).all(axis=1).mean() < 0.5


def de_bruijn(k: int, n: int) -> np.ndarray:
    """A cyclic sequence over k symbols in which every n-window appears once (length k^n)."""
    a, out = [0] * k * n, []

    def db(t, p):
        if t > n:
            if n % p == 0:
                out.extend(a[1:p + 1])
        else:
            a[t] = a[t - p]
            db(t + 1, p)
            for j in range(a[t - p] + 1, k):
                a[t] = j
                db(t + 1, t)
    db(1, 1)
    return np.array(out, dtype=np.uint8)


def test_k3_model_pins_unseen_rules_and_refuses_another_family():
    family = RuleFamily(3, 1)
    rng = np.random.default_rng(0)
    train = [int(x) for x in rng.integers(0, 3 ** 27, 6)]
    model_agent = trained(train, steps=100, L=27, H=8, family=family)
    post = torch.as_tensor(de_bruijn(3, 3)).long().unsqueeze(0)            # all 27 windows, L = 27
    tests = [int(x) for x in rng.integers(0, 3 ** 27, 20)]
    tables = torch.as_tensor(family.tables(tests)).long()                   # (20, 27)
    nexts = tables.gather(1, windows(post.expand(len(tests), -1), 3, 1))
    counts = context_counts(post.expand(len(tests), -1).unsqueeze(1), nexts.unsqueeze(1), 3, 1)
    assert torch.equal(model_agent.model.table(counts).argmax(-1), tables)
    planner = model_agent.evaluation_policy()
    batch = EpisodeBatch(L=27, H=8, keys=np.arange(2, dtype=np.uint64), goal=np.zeros(27, np.uint8),
                         success_bonus=1.0, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="colours.*radius"):
        planner.begin(batch)                                                 # elementary episodes, a k = 3 model


def test_with_the_true_table_the_planner_is_the_true_dynamics_mpc(agent):
    L, H, n = 16, 16, 6
    rules = np.array([30, 110, 45, 90, 54, 150])
    batch = EpisodeBatch(L=L, H=H, keys=np.arange(n, dtype=np.uint64) * 7 + 1, goal=np.zeros(L, np.uint8),
                         success_bonus=1.0, device=torch.device("cpu"), rules=rules)
    planner = ContextPlanner(agent.model, agent.config, "cpu")
    planner.begin(batch)
    post = torch.as_tensor(np.tile(DE_BRUIJN, 2)).long().expand(n, -1)
    nexts = torch.as_tensor(np.stack([reference.ca_step(post[0].numpy().astype(np.uint8), int(z)) for z in rules]))
    planner.counts = context_counts(post.unsqueeze(1), nexts.long().unsqueeze(1), 2, 1)
    assert np.array_equal(table_rules(planner.table()), rules)
    mpc = MPCPolicy(MPCConfig(horizon=agent.config.horizon, candidates=agent.config.candidates,
                              seed=agent.config.planner_seed))
    mpc.begin(batch)
    obs = as_obs(np.random.default_rng(2).integers(0, 2, (n, 1, L)).astype(np.uint8))[:, 0]
    assert torch.equal(planner.act(obs), mpc.act(obs))


def test_evaluation_state_is_per_episode(agent):
    assert_per_episode_policy(agent.evaluation_policy, L=8, H=8)


def test_a_resumed_training_state_continues_identically():
    first = trained(steps=150)
    state = copy.deepcopy(first.state_dict())   # as a checkpoint holds it: no tensor shared with `first`
    second = make_agent("context_mpc", first.config, EnvSpec.for_tape(16, 16), 10_000, "cpu")
    second.load_state_dict(state)
    assert tensors_equal(second.state_dict(), state)
    env = BatchedTapeEnv(8, L=16, H=16, rules=[30, 110], seed=4)
    obs = env.reset(seed=4)
    for step in range(40):
        torch.manual_seed(step)
        actions = first.act(obs)
        following, rewards, terminated, truncated, info = env.step(actions)
        for a in (first, second):
            a.observe(obs, actions, rewards, info["final_obs"], terminated, truncated)
            torch.manual_seed(100 + step)
            a.update()
        obs = following
    assert tensors_equal(first.state_dict(), second.state_dict())


def test_world_tester_predicts_like_exact_reasoning_once_the_interaction_pins_the_rule(agent):
    settings = WorldTestSettings(tasks=("prediction", "detection", "planning"), problems_per_rule=2,
                                 planner_candidates=16, interaction_start="random")
    sides = {"test": [30, 110, 45, 150, 57, 106]}
    common = dict(sides=sides, L=16, H=16, seed=0, budget=8)
    ours = run_worldtest(get_method("context_mpc"), agent.config, settings, agent=agent, **common)
    exact = run_worldtest(get_method("identify_then_plan"), build_config("identify_then_plan", {}), settings, **common)
    for task in ("prediction", "detection", "planning"):
        assert ours.query("task == @task")["score"].tolist() == exact.query("task == @task")["score"].tolist(), task


def test_k3_world_tester_matches_exact_reasoning_once_pinned_and_refuses_a_model_of_another_family(agent):
    family = RuleFamily(3, 1)
    rng = np.random.default_rng(0)
    model_agent = trained([int(x) for x in rng.integers(0, 3 ** 27, 6)], steps=100, L=27, H=8, family=family)
    settings = WorldTestSettings(tasks=("prediction", "detection"), problems_per_rule=2, interaction_start="random")
    common = dict(sides={"test": [int(x) for x in rng.integers(0, 3 ** 27, 6)]}, L=27, H=8, seed=0, budget=16,
                  family=family)
    ours = run_worldtest(get_method("context_mpc"), model_agent.config, settings, agent=model_agent, **common)
    exact = run_worldtest(get_method("identify_then_plan"), build_config("identify_then_plan", {}), settings, **common)
    assert ours["score"].tolist() == exact["score"].tolist() and ours["score"].mean() > 0.9
    with pytest.raises(ValueError, match="colours"):
        run_worldtest(get_method("context_mpc"), agent.config, settings, agent=agent, **common)
