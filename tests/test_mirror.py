import numpy as np
import pytest

from tapebench.ca.reference import ca_step, transition
from tapebench.rules.mirror import (class_representative, is_self_mirror, mirror_classes, mirror_leaks, mirror_rule,
                                    reflect_action, reflect_tape)


def test_mirror_is_an_involution_with_known_pairs():
    assert all(mirror_rule(mirror_rule(z)) == z for z in range(256))
    assert mirror_rule(30) == 86 and mirror_rule(110) == 124 and mirror_rule(4) == 4
    assert mirror_rule(90) == 90 and mirror_rule(60) == 102


def test_256_rules_form_160_classes_with_64_self_mirror():
    classes = mirror_classes()
    assert len(classes) == 160
    assert sum(len(c) == 1 for c in classes) == 64
    assert sum(is_self_mirror(z) for z in range(256)) == 64
    assert sorted(r for c in classes for r in c) == list(range(256))
    assert all(class_representative(r) == c[0] for c in classes for r in c)


@pytest.mark.parametrize("L", [5, 8, 13])
def test_reflection_maps_rule_to_its_mirror_in_the_reference_kernel(L):
    rng = np.random.default_rng(L)
    tapes = rng.integers(0, 2, size=(4, L), dtype=np.uint8)
    for z in range(256):
        for x in tapes:
            assert np.array_equal(reflect_tape(ca_step(x, z)), ca_step(reflect_tape(x), mirror_rule(z)))


def test_reflection_maps_action_to_the_opposite_cell():
    rng = np.random.default_rng(1)
    L = 9
    for z in (30, 110, 4, 108, 57):
        for _ in range(10):
            x, a = rng.integers(0, 2, size=L, dtype=np.uint8), int(rng.integers(L))
            assert np.array_equal(reflect_tape(transition(x, a, z)),
                                  transition(reflect_tape(x), reflect_action(a, L), mirror_rule(z)))


def test_mirror_is_not_complement_equivalence():
    # rule 0 (everything dies) and its complement-conjugate 255 are different tasks and not mirrors
    assert mirror_rule(0) == 0 and class_representative(255) == 255


def test_classes_restricted_to_a_subset_keep_partial_classes():
    assert mirror_classes([30, 86, 110, 4]) == [(4,), (30, 86), (110,)]


def test_mirror_leaks_list_test_rules_whose_mirror_is_in_train():
    assert mirror_leaks(train=[86, 4, 124], test=[30, 90, 110]) == [(30, 86), (110, 124)]
    assert mirror_leaks(train=[90], test=[90]) == []  # self-mirror is overlap, not a mirror leak


def test_bad_inputs_name_the_value():
    with pytest.raises(ValueError, match="256"):
        mirror_rule(256)
    with pytest.raises(ValueError, match="0..7"):
        reflect_action(8, 8)
