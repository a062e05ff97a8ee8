"""Seed blocks (methods/contract.py, "Seed blocks"): S seeds of DQN trained as one block give each seed exactly what
it gets trained alone, and a seed's result does not depend on its neighbours in the block."""
from __future__ import annotations

import dataclasses
import io

import pytest
import torch
import torch.nn.functional as F

from tapebench.envs.batched import BatchedTapeEnv
from tapebench.methods import curl_dqn, dqn, rad_dqn
from tapebench.methods.contract import EnvSpec
from tapebench.methods.stacked import grouped_seed_conv
from tapebench.training.loop import seed_everything

L, H, STEPS = 8, 8, 256
SPEC = EnvSpec.for_tape(L, H)


def tiny(**overrides) -> dqn.Config:
    fields = dict(num_envs=4, hidden_size=32, buffer_size=500, learning_starts=32, batch_size=16,
                  target_update_frequency=64, max_grad_norm=0.5)
    return dqn.Config(**{**fields, **overrides})


RULES = (30, 90, 110)


def build(config, seeds, module=dqn, total_steps=STEPS):
    """The agents and generators the training loop builds for a block of `seeds`, and each seed's env seed."""
    agents, generators, env_seeds = [], [], []
    for seed in seeds:
        env_seeds.append(seed_everything(seed))
        agents.append(module.make(config, SPEC, total_steps, "cpu"))
        g = torch.Generator()
        g.set_state(torch.get_rng_state())
        generators.append(g)
    return agents, generators, env_seeds


def env(config, env_seed, rules=RULES):
    return BatchedTapeEnv(config.num_envs, L=L, H=H, rules=list(rules), seed=env_seed)


def count_ends(ends: dict | None, terminated, truncated) -> None:
    """Add the episodes that ended by success and by truncation alone to `ends` (if given)."""
    if ends is not None:
        ends["terminated"] += int(terminated.sum())
        ends["truncated"] += int((truncated & ~terminated).sum())


