"""`tapebench bench train --agents` and `tapebench bench sb3`: agent selection against the registry, our
Config defaults translated into Stable-Baselines3 arguments, and the message when SB3 is missing.
No timing and no training here (benchmarks print figures; they are not tests)."""
from __future__ import annotations

import dataclasses
import sys
import types

import pytest
from torch import nn

from tapebench import registry as methods
from tapebench.bench.sb3 import (COUNTERPARTS, AnnealedLearningRate, fused_adam_available, require_sb3,
                                 sb3_dqn_settings, sb3_ppo_settings)
from tapebench.bench.training import select_agents, trained_methods
from tapebench.cli import main
from tapebench.methods import dqn, ppo
from tapebench.methods.equivariant import NETWORK_FIELDS
from tapebench.registry import Method, build_config


@pytest.fixture
def toy_trainer():
    """A plug-in-like method that trains, registered for one test."""
    method = methods.register(Method.from_agent_module("toy_trainer", "Toy", "value_based", dqn))
    yield method.id
    methods.unregister(method.id)


def test_bench_train_covers_every_method_that_trains(toy_trainer):
    agents = select_agents(None)
    assert agents == trained_methods()
    assert {"dqn", "ppo", toy_trainer} <= set(agents)
    assert not {"random", "mpc", "exact"} & set(agents)


def test_agents_subset_keeps_order_and_drops_repeats():
    assert select_agents(["ppo", "dqn", "ppo"]) == ["ppo", "dqn"]


@pytest.mark.parametrize("agents,needle", [
    (["nope"], "unknown method id(s) ['nope']"),
    (["dqn", "mpc"], "['mpc'] do not train"),
])
def test_bench_train_rejects_bad_agents(agents, needle, capsys):
    assert main(["bench", "train", "--agents", *agents]) == 2
    err = capsys.readouterr().err
    assert needle in err and "allowed" in err and "'dqn'" in err and "'ppo'" in err


def test_sb3_bench_only_takes_agents_with_a_counterpart(toy_trainer):
    assert select_agents(None, allowed=list(COUNTERPARTS), command="bench sb3") == ["dqn", "ppo"]
    with pytest.raises(ValueError, match=r"bench sb3` does not cover \['toy_trainer'\]; allowed: \['dqn', 'ppo'\]"):
        select_agents(["dqn", toy_trainer], allowed=list(COUNTERPARTS), command="bench sb3")


def test_steps_must_be_positive(capsys):
    assert main(["bench", "sb3", "--steps", "0"]) == 2
    assert "--steps must be >= 1" in capsys.readouterr().err


def _optimizer(eps):
    return {"eps": eps, **({"fused": True} if fused_adam_available() else {})}


def test_sb3_dqn_settings_from_our_defaults():
    # a new DQN hyperparameter must be mapped (or listed as a difference) before this passes again
    assert [f.name for f in dataclasses.fields(dqn.Config)] == [
        "num_envs", "hidden_size", "hidden_layers", "learning_rate", "gamma", "buffer_size", "batch_size",
        "learning_starts", "train_frequency", "target_update_frequency", "tau", "epsilon_start", "epsilon_end",
        "exploration_fraction", "double_dqn", "max_grad_norm", *NETWORK_FIELDS,   # network: refused unless mlp
        "her_strategy", "her_k"]                                                   # HER: refused unless "none"
    assert sb3_dqn_settings(build_config("dqn", {}), 20_000) == {"n_envs": 4, "total_steps": 20_000, "kwargs": {
        "learning_rate": 5e-4, "buffer_size": 100_000, "learning_starts": 1_000, "batch_size": 128, "tau": 1.0,
        "gamma": 0.99, "train_freq": 1, "gradient_steps": 1, "target_update_interval": 1_000,
        "exploration_fraction": 0.5, "exploration_initial_eps": 1.0, "exploration_final_eps": 0.05,
        "max_grad_norm": 10.0,
        "policy_kwargs": {"net_arch": [256, 256], "activation_fn": nn.ReLU, "optimizer_kwargs": _optimizer(1e-8)}}}


@pytest.mark.parametrize("overrides,expected", [
    ({"train_frequency": 8}, {"train_freq": 2, "gradient_steps": 1}),
    ({"num_envs": 8}, {"train_freq": 1, "gradient_steps": 2}),
    ({"batch_size": 64, "hidden_layers": 3}, {"batch_size": 64}),
])
def test_changed_dqn_hyperparameters_show_up_in_sb3_arguments(overrides, expected):
    settings = sb3_dqn_settings(build_config("dqn", overrides), 1_001)
    assert {k: settings["kwargs"][k] for k in expected} == expected
    assert settings["total_steps"] % settings["n_envs"] == 0 and settings["total_steps"] >= 1_001
    assert settings["kwargs"]["policy_kwargs"]["net_arch"] == [256] * overrides.get("hidden_layers", 2)


