"""RL2-A2C's seed block (`rl2_a2c.make_block`): S seeds as one stacked model (stacked GRU cells included) give, on
the CPU, each seed's one-seed run bit for bit (complete training state, checkpoints, generator, metrics), whatever
its neighbours."""
from __future__ import annotations

import dataclasses

import pytest
import test_seed_blocks as seed_blocks
import torch
from test_seed_blocks import SPEC, assert_exports_its_one_seed_run, saved

from tapebench.methods import rl2_a2c, stacked
from tapebench.methods.contract import BlockUnsupported
from tapebench.registry import get_method
from tapebench.training.loop import seed_everything

# 32 env steps per update: four updates and a half-full rollout (the exported rollout and optimiser state count)
CONFIG = rl2_a2c.Config(num_envs=4, num_steps=8, hidden_size=16)
STEPS = 4 * 32 + 16

pytestmark = pytest.mark.usefixtures("one_torch_thread")


RULES = (0, 4, 30, 90, 110)


def build(config, seeds):
    return seed_blocks.build(config, seeds, rl2_a2c, STEPS)


def train_alone(config, seed, steps=STEPS):
    """A one-seed run as the training loop drives it; also how many episodes ended by success and by truncation
    before a rollout's last step (a hidden state reset inside the BPTT replay)."""
    env_seed = seed_everything(seed)
    agent = rl2_a2c.make(config, SPEC, STEPS, "cpu")
    e = seed_blocks.env(config, env_seed, RULES)
    obs, metrics, ends = e.reset(), [], {"terminated": 0, "truncated": 0}
    for _ in range(steps // config.num_envs):
        actions = agent.act(obs)
        next_obs, rewards, terminated, truncated, info = e.step(actions)
        if agent.rollout.position < config.num_steps - 1:
            ends["terminated"] += int(terminated.sum())
            ends["truncated"] += int(truncated.sum())
        agent.observe(obs, actions, rewards, info["final_obs"], terminated, truncated)
        metrics.append(agent.update())
        obs = next_obs
    return agent, metrics, ends


def train_block(config, seeds, steps=STEPS):
    return seed_blocks.train_block(config, seeds, steps, rl2_a2c, rules=RULES, total_steps=STEPS)


@pytest.mark.parametrize("overrides", [{}, {"norm_adv": False, "anneal_lr": False, "hidden_size": 8}])
def test_each_seed_of_a_block_is_its_one_seed_run_bit_for_bit(overrides):
    config = dataclasses.replace(CONFIG, **overrides)
    seeds = [0, 1, 2]
    block, agents, block_metrics = train_block(config, seeds)
    for k, seed in enumerate(seeds):
        alone, alone_metrics, ends = train_alone(config, seed)
        assert alone.updates_done == 4 and alone.rollout.position == config.num_steps // 2
        assert ends["terminated"] > 0 and ends["truncated"] > 0
        assert_exports_its_one_seed_run(block, k, agents[k], alone, block_metrics, alone_metrics)


def test_a_seed_does_not_depend_on_its_neighbours():
    first, first_agents, _ = train_block(CONFIG, [0, 1, 2])
    other, other_agents, _ = train_block(CONFIG, [0, 5, 7])
    first.export_seed(0, first_agents[0])
    other.export_seed(0, other_agents[0])
    assert saved(first_agents[0].state_dict()) == saved(other_agents[0].state_dict())
    first.export_seed(1, first_agents[1])
    assert saved(first_agents[1].state_dict()) != saved(first_agents[0].state_dict())   # the seeds do differ


def test_export_import_round_trip_and_a_seed_at_another_step_is_refused():
    block, agents, _ = train_block(CONFIG, [3, 4])
    for k, agent in enumerate(agents):
        block.export_seed(k, agent)
    states = [saved(agent.state_dict()) for agent in agents]
    again = rl2_a2c.make_block(agents, [torch.Generator() for _ in agents])   # import_seed of every seed
    for k in range(len(agents)):
        fresh = rl2_a2c.make(CONFIG, SPEC, STEPS, "cpu")
        again.export_seed(k, fresh)
        assert saved(fresh.state_dict()) == states[k]
    agents[1].rollout.position += 1
    with pytest.raises(ValueError, match="same step"):
        block.import_seed(1, agents[1])
    agents[1].rollout.position -= 1
    agents[1].updates_done += 1
    with pytest.raises(ValueError, match="same step"):
        rl2_a2c.make_block(agents, [torch.Generator() for _ in agents])


def test_the_stacked_gru_cell_is_each_seeds_gru_cell_bit_for_bit():
    """Forward and every gradient, seed by seed against `nn.GRUCell`, on 16-byte aligned slices (as in a block)."""
    S, n, fan_in, hidden = 3, 4, 12, 8
    cells = [torch.nn.GRUCell(fan_in, hidden) for _ in range(S)]
    stacked_cell = stacked.StackedGRUCell(cells, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(S, n, fan_in, generator=generator, requires_grad=True)
    h = torch.randn(S, n, hidden, generator=generator, requires_grad=True)
    grad = torch.randn(S, n, hidden, generator=generator)
    stacked_cell(x, h).backward(grad)
    for k, cell in enumerate(cells):
        one_x, one_h = x[k].detach().clone().requires_grad_(), h[k].detach().clone().requires_grad_()
        out = cell(one_x, one_h)
        out.backward(grad[k])
        assert torch.equal(stacked_cell(x, h)[k], out) and torch.equal(stacked_cell.one_seed(k, x[k], h[k]), out)
        assert torch.equal(x.grad[k], one_x.grad) and torch.equal(h.grad[k], one_h.grad)
        for name, p in zip(stacked_cell.names, stacked_cell.parameters):
            assert torch.equal(p.grad[k], getattr(cell, name).grad), name


def test_the_registry_row_stacks_and_what_cannot_be_stacked_is_refused():
    assert get_method("rl2_a2c").make_block is rl2_a2c.make_block
    assert rl2_a2c.make_block.bit_exact_devices == ("cpu",)
    agents, generators, _ = build(CONFIG, [0, 1])
    with pytest.raises(ValueError, match="one generator per agent"):
        rl2_a2c.make_block(agents, generators[:1])
    agents[1].num_updates += 1
    with pytest.raises(ValueError, match="share their configuration"):
        rl2_a2c.make_block(agents, generators)
    for misaligned in ({"num_envs": 3}, {"hidden_size": 6}):
        agents, generators, _ = build(dataclasses.replace(CONFIG, **misaligned), [0, 1])
        with pytest.raises(BlockUnsupported, match="multiples of 4"):
            rl2_a2c.make_block(agents, generators)
    with pytest.raises(ValueError, match="evaluation_policy"):
        rl2_a2c.make_block(*build(CONFIG, [0, 1])[:2]).act(torch.zeros(2, 4, SPEC.obs_dim), greedy=True)


def test_off_the_cpu_every_product_is_batched_and_a_seed_agrees_with_its_one_seed_run_to_rounding(monkeypatch):
    """The path a GPU takes (every product batched, truncation bootstraps over every row), run here on the CPU with
    a misaligned configuration."""
    monkeypatch.setattr(rl2_a2c.RL2Block, "BIT_EXACT_DEVICES", ())
    config = dataclasses.replace(CONFIG, num_envs=3, hidden_size=6)
    seeds = [0, 3]
    block, agents, _ = train_block(config, seeds, steps=STEPS - STEPS % 3)
    largest = 0.0
    for k, seed in enumerate(seeds):
        alone, _, _ = train_alone(config, seed, steps=STEPS - STEPS % 3)
        block.export_seed(k, agents[k])
        ours, theirs = agents[k].state_dict()["network"], alone.state_dict()["network"]
        largest = max(largest, *((ours[name] - theirs[name]).abs().max().item() for name in ours))
        assert torch.equal(block.generators[k].get_state(), torch.get_rng_state())
    print(f"largest parameter difference, batched everywhere vs one-seed runs: {largest:.3g}")
    assert 0 < largest < 1e-4
