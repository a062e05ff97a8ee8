"""The rule-family object: Wolfram numbering, mirror map, Langton's lambda, sub-families (closed forms)."""
import itertools

import numpy as np
import pytest

from tapebench.rule_family import ELEMENTARY, RuleFamily, family_from_config

FAMILIES = [RuleFamily(k, r) for k in (2, 3, 4) for r in (1, 2)]


def old_elementary_mirror(rule: int) -> int:
    """The elementary mirror map written out bit by bit (the definition before families existed)."""
    out = 0
    for idx in range(8):
        left, centre, right = (idx >> 2) & 1, (idx >> 1) & 1, idx & 1
        out |= ((rule >> idx) & 1) << (4 * right + 2 * centre + left)
    return out


def random_rule(family: RuleFamily, rng) -> int:
    return family.number(rng.integers(0, family.k, family.neighbourhoods))


def test_elementary_table_is_the_bits_of_the_rule_number():
    for rule in range(256):
        assert ELEMENTARY.table(rule).tolist() == [(rule >> idx) & 1 for idx in range(8)]
        assert ELEMENTARY.number(ELEMENTARY.table(rule)) == rule


def test_elementary_mirror_map_is_unchanged_and_gives_160_classes():
    assert [ELEMENTARY.mirror_rule(z) for z in range(256)] == [old_elementary_mirror(z) for z in range(256)]
    assert sum(ELEMENTARY.is_self_mirror(z) for z in range(256)) == 64
    assert len({ELEMENTARY.class_representative(z) for z in range(256)}) == 160


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_numbering_round_trips_and_matches_the_definition(family):
    rng = np.random.default_rng(family.k * 10 + family.r)
    for _ in range(20):
        table = rng.integers(0, family.k, family.neighbourhoods).astype(np.uint8)
        rule = family.number(table)
        assert rule == sum(int(v) * family.k ** idx for idx, v in enumerate(table))
        assert 0 <= rule < family.num_rules
        np.testing.assert_array_equal(family.table(rule), table)
    assert family.number(np.full(family.neighbourhoods, family.k - 1)) == family.num_rules - 1


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_neighbourhood_index_puts_the_left_neighbour_most_significant(family):
    for idx in range(family.neighbourhoods):
        cells = family.neighbourhood(idx)
        assert len(cells) == 2 * family.r + 1
        assert sum(c * family.k ** (family.width - 1 - j) for j, c in enumerate(cells)) == idx
        assert family.index(cells) == idx
        assert int(np.dot(cells, family.place_values)) == idx


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_mirror_is_an_involution_that_reverses_neighbourhoods(family):
    rng = np.random.default_rng(7)
    perm = family.mirror_permutation
    assert sorted(perm.tolist()) == list(range(family.neighbourhoods))
    for idx in range(family.neighbourhoods):
        assert family.neighbourhood(perm[idx]) == tuple(reversed(family.neighbourhood(idx)))
    for _ in range(10):
        rule = random_rule(family, rng)
        mirrored = family.mirror_rule(rule)
        assert family.mirror_rule(mirrored) == rule
        # F'(reversed window) = F(window)
        for idx in rng.integers(0, family.neighbourhoods, 5):
            window = family.neighbourhood(int(idx))
            assert family.table(mirrored)[family.index(reversed(window))] == family.table(rule)[idx]


def test_self_mirror_count_is_k_to_the_number_of_reflection_orbits():
    family = RuleFamily(3, 1)
    palindromes = 3 ** 2                      # windows (a, b, a)
    orbits = (27 + palindromes) // 2          # Burnside: 18 orbits of the reflection on 27 windows
    rng = np.random.default_rng(0)
    # a self-mirror rule is a free choice of one value per orbit; check a sample built that way
    for _ in range(20):
        table = np.zeros(27, dtype=np.uint8)
        for idx in range(27):
            partner = family.mirror_permutation[idx]
            table[idx] = table[partner] if partner < idx else rng.integers(0, 3)
        assert family.is_self_mirror(family.number(table))
    assert orbits == len({frozenset((i, int(family.mirror_permutation[i]))) for i in range(27)})


