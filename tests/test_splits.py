import json

import pandas as pd
import pytest

import tapebench.utils.io as uio
from tapebench.cli import main as cli_main
from tapebench.rules.features import FeatureProtocol, write_features
from tapebench.rules.mirror import mirror_leaks, mirror_rule
from tapebench.splits.generate import SplitParams, format_rule_list, generate_split, make_split
from tapebench.splits.health import SplitHealthError, split_health
from tapebench.splits.io import load_split, resolve_split, save_split
from tapebench.validation import parse_rule_list


@pytest.fixture(autouse=True)
def fixed_code_version(monkeypatch):
    # a concurrent edit elsewhere in the checkout must not flip '-dirty' between two writes in one test
    monkeypatch.setattr(uio, "code_version", lambda: "test-version")


@pytest.fixture(scope="module")
def features_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("rules") / "features.parquet"
    write_features(path, FeatureProtocol())
    return path


def _split(features_path, tmp_path, **kwargs):
    params = SplitParams(name=kwargs.pop("name", "s"), **kwargs)
    out = tmp_path / f"{params.name}.json"
    return generate_split(params, features_path, out), out


def test_default_diverse_split_is_whole_mirror_classes(features_path, tmp_path):
    split, _ = _split(features_path, tmp_path)
    train, test = set(split["train"]), set(split["test"])
    assert len(test) == 30 and not train & test and train | test == set(range(256))
    assert all(mirror_rule(r) in test for r in test)
    assert mirror_leaks(split["train"], split["test"]) == []
    assert sum(split["test_type_counts"].values()) == 30
    assert split["test_type_counts"] == {t: sum(split["types"][str(r)] == t for r in test)
                                         for t in ("stable", "periodic", "chaotic")}
    assert split["params"]["feature_protocol"] == {"L": 32, "trials": 64, "steps": 64, "seed": 0}
    assert set(split["features"]) == {str(r) for r in range(256)}


def test_same_parameters_give_byte_identical_files(features_path, tmp_path):
    for kwargs in ({"method": "diverse"}, {"method": "random", "seed": 3}, {"unit": "rule"}):
        _, first = _split(features_path, tmp_path / "a", **kwargs)
        _, second = _split(features_path, tmp_path / "b", **kwargs)
        assert first.read_bytes() == second.read_bytes()


def test_provenance_is_recorded_but_not_part_of_the_content_hash(features_path, tmp_path, monkeypatch):
    split, path = _split(features_path, tmp_path)
    assert split["provenance"]["code_version"] == "test-version"
    monkeypatch.setattr(uio, "code_version", lambda: "other-version")
    again, _ = _split(features_path, tmp_path / "other")
    assert again["provenance"]["code_version"] == "other-version"
    assert again["content_hash"] == split["content_hash"]


def test_farthest_point_order_on_a_line():
    frame = pd.DataFrame({"rule": [0, 1, 2, 3, 4], "type": ["stable"] * 5, "x": [0.0, 1.0, 2.0, 3.0, 10.0]})
    meta = {"config": {"feature_names": ["x"]}}
    split = make_split(SplitParams(name="line", test_size=3, unit="rule", rules=(0, 1, 2, 3, 4)), frame, meta)
    # start: farthest from the mean (10); then farthest from {10} (0); then farthest from {0, 10} (3)
    assert split["selection"]["test_units_in_order"] == [[4], [0], [3]]
    assert split["test"] == [0, 3, 4] and split["train"] == [1, 2]


def test_diverse_seed_changes_the_start(features_path, tmp_path):
    a, _ = _split(features_path, tmp_path, seed=0)
    b, _ = _split(features_path, tmp_path, seed=1, name="other")
    assert a["selection"]["test_units_in_order"][0] != b["selection"]["test_units_in_order"][0]


