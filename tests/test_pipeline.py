"""The Snakemake pipeline: config validation before any job, lint, the whole DAG on a tiny config,
precise partial reruns (a DQN hyperparameter change reruns only DQN's jobs and what depends on them),
training progress on the console, and a damaged artifact stopping the run before any job."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tapebench.jobserver import MIN_JOBS
from pipeline_helpers import REPO, abstract_sockets, copy_workdir, make_workdir, scheduled_jobs, snakemake

pytestmark = pytest.mark.xdist_group("tiny_build")   # with the other users of the session's tiny build


@pytest.fixture(scope="module")
def tiny_run(tiny_build, tmp_path_factory):
    """A copy of the session's tiny build (these tests damage and rerun it)."""
    return copy_workdir(tiny_build, tmp_path_factory.mktemp("pipeline"))


def test_lint_is_clean():
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Lints for" not in proc.stdout + proc.stderr


def test_the_snakefiles_header_commands_parse_as_meant():
    """`--configfile` takes every word up to the next option, so a target after it is read as a second config file:
    each command in the Snakefile's header names its targets as targets and only existing YAML files as configs."""
    from snakemake.cli import get_argument_parser

    commands = [m.group(1).split() for m in re.finditer(r"^#[^:\n]*:\s+(snakemake .*)$",
                                                         (REPO / "Snakefile").read_text(), re.M)]
    assert len(commands) == 3, commands
    for command in commands:
        args = get_argument_parser().parse_args(command[1:])
        folders = [yaml.safe_load((REPO / f).read_text()).get("results_dir") for f in args.configfile or []]
        folder = next((f for f in reversed(folders) if f), "results")   # the last preset that states one
        assert args.targets == [f"{folder}/table3.tex"], command
        assert all(str(f).endswith(".yaml") and (REPO / f).is_file() for f in args.configfile or []), command


