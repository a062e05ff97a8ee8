"""The 2D rule space (docs/protocol.md#grid-rule-space): λ and growth flags of hand-computed rules, cycle detection
on known patterns and against a brute-force search, the complement map, the feature table and the Moore sample."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tapebench.ca import grid_packed, grid_reference
from tapebench.cli import main
from tapebench.grid_rules import MOORE, VON_NEUMANN, parse_rule
from tapebench.rule_family import family_from_config
from tapebench.rules import grid_features
from tapebench.rules.grid_features import (
    ATTRACTORS, GRID_FEATURE_COLUMNS, GridFeatureProtocol, all_lambdas, complement_rule, grid_rule_features,
    growth_flags, langton_lambda, sample_grid_rules, table_lambda, write_grid_features,
)
from tapebench.splits.generate import SplitParams, generate_split
from tapebench.splits.io import load_split
from tapebench.utils.io import read_parquet_meta

SMALL = GridFeatureProtocol(trials=8, steps=16, max_cycle_steps=64)


@pytest.mark.parametrize("text, lam, lam_table", [
    ("B3/S23", (56 + 28 + 56) / 512, 3 / 18),        # C(8,3) births, C(8,2) + C(8,3) survivals of 2^9 configurations
    ("B/S", 0.0, 0.0),
    ("B1/S12V", (4 + 4 + 6) / 32, 3 / 10),
    ("B0/S", 1 / 512, 1 / 18),                        # only the all-dead configuration
    ("B012345678/S012345678", 1.0, 1.0),
    ("B0/S4V", (1 + 1) / 32, 2 / 10),
])
def test_lambda_of_hand_computed_rules(text, lam, lam_table):
    rule = parse_rule(text)
    assert langton_lambda(rule) == lam and table_lambda(rule) == lam_table
    assert all_lambdas(rule.family)[rule.id] == lam


@pytest.mark.parametrize("text, flags", [
    ("B3/S23", {}),
    ("B/S", {"mortal", "sterile"}),
    ("B1/S12V", {"fertile"}),
    ("B0/S8", {"b0"}),
    ("B2/S", {"fertile", "mortal"}),
    ("B0/S0123V", {"b0"}),
])
def test_growth_flags(text, flags):
    assert {k for k, v in growth_flags(parse_rule(text)).items() if v} == set(flags)


def place(cells, n=8):
    grid = np.zeros((n, n), dtype=np.uint8)
    for r, c in cells:
        grid[r, c] = 1
    return grid


LIFE = MOORE.rule("B3/S23").id
PATTERNS = {                      # grid under B3/S23 on the 8 × 8 torus -> (transient, period, entry is empty)
    "blinker": (place([(3, 2), (3, 3), (3, 4)]), 0, 2, False),
    "block": (place([(2, 2), (2, 3), (3, 2), (3, 3)]), 0, 1, False),
    "single cell dies": (place([(4, 4)]), 1, 1, True),
    "empty": (place([]), 0, 1, True),
    "glider": (place([(0, 1), (1, 2), (2, 0), (2, 1), (2, 2)]), 0, 32, False),   # 4 steps per cell, 8 cells
}


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_cycle_detection_on_known_patterns(name):
    grid, mu, lam, empty = PATTERNS[name]
    transient, period, entry = grid_packed.cycle_words(grid_packed.pack(grid), np.array([LIFE]), 8, True, 64)
    assert (transient[0], period[0], entry[0] == 0) == (mu, lam, empty)
    short = grid_packed.cycle_words(grid_packed.pack(grid), np.array([LIFE]), 8, True, mu + lam - 1)
    assert (short[0][0], short[1][0]) == (-1, 0)        # a repeat after mu + lam updates is not within mu + lam - 1


def brute_cycle(grid, rule, max_steps):
    seen = {grid.tobytes(): 0}
    for t in range(1, max_steps + 1):
        grid = grid_reference.ca_step(grid, rule)
        key = grid.tobytes()
        if key in seen:
            return seen[key], t - seen[key], grid
        seen[key] = t
    return -1, 0, None


@pytest.mark.parametrize("family", [MOORE, VON_NEUMANN])
def test_cycle_detection_matches_a_brute_force_search(family):
    rng = np.random.default_rng(3)
    n, max_steps = 5, 40
    grids = rng.integers(0, 2, (60, n, n), dtype=np.uint8)
    ids = rng.integers(0, family.num_rules, 60)
    transient, period, entry = grid_packed.cycle_words(grid_packed.pack(grids), ids, n, family == MOORE, max_steps)
    outcomes = set()
    for i in range(60):
        mu, lam, state = brute_cycle(grids[i], family.rule(int(ids[i])), max_steps)
        assert (transient[i], period[i]) == (mu, lam)
        if state is not None:
            assert (grid_packed.unpack(entry[i], n)[0] == state).all()
        outcomes.add("long" if mu < 0 else "fixed" if lam == 1 else "periodic")
    assert outcomes == {"long", "fixed", "periodic"}, outcomes     # the draw exercises every branch


def test_complement_is_an_involution_and_matches_complemented_grids_bit_exactly():
    rng = np.random.default_rng(5)
    for family in (MOORE, VON_NEUMANN):
        rules = [family.rule(int(i)) for i in rng.integers(0, family.num_rules, 40)]
        grids = rng.integers(0, 2, (6, 7, 7), dtype=np.uint8)
        for rule in rules:
            twin = complement_rule(rule)
            assert complement_rule(twin) == rule
            assert (grid_reference.ca_step(1 - grids, twin) == 1 - grid_reference.ca_step(grids, rule)).all()
    assert all(complement_rule(complement_rule(r)) == r for r in VON_NEUMANN.rules(range(1024)))
    assert str(complement_rule(parse_rule("B3/S23"))) == "B0123478/S01234678"
    assert complement_rule(parse_rule("B/S")).id == MOORE.num_rules - 1


def test_feature_table_of_the_von_neumann_family(monkeypatch):
    frame = grid_rule_features(VON_NEUMANN, protocol=SMALL)
    assert list(frame.columns) == list(GRID_FEATURE_COLUMNS) and len(frame) == 1024
    assert frame["rule"].tolist() == list(range(1024))
    assert (frame["mirror_rule"] == frame["rule"]).all() and (frame["mirror_class"] == frame["rule"]).all()
    fractions = frame[[f"{a}_fraction" for a in ATTRACTORS]].sum(axis=1)
    assert np.allclose(fractions, 1.0)
    by = frame.set_index("notation")
    assert by.at["B/SV", "type"] == "stable" and by.at["B/SV", "attractor"] == "extinct"
    assert by.at["B0/SV", "attractor"] == "periodic" and by.at["B0/SV", "max_period"] == 2   # empty <-> full
    assert by.at["B01234/S01234V", "attractor"] == "fixed" and by.at["B01234/S01234V", "density"] == 1.0
    assert set(frame["type"]) == {"stable", "periodic", "chaotic"}
    monkeypatch.setattr(grid_features, "CHUNK", 100)        # chunks of rules change nothing
    again = grid_rule_features(VON_NEUMANN, protocol=SMALL)
    pd.testing.assert_frame_equal(frame, again)
    other = grid_rule_features(VON_NEUMANN, protocol=GridFeatureProtocol(trials=8, steps=16, max_cycle_steps=64,
                                                                         seed=1))
    assert not frame["density"].equals(other["density"])


def test_moore_sample_is_stratified_and_deterministic():
    sample = sample_grid_rules(MOORE, 23, lambda_bins=5, seed=4)
    assert sample == sample_grid_rules(MOORE, 23, lambda_bins=5, seed=4)
    assert sample["rules"] != sample_grid_rules(MOORE, 23, lambda_bins=5, seed=5)["rules"]
    bins = [row["bin"] for row in sample["per_rule"]]
    assert [bins.count(b) for b in range(5)] == [5, 5, 5, 4, 4] and len(set(sample["rules"])) == 23
    for row in sample["per_rule"]:
        assert row["lambda"] == langton_lambda(MOORE.rule(row["rule"]))
        assert sample["lambda_edges"][row["bin"]] <= row["lambda"] <= sample["lambda_edges"][row["bin"] + 1]
    no_b0 = sample_grid_rules(MOORE, 50, seed=0, allow_b0=False)
    assert not any(r & 1 for r in no_b0["rules"])
    frame = grid_rule_features(MOORE, sample["rules"], SMALL)
    assert frame["rule"].tolist() == sorted(sample["rules"])


def test_bad_requests_name_what_is_allowed():
    with pytest.raises(ValueError, match="explicit rule list"):
        grid_rule_features(MOORE, protocol=SMALL)
    with pytest.raises(ValueError, match="grid features n"):
        GridFeatureProtocol(n=9)
    with pytest.raises(ValueError, match="bin 0"):
        sample_grid_rules(VON_NEUMANN, 1000, lambda_bins=[0, 0.01, 1])
    with pytest.raises(ValueError, match="von_neumann neighbourhood"):
        grid_rule_features(VON_NEUMANN, ["B3/S23"], SMALL)


def test_grid_features_command_writes_the_table(tmp_path, capsys):
    out = tmp_path / "grid.parquet"
    assert main(["grid-features", "--family", "von_neumann", "--sample", "10", "--seed", "2", "--out", str(out)]) == 0
    frame = pd.read_parquet(out)
    assert frame["rule"].tolist() == sample_grid_rules(VON_NEUMANN, 10, seed=2)["rules"]
    meta = read_parquet_meta(out)["config"]
    assert meta["family"] == {"neighbourhood": "von_neumann"} and meta["sample"]["n"] == 10 and "10 von_neumann rules" in capsys.readouterr().out
    assert main(["grid-features", "--family", "moore", "--out", str(tmp_path / "moore.parquet")]) == 2
    assert "--sample is required for the moore" in capsys.readouterr().err
    assert not (tmp_path / "moore.parquet").exists()


def test_every_table_entry_occurs_so_distinct_ids_are_distinct_maps():
    """No two grid rules are the same map (so nothing to identify beyond the symmetries): on the 3 × 3 torus
    every single-entry rule (id 2^k) changes some grid's update."""
    grids = grid_packed.pack(((np.arange(512)[:, None] >> np.arange(9)) & 1).reshape(512, 3, 3))
    for family in (MOORE, VON_NEUMANN):
        for k in range(2 * family.counts):
            assert grid_packed.step_words(grids, 1 << k, 3, family == MOORE).any(), (family.name, k)


