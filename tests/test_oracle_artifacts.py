"""Oracle artifacts: CLI records and provenance, by-type export, oracle gap, ON(p), Tables 1 and 7."""
import json

import pandas as pd
import pytest

import tapebench.utils.io as uio
from tapebench.cli import main as cli_main
from tapebench.episodes.sets import episode_set
from tapebench.episodes.streams import split_key
from tapebench.evaluation.protocol import protocol_episodes, read_records
from tapebench.evaluation.records import EPISODE_COLUMNS
from tapebench.oracle.normalized import evaluation_protocol, normalized_score
from tapebench.splits.io import save_split

TYPES = {0: "stable", 4: "periodic", 108: "periodic", 204: "periodic", 30: "chaotic", 110: "chaotic",
         45: "chaotic", 90: "periodic"}
SMALL = ["--L", "10", "--H", "8", "--horizon", "3", "--candidates", "16"]


@pytest.fixture(autouse=True)
def fixed_code_version(monkeypatch):
    monkeypatch.setattr(uio, "code_version", lambda: "test-version")


@pytest.fixture
def split_path(tmp_path):
    path = tmp_path / "splits" / "toy.json"
    save_split(path, {"name": "toy", "train": [4, 30, 45, 90], "test": [0, 108, 110, 204],
                      "types": {str(k): v for k, v in TYPES.items()}, "params": {"method": "hand-made"},
                      "unit": "rule"})
    return path


def test_mpc_cli_on_a_split_side_writes_typed_records_with_protocol(split_path, tmp_path):
    out = tmp_path / "mpc.parquet"
    rc = cli_main(["mpc", "--split", str(split_path), "--side", "test", "--episodes-per-rule", "3",
                   "--eval-seed", "9", *SMALL, "--out", str(out)])
    assert rc == 0
    frame, meta = read_records(out)
    assert list(frame.columns[:len(EPISODE_COLUMNS)]) == list(EPISODE_COLUMNS)
    assert len(frame) == 12 and set(frame["side"]) == {"test"} and set(frame["split"]) == {"toy"}
    assert dict(zip(frame["rule"], frame["type"])) == {z: TYPES[z] for z in (0, 108, 110, 204)}
    protocol = meta["protocol"]
    assert protocol["split_hash"] == json.loads(split_path.read_text())["content_hash"]
    assert (protocol["L"], protocol["H"], protocol["side"], protocol["episodes_per_rule"], protocol["eval_seed"]) \
        == (10, 8, "test", 3, 9)
    assert meta["config"]["planner"] == {"kind": "random_shooting_mpc", "horizon": 3, "candidates": 16, "seed": 0}
    assert meta["code_version"] == "test-version" and meta["seed"] == 0
    # the oracle plays exactly the agents' evaluation episodes (common random numbers)
    episodes, _, _ = protocol_episodes(L=10, H=8, episodes_per_rule=3, eval_seed=9, split=split_path, side="test")
    expected = episode_set([0, 108, 110, 204], 3, 10, eval_seed=9,
                           key=split_key(protocol["split_hash"]), side="test")
    assert (episodes.tapes == expected.tapes).all()


def test_rule_list_types_come_from_the_features_file(tmp_path):
    from tapebench.rules.features import FeatureProtocol, write_features

    features = tmp_path / "features.parquet"
    written = write_features(features, FeatureProtocol(L=16, trials=4, steps=8), rules=[0, 30])
    out = tmp_path / "mpc.parquet"
    assert cli_main(["mpc", "--rules", "0,30", "--features", str(features), "--episodes-per-rule", "2",
                     *SMALL, "--out", str(out)]) == 0
    frame = pd.read_parquet(out)
    assert dict(zip(frame["rule"], frame["type"])) == dict(zip(written["rule"], written["type"]))
    assert set(frame["side"]) == {"rules"} and set(frame["split"]) == {""}
    assert cli_main(["mpc", "--rules", "0", "--episodes-per-rule", "1", *SMALL, "--out", str(out)]) == 0
    assert set(pd.read_parquet(out)["type"]) == {""}


