"""Rainbow's seed block (`rainbow.make_block`, methods/contract.py "Seed blocks"): S seeds as one stacked model give,
on the CPU, each seed's one-seed run bit for bit (complete training state, policy, generator, metrics), whatever its
neighbours; the replay wraps, episodes end by success and by truncation, the n-step windows hold pending steps."""
from __future__ import annotations


import pytest
import torch
import test_seed_blocks as seed_blocks
from test_seed_blocks import L, SPEC, assert_exports_its_one_seed_run, build, saved, train_alone

from tapebench.methods import rainbow
from tapebench.methods.contract import BlockUnsupported

STEPS = 256


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread, as the trainer runs a block (and fast on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(**overrides) -> rainbow.Config:
    # buffer_size 40: the replay wraps several times; learning_starts 32 (8 batched steps): gradient steps from the
    # 8th batched step on, a target copy every 8
    fields = dict(num_envs=4, hidden_size=16, atoms=11, buffer_size=40, batch_size=8, learning_starts=32,
                  target_update_frequency=32, max_grad_norm=0.5)
    return rainbow.Config(**{**fields, **overrides})


def train_block(config, seeds, steps=STEPS):
    """The block driven as the trainer drives it; also how many episodes ended by success and by truncation."""
    ends = {"terminated": 0, "truncated": 0}
    block, agents, metrics = seed_blocks.train_block(config, seeds, steps, rainbow, ends=ends)
    return block, agents, metrics, (ends["terminated"], ends["truncated"])


@pytest.mark.parametrize("seeds, overrides, steps", [
    ([0, 1, 2], {}, STEPS),
    ([4, 9], {"n_step": 1, "gamma": 0.9, "priority_alpha": 0.0, "target_update_frequency": 8, "noisy_std": 0.1,
              "v_min": -3.0, "batch_size": 5}, 128),
    ([3, 0], {"n_step": 5, "num_envs": 2, "train_frequency": 2, "buffer_size": 30}, 130)])   # a half-filled window
def test_block_seeds_equal_single_runs_bit_for_bit(seeds, overrides, steps):
    config = tiny(**overrides)
    block, agents, block_metrics, (successes, truncations) = train_block(config, seeds, steps)
    assert successes > 0 and truncations > 0
    obs = torch.rand(len(seeds), 5, SPEC.obs_dim).round()
    greedy = block.act(obs, greedy=True)
    for k, seed in enumerate(seeds):
        alone, alone_metrics = train_alone(config, seed, steps, rainbow)
        assert alone.gradient_steps > 0 and alone.replay.size == config.buffer_size
        assert (alone.window.pending.any() or config.n_step == 1) and alone.replay.max_priority > 1.0
        assert_exports_its_one_seed_run(block, k, agents[k], alone, block_metrics, alone_metrics)
        assert torch.equal(greedy[k], alone.act(obs[k], greedy=True))


def test_seed_does_not_depend_on_its_neighbours():
    config = tiny()
    a, agents_a, _, _ = train_block(config, [0, 1, 2], steps=128)
    b, agents_b, _, _ = train_block(config, [0, 5, 7], steps=128)
    a.export_seed(0, agents_a[0])
    b.export_seed(0, agents_b[0])
    assert saved(agents_a[0].state_dict()) == saved(agents_b[0].state_dict())
    a.export_seed(1, agents_a[1])
    assert not torch.equal(agents_a[1].online.torso.weight, agents_b[0].online.torso.weight)


def test_export_import_round_trip():
    config = tiny()
    block, agents, _, _ = train_block(config, [3, 4], steps=96)
    for k, agent in enumerate(agents):
        block.export_seed(k, agent)
    states = [saved(a.state_dict()) for a in agents]
    again = rainbow.make_block(agents, [torch.Generator() for _ in agents])   # import_seed for every seed
    for k in range(len(agents)):
        fresh = rainbow.make(config, SPEC, STEPS, "cpu")
        again.export_seed(k, fresh)
        assert saved(fresh.state_dict()) == states[k]
    agents[1].env_steps += config.num_envs
    with pytest.raises(ValueError, match="same step"):
        block.import_seed(1, agents[1])


def test_block_refuses_what_it_cannot_stack():
    agents, generators, _ = build(tiny(), [0, 1], rainbow)
    with pytest.raises(ValueError, match="one generator per agent"):
        rainbow.make_block(agents, generators[:1])
    # a gradient step before n_step batched steps: a seed's replay could still be empty while another's is not
    agents, generators, _ = build(tiny(learning_starts=8), [0, 1], rainbow)
    with pytest.raises(BlockUnsupported, match="learning_starts"):
        rainbow.make_block(agents, generators)


def test_the_batched_forms_off_the_cpu_are_each_seeds_own_computation():
    # on a GPU `per_seed` makes one call on the stacked tensors: the functions it gets take leading dimensions
    g = torch.Generator().manual_seed(0)
    S, B, A, K = 3, 5, L, 11
    support = torch.linspace(-3.0, 1.0, K)
    value, advantage = torch.randn(S, B, 1, K, generator=g), torch.randn(S, B, A, K, generator=g)
    actions = torch.randint(0, A, (S, B), generator=g)
    returns, discounts = torch.randn(S, B, generator=g), torch.rand(S, B, generator=g)
    stacked_log_probs = rainbow.dueling_log_probs(value, advantage)
    probs = rainbow.taken(stacked_log_probs.exp(), actions)
    projected = rainbow.project_distribution(probs, returns, discounts, support)
    for k in range(S):
        log_probs = rainbow.dueling_log_probs(value[k], advantage[k])
        assert torch.allclose(stacked_log_probs[k], log_probs, atol=1e-6)
        assert torch.equal(probs[k], stacked_log_probs[k].exp()[torch.arange(B), actions[k]])
        assert torch.allclose(projected[k], rainbow.project_distribution(probs[k], returns[k], discounts[k], support),
                              atol=1e-6)
    assert torch.allclose(projected.sum(-1), torch.ones(S, B), atol=1e-5)