@pytest.mark.parametrize("method", ["diverse", "random"])
def test_splits_of_the_grid_features(tmp_path, method):
    assert family_from_config(VON_NEUMANN.as_dict()) == VON_NEUMANN
    features = tmp_path / "vn.parquet"
    frame = write_grid_features(features, VON_NEUMANN, None, SMALL)
    params = SplitParams(name=f"vn_{method}", method=method, test_size=40, seed=0, rules=tuple(range(1024)),
                         family=VON_NEUMANN)
    split = generate_split(params, features, tmp_path / "a.json")
    assert split == generate_split(params, features, tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert len(split["test"]) == 40 and len(split["train"]) == 984 and not set(split["test"]) & set(split["train"])
    assert split["family"] == {"neighbourhood": "von_neumann"} and load_split(tmp_path / "a.json").family == VON_NEUMANN
    assert split["feature_names"] == ["density", "density_std", "activity", "activity_2step", "entropy", "lambda"]
    types = frame.set_index("rule")["type"]
    assert split["test_type_counts"] == {t: int((types.loc[split["test"]] == t).sum())
                                         for t in ("stable", "periodic", "chaotic")}
    if method == "diverse":     # farthest-point: the test rules spread wider than the training rules
        z = frame.set_index("rule")[split["feature_names"]]
        z = (z - z.mean()) / z.std(ddof=0)
        assert z.loc[split["test"]].std().mean() > z.loc[split["train"]].std().mean()
    assert main(["split-health", str(tmp_path / "a.json")]) == 0      # the split gate reads the grid family
    other = generate_split(SplitParams(name="x", method=method, test_size=40, seed=3, rules=tuple(range(1024)),
                                       family=VON_NEUMANN), features, tmp_path / "c.json")
    assert other["test"] != split["test"]
