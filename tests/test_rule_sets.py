"""Sampled rule sets of large families and their features (docs/protocol.md#rule-sets)."""
from collections import Counter
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from tapebench.ca.reference import rollout
from tapebench.rule_family import ELEMENTARY, RuleFamily
from tapebench.rules.features import (FEATURE_NAMES, FeatureProtocol, family_step, read_features, rule_features,
                                      solved_by_any_action, start_tapes, write_features)
from tapebench.rules.sampling import (SampleSpec, bin_of, lambda_edges, read_rule_set, sample_rule_set,
                                      spec_from_config, write_rule_set)

K3R1 = RuleFamily(3, 1)


@pytest.fixture(scope="module")
def k3r1_set():
    return sample_rule_set(K3R1, SampleSpec(n=20, lambda_bins=5, seed=7))


def test_every_rule_lies_in_its_lambda_bin_and_bins_get_equal_counts(k3r1_set):
    edges = lambda_edges(5)
    for row in k3r1_set["per_rule"]:
        exact = Fraction(int(np.count_nonzero(K3R1.table(row["rule"]))), 27)
        assert row["lambda"] == float(exact)
        assert bin_of(exact, edges) == row["bin"]
        assert edges[row["bin"]] <= row["lambda"] <= edges[row["bin"] + 1]
    assert k3r1_set["classes_per_bin"] == [4, 4, 4, 4, 4]
    classes = Counter(row["bin"] for row in k3r1_set["per_rule"] if row["rule"] == row["mirror_class"])
    assert [classes[b] for b in range(5)] == [4, 4, 4, 4, 4]


def test_rule_set_is_mirror_closed_without_duplicates(k3r1_set):
    rules = k3r1_set["rules"]
    assert rules == sorted(set(rules))
    assert {K3R1.mirror_rule(r) for r in rules} == set(rules)
    assert len({K3R1.class_representative(r) for r in rules}) == 20
    assert all(0 <= r < 3 ** 27 for r in rules)


def test_sampling_is_deterministic_per_seed():
    a = sample_rule_set(K3R1, SampleSpec(n=10, lambda_bins=[0, 0.5, 1], seed=3))
    b = sample_rule_set(K3R1, SampleSpec(n=10, lambda_bins=[0, 0.5, 1], seed=3))
    c = sample_rule_set(K3R1, SampleSpec(n=10, lambda_bins=[0, 0.5, 1], seed=4))
    assert a == b
    assert a["rules"] != c["rules"]
    assert a["classes_per_bin"] == [5, 5]


@pytest.mark.parametrize("subfamily,check", [("totalistic", "is_totalistic"),
                                             ("outer_totalistic", "is_outer_totalistic")])
def test_sub_family_flag_holds(subfamily, check):
    rule_set = sample_rule_set(K3R1, SampleSpec(n=15, lambda_bins=3, subfamily=subfamily, seed=1))
    assert all(getattr(K3R1, check)(r) for r in rule_set["rules"])
    assert rule_set["classes_per_bin"] == [5, 5, 5]
    # totalistic rules are their own mirror (reflection keeps the neighbourhood sum)
    if subfamily == "totalistic":
        assert len(rule_set["rules"]) == 15


def test_remainder_goes_to_the_lowest_bins():
    assert SampleSpec(n=7, lambda_bins=3).per_bin() == [3, 2, 2]


def test_too_many_classes_for_a_small_family_is_an_exact_early_error():
    # elementary rules with lambda in [0, 0.2): 0 and the 8 one-entry rules, 7 mirror classes
    with pytest.raises(ValueError, match=r"bin 0 \[0, 0.2\) has 7 mirror classes, 8 requested"):
        sample_rule_set(ELEMENTARY, SampleSpec(n=40, lambda_bins=5))
    # the 3^7 = 2187 totalistic k3r1 rules: counted exactly
    with pytest.raises(ValueError, match="totalistic rules of k = 3"):
        sample_rule_set(K3R1, SampleSpec(n=5000, lambda_bins=1, subfamily="totalistic"))


def test_a_bin_no_rule_can_reach_fails_naming_the_bin():
    # k3r1 lambda takes values j/27: no rule has lambda in [0.5, 0.51]
    with pytest.raises(ValueError, match=r"bin 1 \[0.5, 0.51\] holds no all rule of k = 3"):
        sample_rule_set(K3R1, SampleSpec(n=2, lambda_bins=[0, 0.5, 0.51]))
    # small families are counted exactly first
    with pytest.raises(ValueError, match=r"bin 1 \[0.26, 0.3\] has 0 mirror classes, 1 requested"):
        sample_rule_set(ELEMENTARY, SampleSpec(n=2, lambda_bins=[0, 0.26, 0.3]))


@pytest.mark.parametrize("bins,match", [(0, "lambda_bins"), ([0.5, 0.2], "strictly increasing"),
                                        ([0, 1.5], "in \\[0, 1\\]"), ("five", "lambda_bins")])
def test_bad_bins_are_rejected(bins, match):
    with pytest.raises(ValueError, match=match):
        SampleSpec(n=4, lambda_bins=bins)


