"""Ensemble MPC seed blocks (`ensemble_mpc.make_block`): on the CPU each seed of a block trains exactly as its one-seed
run (its ensemble, optimiser, replay and contexts, byte for byte), whatever its neighbours."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from tapebench.methods import ensemble_mpc
from tapebench.methods.contract import BlockUnsupported
from test_seed_blocks import SPEC, assert_exports_its_one_seed_run, assert_same_state, build, train_alone, train_block

TINY = ensemble_mpc.Config(num_envs=4, ensemble_size=3, hidden_size=16, buffer_size=128, batch_size=8,
                           learning_starts=32, train_frequency=4)
STEPS = 192   # the replay (128) wraps


def trained_block(config, seeds):
    return train_block(config, seeds, STEPS, ensemble_mpc)


@pytest.mark.parametrize("config, seeds", [(TINY, [0, 1, 2]),
                                           (dataclasses.replace(TINY, hidden_layers=1, train_frequency=8), [4, 1])])
def test_block_seeds_equal_single_runs_bit_for_bit(config, seeds):
    block, agents, block_metrics = trained_block(config, seeds)
    for k, seed in enumerate(seeds):
        alone, alone_metrics = train_alone(config, seed, STEPS, ensemble_mpc)
        assert alone.gradient_steps > 0 and alone.replay.position < alone.replay.size   # learned, and wrapped
        assert_exports_its_one_seed_run(block, k, agents[k], alone, block_metrics, alone_metrics)


def test_a_seed_does_not_depend_on_its_neighbours_and_round_trips():
    a, agents_a, _ = trained_block(TINY, [0, 1, 2])
    b, agents_b, _ = trained_block(TINY, [0, 5])
    a.export_seed(0, agents_a[0])
    b.export_seed(0, agents_b[0])
    assert_same_state(agents_a[0].state_dict(), agents_b[0].state_dict())
    a.export_seed(1, agents_a[1])
    state = agents_a[1].state_dict()
    again = ensemble_mpc.make_block(agents_a[:2], [torch.Generator() for _ in range(2)])   # import_seed of each
    fresh = ensemble_mpc.make(TINY, SPEC, STEPS, "cpu")
    again.export_seed(1, fresh)
    assert_same_state(fresh.state_dict(), state)
    agents_a[1].env_steps += TINY.num_envs
    with pytest.raises(ValueError, match="same step"):
        again.import_seed(1, agents_a[1])


def test_the_batched_products_of_a_gpu_compute_the_same_losses():
    """The path a GPU takes (the S x E members as one batch) on the CPU: the same logits to rounding."""
    agents, generators, _ = build(TINY, [0, 1], ensemble_mpc)
    block = ensemble_mpc.make_block(agents, generators)
    x = torch.rand(2, TINY.ensemble_size, 5, 3 * 8 + 1)
    batched = ensemble_mpc.ensemble_logits(block.parameters, x)
    for k, agent in enumerate(agents):
        torch.testing.assert_close(batched[k], agent.ensemble(x[k]), rtol=1e-5, atol=1e-6)


def test_what_a_block_refuses():
    agents, generators, _ = build(ensemble_mpc.EquivariantConfig(num_envs=4, ensemble_size=2, conv_channels=4,
                                                                 conv_layers=2), [0, 1], ensemble_mpc)
    with pytest.raises(BlockUnsupported, match="MLP members only"):
        ensemble_mpc.make_block(agents, generators)
    with pytest.raises(ValueError, match="one generator per agent"):
        ensemble_mpc.make_block(agents, generators[:1])
    agents, generators, _ = build(TINY, [0], ensemble_mpc)
    block = ensemble_mpc.make_block(agents, generators)
    with pytest.raises(ValueError, match="evaluation_policy"):
        block.act(torch.zeros(1, 4, 9), greedy=True)
