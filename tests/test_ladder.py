"""Severity ladders (docs/protocol.md#severity-ladders): exact distances, mirror safety, determinism, the unfillable
level, mutation sampling in a large family, the ladder split artifact and its health gate, ladder sides in the
evaluation episodes and the aggregate, the config checks."""
from __future__ import annotations

import copy
import itertools
import json
from math import comb
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tapebench.evaluation.evaluate import side_protocols
from tapebench.pipeline.config import ConfigError, validate_config
from tapebench.rule_family import ELEMENTARY, RuleFamily
from tapebench.splits.health import SplitHealthError, check_split_health, split_health
from tapebench.splits.io import load_split, save_split
from tapebench.splits.ladder import (LadderError, LadderParams, check_mirror_closed, distances_to, draw_training_set,
                                     ladder_levels, make_ladder_split, shell_sizes)
from tapebench.stats.aggregate import aggregate_seeds

REPO = Path(__file__).resolve().parents[1]
K3 = RuleFamily(3, 1)


def _brute_distance(family, rule, train) -> int:
    return min(sum(a != b for a, b in zip(family.table(rule), family.table(t))) for t in train)


def _features() -> pd.DataFrame:
    """A features table with hand-set types: rule z is stable / periodic / chaotic by z mod 3 (mirror-invariant)."""
    types = ("stable", "periodic", "chaotic")
    rows = []
    for z in range(256):
        rep = ELEMENTARY.class_representative(z)
        rows.append({"rule": z, "density": rep / 255.0, "activity": (rep % 7) / 7.0, "type": types[rep % 3]})
    return pd.DataFrame(rows)


def test_distances_from_rule_zero_are_bit_counts():
    # d(z, {0}) is the number of ones in z's 8-bit table: C(8, d) rules at distance d, level 1 = the one-bit rules
    d = distances_to(ELEMENTARY, range(256), [0])
    assert d.tolist() == [bin(z).count("1") for z in range(256)]
    assert shell_sizes(ELEMENTARY, [0]) == {k: comb(8, k) for k in range(9)}
    level1 = ladder_levels(ELEMENTARY, [0], [1], level_size=8)[1]
    assert level1 == [1, 2, 4, 8, 16, 32, 64, 128]


def test_shell_sizes_match_brute_force_for_a_mirror_closed_training_set():
    train = [30, 86, 110, 124]                # two mirror classes
    brute = [_brute_distance(ELEMENTARY, z, train) for z in range(256)]
    expected = {k: brute.count(k) for k in range(9)}
    assert shell_sizes(ELEMENTARY, train) == expected
    assert expected == {0: 4, 1: 28, 2: 70, 3: 84, 4: 52, 5: 16, 6: 2, 7: 0, 8: 0}
    levels = ladder_levels(ELEMENTARY, train, [1, 2, 3, 4], level_size=6, seed=3)
    for d, rules in levels.items():
        assert [brute[z] for z in rules] == [d] * len(rules)


def test_levels_hold_whole_mirror_classes_and_no_training_rule():
    train = [30, 86, 110, 124]
    levels = ladder_levels(ELEMENTARY, train, [1, 2, 3, 4, 5], level_size=7, seed=1)
    for d, rules in levels.items():
        assert len(rules) in (7, 8)       # whole classes: at most one rule over (only when no fitting class remains)
        assert {ELEMENTARY.mirror_rule(z) for z in rules} == set(rules)
        assert not set(rules) & set(train)
    # distance is mirror-invariant for a mirror-closed training set
    d = distances_to(ELEMENTARY, range(256), train)
    assert all(d[z] == d[ELEMENTARY.mirror_rule(z)] for z in range(256))
    # ... and not for one that is not closed (why the ladder insists on closure)
    d_open = distances_to(ELEMENTARY, range(256), [30])
    assert any(d_open[z] != d_open[ELEMENTARY.mirror_rule(z)] for z in range(256))


