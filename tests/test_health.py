"""The benchmark health report (docs/protocol.md#benchmark-health) on hand-built splits: a mirror leak, a test rule
the random policy always solves (rule 0: every tape becomes the goal after one step), a rule whose goal is
unreachable (rule 255: every tape becomes all ones), the gate's message, and the thresholds from the config."""
from __future__ import annotations

import copy
import json

import numpy as np
import pandas as pd
import pytest
from test_config import REPO, SCHEMA

from tapebench.cli import main
from tapebench.health.checks import CHECKS, FAIL, NOT_APPLICABLE, PASS, WARN, gate_message, reference_oracle, status_of
from tapebench.pipeline.config import ConfigError, load_config, validate_config
from tapebench.report.health import render_health
from tapebench.rule_family import RuleFamily
from tapebench.rules.mirror import mirror_rule
from tapebench.splits.io import save_split

L, H, EPISODES = 8, 8, 4
TRAIN, TEST = [30, 45, 90, 110], [0, 124, 204, 255]      # 124 is the mirror image of 110 (a leak, unit "rule")


def default_health() -> dict:
    return validate_config(load_config(root=REPO), SCHEMA)["health"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """The split, the split gate's report, exact-optimum, random-policy and identifiability records, via the CLIs
    the pipeline runs."""
    d = tmp_path_factory.mktemp("health")
    split = d / "toy.json"
    types = {str(r): "stable" for r in TRAIN + TEST}
    save_split(split, {"name": "toy", "train": TRAIN, "test": TEST, "types": types, "params": {"method": "hand"},
                       "unit": "rule"})
    protocol = ["--L", str(L), "--episodes-per-rule", str(EPISODES), "--eval-seed", "7"]
    params = json.dumps({"agent": {}, "env": {"L": L, "H": H, "success_bonus": 1.0},
                         "evaluation": {"episodes_per_rule": EPISODES, "eval_seed": 7}})
    calls = [["split-health", str(split), "--out", str(d / "toy.health.json")],
             ["exact", "--split", str(split), "--side", "test", "--H", str(H), *protocol, "--out", str(d / "exact.parquet")],
             ["identifiability", "--split", str(split), "--H", str(H), *protocol, "--out", str(d / "ident.parquet")]]
    calls += [["evaluate", "--method", "random", "--seed", str(s), "--split", str(split), "--H", str(H), "--params", params,
               "--out", str(d / f"random{s}.parquet")] for s in (0, 1)]
    calls += [["evaluate", "--method", "live_leftmost", "--seed", "0", "--split", str(split), "--H", str(H),
               "--params", params, "--out", str(d / "live_leftmost0.parquet")]]
    for argv in calls:
        assert main(argv) == 0, argv
    return d


def run_health(d, settings: dict, name="report", rule_agnostic=("live_leftmost0",)):
    out = d / f"{name}.json"
    agnostic = ["--rule-agnostic", *(str(d / f"{n}.parquet") for n in rule_agnostic)] if rule_agnostic else []
    argv = ["benchmark-health", "--split", str(d / "toy.json"), "--split-health", str(d / "toy.health.json"),
            "--reference", str(d / "exact.parquet"), "--random", str(d / "random0.parquet"), str(d / "random1.parquet"),
            *agnostic,
            "--identifiability", str(d / "ident.parquet"), "--settings", json.dumps(settings),
            "--statistics", json.dumps({"n_resamples": 500, "ci": 0.95, "seed": 0}), "--L", str(L), "--H", str(H),
            "--out", str(out), "--per-rule-out", str(d / f"{name}.per_rule.parquet")]
    assert main(argv) == 0
    return json.loads(out.read_text()), pd.read_parquet(d / f"{name}.per_rule.parquet").set_index("rule")


def test_the_checks_on_a_hand_built_split(inputs):
    assert mirror_rule(110) == 124
    report, per_rule = run_health(inputs, default_health())
    checks = report["checks"]
    assert report["protocol"]["reference"] == "exact" and report["protocol"]["n_test_rules"] == 4
    # leakage: the split gate's mirror pair (124 in test, 110 in train), 1 of 4 test rules
    assert checks["leakage"]["mirror_leak_pairs"] == [[124, 110]]
    assert (checks["leakage"]["value"], checks["leakage"]["rules"], checks["leakage"]["status"]) == (0.25, [124], FAIL)
    # rule 255 maps every neighbourhood to 1: the all-zero goal is unreachable, the exact optimum never solves it
    assert per_rule.loc[255, "reference_success"] == 0.0 and per_rule.loc[255, "random_success"] == 0.0
    assert 255 in checks["reference_unsolved"]["rules"]
    assert checks["reference_unsolved"]["value"] == len(checks["reference_unsolved"]["rules"]) / 4
    # rule 0 maps every tape to the goal: random success 1 (>= 0.9), the reference cannot do better
    assert per_rule.loc[0, "random_success"] == 1.0 and per_rule.loc[0, "reference_success"] == 1.0
    assert bool(per_rule.loc[0, "trivially_solved"]) and per_rule.loc[0, "headroom"] == 0.0
    assert checks["trivially_solved"]["rules"] == [0] and checks["trivially_solved"]["value"] == 0.25
    assert checks["trivially_solved"]["status"] == WARN      # 0.25 is not above the default fail bound 0.25
    # headroom: the mean over test rules of reference minus random success, its CI around it
    assert checks["headroom"]["value"] == pytest.approx((per_rule["reference_success"] - per_rule["random_success"]).mean())
    assert checks["headroom"]["low"] <= checks["headroom"]["value"] <= checks["headroom"]["high"]
    assert checks["headroom"]["random_success"]["mean"] == pytest.approx(per_rule["random_success"].mean())
    assert 0 in checks["headroom"]["rules"] and 255 in checks["headroom"]["rules"]
    # identifiability: the identifiability artifact's test episodes
    ident = pd.read_parquet(inputs / "ident.parquet")
    ident = ident[ident["side"] == "test"]
    assert checks["identifiability"]["value"] == pytest.approx(1 - ident["identified"].mean())
    assert report["fatal_failures"] == ["leakage"] and report["status"] == FAIL
    assert report["provenance"]["config"]["health"]["trivial_success"] == 0.9


def test_rule_dependent_headroom_against_the_best_rule_agnostic_row(inputs):
    report, per_rule = run_health(inputs, default_health(), "agnostic")
    check = report["checks"]["rule_headroom"]
    live = pd.read_parquet(inputs / "live_leftmost0.parquet")
    live = live[live["side"] == "test"].groupby("rule")["success"].mean().reindex(TEST)
    random = per_rule["random_success"].reindex(TEST)
    # the floor is the better of the random policy and live_leftmost by mean over test rules
    floor_name, floor = ("live_leftmost", live) if live.mean() > random.mean() else ("random", random)
    assert check["floor"] == floor_name and per_rule["floor_success"].reindex(TEST).tolist() == floor.tolist()
    reference = per_rule["reference_success"].reindex(TEST)
    assert check["value"] == pytest.approx((reference - floor).mean())
    assert check["low"] <= check["value"] <= check["high"]
    # one type ("stable") here: its headroom is the overall one
    assert list(check["by_type"]) == ["stable"] and check["by_type"]["stable"]["mean"] == pytest.approx(check["value"])
    # without other rows the floor is the random policy, and the check warns below its threshold
    alone, _ = run_health(inputs, default_health(), "random_floor", rule_agnostic=())
    assert alone["checks"]["rule_headroom"]["floor"] == "random"
    settings = default_health()
    settings["rule_headroom"] = {"warn": check["value"] + 0.01, "fail": 0.0, "fatal": False}
    warned, _ = run_health(inputs, settings, "warned")
    assert warned["checks"]["rule_headroom"]["status"] == WARN and warned["fatal_failures"] == ["leakage"]


def test_the_gate_names_each_failed_gate_and_its_rules(inputs):
    settings = default_health()
    settings["trivially_solved"] = {"warn": 0.0, "fail": 0.2, "fatal": True}
    report, _ = run_health(inputs, settings, "strict")
    assert report["fatal_failures"] == ["leakage", "trivially_solved"]
    message = gate_message(report)
    assert "split toy fails gate 'leakage': rules [124]" in message
    assert "split toy fails gate 'trivially_solved': rules [0]" in message
    assert main(["health-gate", str(inputs / "strict.json"), "--out", str(inputs / "strict.verdict.json")]) == 2
    assert not (inputs / "strict.verdict.json").exists()
    # a failure that is not fatal, or a bound that tolerates it, lets the split through with a verdict
    settings["leakage"] = {"warn": 0.0, "fail": 0.5, "fatal": True}
    settings["trivially_solved"]["fatal"] = False
    report, _ = run_health(inputs, settings, "tolerant")
    assert report["fatal_failures"] == [] and report["checks"]["trivially_solved"]["status"] == FAIL
    assert gate_message(report) is None
    assert main(["health-gate", str(inputs / "tolerant.json"), "--out", str(inputs / "tolerant.verdict.json")]) == 0
    verdict = json.loads((inputs / "tolerant.verdict.json").read_text())
    assert verdict["status"] == FAIL and "leakage" in verdict["warnings"]


def test_status_directions_and_bounds():
    higher, lower = CHECKS[0], next(c for c in CHECKS if c.name == "headroom")
    bounds = {"warn": 0.1, "fail": 0.3}
    assert [status_of(higher, v, bounds) for v in (0.0, 0.1, 0.2, 0.3, 0.31)] == [PASS, PASS, WARN, WARN, FAIL]
    bounds = {"warn": 0.25, "fail": 0.05}
    assert [status_of(lower, v, bounds) for v in (0.5, 0.25, 0.2, 0.05, 0.0)] == [PASS, PASS, WARN, WARN, FAIL]
    assert reference_oracle(20) == "exact" and reference_oracle(21) == "mpc"


def test_thresholds_come_from_the_config():
    health = default_health()
    assert health["trivial_success"] == 0.9
    assert {c.name: (health[c.name]["warn"], health[c.name]["fail"], health[c.name]["fatal"]) for c in CHECKS} == {
        "leakage": (0.0, 0.0, True), "reference_unsolved": (0.5, 0.9, False), "headroom": (0.25, 0.05, True),
        "trivially_solved": (0.0, 0.25, True), "rule_headroom": (0.05, 0.0, False),
        "identifiability": (0.5, 1.0, False)}
    config = load_config(root=REPO)
    config["health"] = {"trivially_solved": {"warn": 0.5, "fail": 0.2}}
    with pytest.raises(ConfigError, match="'health.trivially_solved': warn = 0.5 must be at most fail = 0.2"):
        validate_config(copy.deepcopy(config), SCHEMA)
    config["health"] = {"headroom": {"warn": 0.01, "fail": 0.05}}
    with pytest.raises(ConfigError, match="'health.headroom': warn = 0.01 must be at least fail = 0.05"):
        validate_config(copy.deepcopy(config), SCHEMA)
    config["health"] = {"leakage": {"fail": 1.5}}
    with pytest.raises(ConfigError, match="health.leakage.fail"):
        validate_config(copy.deepcopy(config), SCHEMA)


def test_the_health_table_has_one_row_per_split(inputs, tmp_path):
    report, _ = run_health(inputs, default_health(), "table")
    second = dict(report, split="other")
    (tmp_path / "other.json").write_text(json.dumps(second))
    text = render_health(tmp_path / "health.tex", reports=[inputs / "table.json", tmp_path / "other.json"])
    rows = [line for line in text.splitlines() if line.startswith(r"\texttt{")]
    assert [r.split("}")[0] for r in rows] == [r"\texttt{toy", r"\texttt{other"]
    cells = [c.strip() for c in rows[0].rstrip("\\ ").split("&")]
    assert cells[1] == "4" and cells[2] == "0.25 FAIL*" and cells[10] == "0.25 warn" and cells[-1] == "fail"
    hdr = report["checks"]["rule_headroom"]
    assert cells[8].startswith(f"{hdr['value']:.2f}") and hdr["floor"].replace("_", " ") in cells[7]
    assert "rule hdr. by type: stable" in text
    assert "leakage 0.0 / 0.0 (fatal)" in text


def test_a_k_colour_split_gets_mpc_as_reference_and_identifiability_not_applicable(tmp_path):
    """Rule families (docs/protocol.md#rule-sets): the reference is true-dynamics MPC whatever L, and the
    identifiability check (an elementary rule's 8-entry table) is n/a, never a gate; the other checks still run."""
    family = RuleFamily(3, 1)
    clearing = 0                                            # every neighbourhood -> 0: any tape reaches the goal
    saturating = family.number(np.full(family.neighbourhoods, 2, dtype=np.uint8))   # every tape -> all 2
    alternating = family.number(np.arange(family.neighbourhoods, dtype=np.uint8) % 2)
    assert family.mirror_rule(saturating) == saturating and family.mirror_rule(clearing) == clearing
    train = sorted({alternating, family.mirror_rule(alternating)})
    split = tmp_path / "k3.json"
    save_split(split, {"name": "k3", "train": train, "test": [clearing, saturating],
                       "types": {str(r): "stable" for r in [*train, clearing, saturating]}, "params": {"method": "hand"},
                       "family": family.as_dict()})
    protocol = ["--L", str(L), "--episodes-per-rule", str(EPISODES), "--eval-seed", "7"]
    params = json.dumps({"agent": {}, "env": {"L": L, "H": H, "success_bonus": 1.0},
                         "evaluation": {"episodes_per_rule": EPISODES, "eval_seed": 7}})
    for argv in (["split-health", str(split), "--out", str(tmp_path / "k3.health.json")],
                 ["mpc", "--split", str(split), "--side", "test", "--H", str(H), *protocol,
                  "--out", str(tmp_path / "mpc.parquet")],
                 ["evaluate", "--method", "random", "--seed", "0", "--split", str(split), "--H", str(H),
                  "--params", params, "--out", str(tmp_path / "random.parquet")]):
        assert main(argv) == 0, argv
    out = tmp_path / "report.json"
    assert main(["benchmark-health", "--split", str(split), "--split-health", str(tmp_path / "k3.health.json"),
                 "--reference", str(tmp_path / "mpc.parquet"), "--random", str(tmp_path / "random.parquet"),
                 "--settings", json.dumps(default_health()), "--L", str(L), "--H", str(H), "--out", str(out),
                 "--per-rule-out", str(tmp_path / "per_rule.parquet")]) == 0
    report = json.loads(out.read_text())
    checks = report["checks"]
    assert report["protocol"]["reference"] == "mpc" and reference_oracle(L, family) == "mpc"
    assert checks["identifiability"]["status"] == NOT_APPLICABLE and checks["identifiability"]["value"] is None
    assert checks["leakage"]["value"] == 0.0
    assert checks["trivially_solved"]["rules"] == [clearing]             # random solves the clearing rule
    assert saturating in checks["reference_unsolved"]["rules"]           # all-2 tapes never reach the zero goal
    assert "identifiability" not in report["fatal_failures"]
    text = render_health(tmp_path / "health.tex", reports=[out])
    row = next(line for line in text.splitlines() if line.startswith(r"\texttt{k3"))
    assert [c.strip() for c in row.rstrip("\\ ").split("&")][11] == "-- n/a"


def test_an_elementary_split_needs_identifiability_records(inputs, capsys):
    argv = ["benchmark-health", "--split", str(inputs / "toy.json"), "--split-health", str(inputs / "toy.health.json"),
            "--reference", str(inputs / "exact.parquet"), "--random", str(inputs / "random0.parquet"),
            "--settings", json.dumps(default_health()), "--L", str(L), "--H", str(H),
            "--out", str(inputs / "x.json"), "--per-rule-out", str(inputs / "x.parquet")]
    assert main(argv) != 0
    assert "split toy is of the elementary family: its health report needs identifiability records" in \
        capsys.readouterr().err


def test_wrong_records_and_settings_are_named_not_key_errors(inputs, capsys):
    """DQN's records given as the random policy's, the random policy's as the reference, a split as the report,
    settings without a key: each refused in one line naming the file or the key."""
    from tapebench.utils.io import read_parquet_meta, write_parquet

    frame = pd.read_parquet(inputs / "random0.parquet")
    frame["agent"] = "dqn"
    dqn = inputs / "dqn0.parquet"
    write_parquet(dqn, frame, meta=read_parquet_meta(inputs / "random0.parquet"))
    base = {"--split": str(inputs / "toy.json"), "--split-health": str(inputs / "toy.health.json"),
            "--reference": str(inputs / "exact.parquet"), "--random": str(inputs / "random0.parquet"),
            "--identifiability": str(inputs / "ident.parquet"), "--settings": json.dumps(default_health()),
            "--L": str(L), "--H": str(H), "--out": str(inputs / "wrong.json"),
            "--per-rule-out": str(inputs / "wrong.parquet")}
    settings = default_health()
    del settings["headroom"]["warn"]
    cases = [({"--random": str(dqn)}, f"{dqn} holds records of ['dqn'], not the random policy's"),
             ({"--reference": str(inputs / "random0.parquet")}, "holds records of ['random'], not the reference"),
             ({"--rule-agnostic": str(dqn)}, "holds records of ['dqn'], not a rule-agnostic method's"),
             ({"--settings": json.dumps(settings)}, "'health.headroom.warn' must be a number in [0, 1], got None"),
             ({"--settings": "{}"}, "'health.trivial_success' must be a number in (0, 1], got None"),
             ({"--statistics": json.dumps({"n_resamples": 10})}, "--statistics: 'ci' is a required property")]
    for change, needle in cases:
        argv = ["benchmark-health", *[x for kv in {**base, **change}.items() for x in kv]]
        assert main(argv) == 2, change
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, err
    assert not (inputs / "wrong.json").exists()
    assert main(["health-gate", str(inputs / "toy.json"), "--out", str(inputs / "v.json")]) == 2
    err = capsys.readouterr().err
    assert "toy.json is not a benchmark health report: it is a split file" in err and err.count("\n") == 1
    assert main(["health-gate", str(inputs / "toy.health.json"), "--out", str(inputs / "v.json")]) == 2
    assert "is not a benchmark health report" in capsys.readouterr().err
