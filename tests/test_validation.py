"""Bad input fails early with an error that names the bad value and what is allowed."""
from __future__ import annotations

import importlib
import re

import gymnasium
import numpy as np
import pytest
import torch

import tapebench  # noqa: F401  (registers tapebench/Tape-v0)
from tapebench import validation as v
from tapebench.bench import BENCHMARKS
from tapebench.cli import main
from tapebench.envs import ENV_ID
from tapebench.envs.batched import BatchedTapeEnv
from tapebench.envs.tape_env import TapeEnv

# (keyword arguments, regex the message must match): the message shows the value and the range
BAD_ENV_ARGS = [
    (dict(rule=256), r"rule must be in 0\.\.255.*got 256"),
    (dict(rule=-1), r"rule must be in 0\.\.255.*got -1"),
    (dict(rule=1.5), r"rule must be an integer in 0\.\.255, got 1\.5"),
    (dict(rule="30"), r"rule must be an integer in 0\.\.255, got '30'"),
    (dict(rule=True), r"rule must be an integer in 0\.\.255, got True"),
    (dict(L=2), r"tape length L must be in 3\.\.64, got 2"),
    (dict(L=65), r"tape length L must be in 3\.\.64, got 65"),
    (dict(L=32.0), r"tape length L must be an integer in 3\.\.64, got 32\.0"),
    (dict(H=0), r"horizon H must be >= 1, got 0"),
    (dict(H=-4), r"horizon H must be >= 1, got -4"),
    (dict(H=2.5), r"horizon H must be an integer >= 1, got 2\.5"),
    (dict(L=4, goal=[0, 1, 0]), r"goal tape must have length L=4, got shape \(3,\)"),
    (dict(L=4, goal=[[0, 1], [0, 1]]), r"goal tape must have length L=4, got shape \(2, 2\)"),
    (dict(L=4, goal=[0, 2, 1, 0]), r"goal tape cells must be 0 or 1, got values \[2\]"),
    (dict(L=3, goal=[0.5, 0, 1]), r"goal tape cells must be 0 or 1, got values \[0\.5\]"),
    (dict(success_bonus=float("nan")), r"success_bonus must be a finite number, got nan"),
    (dict(success_bonus="big"), r"success_bonus must be a finite number, got 'big'"),
]
BAD_RULE_SETS = [
    ([30, 300], r"rule must be in 0\.\.255.*got 300"),
    ([], r"at least one rule"),
    ("0-255", r"got the string '0-255'"),
    (30, r"rules must be a collection of integers in 0\.\.255.*got 30"),
]


# --- the shared checks ----------------------------------------------------------------------

def test_check_functions_accept_good_values():
    assert v.check_rule(np.uint8(30)) == 30 and v.check_rule(255) == 255
    assert v.check_rules(np.array([0, 30])) == [0, 30] and v.check_rules(torch.tensor([7])) == [7]
    assert v.check_length(np.int64(64)) == 64 and v.check_length(3) == 3
    assert v.check_horizon(1) == 1
    assert v.check_goal(None, 4).tolist() == [0, 0, 0, 0]
    assert v.check_goal([True, False, True], 3).tolist() == [1, 0, 1]
    assert v.check_action(np.int64(2), 3) == 2
    assert v.check_success_bonus(0) == 0.0
    assert v.parse_rule_list("110, 30,0-2") == [0, 1, 2, 30, 110]


@pytest.mark.parametrize("text,match", [
    ("0-300", r"rule must be in 0\.\.255.*got 256"),
    ("5-3", r"cannot parse rule list item '5-3' in '5-3'"),
    ("30,x", r"cannot parse rule list item 'x'"),
    ("", r"at least one rule"),
])
def test_parse_rule_list_errors(text, match):
    with pytest.raises(ValueError, match=match):
        v.parse_rule_list(text)


@pytest.mark.parametrize("action,match", [
    (-1, r"action must be a cell index in 0\.\.4, got -1"),
    (5, r"action must be a cell index in 0\.\.4, got 5"),
    (1.0, r"action must be an integer cell index in 0\.\.4, got 1\.0"),
    ("2", r"action must be an integer cell index in 0\.\.4, got '2'"),
    (None, r"action must be an integer cell index in 0\.\.4, got None"),
])
def test_check_action_errors(action, match):
    with pytest.raises(ValueError, match=match):
        v.check_action(action, 5)


# --- TapeEnv and gymnasium.make -------------------------------------------------------------

@pytest.mark.parametrize("kwargs,match", BAD_ENV_ARGS)
def test_tape_env_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TapeEnv(**kwargs)
    with pytest.raises(ValueError, match=match):
        gymnasium.make(ENV_ID, **kwargs)


@pytest.mark.parametrize("rules,match", BAD_RULE_SETS)
def test_tape_env_rejects_bad_rule_sets(rules, match):
    with pytest.raises(ValueError, match=match):
        gymnasium.make(ENV_ID, rules=rules, L=8, H=8)