def test_training_set_must_be_mirror_closed():
    with pytest.raises(LadderError, match=r"missing mirrors of 30 \(mirror 86\)"):
        check_mirror_closed(ELEMENTARY, [0, 30])
    assert check_mirror_closed(ELEMENTARY, [86, 30, 0]) == [0, 30, 86]


def test_levels_are_deterministic_and_independent_of_the_other_levels():
    train = [0, 255]
    a = ladder_levels(ELEMENTARY, train, [1, 2, 3, 4], level_size=6, seed=5)
    b = ladder_levels(ELEMENTARY, train, [4, 2], level_size=6, seed=5)
    assert a == ladder_levels(ELEMENTARY, train, [1, 2, 3, 4], level_size=6, seed=5)
    assert b == {2: a[2], 4: a[4]}
    assert ladder_levels(ELEMENTARY, train, [2], level_size=6, seed=6)[2] != a[2]


def test_an_unfillable_level_is_named():
    # from {0, 255} no rule is farther than 4 (d(z) = min(ones, 8 - ones)); 70 rules at distance 4
    assert shell_sizes(ELEMENTARY, [0, 255])[4] == 70
    with pytest.raises(LadderError, match=r"level d=5 has only 0 rules at exact distance 5 from the 2 training rules"):
        ladder_levels(ELEMENTARY, [0, 255], [1, 5], level_size=2)
    with pytest.raises(LadderError, match=r"level d=1 has only 16 rules at exact distance 1 from the 2 training "
                                          r"rules .*use a smaller training set or a smaller level_size"):
        ladder_levels(ELEMENTARY, [0, 255], [1], level_size=17)


def test_mutation_sampler_returns_exact_distances_in_k3():
    drawn_rules = [int(z) for z in np.random.default_rng(1).integers(3 ** 27, size=2)]
    train = sorted({*drawn_rules, *(K3.mirror_rule(z) for z in drawn_rules)})
    levels = ladder_levels(K3, train, [1, 2, 3, 4], level_size=5, seed=0)
    for d, rules in levels.items():
        assert len(rules) in (5, 6)
        assert [_brute_distance(K3, z, train) for z in rules] == [d] * len(rules)
        assert {K3.mirror_rule(z) for z in rules} == set(rules)
        assert not set(rules) & set(train)
    assert levels == ladder_levels(K3, train, [1, 2, 3, 4], level_size=5, seed=0)
    drawn = draw_training_set(K3, 2, seed=0)
    assert {K3.mirror_rule(z) for z in drawn} == set(drawn) and len({K3.class_representative(z) for z in drawn}) == 2


def test_drawn_training_classes_cycle_over_types():
    types = dict(zip(_features()["rule"], _features()["type"]))
    train = draw_training_set(ELEMENTARY, 3, seed=4, types=types, type_cycle=("stable", "periodic", "chaotic"))
    classes = {ELEMENTARY.class_representative(z) for z in train}
    assert sorted(types[c] for c in classes) == ["chaotic", "periodic", "stable"]
    assert {ELEMENTARY.mirror_rule(z) for z in train} == set(train)


def _ladder_file(tmp_path, **kwargs) -> Path:
    params = LadderParams(name="lad", **{"train": (30, 86, 110, 124), "level_size": 4, **kwargs})
    path = tmp_path / "lad.json"
    save_split(path, make_ladder_split(params, _features()))
    return path


def test_ladder_split_artifact_passes_the_health_gate(tmp_path):
    path = _ladder_file(tmp_path)
    raw = json.loads(path.read_text())
    split = load_split(path)
    assert split.train == (30, 86, 110, 124)
    assert split.sides == ("train", "d1", "d2", "d3", "d4")
    assert sorted(split.test) == sorted(z for rules in split.levels.values() for z in rules)
    assert {int(z): d for z, d in raw["distances"].items()} == {z: d for d, rules in split.levels.items() for z in rules}
    report = split_health(path)
    assert report["ok"] and report["mirror_leaks"] == 0
    assert {side: v["n"] for side, v in report["ladder"].items()} == {"d1": 4, "d2": 4, "d3": 4, "d4": 4}
    assert save_split(tmp_path / "again.json", make_ladder_split(
        LadderParams(name="lad", train=(30, 86, 110, 124), level_size=4), _features()))["content_hash"] \
        == raw["content_hash"]


