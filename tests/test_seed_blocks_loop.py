"""The seed-block trainer (training/blocks.py): bookkeeping, resume and the one-by-one fallback, checked with a
lock-step block that runs each seed's own one-seed agent on its own generator (so any difference from one-seed
runs is the trainer's, not a stacked network's)."""
from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
import torch

from tapebench.grid_rules import VON_NEUMANN
from tapebench.methods.contract import BlockUnsupported
from tapebench.registry import get_method, register, unregister
from tapebench.training import checkpoint as ckpt
from tapebench.training.blocks import train_block
from tapebench.training.loop import TrainSpec, train
from tapebench.utils.artifacts import read_json
from test_seed_blocks_ppo import assert_same_state, training_state

HYPER = {"num_envs": 4, "buffer_size": 500, "learning_starts": 32, "batch_size": 16, "hidden_size": 16,
         "target_update_frequency": 64}


class LockstepBlock:
    """The seed-block contract with no stacking: seed k's own agent, torch's global generator swapped to seed k's."""

    bit_exact_devices = ("cpu",)

    def __init__(self, agents, generators):
        self.agents, self.generators = agents, generators

    def _as_seed(self, k, call):
        torch.set_rng_state(self.generators[k].get_state())
        out = call()
        self.generators[k].set_state(torch.get_rng_state())
        return out

    def act(self, obs):
        return torch.stack([self._as_seed(k, lambda k=k: a.act(obs[k])) for k, a in enumerate(self.agents)])

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated):
        for k, a in enumerate(self.agents):
            a.observe(obs[k], actions[k], rewards[k], next_obs[k], terminated[k], truncated[k])

    def update(self):
        return [self._as_seed(k, a.update) for k, a in enumerate(self.agents)]

    def export_seed(self, k, agent):
        agent.load_state_dict(self.agents[k].state_dict())

    def import_seed(self, k, agent):
        self.agents[k].load_state_dict(agent.state_dict())


def refuse(agents, generators):
    raise BlockUnsupported("this test method never stacks")


@pytest.fixture
def lockstep_method():
    dqn = get_method("dqn")
    for id_, make_block in (("dqn_lockstep", LockstepBlock), ("dqn_refusing", refuse)):
        register(dataclasses.replace(dqn, id=id_, make_block=make_block))
    yield
    unregister("dqn_lockstep")
    unregister("dqn_refusing")


class Killed(Exception):
    """What `kill_after` raises: the trainer stops as a killed process would."""


def kill_after(monkeypatch, writes: int) -> None:
    """The block trainer raises `Killed` right after its `writes`-th checkpoint write (that write's files on disk)."""
    import tapebench.training.blocks as blocks
    original, calls = blocks.write_run_checkpoint, []

    def write_then_die(*args, **kwargs):
        original(*args, **kwargs)
        calls.append(1)
        if len(calls) == writes:
            raise Killed

    monkeypatch.setattr(blocks, "write_run_checkpoint", write_then_die)


def spec(agent, seed, total_steps=256):
    return TrainSpec(agent=agent, rules=(30, 90, 110), seed=seed, hyperparameters=HYPER, L=8, H=8,
                     total_steps=total_steps, eval_every=128)


def checkpoint_digests(run):
    manifest = read_json(run / "train.json", "manifest")
    return manifest["fingerprint"], [c["sha256"] for c in manifest["checkpoints"]]


def test_a_stacked_block_writes_each_seed_what_its_one_seed_run_writes(tmp_path, lockstep_method):
    seeds = [0, 3, 4]
    alone = [checkpoint_digests(run) for run in
             (train(spec("dqn_lockstep", s), tmp_path / f"alone{s}", quiet=True) and tmp_path / f"alone{s}"
              for s in seeds)]
    manifests = train_block([spec("dqn_lockstep", s) for s in seeds], [tmp_path / f"block{s}" for s in seeds],
                            quiet=True)
    assert [checkpoint_digests(tmp_path / f"block{s}") for s in seeds] == alone
    assert all(m["block"] == {**m["block"], "seeds": seeds, "stacked": True} for m in manifests)
    assert not any((tmp_path / f"block{s}" / "resume.pt").exists() for s in seeds)


