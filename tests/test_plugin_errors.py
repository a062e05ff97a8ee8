"""A plug-in that breaks the method contract is named, with the rule it broke, in one line (no traceback): a Config
without defaults (in `tapebench config` and `snakemake -n`), a make_agent that raises, a policy without
begin/act/observe, an act that returns None."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch
from agent_contract import toy_split
from pipeline_helpers import REPO, make_workdir

from tapebench.cli import main
from tapebench.methods.contract import StatelessPolicy
from tapebench.registry import Method, register, unregister

PARAMS = json.dumps({"env": {"L": 8, "H": 8}, "evaluation": {"episodes_per_rule": 1},
                     "training": {"total_steps": 64, "eval_every": 32}})

PLUGIN = '''
from dataclasses import dataclass

from tapebench.registry import Method


@dataclass
class Config:
    num_envs: int
    learning_rate: float = 0.1


def make(config, env_spec, total_steps, device):
    raise RuntimeError("never built")


METHOD = Method.from_agent_module("nodefault", "No default", "value_based", "nodefault_plugin")
'''


@dataclass
class Settings:
    num_envs: int = 4


class NoneAgent:
    """An agent with every part of the contract, whose act returns None."""

    def act(self, obs, greedy=False):
        return None

    def observe(self, *transition):
        pass

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


def _raise(*args):
    raise RuntimeError("no GPU here")


METHODS = {
    "none_act": dict(make_policy=lambda config, context: StatelessPolicy(lambda obs: None)),
    "float_act": dict(make_policy=lambda config, context: (lambda obs: torch.zeros(obs.shape[0]))),
    "no_begin": dict(make_policy=lambda config, context: object()),
    "raising_policy": dict(make_policy=_raise),
    "raising_agent": dict(make_agent=_raise),
    "none_agent_act": dict(make_agent=lambda *args: NoneAgent()),
    "no_update": dict(make_agent=lambda *args: StatelessPolicy(lambda obs: None)),
}


@pytest.fixture
def plugins():
    for method_id, parts in METHODS.items():
        register(Method(method_id, method_id, "reference", Settings, **parts))
    yield
    for method_id in METHODS:
        unregister(method_id)


@pytest.mark.parametrize("method_id,needle", [
    ("none_act", "method 'none_act': act(obs) returned None; the method contract"),
    ("float_act", "method 'float_act': act(obs) returned a Tensor of shape (3,) and dtype torch.float32"),
    ("no_begin", "method 'no_begin': make_policy(config, context) returned a object without begin/act/observe"),
    ("raising_policy", "method 'raising_policy': make_policy(config, context) raised RuntimeError: no GPU here"),
])
def test_an_evaluation_policy_that_breaks_the_contract_is_named(plugins, method_id, needle, tmp_path, capsys):
    split = toy_split(tmp_path / "toy.json")
    assert main(["evaluate", "--method", method_id, "--split", str(split), "--H", "8", "--params", PARAMS,
                 "--out", str(tmp_path / "e.parquet"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err


@pytest.mark.parametrize("method_id,needle", [
    ("raising_agent", "method 'raising_agent': make_agent(config, env_spec, total_steps, device) raised "
                      "RuntimeError: no GPU here"),
    ("none_agent_act", "method 'none_agent_act': act(obs) returned None"),
    ("no_update", "method 'no_update': make_agent(config, env_spec, total_steps, device) returned a "
                  "StatelessPolicy without update/state_dict/load_state_dict"),
])
def test_an_agent_that_breaks_the_contract_is_named(plugins, method_id, needle, tmp_path, capsys):
    split = toy_split(tmp_path / "toy.json")
    assert main(["train", "--agent", method_id, "--split", str(split), "--seed", "0", "--params", PARAMS,
                 "--out", str(tmp_path / "run"), "--device", "cpu", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err


def test_a_config_without_defaults_is_refused_when_the_method_is_made():
    @dataclass
    class Bare:
        num_envs: int
        gamma: float = 0.9

    with pytest.raises(ValueError, match=r"method 'bare': Config field\(s\) \['num_envs'\] have no default"):
        Method("bare", "Bare", "reference", Bare, make_agent=_raise)


def test_a_plugin_config_without_defaults_is_named_in_config_and_snakemake(tmp_path):
    """The plug-in's Config is read lazily (a module name), so the refusal comes where the config names it."""
    site = tmp_path / "site"
    (site / "nodefault_plugin-0.1.dist-info").mkdir(parents=True)
    (site / "nodefault_plugin.py").write_text(PLUGIN)
    (site / "nodefault_plugin-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: nodefault-plugin\n"
                                                                    "Version: 0.1\n")
    (site / "nodefault_plugin-0.1.dist-info" / "entry_points.txt").write_text(
        "[tapebench.methods]\nnodefault = nodefault_plugin:METHOD\n")
    preset = tmp_path / "plugin.yaml"
    preset.write_text("agents:\n  nodefault: {learning_rate: 0.2}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    needle = "method 'nodefault': Config field(s) ['num_envs'] have no default"
    proc = subprocess.run([sys.executable, "-m", "tapebench", "config", "--configfile", str(preset)], cwd=REPO,
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    (tmp_path / "wd").mkdir()
    workdir = make_workdir(tmp_path / "wd")
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(preset)],
                          cwd=workdir, capture_output=True, text=True, env=env, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and needle in out and "TypeError" not in out, out[-3000:]
