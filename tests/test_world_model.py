"""The shared world model (agents/world_model.py) of DreamerV3 and PlaNet-MPC: symlog two-hot, free-bits
KL, the fused unroll's class-major latents, the sequence replay, and the `world_model_rollout` contract
(shapes, determinism, no side effects, use of the prefix, and a low one-step error after training on a
fixed rule)."""
from __future__ import annotations

import math

import pytest
import torch
from agent_contract import tensors_equal

from tapebench.envs.batched import BatchedTapeEnv
from tapebench.methods.contract import EnvSpec
from tapebench.methods.world_model import (REWARD_GRID, RSSM, VALUE_GRID, SequenceReplay, TwoHot, WorldModelConfig,
                                           class_major_logprobs, class_major_probs, class_major_sample, kl_loss, symexp,
                                           symlog, to_class_major, to_group_major, unimix_logits)
from tapebench.registry import build_config, make_agent
from tapebench.training import checkpoint as ckpt
from tapebench.training.loop import TrainSpec, train

SMALL = {"num_envs": 8, "deter_size": 64, "hidden_size": 64, "batch_size": 8, "sequence_length": 16,
         "learning_starts": 256}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --- symlog two-hot --------------------------------------------------------------------------------
def test_symlog_and_symexp_are_inverse():
    x = torch.tensor([-1e4, -20.0, -1.0, -0.03125, 0.0, 0.5, 1.0, 2.0, 1e3])
    assert torch.allclose(symexp(symlog(x)), x, rtol=1e-5)
    assert torch.equal(symlog(torch.tensor([0.0])), torch.tensor([0.0]))
    assert torch.allclose(symlog(torch.tensor([1.0, -1.0])), torch.tensor([math.log(2), -math.log(2)]))


@pytest.mark.parametrize("grid", [REWARD_GRID, VALUE_GRID, TwoHot(5.0, 7)])
def test_two_hot_round_trip_on_and_between_bins(grid):
    on = symexp(grid.bins)
    between = symexp(0.5 * (grid.bins[1:] + grid.bins[:-1]))
    rewards = torch.tensor([-1.0, -0.96875, -0.5, -0.03125, 0.0, 1.0, 2.0])   # the shaped rewards of the env
    for x in (on, between, rewards):
        target = grid.encode(x)
        assert torch.allclose(target.sum(-1), torch.ones(len(x)))
        assert int((target > 0).sum(-1).max()) <= 2                    # two-hot
        assert torch.allclose(grid.decode(target), x, rtol=1e-4, atol=1e-5)
    # beyond the grid: the end bins
    outside = grid.encode(torch.tensor([-1e9, 1e9]))
    assert outside[0, 0] == 1 and outside[1, -1] == 1


def test_two_hot_loss_is_smallest_at_the_target():
    x = torch.tensor([0.7])
    good = torch.log(REWARD_GRID.encode(x) + 1e-9)
    bad = torch.log(REWARD_GRID.encode(torch.tensor([-0.7])) + 1e-9)
    assert REWARD_GRID.loss(good, x) < REWARD_GRID.loss(bad, x)


def test_unimix_keeps_every_class_possible():
    logits = torch.tensor([[100.0, -100.0, -100.0, -100.0]])
    probs = unimix_logits(logits, 0.01).exp()
    assert torch.allclose(probs.sum(-1), torch.ones(1))
    assert float(probs.min()) == pytest.approx(0.0025, rel=1e-3)