def test_finished_seeds_are_left_alone_and_a_method_that_refuses_trains_one_by_one(tmp_path, lockstep_method):
    first = train_block([spec("dqn_refusing", s) for s in (0, 1)], [tmp_path / f"s{s}" for s in (0, 1)], quiet=True)
    assert all("block" not in m for m in first)          # refused: the one-seed loop wrote them
    stamp = (tmp_path / "s0" / "train.json").stat().st_mtime_ns
    more = train_block([spec("dqn_refusing", s) for s in (0, 1, 2)], [tmp_path / f"s{s}" for s in (0, 1, 2)],
                       quiet=True)
    assert (tmp_path / "s0" / "train.json").stat().st_mtime_ns == stamp   # adding a seed trains only the new one
    assert [m["seed"] for m in more] == [0, 1, 2]
    alone = train(spec("dqn_refusing", 2), tmp_path / "alone2", quiet=True)
    assert checkpoint_digests(tmp_path / "s2") == (alone["fingerprint"], [c["sha256"] for c in alone["checkpoints"]])


def test_a_killed_stacked_block_resumes_to_the_same_checkpoints(tmp_path, lockstep_method, monkeypatch):
    seeds, runs = [1, 2], [tmp_path / "k1", tmp_path / "k2"]
    specs = [spec("dqn_lockstep", s, total_steps=384) for s in seeds]
    kill_after(monkeypatch, 2 * len(seeds))   # both seeds' second checkpoint and resume.pt are on disk
    with pytest.raises(Killed):
        train_block(specs, runs, quiet=True)
    assert all((run / "resume.pt").exists() and not (run / "train.json").exists() for run in runs)
    resumed = train_block(specs, runs, quiet=True)
    assert all(m["resumes"] == 1 for m in resumed)
    fresh = train_block(specs, [tmp_path / "f1", tmp_path / "f2"], quiet=True)
    assert [m["checkpoints"] for m in resumed] == [m["checkpoints"] for m in fresh]


def test_block_arguments_are_checked_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="distinct"):
        train_block([spec("dqn", 0), spec("dqn", 0)], [tmp_path / "a", tmp_path / "b"])
    with pytest.raises(ValueError, match="differ only in their seed"):
        train_block([spec("dqn", 0), spec("dqn", 1, total_steps=512)], [tmp_path / "a", tmp_path / "b"])
    with pytest.raises(ValueError, match="own run folder"):
        train_block([spec("dqn", 0), spec("dqn", 1)], [tmp_path / "a", tmp_path / "a"])
    assert not any(tmp_path.iterdir())


def test_the_cli_trains_a_block_into_each_seeds_folder_and_records_it(tmp_path, capsys):
    from tapebench.cli import main

    params = json.dumps({"agent": HYPER, "env": {"L": 8, "H": 8}, "training": {"total_steps": 128, "eval_every": 128}})
    record = tmp_path / "block.json"
    assert main(["train", "--agent", "dqn", "--rules", "30,90", "--seeds", "2-3", "--params", params, "--quiet",
                 "--out", str(tmp_path / "seed{seed}"), "--block-record", str(record)]) == 0
    body = read_json(record, "block record")
    assert body["seeds"] == [2, 3] and [r["run"] for r in body["runs"]] == [str(tmp_path / f"seed{s}") for s in (2, 3)]
    capsys.readouterr()
    assert main(["train", "--agent", "dqn", "--rules", "30", "--seeds", "0-1", "--out", str(tmp_path / "x")]) == 2
    assert "--seeds needs {seed} in --out" in capsys.readouterr().err
    assert main(["train", "--agent", "dqn", "--rules", "30", "--seeds", "a-b", "--out", str(tmp_path / "s{seed}")]) == 2
    assert "cannot parse seed list item 'a-b'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()

    # evaluation in blocks: each seed's records as its own command writes them, whatever ran before in the process
    evaluate = ["evaluate", "--rules", "30,90", "--H", "8", "--quiet", "--params", json.dumps({"evaluation": {
        "episodes_per_rule": 2}})]
    for source in (["--run", str(tmp_path / "seed{seed}")], ["--method", "random"]):
        single, block = tmp_path / "single{seed}.parquet", tmp_path / "block{seed}.parquet"
        one_seed = [a.replace("{seed}", "3") for a in source]
        assert main([*evaluate, *one_seed, "--seed", "3", "--out", str(single).replace("{seed}", "3")]) == 0
        assert main([*evaluate, *source, "--seeds", "2-3", "--out", str(block)]) == 0
        pd.testing.assert_frame_equal(pd.read_parquet(str(block).replace("{seed}", "3")),
                                      pd.read_parquet(str(single).replace("{seed}", "3")))
        assert set(pd.read_parquet(str(block).replace("{seed}", "2"))["seed"]) == {2}
    assert main([*evaluate, "--run", str(tmp_path / "seed2"), "--seeds", "2-3", "--out", str(tmp_path / "e{seed}")]) == 2
    assert "--seeds needs {seed} in --run" in capsys.readouterr().err


