"""Resources before jobs: every training, evaluation and world-test job's memory is estimated from its config slice
(tapebench.pipeline.resources), a config whose job would need more than resources.max_mem_mb is refused at
validation naming the key, and the workflow declares each job's mem_mb and runtime from the same estimate."""
from __future__ import annotations

import copy
import re

import pytest
from pipeline_helpers import REPO, make_workdir, snakemake

from tapebench.cli import main
from tapebench.pipeline import resources
from tapebench.pipeline.config import ConfigError, load_config, max_mem_mb, training_job, validate_config
from tapebench.registry import build_config

SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
LIMIT_MB = 16_000   # the refusals must not depend on the memory of the machine that runs the tests


def tiny() -> dict:
    config = load_config([REPO / "tests" / "data" / "tiny.yaml"], root=REPO)
    config["resources"] = {"max_mem_mb": LIMIT_MB}
    return config


SIZE_CASES = [
    *[(m, "hidden_size", 10 ** 8) for m in ("dqn", "ppo", "dreamer", "dreamer_large", "ensemble_mpc")],
    ("dreamer", "deter_size", 10 ** 8),
    ("dqn", "hidden_layers", 10 ** 6),
    ("dqn_equivariant", "conv_channels", 10 ** 9),
    ("dqn_equivariant", "conv_kernel", 10 ** 9 + 1),
    ("dqn", "buffer_size", 10 ** 12),
    ("dqn", "batch_size", 10 ** 9),
    ("ppo", "num_steps", 10 ** 9),
]


@pytest.mark.parametrize("method, key, value", SIZE_CASES, ids=[f"{m}.{k}" for m, k, _ in SIZE_CASES])
def test_a_job_too_large_for_max_mem_mb_is_refused_naming_the_key(method, key, value):
    config = tiny()
    config["methods"] = list(dict.fromkeys([*config["methods"], method]))
    config["agents"][method] = {**config["agents"].get(method, {}), key: value}
    with pytest.raises(ConfigError) as error:
        validate_config(config, SCHEMA)
    message = str(error.value)
    assert f"config key 'agents.{method}.{key}'" in message, message
    assert re.search(r"needs about [\d,]+ MB", message) and f"resources.max_mem_mb = {LIMIT_MB:,} MB" in message


def test_the_worldtest_problems_that_fill_the_memory_are_refused():
    config = tiny()
    config["env"]["L"] = 64
    config["methods"] = ["dqn", "ppo", "random", "mpc"]     # the exact optimum needs L <= 20
    config["studies"]["worldtest"].update(problems_per_rule=10_000, prediction={"lengths": [64], "masked_cells": 64})
    with pytest.raises(ConfigError, match=r"config key 'studies\.worldtest\.problems_per_rule': a world-test job "
                                          r"needs about [\d,]+ MB: prediction tapes"):
        validate_config(config, SCHEMA)


def test_the_worldtest_planner_is_bounded():
    config = tiny()
    config["studies"]["worldtest"]["planner"] = {"horizon": 256, "candidates": 65536}
    with pytest.raises(ConfigError, match=r"config key 'studies\.worldtest\.planner': horizon x candidates = "
                                          r"256 x 65536 = 16,777,216 .* at most 65,536"):
        validate_config(config, SCHEMA)


def test_max_mem_mb_defaults_to_this_machines_memory_and_bounds_the_tiny_jobs():
    config = load_config([REPO / "tests" / "data" / "tiny.yaml"], root=REPO)
    validate_config(config, SCHEMA)
    assert max_mem_mb(config) == resources.machine_mem_mb() > 1000
    assert "max_mem_mb" not in config["resources"]      # not written into the config: job params stay machine-free
    config = tiny()
    config["resources"]["max_mem_mb"] = 500      # below any torch process: no hyperparameter is to blame
    with pytest.raises(ConfigError, match=r"config key 'resources\.max_mem_mb': 500 MB \(resources.max_mem_mb\) is "
                                          r"less than the 800 MB every job's process needs") as error:
        validate_config(config, SCHEMA)
    assert "agents." not in str(error.value)