# --- free-bits KL ----------------------------------------------------------------------------------
def test_kl_below_free_bits_has_no_gradient_and_above_it_does():
    # 2 groups of 4 classes: prior and posterior close (KL < 1 nat) and far (KL > 1 nat)
    prior = torch.log_softmax(torch.zeros(1, 2, 4), -1)
    near = torch.log_softmax(torch.tensor([[[0.3, 0.0, 0.0, 0.0], [0.0, 0.2, 0.0, 0.0]]]), -1).requires_grad_()
    far = torch.log_softmax(torch.tensor([[[9.0, 0.0, 0.0, 0.0], [0.0, 9.0, 0.0, 0.0]]]), -1).requires_grad_()
    loss, value = kl_loss(near, prior, free_bits=1.0, dyn_scale=0.5, rep_scale=0.1)
    assert float(value) < 1.0 and float(loss.detach()) == pytest.approx(0.6)   # both terms clipped to 1 nat
    loss.sum().backward()
    assert near.grad is None or float(near.grad.abs().sum()) == 0.0
    loss, value = kl_loss(far, prior, free_bits=1.0, dyn_scale=0.5, rep_scale=0.1)
    expected = (far.exp() * (far - prior)).sum().detach()
    assert float(value) == pytest.approx(float(expected), rel=1e-5) and float(value) > 1.0
    assert float(loss.detach()) == pytest.approx(0.6 * float(expected.detach()), rel=1e-5)
    loss.sum().backward()
    assert float(far.grad.abs().sum()) > 0


# --- the fused unroll's class-major latents --------------------------------------------------------
def test_class_major_unroll_pieces_agree_with_the_group_major_model():
    # the unrolls hold latents class-major with permuted weights; the parameters keep their meaning
    torch.manual_seed(0)
    config = WorldModelConfig(deter_size=16, stoch_groups=6, stoch_classes=3, hidden_size=8)
    model = RSSM(config, EnvSpec.for_tape(5, 5))
    G, K, N = 6, 3, 7
    z = torch.nn.functional.one_hot(torch.randint(0, K, (N, G)), K).float().reshape(N, G * K)
    assert torch.equal(to_group_major(to_class_major(z, G, K), G, K), z)
    h, actions = torch.randn(N, 16), torch.randint(0, 5, (N,))
    with torch.no_grad():
        w = model.unroll_weights()
        prior = class_major_logprobs(model.prior_raw(w, h), K, model.unimix).transpose(-1, -2)
        assert torch.allclose(prior, model.prior(h), atol=1e-6)
        stepped = model.img_step(w, h, to_class_major(z, G, K), model.action_inputs(w, actions))
        assert torch.allclose(stepped, model.transition(h, z, actions), atol=1e-6)
        # the same uniforms pick the same classes as the group-major sampler
        probs = class_major_probs(model.prior_raw(w, h), K, model.unimix)           # (N, K, G)
        uniform = torch.rand(N, 1, G)
        sample = class_major_sample(probs, uniform)
        assert torch.equal(sample.sum(1), torch.ones(N, G))                               # one-hot per group
        cdf = probs.transpose(1, 2).cumsum(-1)                                            # (N, G, K)
        assert torch.equal(sample.argmax(1), (uniform.transpose(1, 2) > cdf).sum(-1).clamp(max=K - 1))


