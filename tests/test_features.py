import numpy as np
import pandas as pd
import pytest

from tapebench.ca.reference import rollout
from tapebench.rules.features import (FEATURE_NAMES, FeatureProtocol, read_features, rule_features, rule_type,
                                      start_tapes, write_features)
from tapebench.utils.io import read_parquet_meta


@pytest.fixture(scope="module")
def features():
    return rule_features().set_index("rule")


@pytest.mark.parametrize("rule,expected", [(0, "stable"), (4, "periodic"), (108, "periodic"), (204, "periodic"),
                                           (90, "periodic"), (30, "chaotic"), (110, "chaotic")])
def test_paper_anchor_types(features, rule, expected):
    assert features.at[rule, "type"] == expected


def test_thresholds_are_strict_inequalities():
    assert rule_type(0.05, 0.2) == "stable"
    assert rule_type(0.06, 0.2) == "periodic"
    assert rule_type(0.05, 0.25) == "periodic"
    assert rule_type(0.3, 0.6) == "chaotic"
    assert rule_type(0.22, 0.9) == "periodic"
    assert rule_type(0.9, 0.55) == "periodic"


def test_one_row_per_rule_with_bounded_features(features):
    assert list(features.index) == list(range(256))
    values = features[list(FEATURE_NAMES)].to_numpy()
    assert np.all((values >= 0) & (values <= 1))
    assert set(features["type"]) == {"stable", "periodic", "chaotic"}


def test_known_extreme_rules(features):
    assert features.at[204, "activity"] == 0.0                      # identity
    assert features.at[51, "activity"] == 1.0                       # complement every step
    assert features.at[51, "activity_2step"] == 0.0
    assert features.at[0, "density"] == 0.0 and features.at[0, "entropy"] == 0.0
    assert features.at[255, "density"] == 1.0


def test_mirror_rules_have_identical_features(features):
    cols = ["type", *FEATURE_NAMES]
    mirrored = features.loc[features["mirror_rule"].to_numpy(), cols].reset_index(drop=True)
    pd.testing.assert_frame_equal(mirrored, features[cols].reset_index(drop=True), check_exact=True)


@pytest.mark.parametrize("rule", [30, 4, 60])
def test_activity_entropy_density_match_reference_rollouts(rule):
    protocol = FeatureProtocol(L=12, trials=6, steps=10, seed=3)
    got = rule_features([rule], protocol).iloc[0]
    runs = np.stack([rollout(x, rule, protocol.steps) for x in start_tapes(protocol)])   # (n, T+1, L)
    density = runs[:, 1:].mean(axis=2)
    with np.errstate(divide="ignore", invalid="ignore"):
        h2 = np.nan_to_num(-(density * np.log2(density) + (1 - density) * np.log2(1 - density)))
    assert got["activity"] == pytest.approx(np.mean(runs[:, 1:] != runs[:, :-1]), abs=1e-12)
    assert got["activity_2step"] == pytest.approx(np.mean(runs[:, 2:] != runs[:, :-2]), abs=1e-12)
    assert got["density"] == pytest.approx(density.mean(), abs=1e-12)
    assert got["density_std"] == pytest.approx(density.std(axis=1).mean(), abs=1e-12)
    assert got["entropy"] == pytest.approx(h2.mean(), abs=1e-12)


def test_same_seed_same_numbers_other_seed_other_numbers():
    a = rule_features([30, 110], FeatureProtocol(seed=5, trials=8))
    b = rule_features([30, 110], FeatureProtocol(seed=5, trials=8))
    c = rule_features([30, 110], FeatureProtocol(seed=6, trials=8))
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert not np.array_equal(a["activity"], c["activity"])


def test_artifact_records_protocol_seed_and_code_version(tmp_path):
    path = tmp_path / "rules" / "features.parquet"
    write_features(path, FeatureProtocol(trials=8, steps=16, seed=2))
    frame, meta = read_features(path)
    assert {"rule", "type", "activity", "entropy", *FEATURE_NAMES} <= set(frame.columns)
    assert len(frame) == 256
    assert meta == read_parquet_meta(path)
    assert meta["seed"] == 2 and meta["code_version"]
    assert meta["config"]["protocol"] == {"L": 32, "trials": 8, "steps": 16, "seed": 2}
    assert meta["config"]["feature_names"] == list(FEATURE_NAMES)


@pytest.mark.parametrize("kwargs,match", [({"L": 2}, "L must be"), ({"L": 65}, "L must be"),
                                          ({"trials": 0}, "trials"), ({"steps": 1}, "steps"),
                                          ({"seed": -1}, "seed"), ({"trials": 2.5}, "trials")])
def test_bad_protocol_is_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FeatureProtocol(**kwargs)


def test_bad_features_files_are_rejected(tmp_path):
    with pytest.raises(FileNotFoundError, match="tapebench features"):
        read_features(tmp_path / "missing.parquet")
    garbage = tmp_path / "garbage.parquet"
    garbage.write_text("not parquet")
    with pytest.raises(ValueError, match="not a readable Parquet"):
        read_features(garbage)
    no_type = tmp_path / "no_type.parquet"
    rule_features([0, 1], FeatureProtocol(trials=2)).drop(columns="type").to_parquet(no_type)
    with pytest.raises(ValueError, match="missing columns \\['type'\\]"):
        read_features(no_type)
    bad_type = tmp_path / "bad_type.parquet"
    rule_features([0, 1], FeatureProtocol(trials=2)).assign(type="weird").to_parquet(bad_type)
    with pytest.raises(ValueError, match="weird"):
        read_features(bad_type)
