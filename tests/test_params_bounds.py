"""One validation path (issue 50, item 1): every command that takes parameters by hand refuses a value the config
refuses for the key it stands for, naming the option or --params key and the config key, with the CLI's exit code
for bad input (2) and no traceback."""
from __future__ import annotations

import json

import pytest
import yaml
from agent_contract import toy_split
from pipeline_helpers import REPO

from tapebench.cli import main
from tapebench.methods.mpc import MAX_CANDIDATES, MAX_HORIZON, MPCConfig
from tapebench.methods.ppo_context import MAX_LOOKAHEAD_GAIN
from tapebench.pipeline.params import ConfigError, allowed, check_value, key_schema
from tapebench.registry import build_config
from tapebench.utils.io import write_json

SPLIT = "SPLIT"       # replaced by the toy split's path
OUT = "OUT"           # replaced by an output path in tmp_path
TINY_TRAINING = {"total_steps": 8, "eval_every": 8}
TINY_DQN = {"num_envs": 2, "buffer_size": 64, "learning_starts": 4, "batch_size": 4, "hidden_size": 8}


def _train(params):
    return ["train", "--agent", "dqn", "--split", SPLIT, "--params",
            json.dumps({"training": TINY_TRAINING, "agent": TINY_DQN, "env": {"L": 8, "H": 8}, **params}),
            "--out", OUT, "--quiet", "--device", "cpu"]


def _evaluate(params, H="8", method="random"):
    return ["evaluate", "--method", method, "--seed", "0", "--split", SPLIT, "--H", H, "--params",
            json.dumps({"env": {"L": 8}, **params}), "--out", OUT, "--quiet", "--device", "cpu"]


def _worldtest(params, budget="0"):
    return ["worldtest", "--method", "random", "--seed", "0", "--budget", budget, "--split", SPLIT, "--params",
            json.dumps({"env": {"L": 8, "H": 8}, **params}), "--out", OUT, "--quiet"]


def _fewshot(fewshot, evaluation=None):
    return ["fewshot", "--method", "random", "--seed", "0", "--split", SPLIT, "--params",
            json.dumps({"env": {"L": 8, "H": 8}, "evaluation": evaluation or {"episodes_per_rule": 1},
                        "fewshot": {"rules_per_side": 1, **fewshot}}), "--out", OUT, "--quiet"]


def _health(**options):
    args = {"--L": "8", "--H": "8", "--settings": "{}",
            "--statistics": json.dumps({"n_resamples": 100, "ci": 0.95, "seed": 0}), **options}
    return ["benchmark-health", "--split", SPLIT, "--split-health", "none.json", "--reference", "none.parquet",
            "--random", "none.parquet", *[x for kv in args.items() for x in kv], "--out", OUT,
            "--per-rule-out", "none.per_rule.parquet"]