def test_bench_seeds_times_one_process_beside_separate_processes(tmp_path, capsys):
    from tapebench.cli import main

    out = tmp_path / "seeds.json"
    assert main(["bench", "seeds", "--agents", "dqn", "--seeds", "2", "--steps", "128", "--L", "8", "--H", "8",
                 "--rules", "30,90", "--share", "2", "--json", str(out)]) == 0
    figures = read_json(out, "bench figures")["figures"]
    row = figures["agents"]["dqn"]["2"]
    assert row["env_steps"] == 256
    assert row["speedup"] == pytest.approx(row["one_process"] / row["separate"], rel=1e-2)
    # both start-ups are measured (two processes against one; their order is the machine's load, not asserted)
    assert row["separate_startup_s"] > 0 and row["one_process_startup_s"] > 0
    assert "at_most" not in row
    # two blocks of 2 seeds at once, each against the same run's block alone
    share = figures["share"]["dqn"]["2"]
    assert share["blocks"] == 2 and share["env_steps"] == 512
    assert share["aggregate"] == pytest.approx(512 / share["wall_s"], rel=1e-2)
    assert share["gain"] == pytest.approx(share["aggregate"] / row["one_process"], rel=1e-2)
    assert share["slowdown"] == pytest.approx(share["wall_s"] / row["one_process_wall_s"], rel=1e-2)
    assert main(["bench", "seeds", "--share", "0"]) == 2


def test_bench_seeds_floor_bounds_the_block_by_its_counted_flops(tmp_path):
    from tapebench.bench.flops import counted_run_flops
    from tapebench.bench.seeds import at_most
    from tapebench.cli import main

    out = tmp_path / "seeds.json"
    assert main(["bench", "seeds", "--agents", "dqn", "--seeds", "2", "--steps", "128", "--L", "8", "--H", "8",
                 "--rules", "30,90", "--floor", "--json", str(out)]) == 0
    figures = read_json(out, "bench figures")["figures"]
    row, floor = figures["agents"]["dqn"]["2"], figures["floor"]["dqn"]
    _, flops = counted_run_flops(TrainSpec(agent="dqn", rules=(30, 90), seed=0, L=8, H=8, total_steps=128,
                                           eval_every=128))
    assert floor["flops_per_seed"] == flops > 0
    rate = figures["gemm_flops_per_s"]["best"]
    assert floor["loop_s_per_seed"] == pytest.approx(flops / rate)
    # the closed form: N x steps over (measured start-up + N x FLOP time), over the separate processes' rate
    best = 256 / (row["one_process_startup_s"] + 2 * flops / rate)
    assert row["at_most"] == pytest.approx(best / row["separate"], rel=1e-2)
    assert at_most({"env_steps": 100, "seeds": 4, "one_process_startup_s": 1.0, "separate": 10.0},
                   {"loop_s_per_seed": 0.5}) == {"floor_one_process": 33.3, "at_most": 3.333}
    assert main(["bench", "seeds", "--floor", "8192"]) == 2
    assert main(["bench", "seeds", "--floor", "--device", "cuda"]) == 2
    assert main(["bench", "seeds", "--seeds", "0"]) == 2
    assert main(["bench", "sb3", "--seeds", "2", "3"]) == 2


