"""The training contract: checkpoints, resume after a kill (bit-identical on CPU), manifest,
determinism, truncation handling, hyperparameter errors, and the evaluation Parquet."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from agent_contract import KILL_AFTER_CHECKPOINT_2, assert_same_run, tensors_equal

from tapebench import registry as methods
from tapebench.cli import main
from tapebench.evaluation.records import AGENT_COLUMNS, EPISODE_COLUMNS
from tapebench.methods import contract as agents
from tapebench.splits.io import save_split
from tapebench.training import checkpoint as ckpt
from tapebench.training.loop import TrainSpec, checkpoint_steps, train
from tapebench.utils.io import read_parquet_meta

L = H = 8
# small but real runs: DQN learns from step 200; PPO's 8 x 64 = 512-step rollouts straddle the
# checkpoints (so a resume restarts mid-rollout), and eval_every = 300 is not a multiple of 8.
SMALL = {
    "dqn": {"agent": {"num_envs": 4, "hidden_size": 32, "learning_starts": 200, "target_update_frequency": 200},
            "env": {"L": L, "H": H}, "training": {"total_steps": 1200, "eval_every": 300}},
    "ppo": {"agent": {"num_envs": 8, "num_steps": 64, "hidden_size": 32},
            "env": {"L": L, "H": H}, "training": {"total_steps": 1200, "eval_every": 300}},
}
EXPECTED_STEPS = {"dqn": [300, 600, 900, 1200], "ppo": [304, 600, 904, 1200]}


@pytest.fixture(scope="module")
def split_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("split") / "toy.json"
    save_split(path, {"name": "toy", "train": [4, 12, 200], "test": [0, 76],
                      "types": {"4": "periodic", "12": "periodic", "200": "stable", "0": "stable", "76": "stable"},
                      "params": {"method": "hand"}, "unit": "rule"})
    return path


def train_args(agent, split_file, out, seed=3, params=None):
    return ["train", "--agent", agent, "--split", str(split_file), "--seed", str(seed), "--params",
            json.dumps(params if params is not None else SMALL[agent]), "--out", str(out), "--device", "cpu",
            "--threads", "1", "--quiet", "--keep-resume"]


@pytest.fixture(scope="module")
def complete_runs(split_file, tmp_path_factory):
    """One uninterrupted reference run per agent."""
    runs = {}
    for agent in SMALL:
        out = tmp_path_factory.mktemp(f"ref_{agent}")
        assert main(train_args(agent, split_file, out)) == 0
        runs[agent] = out
    return runs


# --- schedule ------------------------------------------------------------------------------------
def test_checkpoint_steps_are_multiples_of_eval_every_rounded_up_to_num_envs():
    assert checkpoint_steps(200_000, 10_000, 16) == list(range(10_000, 200_001, 10_000))
    assert checkpoint_steps(1200, 300, 8) == [304, 600, 904, 1200]
    assert checkpoint_steps(1000, 300, 4) == [300, 600, 900, 1000]   # the end is always a checkpoint
    assert checkpoint_steps(100, 300, 4) == [100]


@pytest.mark.parametrize("agent", sorted(SMALL))
def test_complete_run_writes_checkpoints_resume_state_and_manifest(complete_runs, split_file, agent):
    out = complete_runs[agent]
    manifest = json.loads((out / ckpt.MANIFEST_FILE).read_text())
    assert [c["env_steps"] for c in manifest["checkpoints"]] == EXPECTED_STEPS[agent]
    assert manifest["training"]["env_steps"] == 1200
    split = json.loads(split_file.read_text())
    assert manifest["split"] == {"name": "toy", "content_hash": split["content_hash"]}
    assert manifest["train_rules"] == [4, 12, 200]
    prov = manifest["provenance"]
    assert prov["seed"] == 3 and prov["code_version"] and prov["config"] == SMALL[agent]
    assert manifest["steps_per_second"] > 0 and manifest["resumes"] == 0
    for entry in manifest["checkpoints"]:
        policy, meta = ckpt.load_policy(out / entry["file"])
        assert meta["agent"] == agent and meta["env_steps"] == entry["env_steps"]
        assert meta["hyperparameters"]["hidden_size"] == 32
        actions = policy.act(torch.zeros(5, L + 1), greedy=True)
        assert actions.shape == (5,) and int(actions.max()) < L
    assert (out / ckpt.RESUME_FILE).is_file() and (out / ckpt.LOG_FILE).is_file()


def test_resume_state_is_deleted_after_completion_by_default(split_file, tmp_path):
    args = train_args("dqn", split_file, tmp_path)
    args.remove("--keep-resume")
    assert main(args) == 0
    assert (tmp_path / ckpt.MANIFEST_FILE).is_file() and not (tmp_path / ckpt.RESUME_FILE).exists()
    assert len(list((tmp_path / "checkpoints").glob("step_*.pt"))) == 4


# --- resume --------------------------------------------------------------------------------------
class Interrupt(Exception):
    pass


def stop_after_checkpoint_2(index, env_steps):
    if index == 2:
        raise Interrupt


@pytest.mark.parametrize("agent", sorted(SMALL))
def test_resume_after_interruption_is_bit_identical(complete_runs, split_file, tmp_path, monkeypatch, agent):
    import tapebench.commands.training as training_cli

    real_train = training_cli.train
    monkeypatch.setattr(training_cli, "train",
                        lambda *a, **k: real_train(*a, on_checkpoint=stop_after_checkpoint_2, **k))
    with pytest.raises(Interrupt):
        main(train_args(agent, split_file, tmp_path))
    assert not (tmp_path / ckpt.MANIFEST_FILE).exists()
    assert len(list((tmp_path / "checkpoints").glob("step_*.pt"))) == 2
    monkeypatch.setattr(training_cli, "train", real_train)

    assert main(train_args(agent, split_file, tmp_path)) == 0
    assert "resuming from resume.pt" in (tmp_path / ckpt.LOG_FILE).read_text()
    assert_same_run(complete_runs[agent], tmp_path)
    assert json.loads((tmp_path / ckpt.MANIFEST_FILE).read_text())["resumes"] == 1


def test_sigkilled_process_resumes_bit_identically(complete_runs, split_file, tmp_path):
    """A real SIGKILL right after checkpoint 2 (in a child process), then `tapebench train` again."""
    child = subprocess.run([sys.executable, "-c", KILL_AFTER_CHECKPOINT_2, *train_args("ppo", split_file, tmp_path)],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == -9, child.stderr
    assert not (tmp_path / ckpt.MANIFEST_FILE).exists()
    assert main(train_args("ppo", split_file, tmp_path)) == 0
    assert_same_run(complete_runs["ppo"], tmp_path)


def test_finished_run_is_not_retrained(complete_runs, split_file):
    out = complete_runs["dqn"]
    before = {p: p.stat().st_mtime_ns for p in (out / "checkpoints").iterdir()}
    manifest_before = (out / ckpt.MANIFEST_FILE).read_text()
    assert main(train_args("dqn", split_file, out)) == 0
    assert {p: p.stat().st_mtime_ns for p in (out / "checkpoints").iterdir()} == before
    assert (out / ckpt.MANIFEST_FILE).read_text() == manifest_before
    assert "nothing to do" in (out / ckpt.LOG_FILE).read_text()


def test_changed_config_starts_fresh_and_removes_stale_checkpoints(split_file, tmp_path):
    assert main(train_args("dqn", split_file, tmp_path)) == 0
    params = json.loads(json.dumps(SMALL["dqn"]))
    params["training"] = {"total_steps": 800, "eval_every": 400}
    assert main(train_args("dqn", split_file, tmp_path, params=params)) == 0
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_0000400.pt", "step_0000800.pt"]
    manifest = json.loads((tmp_path / ckpt.MANIFEST_FILE).read_text())
    assert manifest["provenance"]["config"] == params


# --- determinism ---------------------------------------------------------------------------------
def test_same_seed_same_weights_different_seed_different_weights(complete_runs, split_file, tmp_path):
    assert main(train_args("dqn", split_file, tmp_path / "again")) == 0
    assert_same_run(complete_runs["dqn"], tmp_path / "again")
    assert main(train_args("dqn", split_file, tmp_path / "other", seed=4)) == 0
    a = ckpt.load(complete_runs["dqn"] / "checkpoints/step_0001200.pt")["policy"]
    b = ckpt.load(tmp_path / "other/checkpoints/step_0001200.pt")["policy"]
    assert not tensors_equal(a, b)


# --- the loop's side of the agent contract: rule sampling, truncation ----------------------------
@dataclass
class RecorderConfig:
    num_envs: int = 3
    """environments"""


class Recorder:
    """A minimal plug-in agent: uniform random actions; records what the loop hands it."""

    def __init__(self, env_spec):
        self.num_actions, self.seen = env_spec.num_actions, []

    def act(self, obs, greedy=False):
        return torch.randint(0, self.num_actions, (obs.shape[0],))

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated):
        self.seen.append((obs.clone(), next_obs.clone(), terminated.clone(), truncated.clone()))

    def update(self):
        return {}

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass

    def policy_state_dict(self):
        return {}

    def load_policy_state_dict(self, state):
        pass


def test_loop_passes_true_successor_on_episode_end(tmp_path, monkeypatch):
    made = []

    def make(config, env_spec, total_steps, device):
        made.append(Recorder(env_spec))
        return made[-1]

    monkeypatch.setitem(methods.registry(), "recorder", methods.Method(
        id="recorder", display_name="Recorder", family="value_based", Config=RecorderConfig, make_agent=make))
    train(TrainSpec(agent="recorder", rules=(51,), seed=0, L=6, H=4, total_steps=60, eval_every=30), tmp_path,
          quiet=True)
    seen = made[0].seen
    assert len(seen) == 20  # 60 env steps / 3 envs
    truncations = 0
    for (obs, next_obs, terminated, truncated), following in zip(seen, seen[1:] + [None]):
        done = terminated | truncated
        assert torch.allclose(next_obs[truncated, -1], torch.ones(int(truncated.sum())))  # t/H = 1 at truncation
        if following is not None:
            assert torch.all(following[0][done, -1] == 0)          # next episode starts at t = 0
            assert torch.equal(following[0][~done], next_obs[~done])
        truncations += int(truncated.sum())
    assert truncations > 0


# --- agent-specific truncation handling ----------------------------------------------------------
def test_dqn_bootstraps_on_truncation_not_on_termination():
    agent = methods.make_agent("dqn", methods.build_config("dqn", {"num_envs": 2}), agents.EnvSpec.for_tape(L, H),
                               100, "cpu")
    obs = torch.zeros(2, L + 1)
    agent.observe(obs, torch.tensor([1, 2]), torch.tensor([1.0, -0.5]), obs + 1,
                  torch.tensor([True, False]), torch.tensor([False, True]))
    assert agent.replay.terminated[:2].tolist() == [1.0, 0.0]
    assert torch.equal(agent.replay.next_obs[:2], obs + 1)


def test_ppo_adds_discounted_value_of_final_observation_on_truncation():
    config = methods.build_config("ppo", {"num_envs": 2, "num_steps": 4, "num_minibatches": 2})
    agent = methods.make_agent("ppo", config, agents.EnvSpec.for_tape(L, H), 100, "cpu")
    obs, final_obs = torch.zeros(2, L + 1), torch.rand(2, L + 1)
    actions = agent.act(obs)
    agent.observe(obs, actions, torch.tensor([1.0, -0.5]), final_obs, torch.tensor([True, False]),
                  torch.tensor([False, True]))
    with torch.no_grad():
        expected = -0.5 + config.gamma * agent.network.value(final_obs[1:])
    assert agent.rollout.rewards[0, 0].item() == 1.0
    assert torch.allclose(agent.rollout.rewards[0, 1:], expected)
    assert agent.rollout.dones[0].tolist() == [1.0, 1.0]


# --- errors --------------------------------------------------------------------------------------
def test_unknown_hyperparameter_names_key_and_allowed(split_file, tmp_path, capsys):
    params = {"agent": {"learning_rat": 0.1}}
    assert main(train_args("dqn", split_file, tmp_path, params=params)) == 2
    err = capsys.readouterr().err
    assert "learning_rat" in err and "learning_rate" in err and "buffer_size" in err


def test_unknown_agent_lists_registered_agents(split_file, tmp_path, capsys):
    assert main(train_args("sac", split_file, tmp_path, params={})) == 2
    err = capsys.readouterr().err
    assert "'sac'" in err and "dqn" in err and "ppo" in err


@pytest.mark.parametrize("params,needle", [
    ({"agent": {"gamma": "high"}}, "gamma"),
    ({"agent": {"gamma": 1.5}}, "gamma"),
    ({"env": {"L": 99}}, "L"),
    ({"env": {"size": 8}}, "size"),
    ({"training": {"total_steps": -1}}, "total_steps"),   # 0 is the untrained network (budget study)
    ({"trainig": {}}, "trainig"),
])
def test_bad_params_are_clear_errors(split_file, tmp_path, capsys, params, needle):
    assert main(train_args("dqn", split_file, tmp_path, params=params)) == 2
    assert needle in capsys.readouterr().err


def test_invalid_json_params(split_file, tmp_path, capsys):
    args = train_args("dqn", split_file, tmp_path)
    args[args.index("--params") + 1] = "{not json"
    assert main(args) == 2
    assert "--params" in capsys.readouterr().err


# --- evaluation ----------------------------------------------------------------------------------
EVAL_PARAMS = {"env": {"L": L, "H": H, "success_bonus": 1.0}, "evaluation": {"episodes_per_rule": 3, "eval_seed": 11}}


def evaluate_args(run, split_file, out, Hs=H, params=EVAL_PARAMS):
    return ["evaluate", "--run", str(run), "--split", str(split_file), "--H", str(Hs), "--params", json.dumps(params),
            "--out", str(out), "--device", "cpu", "--quiet"]


def test_evaluate_writes_episode_records_with_provenance(complete_runs, split_file, tmp_path):
    out = tmp_path / "eval_H8.parquet"
    assert main(evaluate_args(complete_runs["ppo"], split_file, out)) == 0
    df = pd.read_parquet(out)
    assert set(AGENT_COLUMNS) | set(EPISODE_COLUMNS) <= set(df.columns)
    assert sorted(df["checkpoint"].unique()) == EXPECTED_STEPS["ppo"]
    assert len(df) == 4 * (3 + 2) * 3
    assert set(df.loc[df.side == "train", "rule"]) == {4, 12, 200}
    assert set(df.loc[df.side == "test", "rule"]) == {0, 76}
    assert (df.agent == "ppo").all() and (df.seed == 3).all() and (df.H == H).all() and (df.L == L).all()
    assert set(df.loc[df.rule == 200, "type"]) == {"stable"}
    meta = read_parquet_meta(out)
    assert meta["seed"] == 3 and meta["code_version"] and meta["config"]["evaluation"] == EVAL_PARAMS["evaluation"]
    assert meta["evaluation"]["checkpoints"] == EXPECTED_STEPS["ppo"]
    assert meta["split"]["name"] == "toy"

    # common random numbers: every agent and checkpoint plays the same episodes
    other = tmp_path / "dqn.parquet"
    assert main(evaluate_args(complete_runs["dqn"], split_file, other)) == 0
    key = ["side", "rule", "episode"]
    assert df[df.checkpoint == 1200][key].reset_index(drop=True).equals(
        pd.read_parquet(other).query("checkpoint == 1200")[key].reset_index(drop=True))

    # deterministic, and the last K checkpoints on request
    again = tmp_path / "again.parquet"
    params = {**EVAL_PARAMS, "evaluation": {**EVAL_PARAMS["evaluation"], "checkpoints": 2}}
    assert main(evaluate_args(complete_runs["ppo"], split_file, again, params=params)) == 0
    last_two = pd.read_parquet(again)
    assert sorted(last_two["checkpoint"].unique()) == [904, 1200]
    assert last_two.reset_index(drop=True).equals(df[df.checkpoint >= 904].reset_index(drop=True))


def test_evaluate_longer_horizon(complete_runs, split_file, tmp_path):
    out = tmp_path / "eval_H16.parquet"
    assert main(evaluate_args(complete_runs["dqn"], split_file, out, Hs=16)) == 0
    df = pd.read_parquet(out)
    assert (df.H == 16).all() and df.steps.max() <= 16


def test_evaluate_refuses_other_split_and_unfinished_run(complete_runs, split_file, tmp_path, capsys):
    other = tmp_path / "other.json"
    save_split(other, {"name": "other", "train": [4, 12], "test": [0], "types": {}, "params": {}, "unit": "rule"})
    assert main(evaluate_args(complete_runs["dqn"], other, tmp_path / "x.parquet")) == 2
    assert "trained on split 'toy'" in capsys.readouterr().err
    assert main(evaluate_args(tmp_path / "nothing", split_file, tmp_path / "y.parquet")) == 2
    assert "train.json" in capsys.readouterr().err
    params = {**EVAL_PARAMS, "env": {"L": 16}}
    assert main(evaluate_args(complete_runs["dqn"], split_file, tmp_path / "z.parquet", params=params)) == 2
    assert "L = 8" in capsys.readouterr().err