@pytest.mark.parametrize("unit", ["mirror_class", "rule"])
def test_random_splits_are_seeded_and_hit_the_test_size(features_path, tmp_path, unit):
    tests = []
    for seed in range(6):
        for size in (1, 29, 30, 64):
            split, _ = _split(features_path, tmp_path, method="random", seed=seed, test_size=size, unit=unit)
            assert len(split["test"]) == size and split["selection"]["overshoot"] == 0
            if unit == "mirror_class":
                assert mirror_leaks(split["train"], split["test"]) == []
            if size == 30:
                tests.append(tuple(split["test"]))
    assert len(set(tests)) == 6


def test_rule_subset(features_path, tmp_path):
    split, _ = _split(features_path, tmp_path, rules=tuple(range(64)), test_size=10)
    assert len(split["test"]) == 10 and set(split["train"]) | set(split["test"]) == set(range(64))
    assert split["params"]["rules"] == "0-63" and len(split["types"]) == 64


def test_exact_size_when_only_pairs_remain():
    # rules 30/86 and 110/124 are mirror pairs and 4 is self-mirror: 3 test rules = one pair + rule 4
    frame = pd.DataFrame({"rule": [4, 30, 86, 110, 124], "type": ["periodic"] * 5,
                          "x": [0.0, 5.0, 5.0, -5.0, -5.0]})
    split = make_split(SplitParams(name="s", test_size=3, rules=(4, 30, 86, 110, 124), method="random", seed=0),
                       frame, {"config": {"feature_names": ["x"]}})
    assert len(split["test"]) == 3 and 4 in split["test"]
    # 1 test rule from pairs alone cannot be hit exactly: the overshoot is recorded
    split = make_split(SplitParams(name="s", test_size=1, rules=(30, 86, 110, 124)), frame, {})
    assert len(split["test"]) == 2 and split["selection"]["overshoot"] == 1


def test_rule_level_split_leaks_are_counted_not_fatal(features_path, tmp_path):
    _, path = _split(features_path, tmp_path, unit="rule")
    report = split_health(path, tmp_path / "health.json")
    assert report["ok"] and report["mirror_leaks"] == len(report["mirror_leak_pairs"]) > 0
    assert report["warnings"] and json.loads((tmp_path / "health.json").read_text()) == report
    for test_rule, train_rule in report["mirror_leak_pairs"]:
        assert mirror_rule(test_rule) == train_rule


def test_health_report_counts_types_per_side(features_path, tmp_path):
    split, path = _split(features_path, tmp_path)
    report = split_health(path)
    assert report["ok"] and report["mirror_leaks"] == 0
    assert report["n_train"] == 226 and report["n_test"] == 30
    assert report["type_counts"]["test"] == split["test_type_counts"]
    assert sum(report["type_counts"]["train"].values()) == 226


def _rehashed(features_path, tmp_path, unit="mirror_class", **changes):
    split, _ = _split(features_path, tmp_path, unit=unit)
    split.update(changes)
    path = tmp_path / "edited.json"
    save_split(path, split)   # a consistent hash: the gate itself must catch the problem
    return path


def test_health_fails_on_overlap_naming_the_rules(features_path, tmp_path, capsys):
    split, _ = _split(features_path, tmp_path)
    train = sorted(split["train"] + [split["test"][0]])
    path = _rehashed(features_path, tmp_path, train=train)
    out = tmp_path / "health.json"
    with pytest.raises(SplitHealthError, match=rf"overlap on rules \[{split['test'][0]}\]"):
        split_health(path, out)
    assert json.loads(out.read_text())["ok"] is False
    assert cli_main(["split-health", str(path), "--out", str(out)]) == 2
    assert f"overlap on rules [{split['test'][0]}]" in capsys.readouterr().err


def test_health_fails_on_a_mirror_pair_across_sides(features_path, tmp_path, capsys):
    split, _ = _split(features_path, tmp_path)
    pair = next(r for r in split["test"] if mirror_rule(r) != r)
    partner = mirror_rule(pair)
    train = sorted(split["train"] + [partner])
    test = sorted(set(split["test"]) - {partner})
    path = _rehashed(features_path, tmp_path, train=train, test=test)
    assert cli_main(["split-health", str(path)]) == 2
    err = capsys.readouterr().err
    assert "mirror pairs split across train and test" in err and f"{pair} (test) / {partner} (train)" in err