# (argv, what the error must name): each value just outside what the config allows, so that a command that does
# not check it runs quickly (and the test fails) instead of running for hours
CASES = {
    "train env.H": (_train({"env": {"L": 8, "H": 1025}}), ["--params key 'env.H'", "'env.H'", "1..1024"]),
    "train ppo_context.lookahead_gain": (
        ["train", "--agent", "ppo_context", "--split", SPLIT, "--params",
         json.dumps({"training": TINY_TRAINING, "env": {"L": 8, "H": 8}, "agent": {"lookahead_gain": 1e300}}),
         "--out", OUT, "--quiet", "--device", "cpu"], ["lookahead_gain", f"[0, {MAX_LOOKAHEAD_GAIN:g}]"]),
    "evaluate --H": (_evaluate({}, H="1025"), ["--H", "'evaluation.horizons'", "1..1024"]),
    "evaluate evaluation.episodes_per_rule": (_evaluate({"evaluation": {"episodes_per_rule": 1001}}),
                                              ["--params key 'evaluation.episodes_per_rule'", "1..1000"]),
    "evaluate evaluation.eval_seed": (_evaluate({"evaluation": {"eval_seed": -1}}),
                                      ["--params key 'evaluation.eval_seed'", "0..4294967295"]),
    "evaluate mpc candidates": (_evaluate({"agent": {"candidates": MAX_CANDIDATES + 1}}, method="mpc"),
                                ["candidates", f"1..{MAX_CANDIDATES}"]),
    "model-error --H": (["model-error", "--run", "none", "--split", SPLIT, "--H", "1025", "--out", OUT],
                        ["--H", "'env.H'"]),
    "model-error model_error.depth": (["model-error", "--run", "none", "--split", SPLIT, "--params",
                                       json.dumps({"model_error": {"depth": 65}}), "--out", OUT],
                                      ["--params key 'model_error.depth'", "'diagnostics.model_error.depth'"]),
    "worldtest --budget": (_worldtest({}, budget="4097"), ["--budget", "'studies.worldtest.budgets'", "0..4096"]),
    "worldtest env.H": (_worldtest({"env": {"L": 8, "H": 1025}}), ["--params key 'env.H'"]),
    "worldtest planner rollouts": (_worldtest({"worldtest": {"planner": {"horizon": 256, "candidates": 512}}}),
                                   ["'worldtest.planner'", "65,536"]),
    "worldtest masked_cells > L": (_worldtest({"worldtest": {"prediction": {"masked_cells": 9}}}),
                                   ["'worldtest.prediction.masked_cells'", "env.L = 8"]),
    "fewshot shots": (_fewshot({"shots": [0, 65]}), ["--params key 'fewshot.shots[1]'", "'studies.fewshot.shots'",
                                                     "0..64"]),
    "fewshot rules_per_side": (_fewshot({"rules_per_side": 4097}), ["'fewshot.rules_per_side'", "4096"]),
    "fewshot episodes_per_rule": (_fewshot({}, {"episodes_per_rule": 1001}),
                                  ["--params key 'evaluation.episodes_per_rule'"]),
    "benchmark-health --L": (_health(**{"--L": "65"}), ["--L", "'env.L'", "3..64"]),
    "benchmark-health --H": (_health(**{"--H": "1025"}), ["--H", "'evaluation.horizons'"]),
    "benchmark-health --settings": (_health(**{"--settings": json.dumps({"leakage": {"warn": 2}})}),
                                    ["--settings.leakage.warn", "'health'"]),
    "benchmark-health --statistics": (_health(**{"--statistics": json.dumps({"n_resamples": 10, "ci": 0.95,
                                                                             "seed": 0})}),
                                      ["--statistics.n_resamples", "'statistics'"]),
    "render table3 --H": (["render", "table3", "--aggregate", "none.parquet", "--split", "main", "--H", "1025",
                           "--out", OUT], ["--H", "'evaluation.horizons'"]),
    "render worldtest --L": (["render", "worldtest", "--aggregate", "none.parquet", "--split", "main", "--L", "65",
                              "--out", OUT], ["--L", "'env.L'"]),
    "render noise --levels": (["render", "noise", "--aggregate", "none.parquet", "--levels", "0.6", "--split", "main",
                               "--H", "8", "--out", OUT], ["--levels", "'studies.noise.levels'"]),
    "aggregate-seed --last-k": (["aggregate-seed", "--episodes", "none.parquet", "--last-k", "1001", "--out", OUT],
                                ["--last-k", "'evaluation.last_k'"]),
    "aggregate --n-resamples": (["aggregate", "--per-seed", "none.parquet", "--n-resamples", "99", "--out", OUT],
                                ["--n-resamples", "'statistics.n_resamples'", "100..1000000"]),
    "aggregate --ci": (["aggregate", "--per-seed", "none.parquet", "--ci", "1.0", "--out", OUT],
                       ["--ci", "'statistics.ci'", "(0, 1)"]),
    "aggregate-model-error --n-resamples": (["aggregate-model-error", "--inputs", "none.parquet", "--n-resamples",
                                             "1000001", "--out", OUT], ["--n-resamples", "'statistics.n_resamples'"]),
    "aggregate-worldtest --ci": (["aggregate-worldtest", "--inputs", "none.parquet", "--ci", "0", "--out", OUT],
                                 ["--ci", "'statistics.ci'"]),
    "aggregate-fewshot --seed": (["aggregate-fewshot", "--inputs", "none.parquet", "--seed", "-1", "--out", OUT],
                                 ["--seed", "'statistics.seed'"]),
    "protocol-comparison --n-resamples": (
        ["protocol-comparison", "--protocols", "[]", "--n-resamples", "50", "--out", OUT, "--ranks-out", "r",
         "--reversals-out", "v"], ["--n-resamples", "'statistics.n_resamples'"]),
    "mpc --episodes-per-rule": (["mpc", "--rules", "4", "--L", "8", "--H", "8", "--candidates", "8",
                                 "--episodes-per-rule", "1001", "--out", OUT],
                                ["--episodes-per-rule", "'evaluation.episodes_per_rule'"]),
    "exact --H": (["exact", "--rules", "4", "--L", "8", "--H", "1025", "--episodes-per-rule", "1", "--out", OUT],
                  ["--H", "'evaluation.horizons'"]),
    "feasibility --H": (["feasibility", "--rules", "4", "--L", "8", "--H", "1025", "--out", OUT],
                        ["--H", "'oracle.feasibility.H'"]),
    "export-mpc-by-type --episodes-per-rule": (
        ["export-mpc-by-type", "--split", SPLIT, "--L", "8", "--H", "8", "--candidates", "8",
         "--episodes-per-rule", "1001", "--out", OUT], ["--episodes-per-rule", "'oracle.by_type_episodes_per_rule'"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_command_refuses_what_the_config_refuses(tmp_path, capsys, case):
    argv, needles = CASES[case]
    split = str(toy_split(tmp_path / "toy.json"))
    out = tmp_path / "out" / "x.parquet"
    argv = [split if a == SPLIT else str(out) if a == OUT else a for a in argv]
    assert main(argv) == 2, case
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (case, needle, err)
    assert not out.exists()


def test_the_reproductions_of_the_issue_are_refused_before_any_allocation(tmp_path, capsys):
    """A billion episodes per rule (was a 1.64 TiB _ArrayMemoryError), a billion MPC candidates (a numba
    SystemError), H = 10^9 and 100,000 shots (hours)."""
    split = str(toy_split(tmp_path / "toy.json"))
    out = str(tmp_path / "x.parquet")
    runs = [(_evaluate({"evaluation": {"episodes_per_rule": 10**9}}), "'evaluation.episodes_per_rule'"),
            (_evaluate({"agent": {"candidates": 10**9}}, method="mpc"), "candidates"),
            (_evaluate({"agent": {"candidates": 1e9}}, method="mpc"), "'candidates' of method 'mpc' must be int"),
            (_evaluate({}, H=str(10**9)), "'evaluation.horizons'"),
            (_fewshot({"shots": [100000]}), "'studies.fewshot.shots'")]
    for argv, needle in runs:
        assert main([split if a == SPLIT else out if a == OUT else a for a in argv]) == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err, err


def test_the_mpc_bounds_are_the_configs():
    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    oracle = schema["properties"]["oracle"]["properties"]
    assert (MAX_HORIZON, MAX_CANDIDATES) == (oracle["horizon"]["maximum"], oracle["candidates"]["maximum"])
    with pytest.raises(ValueError, match=f"MPC candidates must be an integer in 1..{MAX_CANDIDATES}"):
        MPCConfig(candidates=MAX_CANDIDATES + 1)
    with pytest.raises(ValueError, match=f"MPC horizon must be an integer in 1..{MAX_HORIZON}"):
        MPCConfig(horizon=MAX_HORIZON + 1)


@pytest.mark.parametrize("gain", [1e300, -1.0, MAX_LOOKAHEAD_GAIN * 2])
def test_the_lookahead_gain_is_bounded(gain):
    with pytest.raises(ValueError, match=rf"lookahead_gain must be a number in \[0, {MAX_LOOKAHEAD_GAIN:g}\]"):
        build_config("ppo_context", {"lookahead_gain": gain})
    assert build_config("ppo_context", {"lookahead_gain": MAX_LOOKAHEAD_GAIN}).lookahead_gain == MAX_LOOKAHEAD_GAIN


def test_a_value_is_checked_against_its_config_key():
    assert check_value(1000, "evaluation.episodes_per_rule", "--x") == 1000
    with pytest.raises(ConfigError, match=r"--x\[1\]: 65 is greater than the maximum of 64; the config key "
                                          r"'studies.fewshot.shots' it stands for allows a list of up to 16 items, "
                                          r"each an integer in 0..64"):
        check_value([0, 65], "studies.fewshot.shots", "--x")
    with pytest.raises(ConfigError, match="is not of type 'integer'"):
        check_value(8.0, "env.L", "--L")
    assert allowed(key_schema("statistics.ci")) == "a number in (0, 1)"
    assert key_schema("evaluation.noise") is None and key_schema("evaluation.horizons[]")["maximum"] == 1024


def test_health_gate_checks_the_thresholds_its_report_records(tmp_path, capsys):
    """health-gate takes no option that stands for a config key; the report it reads records the health thresholds
    and bootstrap it was made with, checked as the config's."""
    report = tmp_path / "health.json"
    health = {"leakage": {"warn": 0.0, "fail": 2.0, "fatal": True}}
    write_json(report, {"split": "toy", "content_hash": "x", "status": "pass", "checks": {},
                        "provenance": {"config": {"health": health}}})
    assert main(["health-gate", str(report), "--out", str(tmp_path / "verdict.json")]) == 2
    err = capsys.readouterr().err
    assert f"{report}: provenance.config.health.leakage.fail: 2.0 is greater than the maximum of 1" in err
    assert not (tmp_path / "verdict.json").exists()