def test_config_section_errors_name_the_key():
    with pytest.raises(ValueError, match="unknown keys \\['bins'\\]"):
        spec_from_config({"n": 3, "bins": 4})
    with pytest.raises(ValueError, match="rule_set.sample.n"):
        spec_from_config({"n": 0})
    with pytest.raises(ValueError, match="subfamily"):
        spec_from_config({"n": 3, "subfamily": "outer"})


def test_rule_set_artifact_round_trip_and_int64_guard(tmp_path):
    path = tmp_path / "rule_set.json"
    written = write_rule_set(path, K3R1, SampleSpec(n=4, lambda_bins=2, seed=0))
    family, rules, raw = read_rule_set(path)
    assert family == K3R1 and rules == written["rules"] and raw["sample"]["n"] == 4
    with pytest.raises(ValueError, match="64 bits"):
        write_rule_set(tmp_path / "big.json", RuleFamily(4, 1), SampleSpec(n=2, lambda_bins=1))


# --- features of k-colour rules ------------------------------------------------------------------------------
def test_family_step_matches_the_reference_kernel():
    rng = np.random.default_rng(0)
    for family in (K3R1, RuleFamily(2, 2), RuleFamily(3, 2)):
        rules = [int(rng.integers(0, 2 ** 62)) % family.num_rules for _ in range(3)]
        tapes = rng.integers(0, family.k, size=(3, 11), dtype=np.uint8)
        got = family_step(tapes, family.tables(rules), family)
        for tape, rule, row in zip(tapes, rules, got):
            np.testing.assert_array_equal(row, rollout(tape, rule, 1, family)[1])


def test_k3_features_match_reference_rollouts_closed_forms():
    protocol = FeatureProtocol(L=9, trials=4, steps=6, seed=2)
    rule = sample_rule_set(K3R1, SampleSpec(n=1, lambda_bins=[0.4, 0.6], seed=5))["rules"][0]
    got = rule_features([rule], protocol, K3R1).iloc[0]
    starts = start_tapes(protocol, K3R1)
    assert set(np.unique(starts[:4])) == {0, 1, 2}
    runs = np.stack([rollout(x, rule, protocol.steps, K3R1) for x in starts])     # (n, T+1, L)
    assert got["density"] == pytest.approx(np.mean(runs[:, 1:] != 0), abs=1e-12)
    assert got["activity"] == pytest.approx(np.mean(runs[:, 1:] != runs[:, :-1]), abs=1e-12)
    p = np.stack([(runs[:, 1:] == c).mean(axis=2) for c in range(3)], axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        entropy = np.nan_to_num(-(p * np.log2(p))).sum(axis=-1) / np.log2(3)
    assert got["entropy"] == pytest.approx(entropy.mean(), abs=1e-12)


def test_k3_closed_form_rules():
    identity = K3R1.number(K3R1.centre_cells)          # F(l, c, r) = c
    frame = rule_features([0, identity], FeatureProtocol(L=16, trials=8, steps=32), K3R1).set_index("rule")
    assert frame.at[0, "density"] == 0 and frame.at[0, "entropy"] == 0 and frame.at[0, "type"] == "stable"
    assert frame.at[identity, "activity"] == 0.0
    assert 0.9 < frame.at[identity, "entropy"] <= 1.0   # uniform colours: near log2 3 bits, normalised to ~1
    assert solved_by_any_action(0, K3R1) and not solved_by_any_action(identity, K3R1)
    twos = K3R1.number(np.full(K3R1.centre_cells.shape, 2))   # F = 2: every tape becomes 2...2, a derived goal
    assert solved_by_any_action(twos, K3R1, "derived") and not solved_by_any_action(twos, K3R1)
    assert not solved_by_any_action(identity, K3R1, "derived")


def test_k3_mirror_rules_have_identical_features(k3r1_set):
    frame = rule_features(k3r1_set["rules"], FeatureProtocol(L=16, trials=8, steps=8), K3R1).set_index("rule")
    cols = ["type", *FEATURE_NAMES]
    mirrored = frame.loc[frame["mirror_rule"].to_numpy(), cols].reset_index(drop=True)
    pd.testing.assert_frame_equal(mirrored, frame[cols].reset_index(drop=True), check_exact=True)
    values = frame[list(FEATURE_NAMES)].to_numpy()
    assert np.all((values >= 0) & (values <= 1 + 1e-12))


def test_k3_features_artifact_records_the_family(tmp_path, k3r1_set):
    path = tmp_path / "features.parquet"
    write_features(path, FeatureProtocol(L=8, trials=2, steps=3), k3r1_set["rules"], K3R1)
    frame, meta = read_features(path)
    assert meta["config"]["family"] == {"k": 3, "r": 1}
    assert frame["rule"].dtype == np.int64 and frame["rule"].tolist() == k3r1_set["rules"]
    with pytest.raises(ValueError, match="explicit rule list"):
        rule_features(None, FeatureProtocol(), K3R1)


def test_elementary_features_artifact_is_unchanged(tmp_path):
    path = tmp_path / "features.parquet"
    write_features(path, FeatureProtocol(L=8, trials=2, steps=3))
    _, meta = read_features(path)
    assert "family" not in meta["config"]