def test_where_stacking_only_rounds_alike_the_fingerprint_names_the_block(tmp_path, lockstep_method):
    """A method whose stacked seeds are not bit for bit its one-seed runs (no bit-exact device): each seed's
    fingerprint names its block, so the same config reproduces it, and the block is trained whole."""
    dqn = get_method("dqn_lockstep")

    def inexact(agents, generators):
        return LockstepBlock(agents, generators)

    inexact.bit_exact_devices = ()
    register(dataclasses.replace(dqn, id="dqn_inexact", make_block=inexact))
    try:
        runs = [tmp_path / f"s{s}" for s in (0, 1)]
        first = train_block([spec("dqn_inexact", s) for s in (0, 1)], runs, quiet=True, stacking="always")
        alone = train(spec("dqn_inexact", 0), tmp_path / "alone", quiet=True)
        assert first[0]["fingerprint"] != alone["fingerprint"]
        assert first[0]["fingerprint"] == dataclasses.replace(spec("dqn_inexact", 0), block=(0, 1)).fingerprint()
        (runs[1] / "train.json").unlink()                      # one seed unfinished: the whole block trains again
        again = train_block([spec("dqn_inexact", s) for s in (0, 1)], runs, quiet=True, stacking="always")
        auto = train_block([spec("dqn_inexact", s) for s in (0, 1)], [tmp_path / "a0", tmp_path / "a1"], quiet=True)
        assert auto[0]["fingerprint"] == alone["fingerprint"]   # auto on the CPU: one after another, bit for bit
        assert [m["checkpoints"] for m in again] == [m["checkpoints"] for m in first]
        assert all(m["block"]["seeds"] == [0, 1] for m in again)

        # the pipeline's job: training.stacking in --params (config `training.stacking: always`)
        from tapebench.cli import main
        slice_ = {"agent": HYPER, "env": {"L": 8, "H": 8},
                  "training": {"total_steps": 256, "eval_every": 128, "stacking": "always"}}
        command = ["train", "--agent", "dqn_inexact", "--rules", "30,90,110", "--seeds", "0-1", "--quiet",
                   "--params", json.dumps(slice_), "--out", str(tmp_path / "cli{seed}")]
        assert main(command) == 0
        cli = [read_json(tmp_path / f"cli{s}" / "train.json", "manifest") for s in (0, 1)]
        assert [m["fingerprint"] for m in cli] == [m["fingerprint"] for m in first]
        for seed, manifest in zip((0, 1), cli):          # same weights (the files' provenance differs: --rules)
            final = manifest["checkpoints"][-1]["file"]
            assert_same_state(*(ckpt.load(folder / final)["policy"] for folder in (tmp_path / f"cli{seed}", runs[seed])))
        assert main([*command, "--stacking", "never"]) == 2     # the flag and the params disagree
    finally:
        unregister("dqn_inexact")


def assert_stacked_seeds_are_their_one_seed_runs(specs, tmp_path) -> None:
    """The block of `specs`, stacked, gives each seed its one-seed run's checkpoints and complete training state."""
    manifests = train_block(specs, [tmp_path / f"block{s.seed}" for s in specs], quiet=True, keep_resume=True)
    assert all(m["block"]["stacked"] for m in manifests)
    for s in specs:
        train(s, tmp_path / f"alone{s.seed}", quiet=True, keep_resume=True)
        assert checkpoint_digests(tmp_path / f"block{s.seed}") == checkpoint_digests(tmp_path / f"alone{s.seed}")
        assert_same_state(training_state(tmp_path / f"block{s.seed}"), training_state(tmp_path / f"alone{s.seed}"))


PEARL_HYPER = {"num_envs": 4, "hidden_size": 16, "latent_dim": 4, "encoder_hidden_size": 16, "buffer_size": 64,
               "learning_starts": 32, "batch_size": 16, "target_update_frequency": 48}


