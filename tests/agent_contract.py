"""Checks every method has to pass, shared by the per-method test files (tests/test_agent_<id>.py).

* `learned_success`: a real training run on one fixed easy rule, then greedy strict success on 200
  common-random-number episodes, beside the untrained policy's success.
* `assert_sigkill_resume_bit_identical`: an uninterrupted run, then a run killed with SIGKILL right after
  its second checkpoint and restarted: every checkpoint and the final training state are identical.
* `assert_per_episode_policy`: evaluation results do not depend on which other episodes share the
  batch or on the batching, and per-episode state does not leak from one episode to the next.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from tapebench.cli import main
from tapebench.episodes.sets import episode_set
from tapebench.evaluation.evaluate import greedy_success
from tapebench.evaluation.runner import run_episodes
from tapebench.methods.contract import EnvSpec
from tapebench.registry import build_config, make_agent
from tapebench.splits.io import save_split
from tapebench.training import checkpoint as ckpt
from tapebench.training.loop import TrainSpec, seed_everything, train


def toy_split(path: Path) -> Path:
    save_split(path, {"name": "toy", "train": [4, 12, 200], "test": [0, 76],
                      "types": {"4": "periodic", "12": "periodic", "200": "stable", "0": "stable", "76": "stable"},
                      "params": {"method": "hand"}, "unit": "rule"})
    return path


def train_args(agent: str, split_file, out, params: dict, seed: int = 3) -> list[str]:
    return ["train", "--agent", agent, "--split", str(split_file), "--seed", str(seed), "--params",
            json.dumps(params), "--out", str(out), "--device", "cpu", "--threads", "1", "--quiet", "--keep-resume"]


def tensors_equal(a, b) -> bool:
    """Deep equality of nested dicts/lists of tensors, arrays and plain values."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(tensors_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(tensors_equal(x, y) for x, y in zip(a, b))
    return a == b


def assert_same_run(reference: Path, resumed: Path) -> None:
    ref_files = sorted(p.name for p in (reference / "checkpoints").iterdir())
    assert ref_files == sorted(p.name for p in (resumed / "checkpoints").iterdir())
    identical_files = True
    for name in ref_files:
        ref_bytes, new_bytes = (reference / "checkpoints" / name).read_bytes(), (resumed / "checkpoints" / name).read_bytes()
        ref, new = ckpt.load(reference / "checkpoints" / name), ckpt.load(resumed / "checkpoints" / name)
        ref_version, new_version = ref["provenance"].pop("code_version"), new["provenance"].pop("code_version")
        assert tensors_equal(ref, new), name
        # identical files too, unless the checkout changed between the two runs (shared working trees)
        assert ref_bytes == new_bytes or ref_version != new_version, name
        identical_files &= ref_bytes == new_bytes
    ref_state, new_state = ckpt.load(reference / ckpt.RESUME_FILE), ckpt.load(resumed / ckpt.RESUME_FILE)
    for key in ("agent", "env", "rng", "iteration"):
        assert tensors_equal(ref_state[key], new_state[key]), key
    # the checkpoints' sha256 match when the files do
    if identical_files:
        assert ref_state["checkpoints"] == new_state["checkpoints"]
    else:
        assert [c["env_steps"] for c in ref_state["checkpoints"]] == [c["env_steps"] for c in new_state["checkpoints"]]


KILL_AFTER_CHECKPOINT_2 = (
    "import os, signal, sys\n"
    "import tapebench.commands.training as training_cli\n"
    "from tapebench.cli import main\n"
    "real_train = training_cli.train\n"
    "kill = lambda index, steps: os.kill(os.getpid(), signal.SIGKILL) if index == 2 else None\n"
    "training_cli.train = lambda *a, **k: real_train(*a, on_checkpoint=kill, **k)\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def assert_sigkill_resume_bit_identical(agent: str, params: dict, tmp_path: Path) -> None:
    """`params` is the job's config slice (agent/env/training); give it >= 3 checkpoints."""
    split_file = toy_split(tmp_path / "toy.json")
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    assert main(train_args(agent, split_file, reference, params)) == 0
    child = subprocess.run([sys.executable, "-c", KILL_AFTER_CHECKPOINT_2, *train_args(agent, split_file, killed,
                                                                                         params)],
                           capture_output=True, text=True, timeout=600)
    assert child.returncode == -9, child.stderr
    assert not (killed / ckpt.MANIFEST_FILE).exists()
    assert main(train_args(agent, split_file, killed, params)) == 0
    assert "resuming from resume.pt" in (killed / ckpt.LOG_FILE).read_text()
    assert_same_run(reference, killed)


def learned_success(agent: str, rule: int, L: int, H: int, budget: int, run_dir: Path, hyperparameters=None,
                    seed: int = 0) -> tuple[float, float]:
    """(untrained greedy success, trained greedy success) on 200 CRN episodes of `rule`."""
    hyperparameters = hyperparameters or {}
    seed_everything(seed)
    untrained = make_agent(agent, build_config(agent, hyperparameters), EnvSpec.for_tape(L, H), 1, "cpu")
    before = greedy_success(untrained, [rule], H=H, L=L, episodes_per_rule=200, eval_seed=7)
    spec = TrainSpec(agent=agent, rules=(rule,), seed=seed, hyperparameters=hyperparameters, L=L, H=H,
                     total_steps=budget, eval_every=budget)
    manifest = train(spec, run_dir, quiet=True)
    trained, _ = ckpt.load_policy(run_dir / manifest["checkpoints"][-1]["file"])
    after = greedy_success(trained, [rule], H=H, L=L, episodes_per_rule=200, eval_seed=7)
    return before, after


def assert_per_episode_policy(make_policy, *, rules=(30, 110, 4, 90), L: int = 8, H: int = 8,
                              episodes_per_rule: int = 3, reveal_rules: bool = False) -> None:
    """`make_policy()` returns a fresh evaluation policy. Checks, episode by episode:

    * the same results when each rule's episodes are played alone, in a batch of all rules, in batches
      of 5, and one episode at a time through the *same* policy object (state must not leak from one
      episode into the next);
    * a second pass of the same policy object over the same batch gives the same results.
    """
    episodes = episode_set(list(rules), episodes_per_rule, L, eval_seed=4, side="test", key=9)
    kwargs = dict(reveal_rules=reveal_rules)
    whole = run_episodes(make_policy(), episodes, H, **kwargs)
    policy = make_policy()
    variants = {
        "batches of 5": run_episodes(make_policy(), episodes, H, batch_size=5, **kwargs),
        "one rule per batch": run_episodes(make_policy(), episodes, H, by_rule=True, **kwargs),
        "one episode at a time, same policy object": run_episodes(policy, episodes, H, batch_size=1, **kwargs),
        "second pass of the same policy object": run_episodes(policy, episodes, H, **kwargs),
    }
    for z in rules:
        alone = episode_set([z], episodes_per_rule, L, eval_seed=4, side="test", key=9)
        rows = episodes.rules == z
        got = run_episodes(make_policy(), alone, H, **kwargs)
        for key in whole:
            assert np.array_equal(whole[key][rows], got[key]), (f"rule {z} alone", key)
    for name, got in variants.items():
        for key in whole:
            assert np.array_equal(whole[key], got[key]), (name, key)