def test_bad_arguments_give_clear_errors(split_path, tmp_path, capsys):
    out = str(tmp_path / "x.parquet")
    assert cli_main(["exact", "--rules", "0", "--L", "32", "--H", "32", "--out", out]) == 2
    assert "needs L in 3..20, got L=32" in capsys.readouterr().err
    assert cli_main(["mpc", "--split", str(split_path), "--side", "ood", "--out", out]) == 2
    assert "side must be one of ['train', 'test'] for split 'toy', got 'ood'" in capsys.readouterr().err
    assert cli_main(["export-mpc-by-type", "--split", str(split_path), "--side", "validation",
                     "--out", str(tmp_path / "b.json")]) == 2
    assert "got 'validation'" in capsys.readouterr().err
    assert cli_main(["mpc", "--split", str(split_path), "--out", out]) == 2
    assert "--split needs --side" in capsys.readouterr().err
    assert cli_main(["feasibility", "--L", "22", "--out", out]) == 2
    assert "--L: 22 is greater than the maximum of 20" in capsys.readouterr().err
    assert cli_main(["mpc", "--rules", "0", "--candidates", "0", "--out", out]) == 2
    assert "candidates must be an integer in 1..65536, got 0" in capsys.readouterr().err
    assert not (tmp_path / "x.parquet").exists()