def train_alone(config, seed, steps=STEPS, module=dqn, *, rules=RULES, total_steps=STEPS):
    """A one-seed run, as the training loop drives it."""
    env_seed = seed_everything(seed)
    agent = module.make(config, SPEC, total_steps, "cpu")
    e = env(config, env_seed, rules)
    obs, metrics = e.reset(), []
    for _ in range(steps // config.num_envs):
        actions = agent.act(obs)
        next_obs, rewards, terminated, truncated, info = e.step(actions)
        agent.observe(obs, actions, rewards, info["final_obs"], terminated, truncated)
        metrics.append(agent.update())
        obs = next_obs
    return agent, metrics


def train_block(config, seeds, steps=STEPS, module=dqn, *, rules=RULES, total_steps=STEPS, ends=None):
    """The block driven as the training loop drives it (`ends`: see `count_ends`)."""
    agents, generators, env_seeds = build(config, seeds, module, total_steps)
    block = module.make_block(agents, generators)
    envs = [env(config, s, rules) for s in env_seeds]
    obs, metrics = torch.stack([e.reset() for e in envs]), []
    for _ in range(steps // config.num_envs):
        actions = block.act(obs)
        out = [e.step(a) for e, a in zip(envs, actions)]
        next_obs, rewards, terminated, truncated = (torch.stack([o[i] for o in out]) for i in range(4))
        final = torch.stack([o[4]["final_obs"] for o in out])
        block.observe(obs, actions, rewards, final, terminated, truncated)
        metrics.append(block.update())
        count_ends(ends, terminated, truncated)
        obs = next_obs
    return block, agents, metrics


def flat(state, prefix=""):
    """A nested state dict as {path: value}, tensors and numbers alike."""
    if isinstance(state, dict):
        out = {}
        for key, value in state.items():
            out.update(flat(value, f"{prefix}/{key}"))
        return out
    if isinstance(state, (list, tuple)):
        return flat(dict(enumerate(state)), prefix)
    return {prefix: state}


def saved(state) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def assert_same_state(a: dict, b: dict) -> None:
    fa, fb = flat(a), flat(b)
    assert fa.keys() == fb.keys()
    for key in fa:
        x, y = fa[key], fb[key]
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), key
        else:
            assert x == y, key


def assert_exports_its_one_seed_run(block, k: int, agent, alone, block_metrics: list, alone_metrics: list) -> None:
    """Seed k of `block`, exported into `agent`, is the one-seed run `alone` just trained (torch's global generator
    still where that run left it): its complete training state and policy byte for byte, its generator, its metrics."""
    block.export_seed(k, agent)
    assert_same_state(agent.state_dict(), alone.state_dict())
    assert_same_state(agent.policy_state_dict(), alone.policy_state_dict())
    assert saved(agent.state_dict()) == saved(alone.state_dict())   # the same resume file, byte for byte
    assert saved(agent.policy_state_dict()) == saved(alone.policy_state_dict())
    assert torch.equal(block.generators[k].get_state(), torch.get_rng_state())
    assert [m[k] if m[k] else {} for m in block_metrics] == alone_metrics


@pytest.mark.parametrize("module, seeds, overrides, steps", [
    (dqn, [0, 1, 2], {}, STEPS),
    (dqn, [4, 9], {"double_dqn": True, "tau": 0.5, "target_update_frequency": 8}, STEPS),
    (rad_dqn, [0, 3], {}, 128),
    (curl_dqn, [0, 1, 2], {}, 128),
    (curl_dqn, [5, 2], {"augment_td": False, "curl_weight": 0.5, "key_momentum": 0.9, "double_dqn": True}, 128),
    (dqn, [0, 6], {"network": "equivariant", "conv_layers": 5, "conv_channels": 4}, 96)])   # dilation 16 > L
def test_block_seeds_equal_single_runs_bit_for_bit(module, seeds, overrides, steps):
    config = module.Config(**{**dataclasses.asdict(tiny()), **overrides})
    block, agents, block_metrics = train_block(config, seeds, steps, module)
    obs = torch.rand(len(seeds), 5, SPEC.obs_dim).round()
    greedy = block.act(obs, greedy=True)
    for k, seed in enumerate(seeds):
        alone, alone_metrics = train_alone(config, seed, steps, module)
        assert alone.gradient_steps > 0
        assert_exports_its_one_seed_run(block, k, agents[k], alone, block_metrics, alone_metrics)
        assert torch.equal(greedy[k], alone.act(obs[k], greedy=True))


def test_export_import_round_trip():
    config = tiny()
    block, agents, _ = train_block(config, [3, 4], steps=128)
    for k, agent in enumerate(agents):
        block.export_seed(k, agent)
    states = [a.state_dict() for a in agents]
    again = dqn.make_block(agents, [torch.Generator() for _ in agents])   # import_seed for every seed
    for k, agent in enumerate(agents):
        fresh = dqn.make(config, SPEC, STEPS, "cpu")
        fresh.load_state_dict(states[k])
        again.export_seed(k, fresh)
        assert_same_state(fresh.state_dict(), states[k])
    agents[1].env_steps += config.num_envs
    with pytest.raises(ValueError, match="same step"):
        block.import_seed(1, agents[1])


def test_seed_does_not_depend_on_its_neighbours():
    config = tiny()
    a, agents_a, _ = train_block(config, [0, 1, 2], steps=128)
    b, agents_b, _ = train_block(config, [0, 5, 7], steps=128)
    a.export_seed(0, agents_a[0])
    b.export_seed(0, agents_b[0])
    assert_same_state(agents_a[0].state_dict(), agents_b[0].state_dict())
    a.export_seed(1, agents_a[1])
    assert not torch.equal(agents_a[1].q_network[0].weight, agents_b[0].q_network[0].weight)


def test_block_refuses_what_it_cannot_stack():
    agents, generators, _ = build(tiny(), [0])
    with pytest.raises(ValueError, match="one generator per agent"):
        dqn.make_block(agents, [])
    agents, generators, _ = build(curl_dqn.Config(**dataclasses.asdict(tiny())), [0], curl_dqn)
    with pytest.raises(NotImplementedError, match="stacks DQNAgent only"):
        dqn.make_block(agents, generators)


def test_gpu_grouped_convolution_is_each_seeds_own_convolution():
    # the GPU path of the stacked per-cell network (one grouped convolution) computes each seed's map
    generator = torch.Generator().manual_seed(0)
    x, weight, bias = (torch.randn(shape, generator=generator) for shape in ((5, 3, 4, 12), (5, 6, 4, 3), (5, 6)))
    reference = torch.stack([F.conv1d(x[k], weight[k], bias[k], dilation=2) for k in range(5)])
    assert torch.allclose(grouped_seed_conv(x, weight, bias, dilation=2), reference, atol=1e-5)


@pytest.mark.parametrize("S", [3, 4, 5])
def test_seed_adam_steps_every_seed_as_its_one_seed_adam_whatever_its_place(S):
    """255 and 13 elements per seed: seed k's slice of one stacked tensor starts mid-vector, where torch's Adam
    kernel would round some elements differently from a tensor of its own (one stacked Adam does, at S = 3 and 5)."""
    from tapebench.methods.common import adam
    from tapebench.methods.stacked import SeedAdam

    g = torch.Generator().manual_seed(0)
    shapes = [(255,), (13, 3)]
    start = [torch.randn((S,) + shape, generator=g) for shape in shapes]
    grads = [[torch.randn((S,) + shape, generator=g) for shape in shapes] for _ in range(20)]
    stacked = [p.clone().requires_grad_() for p in start]
    optimizer = SeedAdam(stacked, lr=1e-3, eps=1e-8)
    for step in grads:
        for p, grad in zip(stacked, step):
            p.grad = grad.clone()
        optimizer.step()
    for k in range(S):
        alone = [p[k].clone().requires_grad_() for p in start]
        one = adam(alone, lr=1e-3)
        for step in grads:
            for p, grad in zip(alone, step):
                p.grad = grad[k].clone()
            one.step()
        for p, q in zip(stacked, alone):
            assert torch.equal(p.detach()[k], q.detach()), (S, k, tuple(q.shape))
