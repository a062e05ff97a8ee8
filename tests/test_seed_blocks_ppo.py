"""PPO's seed block (`ppo.make_block`): S seeds as one stacked model give, on the CPU, each seed's one-seed run bit
for bit (checkpoints and the complete training state), whatever its neighbours; PPO + DR and the equivariant
network stack the same way."""
from __future__ import annotations

import pytest
import torch

from torch import nn

from tapebench.methods import ppo, stacked
from tapebench.methods.contract import BlockUnsupported, EnvSpec
from tapebench.registry import build_config, get_method
from tapebench.training import checkpoint as ckpt
from tapebench.training.blocks import train_block
from tapebench.training.loop import TrainSpec, train

# two updates of 128 env steps and a half-full rollout at the end: the exported rollout and optimiser state count
HYPER = {"num_envs": 4, "num_steps": 32, "hidden_size": 32, "num_minibatches": 4, "update_epochs": 2}
EQUIVARIANT = {**HYPER, "conv_channels": 8, "conv_layers": 3}


def spec(seed, agent="ppo", total_steps=320, L=8, **overrides):
    hyper = EQUIVARIANT if agent == "ppo_equivariant" else HYPER
    return TrainSpec(agent=agent, rules=(30, 90, 110), seed=seed, hyperparameters={**hyper, **overrides}, L=L, H=8,
                     total_steps=total_steps, eval_every=160)


def digests(manifest):
    return manifest["fingerprint"], [c["sha256"] for c in manifest["checkpoints"]]


def training_state(run):
    """resume.pt's agent state, rng and env state (not its clocks)."""
    state = ckpt.load(run / ckpt.RESUME_FILE)
    return {key: state[key] for key in ("agent", "rng", "env", "stats", "iteration")}


def assert_same_state(a, b, where="state"):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_state(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}[{i}]")
    else:
        assert type(a) is type(b) and (a == b if not hasattr(a, "shape") else (a == b).all()), where


# L = 13 and 30 hidden units: layer sizes that are no multiple of the CPU's vector width, so the Adam kernel would
# round a seed's slices of one stacked tensor differently from its one-seed tensors (stacked.SeedAdam)
@pytest.mark.parametrize("agent, L, overrides", [("ppo", 8, {}), ("ppo_dr", 8, {}), ("ppo_equivariant", 8, {}),
                                                 ("ppo", 13, {"hidden_size": 30})])
def test_each_seed_of_a_stacked_block_is_its_one_seed_run_bit_for_bit(tmp_path, agent, L, overrides):
    seeds = [0, 3, 4]
    block = train_block([spec(s, agent, L=L, **overrides) for s in seeds], [tmp_path / f"block{s}" for s in seeds],
                        quiet=True, keep_resume=True)
    assert all(m["block"]["stacked"] for m in block)
    for s, manifest in zip(seeds, block):
        alone = train(spec(s, agent, L=L, **overrides), tmp_path / f"alone{s}", quiet=True, keep_resume=True)
        assert digests(manifest) == digests(alone)
        assert_same_state(training_state(tmp_path / f"block{s}"), training_state(tmp_path / f"alone{s}"))


def test_a_seed_does_not_depend_on_its_neighbours(tmp_path):
    first = train_block([spec(s) for s in (0, 1, 2)], [tmp_path / f"a{s}" for s in (0, 1, 2)], quiet=True)
    other = train_block([spec(s) for s in (0, 5, 7)], [tmp_path / f"b{s}" for s in (0, 5, 7)], quiet=True)
    assert digests(first[0]) == digests(other[0])
    assert digests(first[1]) != digests(first[0])   # the seeds do differ


def test_a_killed_stacked_block_resumes_to_the_one_seed_checkpoints(tmp_path, monkeypatch):
    import tapebench.training.blocks as blocks

    seeds, runs = [1, 2], [tmp_path / "k1", tmp_path / "k2"]
    original, calls = blocks.write_run_checkpoint, []

    class Killed(Exception):
        pass

    def write_then_die(*args, **kwargs):
        original(*args, **kwargs)
        calls.append(1)
        if len(calls) == len(seeds):   # every seed's first checkpoint (mid-rollout) and resume.pt are on disk
            raise Killed

    monkeypatch.setattr(blocks, "write_run_checkpoint", write_then_die)
    with pytest.raises(Killed):
        train_block([spec(s) for s in seeds], runs, quiet=True)
    monkeypatch.setattr(blocks, "write_run_checkpoint", original)
    resumed = train_block([spec(s) for s in seeds], runs, quiet=True)
    assert all(m["resumes"] == 1 and m["block"]["stacked"] for m in resumed)
    for s, manifest in zip(seeds, resumed):
        assert digests(manifest) == digests(train(spec(s), tmp_path / f"alone{s}", quiet=True))


def test_every_ppo_row_stacks_and_a_mismatched_block_or_an_unknown_layer_is_an_error():
    assert get_method("ppo_equivariant").make_block is ppo.make_block
    assert get_method("ppo_dr").make_block is not None
    env_spec = EnvSpec.for_tape(8, 8)
    mlp = build_config("ppo", {"num_envs": 2, "num_steps": 4, "hidden_size": 8})
    agents = [ppo.make(mlp, env_spec, 64, "cpu"), ppo.make(mlp, env_spec, 128, "cpu")]
    with pytest.raises(ValueError, match="share their configuration and budget"):
        ppo.make_block(agents, [torch.Generator() for _ in agents])
    with pytest.raises(ValueError, match="one generator per agent"):
        ppo.make_block(agents, [torch.Generator()])
    with pytest.raises(BlockUnsupported, match="ReLU"):
        stacked.StackedSequential([nn.Sequential(nn.Linear(3, 4), nn.ReLU())] * 2, torch.device("cpu"),
                                  BlockUnsupported)


@pytest.mark.parametrize("agent", ["ppo", "ppo_equivariant"])
def test_off_the_cpu_every_product_is_batched_and_a_seed_agrees_with_its_one_seed_run_to_rounding(tmp_path,
                                                                                                  monkeypatch, agent):
    """The path a GPU takes (no per-shape probe, truncation bootstraps batched), run here on the CPU."""
    monkeypatch.setattr(ppo.PPOBlock, "BIT_EXACT_DEVICES", ())
    seeds = [0, 3]
    block = train_block([spec(s, agent) for s in seeds], [tmp_path / f"block{s}" for s in seeds], quiet=True)
    largest = 0.0
    for s, manifest in zip(seeds, block):
        alone = train(spec(s, agent), tmp_path / f"alone{s}", quiet=True)
        for ours, theirs in zip(manifest["checkpoints"], alone["checkpoints"]):
            a = ckpt.load(tmp_path / f"block{s}" / ours["file"])["policy"]["network"]
            b = ckpt.load(tmp_path / f"alone{s}" / theirs["file"])["policy"]["network"]
            assert a.keys() == b.keys()
            largest = max(largest, *((a[k] - b[k]).abs().max().item() for k in a))
    print(f"{agent}: largest parameter difference, batched everywhere vs one-seed runs: {largest:.3g}")
    assert largest < 1e-4
