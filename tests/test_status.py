"""`tapebench status`: every run of a results folder is done / running / interrupted / failed /
damaged / pending, with progress, steps/s, ETA, the log of a failure and the evaluation files."""
from __future__ import annotations

import json
import os
import re
import shutil
import time

import pandas as pd
import pytest
from pipeline_helpers import make_workdir

from tapebench.cli import main
from tapebench.splits.io import save_split

PARAMS = {"agent": {"num_envs": 4, "hidden_size": 16, "learning_starts": 32, "buffer_size": 500,
                    "batch_size": 16, "target_update_frequency": 64},
          "env": {"L": 8, "H": 8}, "training": {"total_steps": 128, "eval_every": 64}}


def stamp(seconds_ago: float = 0.0) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - seconds_ago))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A workflow folder (config/config.yaml + tiny preset) whose results hold one run in each state."""
    root = make_workdir(tmp_path_factory.mktemp("status"))
    split = root / "results/splits/main.json"
    save_split(split, {"name": "main", "train": [4, 12], "test": [0], "params": {}, "unit": "rule",
                       "types": {"4": "periodic", "12": "periodic", "0": "stable"}})
    runs = root / "results/runs/main"
    done = runs / "dqn/seed0"
    assert main(["train", "--agent", "dqn", "--split", str(split), "--seed", "0", "--params", json.dumps(PARAMS),
                 "--out", str(done), "--device", "cpu", "--quiet"]) == 0
    pd.DataFrame({"x": [1]}).to_parquet(done / "eval_H8.parquet")   # only its presence counts here

    damaged = runs / "ppo/seed1"
    shutil.copytree(done, damaged)
    (damaged / "checkpoints/step_0000064.pt").write_bytes(b"garbage")

    running = runs / "dqn/seed1"
    running.mkdir(parents=True)
    (running / "train.log").write_text(
        f"{stamp(60)} [main dqn seed 1] training dqn on 2 rules\n"
        f"{stamp(2)} [main dqn seed 1] step 100000/400000 (25%) | 500 steps/s | eta 600 s | episodes 9\n")

    interrupted = runs / "ppo/seed0"
    interrupted.mkdir(parents=True)
    (interrupted / "train.log").write_text(
        f"{stamp(3600)} [main ppo seed 0] step 30000/200000 (15%) | 900 steps/s | eta 189 s\n")
    (interrupted / "resume.pt").write_bytes(b"state")
    old = time.time() - 3600
    os.utime(interrupted / "train.log", (old, old))

    failed_log = root / "logs/train/main/dqn/seed2.log"
    failed_log.parent.mkdir(parents=True)
    failed_log.write_text("Traceback (most recent call last):\n  File \"x\", line 1\n"
                          "RuntimeError: CUDA out of memory\n")
    return root


def status_json(workdir, capsys, *extra, whole=False) -> dict:
    capsys.readouterr()
    assert main(["status", "--results", str(workdir / "results"), "--json", *extra]) == 0
    out = json.loads(capsys.readouterr().out)
    runs = {(r["split"], r["agent"], r["seed"]): r for r in out["runs"]}
    return (runs, out) if whole else runs


def test_each_run_state_with_progress_eta_and_failure_log(workdir, capsys):
    runs = status_json(workdir, capsys, "--configfile", str(workdir / "tiny.yaml"))
    assert sorted(runs) == [("main", "dqn", 0), ("main", "dqn", 1), ("main", "dqn", 2),
                            ("main", "ppo", 0), ("main", "ppo", 1)]
    done = runs[("main", "dqn", 0)]
    assert done["state"] == "done" and done["progress"] == "128/128 (100%)" and done["evaluations"] == [8]
    assert done["steps_per_second"] > 0

    running = runs[("main", "dqn", 1)]
    assert running["state"] == "running" and running["progress"] == "100000/400000 (25%)"
    assert running["steps_per_second"] == 500 and 590 <= running["eta_s"] <= 599

    interrupted = runs[("main", "ppo", 0)]
    assert interrupted["state"] == "interrupted" and "resume.pt" in interrupted["note"]
    assert interrupted["progress"] == "30000/200000 (15%)" and interrupted["eta_s"] is None

    failed = runs[("main", "dqn", 2)]
    assert failed["state"] == "failed" and "RuntimeError: CUDA out of memory" in failed["note"]
    assert str(workdir / "logs/train/main/dqn/seed2.log") in failed["note"]

    damaged = runs[("main", "ppo", 1)]
    assert damaged["state"] == "damaged" and "step_0000064.pt" in damaged["note"]
    assert f"rm -r {workdir / 'results/runs/main/ppo/seed1'}" in damaged["note"]


def test_runs_of_another_preset_are_not_counted_against_the_paper_protocol(workdir, capsys):
    """Without --configfile, runs trained for the tiny preset's 128 steps are not listed among the paper protocol's
    pending runs: the note names the run, both step counts and the --configfile to give."""
    runs, out = status_json(workdir, capsys, whole=True)
    assert len(runs) == 5 and "pending" not in {r["state"] for r in runs.values()}
    assert out["expected_by"] == []
    assert "was trained with training.total_steps = 128" in out["note"] and "says 200000" in out["note"]
    assert "--configfile config/quick.yaml" in out["note"]
    capsys.readouterr()
    assert main(["status", "--results", str(workdir / "results")]) == 0
    table = capsys.readouterr().out
    assert re.search(r"5 training runs: 1 done, 1 running, 1 interrupted, 1 failed, 1 damaged; longest running ETA "
                     r"\S+\n", table)
    assert out["note"] in table and "expected by" not in table


def test_runs_the_config_expects_are_pending(workdir, capsys):
    # config/config.yaml given: 20 seeds x its 8 methods that train, whatever the runs found were trained with
    runs, out = status_json(workdir, capsys, "--configfile", str(workdir / "config/config.yaml"), whole=True)
    assert out["expected_by"] == [str(workdir / "config/config.yaml")] * 2 and out["note"]
    assert len(runs) == 160
    assert {agent for _, agent, _ in runs} == {"dqn", "ppo", "ppo_dr", "rad_dqn", "curl_dqn", "pearl_dqn", "dreamer",
                                               "context_mpc"}
    assert runs[("main", "ppo", 19)]["state"] == "pending" and runs[("main", "ppo", 19)]["evaluations"] == []


def test_table_output(workdir, capsys):
    capsys.readouterr()
    assert main(["status", "--results", str(workdir / "results"), "--configfile", str(workdir / "tiny.yaml")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["split", "agent", "seed", "state", "progress", "steps/s", "eta",
                                           "evaluated", "H", "note"]
    assert "5 training runs: 1 done, 1 running, 1 interrupted, 1 failed, 1 damaged" in out
    assert re.search(r"evaluation files 2 of 10; longest running ETA 9m[45]\ds \(pending: expected by \S+/config/"
                     r"config.yaml \+ \S+/tiny.yaml\)\n", out)
    assert "damaged file" not in out


def test_missing_results_folder_is_named(tmp_path, capsys):
    assert main(["status", "--results", str(tmp_path / "nope")]) == 2
    assert "results folder not found" in capsys.readouterr().err


def test_a_presets_runs_are_read_from_its_own_folder(workdir, capsys, monkeypatch):
    """config/quick.yaml writes results/quick/ and logs/quick/ (its results_dir): `tapebench status --configfile
    config/quick.yaml` reads them there without --results, and the paper protocol's results/ lists none of them."""
    shutil.copytree(workdir / "results/runs/main/dqn/seed0", workdir / "results/quick/runs/main/dqn/seed0")
    failed_log = workdir / "logs/quick/train/main/ppo/seed1.log"
    failed_log.parent.mkdir(parents=True)
    failed_log.write_text("Traceback (most recent call last):\nValueError: quick preset failure\n")
    monkeypatch.chdir(workdir)
    try:
        capsys.readouterr()
        assert main(["status", "--configfile", "config/quick.yaml", "--json"]) == 0
        runs = {(r["split"], r["agent"], r["seed"]): r for r in json.loads(capsys.readouterr().out)["runs"]}
        assert len(runs) == 6 * 3   # quick's six methods that train x 3 seeds
        assert runs[("main", "dqn", 0)]["state"] == "done"
        assert runs[("main", "ppo", 1)]["state"] == "failed"
        assert "logs/quick/train/main/ppo/seed1.log" in runs[("main", "ppo", 1)]["note"]
        assert {r["state"] for key, r in runs.items() if key not in {("main", "dqn", 0), ("main", "ppo", 1)}} == \
            {"pending"}
        paper = status_json(workdir, capsys)
        assert len(paper) == 5 and paper[("main", "ppo", 1)]["state"] == "damaged"
    finally:
        shutil.rmtree(workdir / "results/quick")
        shutil.rmtree(workdir / "logs/quick")
