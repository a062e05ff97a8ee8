"""PPO + DR (docs/methods.md): PPO trained with per-episode initial density ρ ~ U[0.2, 0.8] and cell-update
noise ε ~ U[0, 0.02]; evaluated exactly like PPO (noise-free, the protocol's ρ = 0.5 episodes)."""
from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
import torch
from agent_contract import assert_sigkill_resume_bit_identical, learned_success

from tapebench.ca import torch_kernel
from tapebench.envs import factory
from tapebench.envs.batched import BatchedTapeEnv
from tapebench.episodes.sets import episode_set
from tapebench.evaluation import runner
from tapebench.evaluation.trained_runs import evaluate_run
from tapebench.methods import ppo, ppo_dr
from tapebench.methods.contract import EnvSpec, greedy_policy
from tapebench.registry import build_config, get_method, make_agent
from tapebench.training import checkpoint as ckpt
from tapebench.training import loop
from tapebench.training.loop import TrainSpec, train
from tapebench.utils.artifacts import file_sha256

SMALL = {"num_envs": 8, "num_steps": 64, "hidden_size": 32}


def test_registered_as_ppo_with_a_randomised_training_env():
    method = get_method("ppo_dr")
    assert method.display_name == "PPO + DR" and method.family == "actor_critic" and method.trains
    config = build_config("ppo_dr", {})
    assert issubclass(ppo_dr.Config, ppo.Config)
    assert method.training_env(config) == {"init_density": (0.2, 0.8), "noise": (0.0, 0.02)}
    assert loop.training_env_arguments(method, config) == {"init_density": (0.2, 0.8), "noise": (0.0, 0.02)}
    assert isinstance(make_agent("ppo_dr", config, EnvSpec.for_tape(8, 8), 100), ppo.PPOAgent)
    assert loop.training_env_arguments(get_method("ppo"), build_config("ppo", {})) == {}


@pytest.mark.parametrize("overrides,needle", [
    ({"init_density_low": 0.0}, r"init_density_low/init_density_high = \(0\.0, 0\.8\).*\(0, 1\)"),
    ({"init_density_low": 0.7, "init_density_high": 0.3}, "low <= high"),
    ({"noise_high": 0.6}, r"noise_low/noise_high.*\[0, 0\.5\]"),
    ({"noise_low": -0.1}, "noise_low/noise_high"),
    ({"num_minibatches": 0}, "num_minibatches must be >= 1"),   # PPO's own checks still run
])
def test_config_rejects_bad_ranges(overrides, needle):
    with pytest.raises(ValueError, match=needle):
        build_config("ppo_dr", overrides)


class SpyEnv(BatchedTapeEnv):
    """The training loop's env, recording the rows' ρ and ε at each step and the cells the noise flipped."""

    made: list = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kwargs, self.densities, self.noises, self.flips = kwargs, [], [], 0
        SpyEnv.made.append(self)

    def step(self, actions):
        before, rules = self.tapes.clone(), self.rules.clone()
        self.densities.append(self.row_density.clone())
        self.noises.append(self.row_noise.clone())
        out = super().step(actions)
        clean = torch_kernel.transition(before, torch.as_tensor(actions), rules)
        self.flips += int((out[4]["final_obs"][:, :self.L].to(torch.uint8) != clean).sum())
        return out


def test_training_env_draws_rho_and_eps_per_episode(tmp_path, monkeypatch):
    SpyEnv.made = []
    monkeypatch.setattr(factory, "BatchedTapeEnv", SpyEnv)   # the training loop builds through envs.factory
    train(TrainSpec(agent="ppo_dr", rules=(4, 30), seed=0, hyperparameters=SMALL, L=8, H=8, total_steps=1024,
                    eval_every=1024), tmp_path / "dr", quiet=True)
    env = SpyEnv.made[0]
    assert env.kwargs["init_density"] == (0.2, 0.8) and env.kwargs["noise"] == (0.0, 0.02)
    densities, noises = torch.stack(env.densities), torch.stack(env.noises)   # (steps, rows)
    assert ((densities >= 0.2) & (densities < 0.8)).all() and ((noises >= 0.0) & (noises < 0.02)).all()
    assert len(densities[0].unique()) == SMALL["num_envs"]   # rows differ ...
    assert len(densities.unique()) > 5 * SMALL["num_envs"]   # ... and are redrawn episode after episode
    assert len(noises.unique()) > 5 * SMALL["num_envs"]
    # 1024 steps x 8 cells at mean ε = 0.01: ~82 noise flips expected (Poisson; 0 has probability e^-82)
    assert env.flips > 30

    SpyEnv.made = []
    train(TrainSpec(agent="ppo", rules=(4, 30), seed=0, hyperparameters=SMALL, L=8, H=8, total_steps=512,
                    eval_every=512), tmp_path / "ppo", quiet=True)
    plain = SpyEnv.made[0]
    assert "noise" not in plain.kwargs and not plain.nuisances and plain.flips == 0