@pytest.mark.parametrize("agent, hyperparameters", [
    ("dqn", HYPER), ("rad_dqn", HYPER), ("curl_dqn", HYPER),
    ("ppo", {"num_envs": 4, "num_steps": 16, "hidden_size": 16}),
    ("ppo_dr", {"num_envs": 4, "num_steps": 16, "hidden_size": 16}),
    ("rainbow", {**HYPER, "buffer_size": 100, "atoms": 11, "batch_size": 8}),
    ("rl2_a2c", {"num_envs": 4, "num_steps": 12, "hidden_size": 16}),
    ("pearl_dqn", PEARL_HYPER), ("pearl_dqn_equivariant", {**PEARL_HYPER, "conv_channels": 4, "conv_layers": 2}),
    ("ensemble_mpc", {"num_envs": 4, "ensemble_size": 2, "hidden_size": 16, "buffer_size": 200, "batch_size": 8,
                      "learning_starts": 32})])
def test_a_real_methods_block_writes_each_seeds_one_seed_checkpoints(tmp_path, monkeypatch, agent, hyperparameters):
    """Through the trainer, with the method's own stacked block (`--stacking auto` stacks it: bit for bit on the CPU):
    each seed's checkpoints and fingerprint are its one-seed run's, also after the block was killed and resumed
    (the resumed block built from every seed's resumed agent)."""
    seeds = [0, 2]
    specs = [dataclasses.replace(spec(agent, s, total_steps=384), hyperparameters=hyperparameters) for s in seeds]
    alone = [checkpoint_digests(tmp_path / f"alone{s.seed}") for s in specs
             if train(s, tmp_path / f"alone{s.seed}", quiet=True)]
    runs = [tmp_path / f"block{s}" for s in seeds]
    kill_after(monkeypatch, 2 * len(seeds))
    with pytest.raises(Killed):
        train_block(specs, runs, quiet=True)
    manifests = train_block(specs, runs, quiet=True)
    assert all(m["block"]["stacked"] and m["resumes"] == 1 for m in manifests)
    assert [checkpoint_digests(run) for run in runs] == alone


@pytest.mark.parametrize("agent, hyperparameters", [
    ("curl_dqn", {"num_envs": 4, "learning_starts": 16, "batch_size": 8, "hidden_size": 16}),
    ("pearl_dqn", {"num_envs": 4, "learning_starts": 16, "batch_size": 8, "hidden_size": 16, "buffer_size": 64}),
    ("rainbow", {"num_envs": 4, "learning_starts": 16, "batch_size": 8, "hidden_size": 16, "atoms": 11}),
    ("rl2_a2c", {"num_envs": 4, "num_steps": 8, "hidden_size": 16})])
def test_a_stacked_block_on_the_grid_writes_each_seeds_one_seed_checkpoints(tmp_path, agent, hyperparameters):
    """The 2D grid family (4 x 4 torus, von Neumann): the augmentations translate the torus, the networks read its
    cells; each stacked seed is still its one-seed run."""
    specs = [TrainSpec(agent=agent, rules=(194, 4), seed=s, L=16, H=8, total_steps=128, eval_every=64,
                       family=VON_NEUMANN.as_dict(), hyperparameters=hyperparameters) for s in (0, 1)]
    assert_stacked_seeds_are_their_one_seed_runs(specs, tmp_path)


@pytest.mark.parametrize("agent, hyperparameters", [
    ("dqn_equivariant", {**HYPER, "hidden_size": 30, "batch_size": 15, "conv_channels": 5, "conv_layers": 2}),
    ("pearl_dqn", {**PEARL_HYPER, "hidden_size": 30, "latent_dim": 3, "encoder_hidden_size": 14})])
def test_a_stacked_seed_is_its_one_seed_run_at_sizes_off_the_vector_width(tmp_path, agent, hyperparameters):
    """L = 13, 30 hidden units, 5 channels: a seed's slices of the stacked tensors (and of their gradients) start
    mid-vector at places 1 and 2, where the BLAS would round its products differently from its one-seed run's
    (`stacked.aligned`, `stacked.aligned_gradient`)."""
    specs = [TrainSpec(agent=agent, rules=(30, 90, 110), seed=s, hyperparameters=hyperparameters, L=13, H=8,
                       total_steps=192, eval_every=96) for s in (0, 1, 2)]
    assert_stacked_seeds_are_their_one_seed_runs(specs, tmp_path)