@pytest.mark.parametrize("action,match", [
    (-1, r"action must be a cell index in 0\.\.7, got -1"),
    (8, r"action must be a cell index in 0\.\.7, got 8"),
    (2.5, r"action must be an integer cell index in 0\.\.7, got 2\.5"),
    ("3", r"action must be an integer cell index in 0\.\.7, got '3'"),
    (np.array([1, 2]), r"action must be an integer cell index in 0\.\.7"),
    (np.array(9), r"action must be a cell index in 0\.\.7, got 9"),
])
def test_tape_env_rejects_bad_actions(action, match):
    env = gymnasium.make(ENV_ID, rule=30, L=8, H=8)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=match):
        env.unwrapped.step(action)


def test_tape_env_accepts_numpy_and_torch_scalar_actions():
    env = TapeEnv(rule=204, L=8, H=8)
    env.reset(seed=0)
    for action in (np.int64(1), np.array(2), torch.tensor(3), np.uint8(4)):
        env.step(action)
    assert env.t == 4


@pytest.mark.parametrize("options,match", [
    ({"tape": [0, 1]}, r"initial tape \(options\['tape'\]\) must have length L=4, got shape \(2,\)"),
    ({"tape": [0, 1, 3, 0]}, r"initial tape \(options\['tape'\]\) cells must be 0 or 1, got values \[3\]"),
    ({"tape": [0, 0, 0, 0]}, r"initial tape must differ from the goal tape"),
    ({"rule": 999}, r"rule must be in 0\.\.255.*got 999"),
])
def test_tape_env_rejects_bad_reset_options(options, match):
    env = TapeEnv(rule=30, L=4, H=4)
    with pytest.raises(ValueError, match=match):
        env.reset(seed=0, options=options)


# --- BatchedTapeEnv -------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,match", [(kw, m) for kw, m in BAD_ENV_ARGS if "rule" not in kw] + [
    (dict(rules=rules), m) for rules, m in BAD_RULE_SETS] + [
    (dict(num_envs=0), r"num_envs must be an integer >= 1, got 0"),
    (dict(num_envs=2.5), r"num_envs must be an integer >= 1, got 2\.5"),
])
def test_batched_env_rejects_bad_arguments(kwargs, match):
    kwargs = {"num_envs": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        BatchedTapeEnv(**kwargs)


@pytest.mark.parametrize("actions,match", [
    (torch.tensor([0, 1, 2, 8]), r"actions must be cell indices in 0\.\.7, got range 0\.\.8"),
    (torch.tensor([-1, 1, 2, 3]), r"actions must be cell indices in 0\.\.7, got range -1\.\.3"),
    (torch.tensor([0, 1, 2]), r"actions must have shape \(4,\), got \(3,\)"),
    (torch.zeros(4, 1, dtype=torch.long), r"actions must have shape \(4,\), got \(4, 1\)"),
    (torch.tensor([0.0, 1.0, 2.0, 3.0]), r"actions must be integer cell indices in 0\.\.7, got dtype torch\.float32"),
    (np.array([True, False, True, False]), r"actions must be integer cell indices in 0\.\.7, got dtype torch\.bool"),
])
def test_batched_env_rejects_bad_actions(actions, match):
    env = BatchedTapeEnv(4, L=8, H=8, rules=[30])
    env.reset()
    before = env.tapes.clone()
    with pytest.raises(ValueError, match=match):
        env.step(actions)
    assert torch.equal(env.tapes, before)   # nothing happened
    env.step(np.array([0, 1, 2, 7]))         # numpy and list actions are fine
    env.step([7, 6, 5, 4])


@pytest.mark.parametrize("tapes,rules,match", [
    (np.zeros((3, 8)), [30, 30, 30, 30], r"load expects tapes of shape \(4, 8\) and rules of shape \(4,\)"),
    (np.zeros((4, 8)), [30, 30], r"got \(4, 8\) and \(2,\)"),
    (np.full((4, 8), 2), [30] * 4, r"tape cells must be 0 or 1, got values \[2\]"),
    (np.zeros((4, 8)), [30, 30, 30, 256], r"rule must be in 0\.\.255.*got 256"),
])
def test_batched_env_load_rejects_bad_episodes(tapes, rules, match):
    env = BatchedTapeEnv(4, L=8, H=8, rules=[30])
    with pytest.raises(ValueError, match=match):
        env.load(tapes, rules)


# --- CLI ------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv,match", [
    (["--L", "65"], r"tape length L must be in 3\.\.64, got 65"),
    (["--H", "0"], r"horizon H must be >= 1, got 0"),
    (["--rules", "0-300"], r"rule must be in 0\.\.255.*got 256"),
    (["--num-envs", "0"], r"--num-envs must be >= 1, got 0"),
    (["--seconds", "0"], r"--seconds must be > 0, got 0\.0"),
    (["--repeats", "0"], r"--repeats must be >= 1, got 0"),
    (["--threads", "0"], r"--threads must be >= 1, got 0"),
])
def test_bench_cli_rejects_bad_options(argv, match, capsys):
    assert main(["bench", "ca", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tapebench bench: error:")
    assert re.search(match, err), err


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_bench_cli_rejects_cuda_without_cuda(capsys):
    assert main(["bench", "ca", "--device", "cuda"]) == 2
    assert "torch.cuda.is_available() is False" in capsys.readouterr().err


def test_bench_cli_rejects_unknown_benchmark(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "nope"])
    assert exc.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_every_registered_benchmark_resolves_to_a_function():
    for name, target in BENCHMARKS.items():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func)), name
