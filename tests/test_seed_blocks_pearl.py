"""PEARL-DQN seed blocks (methods/contract.py, "Seed blocks"): S seeds trained as one block give each seed exactly
its one-seed run, bit for bit on the CPU, and a seed's result does not depend on its neighbours in the block."""
from __future__ import annotations

import pytest
import torch
import test_seed_blocks as seed_blocks
from test_seed_blocks import SPEC, assert_exports_its_one_seed_run, assert_same_state, saved

from tapebench.methods import dqn, pearl_dqn
from tapebench.methods.contract import BlockUnsupported
from tapebench.registry import get_method
from tapebench.training.loop import seed_everything

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEPS = 192


def tiny(**overrides) -> pearl_dqn.Config:
    # a buffer of 2 * num_envs * H: it wraps after 64 steps, so the episode draws redraw lost episodes
    fields = dict(num_envs=4, hidden_size=32, hidden_layers=2, latent_dim=4, encoder_hidden_size=16,
                  buffer_size=64, learning_starts=32, batch_size=16, target_update_frequency=48, max_grad_norm=0.5)
    return pearl_dqn.Config(**{**fields, **overrides})


def build(config, seeds):
    return seed_blocks.build(config, seeds, pearl_dqn)


def train_alone(config, seed, steps=STEPS):
    """A one-seed run as the training loop drives it, and the number of its episodes that ended."""
    agent, metrics = seed_blocks.train_alone(config, seed, steps, pearl_dqn)
    return agent, metrics, agent.next_episode_id - config.num_envs


def train_block(config, seeds, steps=STEPS):
    return seed_blocks.train_block(config, seeds, steps, pearl_dqn)


def assert_seed_is_its_one_seed_run(block, agents, block_metrics, k, seed, config, steps):
    alone, alone_metrics, episodes = train_alone(config, seed, steps)
    assert alone.gradient_steps > 0 and episodes > 0
    assert_exports_its_one_seed_run(block, k, agents[k], alone, block_metrics, alone_metrics)


@pytest.mark.parametrize("seeds, overrides, steps", [
    ([0, 1, 2], {}, STEPS),
    ([3, 4], {"transitions_per_episode": 1, "encoder_hidden_layers": 0, "tau": 0.5, "target_update_frequency": 8,
              "buffer_size": 256}, 128),
    ([0, 6], {"network": "equivariant", "conv_layers": 2, "conv_channels": 4}, 96)])
def test_block_seeds_equal_single_runs_bit_for_bit(seeds, overrides, steps):
    config = tiny(**overrides)
    block, agents, block_metrics = train_block(config, seeds, steps)
    for k, seed in enumerate(seeds):
        assert_seed_is_its_one_seed_run(block, agents, block_metrics, k, seed, config, steps)


def test_the_episode_draws_redraw_in_the_block_as_alone(monkeypatch):
    """The wrapped buffer of `tiny()` loses episodes' first transitions: the redraw loop runs, in the block too."""
    redraws = []
    original = pearl_dqn.sample_episodes

    def counting(replay, num_episodes, max_length, generator=None):
        state = generator.get_state() if generator is not None else torch.get_rng_state()
        first, length = original(replay, num_episodes, max_length, generator)
        after = generator.get_state() if generator is not None else torch.get_rng_state()
        probe = torch.Generator()
        probe.set_state(state)
        torch.randint(0, replay.size, (num_episodes,), generator=probe)
        redraws.append(not torch.equal(probe.get_state(), after))
        return first, length

    monkeypatch.setattr(pearl_dqn, "sample_episodes", counting)
    block, agents, block_metrics = train_block(tiny(), [0, 1], STEPS)
    assert any(redraws)
    monkeypatch.setattr(pearl_dqn, "sample_episodes", original)
    assert_seed_is_its_one_seed_run(block, agents, block_metrics, 1, 1, tiny(), STEPS)


def test_export_import_round_trip():
    config = tiny()
    block, agents, _ = train_block(config, [3, 4], steps=96)
    for k, agent in enumerate(agents):
        block.export_seed(k, agent)
    states = [a.state_dict() for a in agents]
    again = pearl_dqn.make_block(agents, [torch.Generator() for _ in agents])   # import_seed for every seed
    for k, agent in enumerate(agents):
        fresh = pearl_dqn.make(config, SPEC, STEPS, "cpu")
        fresh.load_state_dict(states[k])
        again.export_seed(k, fresh)
        assert_same_state(fresh.state_dict(), states[k])
        assert saved(fresh.state_dict()) == saved(states[k])
    agents[1].env_steps += config.num_envs
    with pytest.raises(ValueError, match="same step"):
        block.import_seed(1, agents[1])


def test_seed_does_not_depend_on_its_neighbours():
    config = tiny()
    a, agents_a, _ = train_block(config, [0, 1, 2], steps=128)
    b, agents_b, _ = train_block(config, [0, 5, 7], steps=128)
    a.export_seed(0, agents_a[0])
    b.export_seed(0, agents_b[0])
    assert saved(agents_a[0].state_dict()) == saved(agents_b[0].state_dict())
    a.export_seed(1, agents_a[1])
    assert not torch.equal(agents_a[1].network.q[0].weight, agents_b[0].network.q[0].weight)


def test_registry_rows_stack_and_refuse_what_they_cannot():
    for name in ("pearl_dqn", "pearl_dqn_equivariant"):
        method = get_method(name)
        assert method.make_block is pearl_dqn.make_block and "cpu" in method.make_block.bit_exact_devices
    agents, generators, _ = build(tiny(), [0])
    with pytest.raises(ValueError, match="one generator per agent"):
        pearl_dqn.make_block(agents, [])
    seed_everything(0)
    other = dqn.make(dqn.Config(num_envs=4, hidden_size=32, buffer_size=64), SPEC, STEPS, "cpu")
    with pytest.raises(BlockUnsupported, match="stacks PearlDQNAgent only"):
        pearl_dqn.make_block([other], generators)
    with pytest.raises(ValueError, match="evaluation_policy"):
        pearl_dqn.make_block(agents, generators).act(torch.zeros(1, 4, SPEC.obs_dim), greedy=True)