def test_health_fails_on_empty_side_and_bad_rules(features_path, tmp_path):
    with pytest.raises(SplitHealthError, match="test side is empty"):
        split_health(_rehashed(features_path, tmp_path, test=[]))
    with pytest.raises(SplitHealthError, match=r"not rules in 0..255: \[300\]"):
        split_health(_rehashed(features_path, tmp_path, test=[300]))


def test_tampered_or_malformed_split_files_are_rejected(features_path, tmp_path, capsys):
    _, path = _split(features_path, tmp_path)
    raw = json.loads(path.read_text())
    raw["test"] = raw["test"][1:]
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="content hash mismatch"):
        load_split(path)
    assert cli_main(["split-health", str(path)]) == 2
    assert "content hash mismatch" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        split_health(broken)
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        load_split(listing)
    incomplete = tmp_path / "incomplete.json"
    save_split(incomplete, {"name": "x"})
    with pytest.raises(ValueError, match="missing fields"):
        load_split(incomplete)
    with pytest.raises(FileNotFoundError):
        split_health(tmp_path / "nope.json")


def test_unknown_split_name_lists_the_known_ones(features_path, tmp_path):
    _split(features_path, tmp_path, name="main")
    with pytest.raises(ValueError, match=r"unknown split name 'mian'.*\['main'\]"):
        resolve_split("mian", tmp_path)
    assert resolve_split("main", tmp_path).name == "main"


@pytest.mark.parametrize("kwargs,match", [
    ({"method": "fps"}, "unknown split method 'fps'"),
    ({"unit": "class"}, "unknown split unit 'class'"),
    ({"test_size": 256}, r"test_size must be an integer in 1..255"),
    ({"test_size": 0}, "test_size"),
    ({"test_size": True}, "test_size"),
    ({"seed": -2}, "seed"),
    ({"name": "../evil"}, "split name"),
    ({"rules": (5,)}, "at least 2 rules"),
    ({"rules": (1, 999)}, "999"),
])
def test_bad_split_parameters_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SplitParams(name=kwargs.pop("name", "s"), **kwargs)


def test_features_must_cover_the_rule_space(tmp_path):
    path = tmp_path / "few.parquet"
    write_features(path, FeatureProtocol(trials=4), rules=range(10))
    with pytest.raises(ValueError, match="no row for rules 10-255"):
        generate_split(SplitParams(name="s", test_size=3), path, tmp_path / "s.json")


def test_format_rule_list_round_trips():
    for rules in ([0, 1, 2, 3, 90], list(range(256)), [5], [1, 3, 5, 6, 7, 200]):
        assert parse_rule_list(format_rule_list(rules)) == rules
    assert format_rule_list([0, 1, 2, 3, 90]) == "0-3,90"


def test_cli_end_to_end(tmp_path, capsys):
    feats, split, report = tmp_path / "f.parquet", tmp_path / "main.json", tmp_path / "main.health.json"
    assert cli_main(["features", "--out", str(feats), "--trials", "16"]) == 0
    assert cli_main(["split", "--features", str(feats), "--name", "main", "--out", str(split)]) == 0
    assert cli_main(["split-health", str(split), "--out", str(report)]) == 0
    assert json.loads(report.read_text())["n_test"] == 30
    assert cli_main(["split", "--features", str(feats), "--name", "x", "--method", "kmeans",
                     "--out", str(tmp_path / "x.json")]) == 2
    assert "unknown split method 'kmeans'" in capsys.readouterr().err
    assert cli_main(["features", "--out", str(feats), "--L", "100"]) == 2
    assert cli_main(["split", "--features", str(tmp_path / "none.parquet"), "--name", "x",
                     "--out", str(tmp_path / "x.json")]) == 2
    assert cli_main(["split", "--features", str(feats), "--name", "x", "--rules", "0-300",
                     "--out", str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists()