# --- sequence replay -------------------------------------------------------------------------------
def test_sequence_replay_chunks_are_consecutive_steps_of_one_row_and_resume_exactly():
    replay = SequenceReplay(3, 10, 5, "cpu")
    for step in range(14):   # wraps around: the oldest 4 steps are overwritten
        obs = torch.full((3, 5), float(step)) + torch.arange(3).unsqueeze(1) * 100
        ended = torch.tensor([step % 4 == 3, False, step == 7])
        replay.add(obs, torch.full((3,), step), torch.zeros(3), obs + 1, ended, torch.zeros(3, dtype=torch.bool))
    assert replay.size == 10
    torch.manual_seed(0)
    chunk = replay.sample(64, 4)
    steps = chunk["obs"][..., 0] % 100
    assert torch.equal(steps[:, 1:] - steps[:, :-1], torch.ones(64, 3))   # consecutive, no seam
    assert int(steps.min()) >= 4 and int(steps.max()) <= 13                # only the 10 newest steps
    assert torch.equal(chunk["actions"].float(), steps)
    row = (chunk["obs"][..., 0] // 100).long()
    assert torch.equal(chunk["first"], (steps % 4 == 0) & (row == 0) | (steps == 8) & (row == 2))
    # state_dict round trip: a fresh replay samples exactly the same chunks
    other = SequenceReplay(3, 10, 5, "cpu")
    other.load_state_dict(replay.state_dict())
    torch.manual_seed(1)
    a = replay.sample(16, 5)
    torch.manual_seed(1)
    assert tensors_equal(a, other.sample(16, 5))
    assert tensors_equal(replay.state_dict(), other.state_dict())


# --- world_model_rollout ---------------------------------------------------------------------------
def random_prefixes(rule: int, n: int, L: int, C: int, D: int, seed: int = 0):
    """obs (n, C+D+1, L+1) and actions (n, C+D) of random-action episodes of one rule (no termination
    check: a row that reaches the goal is simply kept; rule 4 from random tapes rarely does)."""
    env = BatchedTapeEnv(n, L=L, H=C + D + 1, rules=[rule], seed=seed, autoreset=False)
    obs = [env.reset()]
    gen = torch.Generator().manual_seed(seed)
    actions = torch.randint(0, L, (n, C + D), generator=gen)
    for t in range(C + D):
        obs.append(env.step(actions[:, t])[0])
    return torch.stack(obs, 1), actions


def one_step_error(agent, rule: int, L: int, C: int = 3, n: int = 200) -> tuple[float, float]:
    """(model's wrongly predicted cells, 'tape unchanged' baseline) after C observed transitions."""
    obs, actions = random_prefixes(rule, n, L, C, 1, seed=11)
    probs = agent.world_model_rollout(obs[:, :C + 1], actions[:, :C], actions[:, C:])
    truth = obs[:, C + 1, :L]
    return float(((probs[:, 0] > 0.5).float() != truth).float().mean()), \
        float((obs[:, C, :L] != truth).float().mean())


@pytest.fixture(scope="module", params=["dreamer", "planet"])
def fresh(request):
    torch.manual_seed(0)
    return make_agent(request.param, build_config(request.param, SMALL), EnvSpec.for_tape(8, 8), 1000, "cpu")


def test_rollout_shapes_range_determinism_and_no_side_effects(fresh):
    obs, actions = random_prefixes(30, 6, 8, 2, 5)
    state = {k: v for k, v in fresh.learner.state_dict().items()}
    before = ckpt.rng_state()
    p1 = fresh.world_model_rollout(obs[:, :3], actions[:, :2], actions[:, 2:])
    p2 = fresh.world_model_rollout(obs[:, :3], actions[:, :2], actions[:, 2:])
    assert p1.shape == (6, 5, 8) and p1.dtype == torch.float32
    assert float(p1.min()) >= 0 and float(p1.max()) <= 1
    assert torch.equal(p1, p2)
    after = ckpt.rng_state()
    assert torch.equal(before["torch"], after["torch"])
    assert tensors_equal(state, fresh.learner.state_dict())
    # C = 0: only the first observation
    assert fresh.world_model_rollout(obs[:, :1], actions[:, :0], actions[:, :4]).shape == (6, 4, 8)
    # the prefix is used: other observations in it change the prediction
    changed = obs[:, :3].clone()
    changed[:, 1, :8] = 1.0 - changed[:, 1, :8]
    assert not torch.equal(fresh.world_model_rollout(changed, actions[:, :2], actions[:, 2:]), p1)
    with pytest.raises(ValueError, match="must agree"):
        fresh.world_model_rollout(obs[:, :3], actions[:, :1], actions[:, 2:])


def test_one_step_error_after_training_on_a_fixed_rule_is_low(tmp_path):
    """PlaNet-MPC trains the shared model on random-action data: cheap, so this runs on every test pass."""
    L = 16
    spec = TrainSpec(agent="planet", rules=(4,), seed=0, hyperparameters={**SMALL, "train_ratio": 32, "model_lr": 2e-3}, L=L, H=L,
                     total_steps=4_096, eval_every=4_096)
    torch.manual_seed(0)
    untrained = make_agent("planet", build_config("planet", spec.hyperparameters), EnvSpec.for_tape(L, L), 1, "cpu")
    before, unchanged = one_step_error(untrained, 4, L)
    manifest = train(spec, tmp_path, quiet=True)
    trained, _ = ckpt.load_policy(tmp_path / manifest["checkpoints"][-1]["file"])
    after, _ = one_step_error(trained, 4, L)
    print(f'one-step error: untrained {before:.3f}, tape unchanged {unchanged:.3f}, trained {after:.3f}')
    assert before > 0.3 and unchanged > 0.05
    assert after < unchanged / 2 and after < before / 10