def test_the_refusal_names_the_largest_job_of_the_dag():
    """Two methods over the limit: the larger job's key is named, whichever comes first in `methods`."""
    config = tiny()
    config["methods"] = list(dict.fromkeys([*config["methods"], "dqn", "ppo"]))
    config["agents"]["dqn"] = {**config["agents"].get("dqn", {}), "buffer_size": 10 ** 9}
    config["agents"]["ppo"] = {**config["agents"].get("ppo", {}), "hidden_size": 10 ** 8}
    with pytest.raises(ConfigError, match=r"config key 'agents\.ppo\.hidden_size'"):
        validate_config(config, SCHEMA)


def test_a_sweep_outside_the_dag_is_not_refused_for_its_memory():
    config = tiny()
    config["diagnostics"]["sweep"] = {"method": "dreamer", "hyperparameter": "hidden_size", "values": [100_000]}
    config["methods"] = [m for m in config["methods"] if m != "dreamer"]
    validate_config(config, SCHEMA)             # no sweep job runs: nothing to refuse
    config = tiny()
    config["diagnostics"]["sweep"] = {"method": "dreamer", "hyperparameter": "hidden_size", "values": [100_000]}
    config["methods"] = list(dict.fromkeys([*config["methods"], "dreamer"]))
    with pytest.raises(ConfigError, match=r"config key 'diagnostics\.sweep\.values\[0\]': a sweep training job"):
        validate_config(config, SCHEMA)


def test_the_estimate_grows_with_each_size_and_with_the_seeds_of_a_job():
    base = build_config("dqn", {})
    one = resources.training_memory(base, 32, 32)
    assert resources.training_memory(base, 32, 32, seeds=4).mb - resources.BASE_MB == pytest.approx(
        4 * (one.mb - resources.BASE_MB), abs=4)
    for key in ("hidden_size", "hidden_layers", "buffer_size", "batch_size"):
        bigger = build_config("dqn", {key: 8 * getattr(base, key)})
        assert resources.training_memory(bigger, 32, 32).mb > one.mb, key
    assert resources.training_memory(base, 64, 32).mb > one.mb
    assert resources.training_minutes(base, 32, 32, 200_000) > resources.training_minutes(base, 32, 32, 20_000)


def test_tapebench_train_refuses_a_run_the_machine_cannot_hold(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--agent", "dqn", "--rules", "30", "--out", str(out), "--params",
                 '{"env": {"L": 8, "H": 8}, "agent": {"hidden_size": 100000000}}'])
    err = capsys.readouterr().err
    assert code == 2 and "--params agent.hidden_size: a training run of 'dqn'" in err and "MB" in err, err
    assert not out.exists()


@pytest.mark.slow
def test_snakemake_declares_estimated_mem_mb_and_refuses_an_oversized_job(tmp_path):
    (tmp_path / "wf").mkdir()
    workdir = make_workdir(tmp_path / "wf")
    proc = snakemake(workdir, "-n", "--forceall", "results/aggregate/main/dqn_H8.per_seed.parquet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = tiny()
    validate_config(config, SCHEMA)
    memory, minutes = training_job(config, "dqn")
    train_jobs = re.findall(r"rule train:.*?resources: ([^\n]*)", proc.stdout, re.S)
    assert train_jobs and all(f"mem_mb={memory.mb}," in r and f"runtime={minutes}," in r for r in train_jobs)
    bad = tmp_path / "bad.yaml"
    bad.write_text("agents: {dqn: {hidden_size: 100000000}}\n")
    proc = snakemake(workdir, "-n", configfiles=("tiny.yaml", str(bad)))
    assert proc.returncode != 0 and "config key 'agents.dqn.hidden_size'" in proc.stdout + proc.stderr
