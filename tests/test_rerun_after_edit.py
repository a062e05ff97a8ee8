"""One run after a config edit leaves the results consistent with the config, on a copy of the session's tiny build.

For an edit of every config section (env, evaluation, statistics, each study, one method's hyperparameters, a
split, the oracle, the health thresholds; the diagnostics are not in the
default DAG), `snakemake --summary` (one dry evaluation of the DAG)
must plan an update for every output whose params, input set or code changed: none of them may be left as
"no update". This is what went wrong when a rerun of the random policy's evaluation (read by the health report,
whose verdict every training job takes through `ancient()`) hid the evaluations of trained runs from Snakemake's
rerun checks (tapebench/pipeline/reruns.py). Then one real run after the evaluation and statistics edits: after
it, `--list-changes params`, `input` and `code` list nothing, and a second dry run schedules nothing.
"""
from __future__ import annotations

import pytest
import yaml
from pipeline_helpers import copy_workdir, scheduled_jobs, snakemake

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("tiny_build")]   # 17 Snakemake calls and one run

CHANGED = {"params changed", "set of input files changed", "rule implementation changed"}

EDITS = {
    "env": {"env": {"success_bonus": 0.5}},
    "evaluation": {"evaluation": {"episodes_per_rule": 2}},
    "statistics": {"statistics": {"n_resamples": 100}},
    "fixed_z": {"studies": {"fixed_z": {"total_steps": 384}}},
    "robustness": {"studies": {"robustness": {"splits": ["main", "random2"]}}},
    "noise": {"studies": {"noise": {"levels": [0.0, 0.2]}}},
    "ladder": {"studies": {"ladder": {"seed": 1}}},
    "worldtest": {"studies": {"worldtest": {"problems_per_rule": 2}}},
    "hyperparameters": {"agents": {"dqn": {"hidden_size": 16}}},
    "split": {"splits": {"random1": {"seed": 5}}},
    "oracle": {"oracle": {"candidates": 32}},
    "health": {"health": {"identifiability": {"warn": 0.9, "fail": 1.0, "fatal": False}}},
}


@pytest.fixture(scope="module")
def workdir(tiny_build, tmp_path_factory):
    return copy_workdir(tiny_build, tmp_path_factory.mktemp("rerun_after_edit"))


def _summary(workdir, configfiles) -> list[dict]:
    proc = snakemake(workdir, "--summary", configfiles=configfiles)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    header = lines[0].split("\t")
    assert header[0] == "output_file" and {"status", "plan"} <= set(header), lines[:2]
    return [dict(zip(header, line.split("\t"))) for line in lines[1:]]


def _overlay(workdir, name: str, edit: dict) -> tuple[str, str]:
    (workdir / f"{name}.yaml").write_text(yaml.safe_dump(edit))
    return ("tiny.yaml", f"{name}.yaml")


@pytest.mark.parametrize("section", list(EDITS))
def test_every_changed_output_is_planned_for_an_update(workdir, section):
    rows = _summary(workdir, _overlay(workdir, section, EDITS[section]))
    left = [(r["output_file"], r["rule"], r["status"]) for r in rows if r["status"] in CHANGED
            and r["plan"] == "no update"]
    assert left == [], f"{section}: changed outputs Snakemake would not rebuild: {left[:10]}"
    assert any(r["plan"] == "update pending" for r in rows), f"{section}: the edit changed nothing"


def test_one_run_after_an_edit_leaves_nothing_to_do(workdir):
    configfiles = _overlay(workdir, "edited", EDITS["statistics"])
    before = _summary(workdir, configfiles)
    stale = {r["output_file"] for r in before if r["rule"] == "aggregate"}
    assert stale and all(r["plan"] == "update pending" for r in before if r["output_file"] in stale)
    proc = snakemake(workdir, configfiles=configfiles)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    for change in ("params", "input", "code"):
        listed = snakemake(workdir, "--list-changes", change, configfiles=configfiles)
        assert listed.returncode == 0, listed.stderr[-3000:]
        assert listed.stdout.strip() == "", f"--list-changes {change}: {listed.stdout[:1000]}"
    dry = snakemake(workdir, "--dry-run", configfiles=configfiles)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert scheduled_jobs(dry.stdout) == [], dry.stdout[-3000:]


@pytest.fixture(scope="module")
def finished(tiny_build, tmp_path_factory):
    """A copy of the finished tiny build that no test runs anything in."""
    return copy_workdir(tiny_build, tmp_path_factory.mktemp("stated_defaults"))


def test_stating_a_default_reruns_nothing_and_changing_it_reruns_that_method_only(finished):
    """A job's hyperparameters are its method's resolved Config (docs/protocol.md#job-params): tiny.yaml's DQN with
    its default learning rate stated schedules nothing; another learning rate reruns DQN's jobs (and what reads them)
    and no other method's."""
    from tapebench.registry import get_method

    default = get_method("dqn").Config().learning_rate
    stated = snakemake(finished, "--dry-run",
                       configfiles=_overlay(finished, "stated", {"agents": {"dqn": {"learning_rate": default}}}))
    assert stated.returncode == 0, stated.stderr[-3000:]
    assert scheduled_jobs(stated.stdout) == [], stated.stdout[-3000:]
    changed = snakemake(finished, "--dry-run",
                        configfiles=_overlay(finished, "changed", {"agents": {"dqn": {"learning_rate": default * 2}}}))
    assert changed.returncode == 0, changed.stderr[-3000:]
    jobs = scheduled_jobs(changed.stdout)
    assert any(rule.startswith("train") for rule, _ in jobs), changed.stdout[-3000:]
    assert {w["agent"] for _, w in jobs if "agent" in w} == {"dqn"}, jobs