def test_health_gate_recomputes_level_distances(tmp_path):
    path = _ladder_file(tmp_path)
    raw = json.loads(path.read_text())
    moved = raw["levels"]["1"].pop()                      # a distance-1 rule claimed to be at distance 2
    raw["levels"]["2"].append(moved)
    raw["distances"][str(moved)] = 2
    save_split(path, raw)                                  # a consistent hash: only the gate can catch it
    report = check_split_health(path)
    assert not report["ok"]
    assert any(f"level d=2 holds rules not at exact distance 2 from the training set: {moved} (at 1)" in p
               for p in report["problems"]), report["problems"]
    with pytest.raises(SplitHealthError, match="d=2"):
        split_health(path)


def test_ladder_sides_get_their_own_common_random_number_episodes(tmp_path):
    path = _ladder_file(tmp_path)
    split = load_split(path)
    sides = side_protocols(L=8, H=8, episodes_per_rule=2, eval_seed=7, split=path)
    assert [p.side for _, p, _ in sides] == ["train", "d1", "d2", "d3", "d4"]
    for episodes, protocol, _ in sides:
        assert sorted(set(episodes.rules.tolist())) == sorted(split.side_rules(protocol.side))
    again = side_protocols(L=8, H=8, episodes_per_rule=2, eval_seed=7, split=path)
    assert all(np.array_equal(a[0].tapes, b[0].tapes) for a, b in zip(sides, again))


def test_aggregate_pairs_id_with_every_ladder_level():
    rows = [{"split": "lad", "agent": "random", "L": 8, "H": 8, "seed": s, "side": side, "metric": "success",
             "value": v, "k_used": 1, "checkpoint_first": 0, "checkpoint_last": 0, "n_episodes": 4}
            for s, (side, v) in itertools.product((0, 1), (("train", 1.0), ("d1", 0.5), ("d2", 0.25)))]
    out = aggregate_seeds(pd.DataFrame(rows), n_resamples=50)
    assert out.set_index("side")["mean"].to_dict() == {"train": 1.0, "d1": 0.5, "d2": 0.25}
    with pytest.raises(ValueError, match="seeds are not matched across ID and d2"):
        aggregate_seeds(pd.DataFrame([r for r in rows if not (r["side"] == "d2" and r["seed"] == 1)]), n_resamples=50)


def _config(**ladder) -> dict:
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    tiny = yaml.safe_load((REPO / "tests/data/tiny.yaml").read_text())
    for key, value in tiny.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) and isinstance(config.get(key), dict) \
            else value
    config["studies"] = copy.deepcopy(config["studies"])
    config["studies"]["ladder"] = {**config["studies"]["ladder"], **ladder}
    return config


def test_config_checks_name_the_ladder_key():
    schema = REPO / "workflow/schemas/config.schema.yaml"
    validate_config(_config(), schema)
    with pytest.raises(ConfigError, match=r"studies.ladder.name': 'main' is also a configured split"):
        validate_config(_config(name="main"), schema)
    with pytest.raises(ConfigError, match=r"studies.ladder.methods\[1\]': unknown method 'nope'"):
        validate_config(_config(methods=["random", "nope"]), schema)
    with pytest.raises(ConfigError, match=r"studies.ladder.train': .*missing mirrors of 30 \(mirror 86\)"):
        validate_config(_config(train=[30], train_types=[]), schema)
    with pytest.raises(ConfigError, match=r"studies.ladder.level_size': level d=4 has only 70 rules"):
        validate_config(_config(train=[0, 255], train_types=[], levels=[4], level_size=71), schema)
    with pytest.raises(ConfigError, match=r"studies.ladder.level_size'"):
        validate_config(_config(level_size=1000), schema)