@pytest.mark.parametrize("overrides,needle", [
    ({"double_dqn": True}, "no Double-DQN target"),
    ({"train_frequency": 3}, "train_frequency=3 env steps cannot be expressed"),
    ({"target_update_frequency": 1001}, "target_update_frequency=1001 must be a multiple of num_envs=4"),
    ({"network": "equivariant"}, "policy is an MLP; the comparison needs network='mlp', got network='equivariant'"),
    ({"her_strategy": "future"}, "needs her_strategy='none', got her_strategy='future'"),
])
def test_dqn_settings_sb3_cannot_express_are_errors(overrides, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        sb3_dqn_settings(build_config("dqn", overrides), 20_000)


def test_ppo_settings_refuse_the_equivariant_network():
    with pytest.raises(ValueError, match="PPO policy is an MLP; the comparison needs network='mlp'"):
        sb3_ppo_settings(build_config("ppo", {"network": "equivariant"}), 20_000)


def test_sb3_ppo_settings_from_our_defaults():
    assert [f.name for f in dataclasses.fields(ppo.Config)] == [
        "num_envs", "num_steps", "hidden_size", "hidden_layers", "learning_rate", "anneal_lr", "gamma",
        "gae_lambda", "num_minibatches", "update_epochs", "norm_adv", "clip_coef", "clip_vloss", "ent_coef",
        "vf_coef", "max_grad_norm", *NETWORK_FIELDS]
    settings = sb3_ppo_settings(build_config("ppo", {}), 20_000)
    assert settings == {"n_envs": 16, "total_steps": 20_480, "kwargs": {
        "learning_rate": AnnealedLearningRate(2.5e-4, 2048 / 20_480), "n_steps": 128, "batch_size": 512,
        "n_epochs": 4, "gamma": 0.99, "gae_lambda": 0.95, "clip_range": 0.2, "clip_range_vf": 0.2,
        "normalize_advantage": True, "ent_coef": 0.01, "vf_coef": 0.25, "max_grad_norm": 0.5,
        "policy_kwargs": {"net_arch": {"pi": [256, 256], "vf": [256, 256]}, "activation_fn": nn.Tanh,
                          "ortho_init": True, "optimizer_kwargs": _optimizer(1e-5)}}}
    no_anneal = sb3_ppo_settings(build_config("ppo", {"anneal_lr": False, "clip_vloss": False}), 20_000)["kwargs"]
    assert no_anneal["learning_rate"] == 2.5e-4 and no_anneal["clip_range_vf"] is None


def test_ppo_learning_rate_schedule_equals_our_annealing():
    """SB3 calls the schedule after rollout k at progress_remaining = 1 - (k + 1) / N; ours sets
    lr * (1 - k / N) before update k (agents/ppo.py)."""
    config = build_config("ppo", {})
    settings = sb3_ppo_settings(config, 20_000)
    updates = settings["total_steps"] // (config.num_envs * config.num_steps)
    schedule = settings["kwargs"]["learning_rate"]
    assert schedule(1.0) == config.learning_rate   # SB3's initial optimizer learning rate
    for k in range(updates):
        assert schedule(1.0 - (k + 1) / updates) == pytest.approx(config.learning_rate * (1.0 - k / updates))


def test_missing_sb3_names_the_install_command(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "stable_baselines3", None)   # makes `import stable_baselines3` fail
    assert main(["bench", "sb3"]) == 2
    err = capsys.readouterr().err
    assert 'pip install -e ".[bench]"' in err and "Stable-Baselines3" in err


def test_old_sb3_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "stable_baselines3", types.SimpleNamespace(__version__="2.2.1"))
    with pytest.raises(ValueError, match=r"needs stable-baselines3 >= 2.3, found 2.2.1"):
        require_sb3()


def test_sb3_side_trains_on_the_gymnasium_tape_env():
    """Only where SB3 happens to be installed (never in CI): a tiny PPO run goes through TapeEnv."""
    pytest.importorskip("stable_baselines3")
    from tapebench.bench.sb3 import time_sb3

    settings = sb3_ppo_settings(build_config("ppo", {"num_envs": 2, "num_steps": 8, "num_minibatches": 2,
                                                     "hidden_size": 8}), 16)
    figures = time_sb3("ppo", settings, rules=[4, 30], L=8, H=4, seed=0, threads=1)
    assert figures["env"] == "tapebench.envs.tape_env.TapeEnv" and figures["env_steps"] == 16


def test_sb3_rule_set_from_rules_or_a_split(tmp_path):
    import argparse

    from tapebench.bench.sb3 import _rule_set
    from tapebench.splits.io import save_split

    path = tmp_path / "toy.json"
    save_split(path, {"name": "toy", "train": [4, 12, 200], "test": [0, 76],
                      "types": {"4": "periodic", "12": "periodic", "200": "stable", "0": "stable", "76": "stable"},
                      "params": {"method": "hand"}, "unit": "rule"})
    rules, label = _rule_set(argparse.Namespace(split=str(path), rules="0-255"))
    assert rules == [4, 12, 200] and "split 'toy'" in label
    assert _rule_set(argparse.Namespace(split=None, rules="0-255"))[0] == list(range(256))
