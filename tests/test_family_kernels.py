"""The family kernels (numba `ca.table_kernel`, torch `ca.torch_table_kernel`) agree bit-exactly with the
plain reference `ca.reference` for k in {2, 3, 4}, r in {1, 2}, random rules and random L in 3..64
(docs/protocol.md#rule-families); for k = 2, r = 1 also with the packed elementary kernel."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tapebench.ca import packed, reference, table_kernel, torch_table_kernel
from tapebench.rule_family import RuleFamily

FAMILIES = [RuleFamily(k, r) for k in (2, 3, 4) for r in (1, 2)]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
SETTINGS = settings(max_examples=8, deadline=None)   # per family: every (k, r) is always covered
FAMILY_IDS = [f.name for f in FAMILIES]


@st.composite
def batches(draw, family_strategy=st.sampled_from(FAMILIES)):
    """A family, 1..3 random rule tables (with their numbers), and 1..4 tapes of random L with actions."""
    family = draw(family_strategy)
    seed = draw(st.integers(0, 2**32 - 1))
    L = draw(st.integers(3, 64))
    rng = np.random.default_rng(seed)
    n_rules, n_tapes = int(rng.integers(1, 4)), int(rng.integers(1, 5))
    tables = rng.integers(0, family.k, (n_rules, family.neighbourhoods), dtype=np.uint8)
    rules = [family.number(t) for t in tables]
    tapes = rng.integers(0, family.k, (n_tapes, L), dtype=np.uint8)
    index = rng.integers(0, n_rules, n_tapes)
    actions = rng.integers(0, L, n_tapes)
    return family, tables, rules, tapes, index, actions


def reference_step(tapes, rules, index, family):
    return np.stack([reference.ca_step(t, rules[i], family) for t, i in zip(tapes, index)])


def reference_transition(tapes, actions, rules, index, family):
    return np.stack([reference.transition(t, int(a), rules[i], family) for t, a, i in zip(tapes, actions, index)])


# --- the reference itself: hand-computed cases ----------------------------------------------------

def test_reference_k3_shift_rule_moves_every_colour_right():
    # F(x[i-1], x[i], x[i+1]) = x[i-1]: table[idx] = idx // 9 (left neighbour most significant)
    family = RuleFamily(3, 1)
    rule = family.number(np.arange(27) // 9)
    tape = np.array([2, 0, 1, 1, 0], dtype=np.uint8)
    assert reference.ca_step(tape, rule, family).tolist() == [0, 2, 0, 1, 1]
    # the action increments mod k before the update: cell 0 goes 2 -> 0, then the shift
    assert reference.transition(tape, 0, rule, family).tolist() == [0, 0, 0, 1, 1]


def test_reference_radius_two_reads_two_cells_each_side():
    # k = 2, r = 2, F = x[i+2]: table[idx] = idx & 1 (the rightmost cell is the least significant)
    family = RuleFamily(2, 2)
    rule = family.number(np.arange(32) & 1)
    tape = np.array([1, 0, 0, 1, 1, 0, 0], dtype=np.uint8)
    assert reference.ca_step(tape, rule, family).tolist() == np.roll(tape, -2).tolist()


# --- numba kernel ---------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES, ids=FAMILY_IDS)
@SETTINGS
@given(data=st.data())
def test_numba_step_and_transition_match_reference(family, data):
    batch = data.draw(batches(st.just(family)))
    family, tables, rules, tapes, index, actions = batch
    k, r = family.k, family.r
    assert np.array_equal(table_kernel.step(tapes, tables, index, k, r),
                          reference_step(tapes, rules, index, family))
    assert np.array_equal(table_kernel.transition(tapes, actions, tables, index, k, r),
                          reference_transition(tapes, actions, rules, index, family))
    one = table_kernel.step_one_rule(tapes, tables[0], k, r)
    assert np.array_equal(one, reference_step(tapes, rules, np.zeros(len(tapes), dtype=int), family))


@pytest.mark.parametrize("family", FAMILIES, ids=FAMILY_IDS)
@SETTINGS
@given(data=st.data(), steps=st.integers(0, 6))
def test_numba_evolve_matches_reference_rollout(family, data, steps):
    batch = data.draw(batches(st.just(family)))
    family, tables, rules, tapes, index, _ = batch
    traj = table_kernel.evolve(tapes, tables, index, family.k, family.r, steps)
    assert traj.shape == (steps + 1, *tapes.shape)
    for n, tape in enumerate(tapes):
        assert np.array_equal(traj[:, n], reference.rollout(tape, rules[index[n]], steps, family))


@settings(max_examples=60, deadline=None)
@given(st.integers(3, 64), st.integers(0, 2**32 - 1))
def test_numba_k2_r1_matches_packed_elementary_kernel(L, seed):
    rng = np.random.default_rng(seed)
    rules = rng.integers(0, 256, 8)
    tapes = rng.integers(0, 2, (8, L), dtype=np.uint8)
    tables = RuleFamily(2, 1).tables(rules)
    index = np.arange(8)
    expected = packed.unpack(packed.step_words_rules(packed.pack(tapes), rules.astype(np.uint64), L), L)
    assert np.array_equal(table_kernel.step(tapes, tables, index, 2, 1), expected)
    evolved = packed.unpack(packed.evolve_words(packed.pack(tapes), int(rules[0]), L, 5), L)
    assert np.array_equal(table_kernel.evolve(tapes, tables, np.zeros(8, dtype=int), 2, 1, 5)[-1], evolved)


def test_numba_entry_points_reject_bad_arguments():
    family = RuleFamily(3, 1)
    tapes = np.zeros((2, 8), dtype=np.uint8)
    tables = family.tables([0, 1])
    with pytest.raises(ValueError, match="shape .*27"):
        table_kernel.step(tapes, tables[:, :8], [0, 1], 3, 1)
    with pytest.raises(ValueError, match=r"cells must be in 0\.\.2"):
        table_kernel.step(tapes + 3, tables, [0, 1], 3, 1)
    with pytest.raises(ValueError, match=r"table_index must be in 0\.\.1"):
        table_kernel.step(tapes, tables, [0, 2], 3, 1)
    with pytest.raises(ValueError, match=r"actions must be"):
        table_kernel.transition(tapes, [0, 8], tables, [0, 1], 3, 1)
    with pytest.raises(ValueError, match=r"radius r must be an integer in 1\.\.2"):
        table_kernel.step(tapes, tables, [0, 1], 3, 3)


# --- torch kernel ---------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES, ids=FAMILY_IDS)
@SETTINGS
@given(data=st.data())
def test_torch_step_and_transition_match_reference(device, family, data):
    batch = data.draw(batches(st.just(family)))
    family, tables, rules, tapes, index, actions = batch
    k, r = family.k, family.r
    row_tables = torch.as_tensor(tables[index], device=device)
    tapes_t = torch.as_tensor(tapes, device=device)
    actions_t = torch.as_tensor(actions, device=device)
    got = torch_table_kernel.ca_step(tapes_t, row_tables, k, r).cpu().numpy()
    assert np.array_equal(got, reference_step(tapes, rules, index, family))
    got = torch_table_kernel.transition(tapes_t, actions_t, row_tables, k, r).cpu().numpy()
    assert np.array_equal(got, reference_transition(tapes, actions, rules, index, family))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES, ids=FAMILY_IDS)
def test_torch_in_place_padded_steps_follow_the_reference_for_many_steps(device, family):
    """The env's hot path: increment_padded_ + step_padded_ on one buffer, stale wrap columns included."""
    rng = np.random.default_rng(family.k * 10 + family.r)
    n, L, steps = 5, int(rng.integers(3, 65)), 6
    tables = rng.integers(0, family.k, (n, family.neighbourhoods), dtype=np.uint8)
    rules = [family.number(t) for t in tables]
    tapes = rng.integers(0, family.k, (n, L), dtype=np.uint8)
    padded = torch_table_kernel.pad_periodic(torch.as_tensor(tapes, device=device), family.r)
    offsets = torch_table_kernel.flat_row_offsets(n, L, family.r, device=device)
    scratch = torch_table_kernel.StepScratch(n, L, family.r, device=device)
    tables_t = torch.as_tensor(tables, device=device)
    expected = tapes.copy()
    for _ in range(steps):
        actions = rng.integers(0, L, n)
        torch_table_kernel.increment_padded_(padded, torch.as_tensor(actions, device=device), offsets, family.k)
        torch_table_kernel.step_padded_(padded, tables_t, family.k, family.r, scratch)
        expected = reference_transition(expected, actions, rules, range(n), family)
        assert np.array_equal(torch_table_kernel.interior(padded, family.r).cpu().numpy(), expected)


def test_increment_wraps_at_k():
    tapes = torch.tensor([[0, 1, 2], [2, 2, 2]], dtype=torch.uint8)
    assert torch_table_kernel.increment(tapes, torch.tensor([2, 1]), 3).tolist() == [[0, 1, 0], [2, 0, 2]]
    padded = torch_table_kernel.pad_periodic(tapes, 1)
    torch_table_kernel.increment_padded_(padded, torch.tensor([2, 1]), torch_table_kernel.flat_row_offsets(2, 3, 1), 3)
    assert torch_table_kernel.interior(padded, 1).tolist() == [[0, 1, 0], [2, 0, 2]]