@pytest.mark.parametrize("family", [ELEMENTARY, RuleFamily(3, 1)], ids=lambda f: f.name)
def test_totalistic_and_outer_totalistic_counts(family):
    """Totalistic rules: k^(number of sums); outer-totalistic: k^(k * number of outer sums)."""
    sums = family.width * (family.k - 1) + 1
    outer_sums = (family.width - 1) * (family.k - 1) + 1
    if family.elementary:
        assert sum(family.is_totalistic(z) for z in range(256)) == 2 ** sums == 16
        assert sum(family.is_outer_totalistic(z) for z in range(256)) == 2 ** (2 * outer_sums) == 64
    rng = np.random.default_rng(1)
    for _ in range(10):
        values = rng.integers(0, family.k, sums)
        rule = family.number(values[family.neighbourhood_sums])
        assert family.is_totalistic(rule) and family.is_outer_totalistic(rule)
    assert not family.is_totalistic(family.number(np.eye(1, family.neighbourhoods, 1, dtype=np.uint8)[0]))


def test_langton_lambda_counts_non_quiescent_outputs():
    assert ELEMENTARY.langton_lambda(0) == 0.0
    assert ELEMENTARY.langton_lambda(255) == 1.0
    assert ELEMENTARY.langton_lambda(30) == 0.5          # 30 = 0b00011110: four ones
    assert ELEMENTARY.langton_lambda(110) == 5 / 8
    family = RuleFamily(3, 1)
    table = np.zeros(27, dtype=np.uint8)
    table[:9] = [1, 2, 1, 2, 1, 2, 1, 2, 1]
    assert family.langton_lambda(family.number(table)) == pytest.approx(9 / 27)


def test_hamming_distance_between_rule_tables():
    assert ELEMENTARY.hamming(0, 255) == 8
    assert ELEMENTARY.hamming(30, 30 ^ 0b101) == 2
    family = RuleFamily(3, 1)
    a = np.zeros(27, dtype=np.uint8)
    b = a.copy()
    b[[0, 5, 26]] = [1, 2, 2]
    assert family.hamming(family.number(a), family.number(b)) == 3


def test_sizes_names_and_int64_limit():
    assert ELEMENTARY.num_rules == 256 and ELEMENTARY.name == "eca" and ELEMENTARY.fits_int64
    assert RuleFamily(3, 1).num_rules == 3 ** 27 and RuleFamily(3, 1).name == "k3r1"
    assert RuleFamily(3, 1).fits_int64 and RuleFamily(2, 2).fits_int64
    assert not RuleFamily(4, 1).fits_int64 and not RuleFamily(3, 2).fits_int64


@pytest.mark.parametrize("kwargs, message", [
    (dict(k=1), r"colours k must be an integer in 2\.\.4, got 1"),
    (dict(k=5), r"colours k must be an integer in 2\.\.4, got 5"),
    (dict(r=0), r"radius r must be an integer in 1\.\.2, got 0"),
    (dict(k=2.0), r"colours k must be an integer in 2\.\.4, got 2\.0"),
])
def test_bad_family_parameters_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RuleFamily(**kwargs)


def test_bad_rules_and_tables_name_the_family():
    family = RuleFamily(3, 1)
    with pytest.raises(ValueError, match=r"rule must be in 0\.\.3\^27 - 1 \(k = 3 colours, radius r = 1"):
        family.check_rule(3 ** 27)
    with pytest.raises(ValueError, match=r"rule table cells must be integers in 0\.\.2, got values \[3\]"):
        family.number(np.full(27, 3))
    with pytest.raises(ValueError, match=r"has 27 entries, got shape \(8,\)"):
        family.number(np.zeros(8))
    with pytest.raises(ValueError, match=r"unknown keys \['colours'\]"):
        family_from_config({"colours": 3})
    assert family_from_config(None) == ELEMENTARY
    assert family_from_config({"k": 3}) == RuleFamily(3, 1)


def test_every_elementary_window_is_enumerated_once():
    windows = [ELEMENTARY.neighbourhood(idx) for idx in range(8)]
    assert sorted(windows) == sorted(itertools.product((0, 1), repeat=3))
