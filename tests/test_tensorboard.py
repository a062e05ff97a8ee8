"""TensorBoard logging of training runs (`logging: {tensorboard: true}`, `training/tensorboard.py`).

* on: a short training run writes an events file under <run>/tensorboard/ with the expected scalar tags
  (episode return and success, the agent's update metrics including epsilon / entropy, env steps/s);
* off: nothing is written, and the checkpoints and the training state are bit-identical to the run with it on;
* a run killed after a checkpoint and resumed logs every step once (what the killed process wrote after its
  last checkpoint is purged);
* the switch reaches train jobs through their params slice only when on, the schema checks it, and a missing
  tensorboard package fails early naming `pip install tapebench[tensorboard]`.
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys
import time

import pytest
from agent_contract import KILL_AFTER_CHECKPOINT_2, assert_same_run, toy_split, train_args
from pipeline_helpers import REPO

from tapebench.cli import main
from tapebench.layout import TENSORBOARD_DIR
from tapebench.pipeline.config import ConfigError, load_config, merge_config, train_slice, validate_config
from tapebench.training import checkpoint as ckpt
from tapebench.training import tensorboard
from tapebench.training.loop import TrainSpec, train

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
PARAMS = {"env": {"L": 8, "H": 8}, "training": {"total_steps": 2400, "eval_every": 800}}
DQN = {"num_envs": 4, "hidden_size": 32, "learning_starts": 200, "target_update_frequency": 200}
PPO = {"num_envs": 4, "num_steps": 32, "hidden_size": 32}
COMMON_TAGS = {"episode/return", "episode/success", "perf/env_steps_per_second"}
AGENT_TAGS = {"dqn": {"agent/td_loss", "agent/q_mean", "agent/epsilon"},
              "ppo": {"agent/policy_loss", "agent/value_loss", "agent/entropy", "agent/approx_kl",
                      "agent/clip_fraction"}}


def scalars(run_dir) -> dict:
    """{tag: [(step, value), ...]} of every events file under <run>/tensorboard/."""
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    files = list((run_dir / TENSORBOARD_DIR).glob("events.out.tfevents.*"))
    assert files, f"no events file under {run_dir / TENSORBOARD_DIR}"
    acc = event_accumulator.EventAccumulator(str(run_dir / TENSORBOARD_DIR))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def params(agent: str, tensorboard: bool | None) -> dict:
    out = {**PARAMS, "agent": DQN if agent == "dqn" else PPO}
    if tensorboard is not None:
        out["logging"] = {"tensorboard": tensorboard}
    return out


@pytest.mark.parametrize("agent", ["dqn", "ppo"])
def test_on_writes_the_scalars_and_off_writes_nothing_with_identical_checkpoints(agent, tmp_path):
    pytest.importorskip("tensorboard")
    split_file = toy_split(tmp_path / "toy.json")
    on, off, default = tmp_path / "on", tmp_path / "off", tmp_path / "default"
    assert main(train_args(agent, split_file, on, params(agent, True))) == 0
    assert main(train_args(agent, split_file, off, params(agent, False))) == 0
    assert main(train_args(agent, split_file, default, params(agent, None))) == 0
    logged = scalars(on)
    assert COMMON_TAGS | AGENT_TAGS[agent] <= set(logged), sorted(logged)
    steps = [s for s, _ in logged["perf/env_steps_per_second"]]
    assert steps == sorted(set(steps)) and steps[-1] == 2400 and len(steps) >= 3       # every 1000 steps + checkpoints
    assert all(0.0 <= v <= 1.0 for _, v in logged["episode/success"])
    assert all(-8.0 <= v <= 1.0 for _, v in logged["episode/return"])                    # H = 8, reward in [-1, 0] + 1
    if agent == "dqn":   # epsilon decays linearly from 1 over half the budget
        epsilon = dict(logged["agent/epsilon"])
        assert epsilon[2400] == pytest.approx(0.05) and all(0.05 <= v <= 1.0 for v in epsilon.values())
    for run in (off, default):
        assert not (run / TENSORBOARD_DIR).exists()
        assert_same_run(on, run)           # checkpoints and training state: the same bytes


# killed at step 2000, after its scalars are on disk: between checkpoint 2 (1600) and 3 (2400)
KILL_AFTER_WRITING_STEP_2000 = (
    "import os, signal, sys\n"
    "import tapebench.training.tensorboard as tb\n"
    "from tapebench.cli import main\n"
    "real_step = tb.TensorBoardLog.step\n"
    "def step(self, env_steps, metrics, checkpoint=False):\n"
    "    real_step(self, env_steps, metrics, checkpoint)\n"
    "    if env_steps == 2000:\n"
    "        self.writer.flush()\n"
    "        os.kill(os.getpid(), signal.SIGKILL)\n"
    "tb.TensorBoardLog.step = step\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.mark.parametrize("kill", [KILL_AFTER_CHECKPOINT_2, KILL_AFTER_WRITING_STEP_2000],
                         ids=["killed-at-checkpoint-2", "killed-between-checkpoints"])
def test_a_resumed_run_logs_every_step_once(tmp_path, kill):
    pytest.importorskip("tensorboard")
    split_file = toy_split(tmp_path / "toy.json")
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    args = lambda out: train_args("dqn", split_file, out, params("dqn", True))
    assert main(args(reference)) == 0
    child = subprocess.run([sys.executable, "-c", kill, *args(killed)], capture_output=True, text=True, timeout=600)
    assert child.returncode == -9, child.stderr
    last = 1600 if kill == KILL_AFTER_CHECKPOINT_2 else 2000
    assert max(s for s, _ in scalars(killed)["agent/td_loss"]) == last
    time.sleep(1.1)   # TensorBoard orders event files by their names, which start with the second they were opened
    assert main(args(killed)) == 0
    assert_same_run(reference, killed)
    want, got = scalars(reference), scalars(killed)
    assert set(got) == set(want)
    for tag in want:
        if tag != "perf/env_steps_per_second":    # wall-clock rates differ between runs
            assert got[tag] == want[tag], tag


def test_a_fresh_start_removes_the_events_of_an_earlier_run(tmp_path):
    pytest.importorskip("tensorboard")
    spec = TrainSpec(agent="dqn", rules=(4,), seed=0, hyperparameters=DQN, L=8, H=8, total_steps=400, eval_every=400)
    train(spec, tmp_path, quiet=True, tensorboard=True)
    first = sorted((tmp_path / TENSORBOARD_DIR).iterdir())
    other = TrainSpec(agent="dqn", rules=(4,), seed=1, hyperparameters=DQN, L=8, H=8, total_steps=400, eval_every=400)
    train(other, tmp_path, quiet=True)                                   # another configuration, logging off
    assert not (tmp_path / TENSORBOARD_DIR).exists() and first


def test_missing_tensorboard_fails_early_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)    # `import` raises ImportError
    spec = TrainSpec(agent="dqn", rules=(4,), seed=0, hyperparameters=DQN, L=8, H=8, total_steps=80, eval_every=80)
    with pytest.raises(ValueError, match=r"pip install tapebench\[tensorboard\]"):
        train(spec, tmp_path / "run", quiet=True, tensorboard=True)
    assert not (tmp_path / "run").exists()
    out = tmp_path / "cli"
    assert main(["train", "--agent", "dqn", "--rules", "4", "--params", json.dumps(params("dqn", True)),
                 "--out", str(out), "--device", "cpu", "--quiet"]) == 2
    assert not out.exists()


@pytest.mark.parametrize("value", ["yes", 1])
def test_train_command_refuses_a_non_boolean_switch(tmp_path, value, capsys):
    bad = {**PARAMS, "logging": {"tensorboard": value}}
    assert main(["train", "--agent", "dqn", "--rules", "4", "--params", json.dumps(bad), "--out",
                 str(tmp_path / "run"), "--device", "cpu", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "'logging.tensorboard'" in err and "boolean" in err, err


def test_the_switch_reaches_train_slices_only_when_on(monkeypatch):
    config = load_config(root=REPO)
    validate_config(config, SCHEMA)
    assert config["logging"] == {"tensorboard": False}
    assert "logging" not in train_slice(config, "dqn")      # off: the train params name no logging
    on = merge_config(config, {"logging": {"tensorboard": True}})
    monkeypatch.setattr(tensorboard, "tensorboard_installed", lambda: False)
    with pytest.raises(ConfigError, match=r"'logging.tensorboard': true, but the tensorboard package is not "
                                          r"installed; install it with `pip install tapebench\[tensorboard\]`"):
        validate_config(copy.deepcopy(on), SCHEMA)     # refused before any training job, not when one starts
    monkeypatch.setattr(tensorboard, "tensorboard_installed", lambda: True)
    validate_config(on, SCHEMA)
    assert train_slice(on, "dqn") == {**train_slice(config, "dqn"), "logging": {"tensorboard": True}}
    for bad in ({"logging": {"tensorboard": "yes"}}, {"logging": {"tensorboard": True, "every": 10}}):
        with pytest.raises(ConfigError, match="logging"):
            validate_config(merge_config(copy.deepcopy(config), bad), SCHEMA)


def test_logging_does_not_change_the_run_fingerprint(tmp_path):
    pytest.importorskip("tensorboard")
    spec = TrainSpec(agent="dqn", rules=(4,), seed=0, hyperparameters=DQN, L=8, H=8, total_steps=400, eval_every=400)
    manifest = train(spec, tmp_path, quiet=True)
    again = train(spec, tmp_path, quiet=True, tensorboard=True)      # a finished run is left alone
    assert again["fingerprint"] == manifest["fingerprint"] and again["checkpoints"] == manifest["checkpoints"]
    assert not (tmp_path / TENSORBOARD_DIR).exists()
    assert "nothing to do" in (tmp_path / ckpt.LOG_FILE).read_text()