def test_workflow_is_formatted_with_snakefmt():
    """The Snakefile and every .smk file are as snakefmt writes them (settings: [tool.snakefmt] in pyproject)."""
    if shutil.which("snakefmt") is None:
        if os.environ.get("TAPEBENCH_REQUIRE_LINT"):
            pytest.fail("snakefmt is not installed (pip install -e '.[test]'); CI requires it")
        pytest.skip("snakefmt is not installed (pip install -e '.[test]')")
    proc = subprocess.run(["snakefmt", "--check", "--diff", "Snakefile", "workflow"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, "run `snakefmt Snakefile workflow`:\n" + proc.stdout + proc.stderr


@pytest.mark.parametrize("override, key", [
    ({"training": {"total_steps": -5}}, "training.total_steps"),
    ({"env": {"L": 100}}, "env.L"),
    ({"evaluation": {"horizons": []}}, "evaluation.horizons"),
    ({"splits": {"main": {"method": "clever", "test_size": 30, "seed": 0}}}, "splits.main.method"),
    ({"main_split": "nope"}, "main_split"),
    ({"agents": {"dqn": {"learning_rat": 0.1}}}, "agents.dqn"),
    ({"agents": {"sac": {}}}, "agents.sac"),
    ({"methods": ["dqn", "sac"]}, "methods[1]"),
    ({"methods": ["dqn", "exact"], "env": {"L": 32}}, "methods[1]"),
    ({"methods": []}, "methods"),
    ({"seeds": 0}, "seeds"),
    ({"seeds": 1_000_000}, "seeds"),
    ({"training": {"total_steps": 10**8, "eval_every": 1}}, "training.eval_every"),
    ({"evaluation": {"last_k": 3}}, "evaluation.last_k"),         # tiny runs have 2 checkpoints
    ({"splits": {"main": {"method": "diverse", "test_size": 4, "seed": 0,
                          "rules": "0-255 --out x; touch INJECTED; true"}}}, "splits.main.rules"),
    ({"splits": {"main": {"method": "diverse", "test_size": 40, "seed": 0, "rules": "0-31"}}},
     "splits.main.test_size"),
])
def test_bad_config_stops_before_any_job(tmp_path, override, key):
    workdir = make_workdir(tmp_path)
    (workdir / "bad.yaml").write_text(yaml.safe_dump(override))
    proc = snakemake(workdir, "--dry-run", configfiles=("tiny.yaml", "bad.yaml"))
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert f"'{key}'" in out, out[-3000:]
    assert not (workdir / "results").exists() and not (workdir / "logs").exists()
    assert not (workdir / "INJECTED").exists()


def test_malformed_config_file_is_named(tmp_path):
    workdir = make_workdir(tmp_path)
    config = workdir / "config" / "config.yaml"
    config.write_text(config.read_text() + "env:\n  L: 32\n H: [\n")
    proc = snakemake(workdir, "--dry-run")
    assert proc.returncode != 0
    assert re.search(r"config file config/config\.yaml is not valid YAML at line \d+", proc.stdout + proc.stderr)


def test_config_mapping_on_the_command_line_merges_into_the_config(tmp_path):
    """`--config 'training={...}'`: Snakemake hands the values over as text; they are read as numbers
    and merged key by key (the other training keys keep their values)."""
    workdir = make_workdir(tmp_path)
    proc = snakemake(workdir, "--dry-run", "--printshellcmds", "--config",
                     "training={total_steps: 512, eval_every: 128}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    train = [line for line in proc.stdout.splitlines() if "tapebench train" in line and "results/runs/main/" in line]
    assert len(train) == 4 and all('"training":{"eval_every":128,"total_steps":512}' in c for c in train)
    assert all("--threads 1" in c for c in train)
    proc = snakemake(workdir, "--dry-run", "--config", "training.total_steps=512")
    assert proc.returncode != 0     # dotted keys are not Snakemake syntax (README shows the forms that work)


def test_tiny_pipeline_produces_tables_and_data(tiny_run):
    results = tiny_run / "results"
    for table in ("table1", "table2", "table3", "table4", "table7"):
        assert (results / f"{table}.tex").stat().st_size > 0
    table3 = (results / "table3.tex").read_text()
    assert re.search(r"^DQN & 2 &", table3, re.M) and re.search(r"^PPO & 2 &", table3, re.M)
    # reference rows under a rule: random policy and MPC with the seeds' streams, the exact optimum once
    assert re.search(r"^Random policy & 2 &", table3, re.M) and re.search(r"^True-dynamics MPC & 2 &.* 100 ", table3, re.M)
    assert re.search(r"^Exact optimum & 1 &", table3, re.M)
    assert table3.index("Reference (not learned)") < table3.index("Random policy &")
    assert table3.count("[") >= 20  # a CI line under each row
    assert "solved by any action" in table3
    for method, seeds in (("random", 2), ("mpc", 2), ("exact", 1)):
        files = sorted((results / "runs/main" / method).glob("seed*/eval_H8.parquet"))
        assert len(files) == seeds, method
        assert not (results / "runs/main" / method / "seed0" / "train.json").exists()
        assert set(pd.read_parquet(files[0])["checkpoint"]) == {0}
    episodes = pd.read_parquet(results / "runs/main/dqn/seed0/eval_H8.parquet")
    assert set(episodes["side"]) == {"train", "test"}
    assert set(episodes["checkpoint"]) == {128, 256}
    aggregate = pd.read_parquet(results / "aggregate/main/aggregate.parquet")
    assert {"agent", "side", "metric", "mean", "ci_low", "ci_high"} <= set(aggregate.columns)
    assert (results / "oracle/feasibility_L8_H8.parquet").exists()
    ident = pd.read_parquet(results / "identifiability/main.parquet")
    assert set(ident["side"]) == {"train", "test"} and ident["steps"].between(1, 9).all()
    assert "Identifiability of the rule" in (results / "identifiability/main.tex").read_text()



def test_local_jobs_run_through_the_job_server(tiny_run):
    """The local run forked its jobs from one job server (docs/compute.md#job-server; what a fork writes is what its own
    process writes: tests/test_jobserver.py), which it stopped at the end."""
    output = (tiny_run / "snakemake.out").read_text()
    started = re.search(r"tapebench job server: jobs fork from process (\d+) \((.*)\)", output)
    assert started, output[-2000:]
    assert started.group(2).startswith("@tapebench-jobserver-")        # abstract: nothing on disk
    assert started.group(2) not in abstract_sockets()                  # stopped at the end


def test_a_rerun_of_few_jobs_starts_no_job_server(tiny_run):
    """Fewer jobs to run than jobserver.MIN_JOBS, however many are finished: each starts its own process."""
    table = tiny_run / "results/table3.tex"
    before = table.read_text()
    table.unlink()
    proc = snakemake(tiny_run)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    ran = int(re.findall(r"(\d+) of \d+ steps \(100%\) done", output)[-1])
    assert ran < MIN_JOBS
    assert "job server" not in output
    assert table.read_text() == before


def test_rerun_is_a_no_op(tiny_run):
    proc = snakemake(tiny_run, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert scheduled_jobs(proc.stdout) == [], proc.stdout[-3000:]


def test_changing_dqn_hyperparameter_reruns_only_dqn_jobs(tiny_run):
    (tiny_run / "lr.yaml").write_text(yaml.safe_dump({"agents": {"dqn": {"learning_rate": 0.001}}}))
    proc = snakemake(tiny_run, "--dry-run", configfiles=("tiny.yaml", "lr.yaml"))
    assert proc.returncode == 0, proc.stderr
    jobs = scheduled_jobs(proc.stdout)
    rules = {rule for rule, _ in jobs}
    trained = sorted((wc["split"], wc["agent"], wc["seed"]) for rule, wc in jobs if rule == "train")
    assert trained == [("main", "dqn", "0"), ("main", "dqn", "1"), ("random1", "dqn", "0")]   # + the robustness split
    assert {wc["agent"] for rule, wc in jobs if rule in ("evaluate", "aggregate_seed")} == {"dqn"}
    assert {"evaluate", "aggregate_seed", "aggregate", "render_table3"} <= rules
    assert not rules & {"rule_features", "split", "split_health", "mpc_split", "feasibility",
                        "fixed_z_oracle", "mpc_by_type"}


def test_changing_a_reference_method_reruns_only_its_evaluations(tiny_run):
    (tiny_run / "mpc.yaml").write_text(yaml.safe_dump({"agents": {"mpc": {"candidates": 32}}}))
    proc = snakemake(tiny_run, "--dry-run", configfiles=("tiny.yaml", "mpc.yaml"))
    assert proc.returncode == 0, proc.stderr
    jobs = scheduled_jobs(proc.stdout)
    rules = {rule for rule, _ in jobs}
    assert sorted((wc["agent"], wc["seed"], wc["H"]) for rule, wc in jobs
                  if rule == "evaluate_method" and wc["split"] == "main") == [
        ("mpc", s, h) for s in ("0", "1") for h in ("16", "8")]
    assert "train" not in rules and "evaluate" not in rules
    assert {wc["agent"] for rule, wc in jobs if rule == "aggregate_seed"} == {"mpc"}


def test_training_progress_reaches_the_console_and_the_job_log(tiny_run):
    progress = re.compile(r"\[main dqn seed 0\] step 128/256 \(50%\) \| \d+ steps/s \| eta \d+ s")
    assert progress.search((tiny_run / "snakemake.out").read_text())
    assert progress.search((tiny_run / "logs/train/main/dqn/seed0.log").read_text())


def test_damaged_artifact_stops_the_run_before_any_job_and_rm_recovers(tiny_run):
    aggregate = tiny_run / "results/aggregate/main/aggregate.parquet"
    tables = {t: (tiny_run / "results" / f"{t}.tex").read_text() for t in ("table2", "table3", "table4")}
    aggregate.write_bytes(aggregate.read_bytes()[:100])
    proc = snakemake(tiny_run)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "results/aggregate/main/aggregate.parquet: not a readable Parquet file" in out
    assert "rm -r results/aggregate/main/aggregate.parquet" in out
    assert "localrule" not in out and "rule render" not in out
    assert {t: (tiny_run / "results" / f"{t}.tex").read_text() for t in tables} == tables

    os.remove(aggregate)
    proc = snakemake(tiny_run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {t: (tiny_run / "results" / f"{t}.tex").read_text() for t in tables} == tables
    assert scheduled_jobs(snakemake(tiny_run, "--dry-run").stdout) == []