def test_by_type_export_schema(split_path, tmp_path):
    out = tmp_path / "mpc_by_type_eval.json"
    assert cli_main(["export-mpc-by-type", "--split", str(split_path), "--side", "test",
                     "--episodes-per-rule", "2", *SMALL, "--out", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert set(payload) == {"by_type", "all", "protocol", "planner", "provenance"}
    assert set(payload["by_type"]) == {"stable", "periodic", "chaotic"}
    counts = {t: v["n_episodes"] for t, v in payload["by_type"].items()}
    assert counts == {"stable": 2, "periodic": 4, "chaotic": 2} and payload["all"]["n_episodes"] == 8
    for bucket in [*payload["by_type"].values(), payload["all"]]:
        assert set(bucket) == {"success", "mean_return", "n_episodes", "n_rules"}
        assert 0.0 <= bucket["success"] <= 1.0
    assert payload["by_type"]["stable"]["success"] == 1.0   # rule 0
    weighted = sum(v["success"] * v["n_episodes"] for v in payload["by_type"].values()) / 8
    assert payload["all"]["success"] == pytest.approx(weighted)
    assert payload["protocol"]["side"] == "test" and payload["provenance"]["code_version"] == "test-version"
    assert payload["planner"]["candidates"] == 16

    tex = tmp_path / "table7.tex"
    assert cli_main(["render", "table7", "--by-type", str(out), "--out", str(tex)]) == 0
    text = tex.read_text()
    assert r"\begin{tabular}" in text and "All (test)" in text
    assert text.index("Stable & 1.000") < text.index("Periodic &") < text.index("Chaotic &") < text.index("All")


def test_exact_vs_mpc_gap_and_table1(split_path, tmp_path, capsys):
    mpc, exact = tmp_path / "mpc.parquet", tmp_path / "exact.parquet"
    common = ["--split", str(split_path), "--side", "train", "--episodes-per-rule", "4", "--L", "10", "--H", "10"]
    assert cli_main(["mpc", *common, "--horizon", "2", "--candidates", "8", "--out", str(mpc)]) == 0
    assert cli_main(["exact", *common, "--out", str(exact)]) == 0
    gap = tmp_path / "gap.parquet"
    assert cli_main(["oracle-gap", "--mpc", str(mpc), "--exact", str(exact), "--out", str(gap)]) == 0
    frame = pd.read_parquet(gap)
    assert list(frame["level"]) == ["rule"] * 4 + ["type"] * 2 + ["all"]
    assert (frame["exact_worse"] == 0).all() and (frame["success_gap"] >= 0).all()
    overall = frame[frame["level"] == "all"].iloc[0]
    assert overall["n"] == 16
    assert overall["mpc_success"] == pytest.approx(pd.read_parquet(mpc)["success"].mean())

    other = tmp_path / "exact_other.parquet"   # different evaluation seed: not the same episodes
    assert cli_main(["exact", *common, "--eval-seed", "1", "--out", str(other)]) == 0
    capsys.readouterr()
    assert cli_main(["oracle-gap", "--mpc", str(mpc), "--exact", str(other), "--out", str(gap)]) == 2
    assert "different protocols: eval_seed (20260101 vs 1)" in capsys.readouterr().err

    feas = tmp_path / "feas.parquet"
    assert cli_main(["feasibility", "--rules", "0,30,255", "--L", "8", "--H", "8", "--out", str(feas)]) == 0
    tex = tmp_path / "table1.tex"
    assert cli_main(["render", "table1", "--mpc", str(mpc), "--exact", str(exact), "--feasibility", str(feas),
                     "--out", str(tex)]) == 0
    text = tex.read_text()
    assert "True-dynamics MPC & $L=10, H=10$" in text and "Exact optimum (DP)" in text
    assert "Feasibility, rule-wise & $L=8, H=8$ & 3 rules, every non-goal tape & 0.667 & -- & --" in text


def test_oracle_normalized_score_refuses_mixed_protocols(split_path, tmp_path):
    files = {}
    for H in (8, 12):
        files[H] = tmp_path / f"mpc_H{H}.parquet"
        assert cli_main(["mpc", "--split", str(split_path), "--side", "test", "--episodes-per-rule", "2",
                         "--L", "10", "--H", str(H), "--out", str(files[H])]) == 0
    frame, meta = read_records(files[12])
    p_oracle = frame["success"].mean()
    protocol = {k: meta["protocol"][k] for k in ("L", "H", "split_hash", "side", "episodes_per_rule", "eval_seed")}
    assert normalized_score(p_oracle / 2, protocol, [files[8], files[12]]) == pytest.approx(50.0)
    with pytest.raises(ValueError, match=r"H \(12 vs 8\)"):
        normalized_score(0.1, protocol, files[8])
    with pytest.raises(ValueError, match=r"episodes_per_rule \(20 vs 2\)"):
        normalized_score(0.1, {**protocol, "episodes_per_rule": 20}, [files[8], files[12]])
    with pytest.raises(ValueError, match="lacks \\['eval_seed'\\]"):
        normalized_score(0.1, {k: v for k, v in protocol.items() if k != "eval_seed"}, files[12])


def test_oracle_cli_defaults_to_the_agents_evaluation_seed():
    import inspect

    from tapebench.cli import build_parser
    from tapebench.evaluation.trained_runs import evaluate_run

    agents_eval_seed = inspect.signature(evaluate_run).parameters["eval_seed"].default
    parser = build_parser()
    for command in (["mpc", "--rules", "30"], ["exact", "--rules", "30"], ["export-mpc-by-type", "--split", "main"]):
        args = parser.parse_args([*command, "--out", "x"])
        assert args.eval_seed == agents_eval_seed, command


def test_on_score_from_an_agent_evaluation_file(split_path, tmp_path):
    oracle = tmp_path / "mpc.parquet"
    assert cli_main(["mpc", "--split", str(split_path), "--side", "test", "--episodes-per-rule", "2",
                     "--L", "10", "--H", "8", "--out", str(oracle)]) == 0
    frame, meta = read_records(oracle)
    agent = frame.assign(agent="dqn", seed=0, checkpoint=1000)
    agent_file = tmp_path / "eval_H8.parquet"
    split = {"name": "toy", "content_hash": meta["protocol"]["split_hash"]}
    evaluation = {"H": 8, "episodes_per_rule": 2, "eval_seed": 20260101, "checkpoints": [1000]}
    uio.write_parquet(agent_file, agent, meta=uio.provenance({}, 0, split=split, evaluation=evaluation))
    protocol = evaluation_protocol(agent_file, "test")
    assert normalized_score(0.0, protocol, oracle) == 0.0
    p_oracle = frame["success"].mean()
    assert normalized_score(p_oracle, protocol, oracle) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="side 'train' is not in"):
        evaluation_protocol(agent_file, "train")
