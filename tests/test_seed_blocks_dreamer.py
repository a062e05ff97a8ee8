"""World-model seed blocks (methods/world_model_block.py; DreamerV3's in methods/dreamer_block.py, PlaNet-MPC's in
methods/planet.py): a stacked block trains each seed as its one-seed run does, and a seed does not depend on its
neighbours in the block."""
from __future__ import annotations

import pytest
import torch
from test_seed_blocks_loop import Killed, kill_after

from tapebench.training import checkpoint as ckpt
from tapebench.training.blocks import train_block
from tapebench.training.loop import TrainSpec, train

# tiny sizes; learning_starts 64 and an update every 8 env steps: an update every 2 env steps
HYPER = {"num_envs": 4, "deter_size": 16, "hidden_size": 16, "stoch_groups": 8, "batch_size": 4,
         "sequence_length": 8, "train_ratio": 16, "learning_starts": 64, "buffer_size": 256,
         "imagination_horizon": 4, "imagination_starts": 16}
STEPS = 256
# the largest difference of any state tensor from the one-seed run's (measured 1.6e-05: batched layer-norm,
# reduction and weight-gradient kernels round differently from the one-seed agent's)
BOUND = 1e-3

pytestmark = pytest.mark.usefixtures("one_torch_thread")


HYPERPARAMETERS = {"dreamer": HYPER, "planet": {k: v for k, v in HYPER.items() if not k.startswith("imagination")}}
AGENTS = pytest.mark.parametrize("agent", list(HYPERPARAMETERS))


def spec(seed, agent="dreamer"):
    return TrainSpec(agent=agent, rules=(30, 90, 110), seed=seed, hyperparameters=HYPERPARAMETERS[agent], L=8, H=8,
                     total_steps=STEPS, eval_every=STEPS // 2)


def tensors(obj, prefix=""):
    """Every tensor of a nested checkpoint payload by path."""
    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    if isinstance(obj, dict):
        return {k: v for key, value in obj.items() for k, v in tensors(value, f"{prefix}/{key}").items()}
    if isinstance(obj, (list, tuple)):
        return {k: v for i, value in enumerate(obj) for k, v in tensors(value, f"{prefix}/{i}").items()}
    return {}


def largest_difference(run_a, run_b) -> float:
    """Largest absolute difference over the full training state (resume.pt) and every checkpoint of two runs."""
    worst = 0.0
    files = [ckpt.RESUME_FILE] + sorted(p.relative_to(run_a).as_posix() for p in (run_a / "checkpoints").iterdir())
    for name in files:
        a, b = ckpt.load(run_a / name), ckpt.load(run_b / name)
        key = "agent" if name == ckpt.RESUME_FILE else "policy"
        ta, tb = tensors(a[key]), tensors(b[key])
        assert ta.keys() == tb.keys() and ta, name
        for path in ta:
            x, y = ta[path], tb[path]
            assert x.shape == y.shape and x.dtype == y.dtype, f"{name}: {path}"
            if x.is_floating_point():
                worst = max(worst, (x - y).abs().max().item() if x.numel() else 0.0)
            else:
                assert torch.equal(x, y), f"{name}: {path}"
    return worst


@AGENTS
def test_a_stacked_block_trains_each_seed_as_its_one_seed_run(tmp_path, agent):
    seeds = [0, 1, 2]
    train_block([spec(s, agent) for s in seeds], [tmp_path / f"block{s}" for s in seeds], quiet=True, keep_resume=True,
                stacking="always")
    differences = []
    for s in seeds:
        train(spec(s, agent), tmp_path / f"alone{s}", quiet=True, keep_resume=True)
        differences.append(largest_difference(tmp_path / f"alone{s}", tmp_path / f"block{s}"))
    print(f"{agent} block of {len(seeds)} vs one-seed runs after {STEPS} env steps: largest state difference "
          f"{max(differences):.3g}")
    assert max(differences) <= BOUND


@AGENTS
def test_a_seed_does_not_depend_on_its_neighbours(tmp_path, monkeypatch, agent):
    """Bit for bit: nothing in a block mixes seeds, not even in rounding (padding rows, sums, the unroll's graph),
    whatever the block's size and its groups of seeds in the update."""
    from tapebench.methods import dreamer_block, world_model_block

    defaults = world_model_block.WORLD_MODEL_GROUP, dreamer_block.ACTOR_CRITIC_GROUP
    for block in ((0, 1, 2), (0, 5, 7), (0, 9, 10, 11)):
        groups = (2, 2) if len(block) == 4 else defaults     # the update in two groups, [0, 9] and [10, 11]
        monkeypatch.setattr(world_model_block, "WORLD_MODEL_GROUP", groups[0])
        monkeypatch.setattr(dreamer_block, "ACTOR_CRITIC_GROUP", groups[1])
        train_block([spec(s, agent) for s in block], [tmp_path / f"{block}" / f"s{s}" for s in block], quiet=True,
                    keep_resume=True, stacking="always")
    differences = [largest_difference(tmp_path / "(0, 1, 2)" / "s0", tmp_path / f"{block}" / "s0")
                   for block in ((0, 5, 7), (0, 9, 10, 11))]
    print(f"{agent} seed 0 in blocks [0, 1, 2], [0, 5, 7] and [0, 9, 10, 11] (groups of 2): largest state "
          f"differences {differences}")
    assert differences == [0.0, 0.0]


@AGENTS
def test_a_killed_block_resumes_to_the_checkpoints_of_an_uninterrupted_one(tmp_path, monkeypatch, agent):
    seeds = (3, 4)
    kill_after(monkeypatch, 2)   # both seeds' first checkpoint and resume.pt are on disk
    with pytest.raises(Killed):
        train_block([spec(s, agent) for s in seeds], [tmp_path / f"k{s}" for s in seeds], quiet=True, stacking="always")
    specs = [spec(s, agent) for s in seeds]
    resumed = train_block(specs, [tmp_path / f"k{s}" for s in seeds], quiet=True, stacking="always")
    fresh = train_block(specs, [tmp_path / f"f{s}" for s in seeds], quiet=True, stacking="always")
    assert all(m["resumes"] == 1 for m in resumed)
    assert [m["checkpoints"] for m in resumed] == [m["checkpoints"] for m in fresh]   # bit for bit