def test_evaluation_is_exactly_ppos_noise_free_rho_half_evaluation(tmp_path, monkeypatch):
    """A ppo_dr run's checkpoints evaluate to the same records as the same weights evaluated as PPO."""
    run = tmp_path / "ppo_dr"
    train(TrainSpec(agent="ppo_dr", rules=(4, 30), seed=1, hyperparameters=SMALL, L=8, H=8, total_steps=1024,
                    eval_every=512), run, quiet=True)
    # the same run relabelled as PPO: manifest and checkpoints, DR fields dropped
    as_ppo = tmp_path / "as_ppo"
    shutil.copytree(run, as_ppo)
    manifest = json.loads((as_ppo / ckpt.MANIFEST_FILE).read_text())
    ppo_fields = set(build_config("ppo", {}).__dataclass_fields__)
    manifest["agent"] = "ppo"
    manifest["hyperparameters"] = {k: v for k, v in manifest["hyperparameters"].items() if k in ppo_fields}
    for entry in manifest["checkpoints"]:
        payload = ckpt.load(as_ppo / entry["file"])
        payload["agent"], payload["hyperparameters"] = "ppo", manifest["hyperparameters"]
        ckpt.save(as_ppo / entry["file"], payload)
        entry["sha256"] = file_sha256(as_ppo / entry["file"])   # the manifest vouches for its checkpoints
    (as_ppo / ckpt.MANIFEST_FILE).write_text(json.dumps(manifest))

    made = []
    real_env = factory.BatchedTapeEnv
    monkeypatch.setattr(factory, "BatchedTapeEnv", lambda *a, **k: made.append(k) or real_env(*a, **k))
    frames = {}
    for name, path in (("ppo_dr", run), ("ppo", as_ppo)):
        frames[name], _ = evaluate_run(path, 8, rules=[4, 30, 90, 110], episodes_per_rule=10, eval_seed=5)
    assert made and all("noise" not in k and "init_density" not in k for k in made)
    assert (frames["ppo_dr"].agent == "ppo_dr").all() and (frames["ppo"].agent == "ppo").all()
    pd.testing.assert_frame_equal(frames["ppo_dr"].drop(columns="agent"), frames["ppo"].drop(columns="agent"))
    # the episodes are the protocol's fair-bit tapes: ρ = 0.5, not the training range
    episodes = episode_set([4, 30, 90, 110], 10, 8, eval_seed=5, side="rules", key=0)
    assert 0.4 < episodes.tapes.mean() < 0.6
    agent, _ = ckpt.load_policy(run / manifest["checkpoints"][-1]["file"])
    plain = make_agent("ppo", build_config("ppo", {k: v for k, v in manifest["hyperparameters"].items()}),
                       EnvSpec.for_tape(8, 8), 1)
    plain.load_policy_state_dict(agent.policy_state_dict())
    a = runner.run_episodes(greedy_policy(agent), episodes, 8)
    b = runner.run_episodes(greedy_policy(plain), episodes, 8)
    assert all((a[k] == b[k]).all() for k in a)


def test_learns_fixed_rule_4(tmp_path):
    before, after = learned_success("ppo_dr", 4, 16, 16, 20_480, tmp_path)
    assert before < 0.9
    assert after >= 0.9


def test_sigkill_resume_with_domain_randomisation_is_bit_identical(tmp_path):
    # 8 x 64 = 512-step rollouts straddle the checkpoints; the env's per-row ρ/ε are part of the resume state
    params = {"agent": SMALL, "env": {"L": 8, "H": 8}, "training": {"total_steps": 1200, "eval_every": 300}}
    assert_sigkill_resume_bit_identical("ppo_dr", params, tmp_path)
    state = ckpt.load(tmp_path / "killed" / ckpt.RESUME_FILE)
    assert {"init_density", "noise"} <= set(state["env"])
