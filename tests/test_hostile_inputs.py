"""What a hostile pass tried, each refused early with a message naming the key, the file or the method: a healthy
file of another kind given as a split, records that lie about their path, inputs given twice, non-finite or
out-of-range --params, a row's defining field overridden, misbehaving plug-in world testers, output paths that
are folders, a diverging training run."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from agent_contract import toy_split
from pipeline_helpers import REPO

from tapebench import layout
from tapebench.cli import main
from tapebench.evaluation.worldtest import WorldTestSettings, run_worldtest
from tapebench.methods import worldtest
from tapebench.methods.dqn import DQNAgent
from tapebench.pipeline.config import ConfigError, load_config, merge_config, validate_config
from tapebench.pipeline.integrity import problems_report, scan_results
from tapebench.registry import Method, build_config
from tapebench.schemas import WORLDTEST_COLUMNS
from tapebench.splits.io import load_split
from tapebench.training import loop
from tapebench.training.loop import TrainSpec, train
from tapebench.utils.artifacts import CorruptArtifact, WrongKind, read_table
from tapebench.utils.io import write_json, write_parquet

SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
SIDES = {"train": [4, 30], "test": [54, 60]}
TINY_WT = WorldTestSettings(problems_per_rule=1, planner_candidates=8, prediction_lengths=(1,), detection_length=4)


def _worldtest_table(agent: str, seed: int = 0, budget: int = 0, split: str = "main", rows: int = 3):
    frame = pd.DataFrame({
        "agent": agent, "seed": seed, "budget": budget, "split": split, "family": "eca", "side": "train", "rule": 30,
        "problem": np.arange(rows), "task": "prediction", "length": 1, "score": 1.0, "success": np.nan,
        "final_dist": np.nan, "delay": np.nan})
    return frame[list(WORLDTEST_COLUMNS)].astype(WORLDTEST_COLUMNS)


# --- a healthy file of another kind given as --split -------------------------------------------------
def test_a_file_of_another_kind_is_named_not_called_corrupt(tmp_path, capsys):
    run = tmp_path / layout.run_dir("main", "dqn", 0)
    write_json(run / "train.json", {"agent": "dqn", "fingerprint": "f", "checkpoints": []})
    table = tmp_path / layout.worldtest_records("main", "random", 0, 0)
    write_parquet(table, _worldtest_table("random"), meta={"table": "worldtest"})
    text = tmp_path / "notes.md"
    text.write_text("# not a split\n")
    expected = {run / "train.json": "a training run's manifest", table: "a world-test table",
                text: "it is a Markdown text file"}
    for path, what in expected.items():
        with pytest.raises(WrongKind, match="is not a split file") as info:
            load_split(path)
        assert what in str(info.value) and "rm " not in str(info.value)
        assert main(["worldtest", "--method", "random", "--seed", "0", "--budget", "0", "--split", str(path),
                     "--out", str(tmp_path / "x.parquet")]) == 2
        err = capsys.readouterr().err
        assert what in err and "rm " not in err and "corrupt" not in err
    damaged = tmp_path / "results" / "splits" / "main.json"
    damaged.parent.mkdir(parents=True)
    damaged.write_text(toy_split(tmp_path / "toy.json").read_text()[:40])     # a split cut short: damage
    with pytest.raises(CorruptArtifact, match=r"rm .*main\.json"):
        load_split(damaged)


# --- records that lie about their path, inputs given twice --------------------------------------------
def test_records_must_carry_the_provenance_their_path_states(tmp_path, capsys):
    results = tmp_path / "results"
    random = tmp_path / layout.worldtest_records("main", "random", 0, 0)
    mpc = tmp_path / layout.worldtest_records("main", "mpc", 0, 0)
    write_parquet(mpc, _worldtest_table("mpc"), meta={"table": "worldtest"})
    write_parquet(random, _worldtest_table("random"), meta={"table": "worldtest"})
    assert scan_results(results) == []
    read_table(random, "worldtest")
    out = str(tmp_path / "agg.parquet")
    assert main(["aggregate-worldtest", "--inputs", str(random), str(random.parent / ".." / "random" / random.name),
                 "--out", out, "--n-resamples", "100"]) == 2
    assert "given twice" in capsys.readouterr().err

    random.write_bytes(mpc.read_bytes())             # mpc's file copied over random's
    problems = scan_results(results)
    assert [p.path for p in problems] == [random]
    assert "agent ['mpc'], but its path names agent 'random'" in problems_report(problems)
    with pytest.raises(CorruptArtifact, match="agent"):
        read_table(random, "worldtest")
    assert main(["aggregate-worldtest", "--inputs", str(random), str(mpc), "--out", out]) == 2
    assert f"rm {random}" in capsys.readouterr().err
    for budget, wrong in ((4, {"budget": 0}), (0, {"seed": 1}), (0, {"split": "other"})):
        path = tmp_path / layout.worldtest_records("main", "dqn", 0, budget)
        write_parquet(path, _worldtest_table("dqn", **{"budget": budget, **wrong}), meta={"table": "worldtest"})
        with pytest.raises(CorruptArtifact, match=next(iter(wrong))):
            read_table(path, "worldtest")
        path.unlink()


def test_every_aggregate_refuses_an_input_given_twice(tmp_path, capsys):
    some = tmp_path / "x.parquet"
    some.write_bytes(b"")
    for command, flag in (("aggregate-seed", "--episodes"), ("aggregate", "--per-seed"),
                          ("aggregate-model-error", "--inputs"), ("aggregate-worldtest", "--inputs")):
        assert main([command, flag, str(some), str(tmp_path / "." / "x.parquet"), "--out",
                     str(tmp_path / "o.parquet")]) == 2
        assert "given twice" in capsys.readouterr().err, command
    protocol = {"name": "p", "split": "main", "H": 8, "side": "test", "per_seed": [str(some), str(some)]}
    assert main(["protocol-comparison", "--protocols", json.dumps([protocol]), "--out", "a", "--ranks-out", "b",
                 "--reversals-out", "c"]) == 2
    assert "given twice" in capsys.readouterr().err


# --- hand-run commands accept only what the pipeline accepts -------------------------------------------
@pytest.mark.parametrize("params,needle", [
    ({"env": {"success_bonus": float("nan")}}, "'env.success_bonus': nan is not a finite number"),
    ({"env": {"success_bonus": float("inf")}}, "'env.success_bonus': inf is not a finite number"),
    ({"env": {"success_bonus": -5}}, "success_bonus must be in 0..1000"),
    ({"env": {"H": 0}}, "horizon H must be >= 1, got 0"),
    ({"agent": {"candidates": float("nan")}}, "'agent.candidates': nan is not a finite number"),
])
def test_worldtest_params_are_checked_as_the_config(tmp_path, capsys, params, needle):
    split = toy_split(tmp_path / "toy.json")
    assert main(["worldtest", "--method", "mpc", "--seed", "0", "--budget", "0", "--split", str(split),
                 "--params", json.dumps(params), "--out", str(tmp_path / "x.parquet"), "--quiet"]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "x.parquet").exists()


def test_seeds_nan_learning_rate_and_a_mismatched_run_are_refused(tmp_path, capsys):
    split = toy_split(tmp_path / "toy.json")
    with pytest.raises(SystemExit):
        main(["worldtest", "--method", "random", "--seed", str(10**23), "--budget", "0", "--split", str(split),
              "--out", str(tmp_path / "x.parquet")])
    assert "--seed: must be an integer in 0..4294967295" in capsys.readouterr().err
    assert main(["train", "--agent", "dqn", "--split", str(split), "--params",
                 '{"agent": {"learning_rate": NaN}}', "--out", str(tmp_path / "run")]) == 2
    assert "'agent.learning_rate': nan is not a finite number" in capsys.readouterr().err
    with pytest.raises(ValueError, match="hyperparameter 'learning_rate' of method 'dqn' must be a finite number"):
        build_config("dqn", {"learning_rate": float("inf")})
    # a run trained at L = H = 8: the world test refuses another L, H or hyperparameters for it
    small = {"num_envs": 4, "ensemble_size": 2, "hidden_size": 8, "batch_size": 8, "learning_starts": 16,
             "candidates": 8, "plan_horizon": 2}
    run = tmp_path / "ensemble_mpc"
    loaded = load_split(split)
    spec = TrainSpec(agent="ensemble_mpc", rules=loaded.train, seed=0, hyperparameters=small, L=8, H=8,
                     total_steps=32, eval_every=32, split={"name": loaded.name, "content_hash": loaded.content_hash})
    train(spec, run, quiet=True)
    for params, needle in (({"env": {"L": 8, "H": 16}, "agent": small}, "env.H = 16, but run"),
                           ({"env": {"L": 16, "H": 8}, "agent": small}, "env.L = 16, but run"),
                           ({"env": {"L": 8, "H": 8}, "agent": {**small, "hidden_size": 16}},
                            "hidden_size = 16 (run: 8)")):
        assert main(["worldtest", "--method", "ensemble_mpc", "--run", str(run), "--seed", "0", "--budget", "0",
                     "--split", str(split), "--params", json.dumps(params), "--out", str(tmp_path / "x.parquet"),
                     "--quiet"]) == 2
        assert needle in capsys.readouterr().err


def test_a_non_finite_loss_stops_the_run_before_its_checkpoint(tmp_path, monkeypatch):
    dqn = {"num_envs": 4, "buffer_size": 200, "learning_starts": 16, "batch_size": 8, "hidden_size": 8}
    spec = TrainSpec(agent="dqn", rules=(4,), seed=0, hyperparameters=dqn, L=8, H=8, total_steps=32, eval_every=16)
    update = DQNAgent.update
    monkeypatch.setattr(DQNAgent, "update", lambda self: {**(update(self) or {}), "td_loss": float("nan")})
    with pytest.raises(ValueError, match=r"training diverged by step 16: td_loss = nan; no checkpoint was written"):
        train(spec, tmp_path, quiet=True)
    assert not list(tmp_path.glob("checkpoints/*.pt"))
    with pytest.raises(ValueError, match="q_mean = inf"):
        loop.check_finite_metrics({"td_loss": 0.5, "q_mean": float("inf")}, 8)


# --- a row's defining field ----------------------------------------------------------------------------
def test_a_rows_defining_field_is_fixed():
    with pytest.raises(ValueError, match=r"'network' of method 'dqn_equivariant' \(DQN \(equivariant\)\) is fixed"):
        build_config("dqn_equivariant", {"network": "mlp"})
    config = load_config(root=REPO)
    with pytest.raises(ConfigError, match="agents.ppo_equivariant.*'network'.*is fixed at 'equivariant'"):
        validate_config(merge_config(config, {"agents": {"ppo_equivariant": {"network": "mlp"}}}), SCHEMA)


# --- plug-in world testers -----------------------------------------------------------------------------
def _plugin(detect=None, tester=None):
    class Reporter(worldtest.ChanceTester):
        def detect_step(self, t, before, actions, after):
            return detect(len(after))

    make = (lambda config, context: tester) if tester is not None else (lambda config, context: Reporter(context))
    return Method("wt_hostile", "Hostile", "reference", worldtest.ActiveConfig, worldtest=make)


@pytest.mark.parametrize("detect,needle", [
    (lambda n: np.full(n, -1), "booleans (or 0 / 1), got -1"),
    (lambda n: np.full(n, 10**6), "booleans (or 0 / 1), got 1000000"),
    (lambda n: np.full(n, np.nan), "booleans, got float64"),
    (lambda n: np.full(n, "yes"), "booleans, got <U3"),
    (lambda n: (_ for _ in ()).throw(RuntimeError("tester broke")), "RuntimeError: tester broke"),
])
def test_plug_in_detection_reports_are_checked_and_errors_name_the_method(detect, needle):
    with pytest.raises(ValueError, match="method 'wt_hostile', world test train detection") as info:
        run_worldtest(_plugin(detect), worldtest.ActiveConfig(), TINY_WT, sides=SIDES, L=8, H=8, seed=0, budget=0)
    assert needle in str(info.value)


def test_a_plug_in_that_returns_no_tester_is_named():
    with pytest.raises(ValueError, match=r"method 'wt_hostile'.*returned object, not a world tester: it lacks "
                                         r"\['explore_begin'"):
        run_worldtest(_plugin(tester=object()), worldtest.ActiveConfig(), TINY_WT, sides=SIDES, L=8, H=8, seed=0,
                       budget=0)


# --- outputs and folders ---------------------------------------------------------------------------------
def test_output_folders_and_bad_render_options_are_refused_before_any_work(tmp_path, capsys):
    assert main(["bench", "pipeline", "--json", str(tmp_path)]) == 2
    assert f"--json {tmp_path} is a folder" in capsys.readouterr().err
    assert main(["bench", "sb3", "--json", str(tmp_path), "--steps", "10"]) == 2
    assert "is a folder" in capsys.readouterr().err
    aggregate = tmp_path / "wt.parquet"
    table = pd.DataFrame({"agent": ["random"], "family": ["k=2 r=1"], "task": ["prediction"], "side": ["train"],
                          "budget": [0], "n_seeds": [1], "problems": [2], "mean": [0.5], "ci_low": [0.4], "ci_high": [0.6],
                          "ci": [0.95], "n_resamples": [10], "chance": [1 / 6]})
    write_parquet(aggregate, table, meta={"table": "worldtest_aggregate"})
    render = ["render", "worldtest", "--aggregate", str(aggregate), "--split", "main"]
    for args, needle in ((["--L", "8", "--out", str(tmp_path)], "is a folder"),
                         (["--L", "8", "--agents", "nonexist", "--out", str(tmp_path / "t.tex")],
                          "--agents ['nonexist']: not in the world-test aggregate"),
                         (["--L", "0", "--out", str(tmp_path / "t.tex")], "--L: 0 is less than the minimum of 3")):
        assert main(render + args) == 2
        assert needle in capsys.readouterr().err
    assert not (tmp_path / "t.tex").exists()
    assert main(["status", "--results", str(aggregate)]) == 2
    assert "is not a folder: it is a Parquet table: a world-test aggregate" in capsys.readouterr().err
