"""Every CA kernel agrees bit-exactly with the plain reference (docs/protocol.md#environment).

All 256 rules are covered deterministically (parametrised); hypothesis adds random L in 3..64,
random tapes, actions and mixed rule batches. The packed kernel is exercised at L = 64 and L = 63
explicitly, where the length mask and the wrap-around shifts are at their edges.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tapebench.ca import packed, reference, torch_kernel

SETTINGS = settings(max_examples=200, deadline=None)
EDGE_LENGTHS = (3, 4, 5, 7, 8, 31, 32, 33, 63, 64)


def bits(value: int, L: int) -> np.ndarray:
    return np.array([(value >> i) & 1 for i in range(L)], dtype=np.uint8)


def reference_batch_step(tapes: np.ndarray, rules) -> np.ndarray:
    return np.stack([reference.ca_step(t, int(r)) for t, r in zip(tapes, rules)])


lengths = st.integers(3, 64)
rules_st = st.integers(0, 255)


@st.composite
def tape_and_length(draw):
    L = draw(lengths)
    return bits(draw(st.integers(0, 2**L - 1)), L), L


# --- the reference itself follows the convention of docs/protocol.md#environment --------------------------------

def test_reference_neighbourhood_convention():
    # rule 16 sets only truth-table bit idx=4, i.e. (left, centre, right) = (1, 0, 0):
    # a single 1 at cell j moves to cell j+1, wrapping at the right edge
    tape = np.zeros(8, dtype=np.uint8)
    tape[7] = 1
    assert reference.ca_step(tape, 16).tolist() == [1, 0, 0, 0, 0, 0, 0, 0]
    # rule 2 sets only idx=1, (0, 0, 1): the 1 moves left
    assert reference.ca_step(tape, 2).tolist() == [0, 0, 0, 0, 0, 0, 1, 0]


def test_reference_known_rules():
    rng = np.random.default_rng(0)
    tape = rng.integers(0, 2, 16, dtype=np.uint8)
    assert reference.ca_step(tape, 204).tolist() == tape.tolist()            # identity
    assert reference.ca_step(tape, 0).tolist() == [0] * 16
    assert reference.ca_step(tape, 255).tolist() == [1] * 16
    assert reference.ca_step(tape, 51).tolist() == (1 - tape).tolist()       # complement
    rule90 = np.roll(tape, 1) ^ np.roll(tape, -1)
    assert reference.ca_step(tape, 90).tolist() == rule90.tolist()
    single = np.zeros(7, dtype=np.uint8)
    single[3] = 1
    assert reference.ca_step(single, 30).tolist() == [0, 0, 1, 1, 1, 0, 0]


def test_reference_transition_flips_before_update():
    tape = np.zeros(5, dtype=np.uint8)
    # flip cell 2 of an all-zero tape, then rule 204 (identity): only cell 2 is set
    assert reference.transition(tape, 2, 204).tolist() == [0, 0, 1, 0, 0]
    # rule 0 erases everything, whatever the flip
    assert reference.transition(tape, 2, 0).tolist() == [0] * 5
    assert reference.distance([1, 0, 1, 0], [0, 0, 0, 0]) == 0.5


# --- all 256 rules, deterministic ----------------------------------------------------------

@pytest.mark.parametrize("rule", range(256))
def test_all_kernels_match_reference_for_every_rule(rule):
    rng = np.random.default_rng(rule)
    for L in EDGE_LENGTHS + (int(rng.integers(3, 65)),):
        tapes = rng.integers(0, 2, (3, L), dtype=np.uint8)
        tapes[0] = 1  # all ones: every left/right neighbour set, exercises the mask
        expected = reference_batch_step(tapes, [rule] * len(tapes))
        words = packed.pack(tapes)
        assert np.array_equal(packed.unpack(packed.step_words(words, rule, L), L), expected)
        assert np.array_equal(packed.unpack(packed.step_words_rules(words, np.full(len(tapes), rule), L), L),
                              expected)
        assert packed.step_word(words[1], rule, L) == words_of(expected[1])
        got = torch_kernel.ca_step(torch.from_numpy(tapes), torch.full((len(tapes),), rule))
        assert np.array_equal(got.numpy(), expected)


def words_of(tape) -> np.uint64:
    return packed.pack(tape)[0]


# --- packed kernel, random L ---------------------------------------------------------------

@SETTINGS
@given(tape_and_length(), rules_st)
def test_packed_step_matches_reference(tape_L, rule):
    tape, L = tape_L
    word = packed.pack(tape)
    expected = reference.ca_step(tape, rule)
    assert packed.step_word(word[0], rule, L) == words_of(expected)
    assert np.array_equal(packed.unpack(packed.step_words(word, rule, L), L)[0], expected)


@SETTINGS
@given(tape_and_length(), rules_st, st.data())
def test_packed_transition_word_matches_reference(tape_L, rule, data):
    tape, L = tape_L
    action = data.draw(st.integers(0, L - 1))
    masks = packed.rule_masks(rule)
    got = packed.transition_word(packed.pack(tape)[0], action, masks, L, np.uint64(packed.length_mask(L)))
    assert np.array_equal(packed.unpack(got, L)[0], reference.transition(tape, action, rule))


@SETTINGS
@given(lengths, st.data())
def test_packed_mixed_rules_match_reference(L, data):
    n = data.draw(st.integers(1, 12))
    tapes = np.stack([bits(data.draw(st.integers(0, 2**L - 1)), L) for _ in range(n)])
    rules = np.array(data.draw(st.lists(rules_st, min_size=n, max_size=n)), dtype=np.int64)
    got = packed.unpack(packed.step_words_rules(packed.pack(tapes), rules, L), L)
    assert np.array_equal(got, reference_batch_step(tapes, rules))


@SETTINGS
@given(tape_and_length(), rules_st, st.integers(0, 12))
def test_packed_evolve_matches_repeated_reference_steps(tape_L, rule, steps):
    tape, L = tape_L
    expected = reference.rollout(tape, rule, steps)[-1]
    got = packed.evolve_words(packed.pack(tape), rule, L, steps)
    assert np.array_equal(packed.unpack(got, L)[0], expected)


@pytest.mark.parametrize("L", [5, 32, 64])
def test_packed_evolve_across_block_boundaries(L):
    # more tapes than one evolve block, and a ragged last block
    rng = np.random.default_rng(L)
    n = 2 * packed.EVOLVE_BLOCK + 7
    words = packed.pack(rng.integers(0, 2, (n, L), dtype=np.uint8))
    for rule in (30, 110, 90, 184):
        expected = words
        for _ in range(9):
            expected = packed.step_words(expected, rule, L)
        assert np.array_equal(packed.evolve_words(words, rule, L, 9), expected)


@pytest.mark.parametrize("L", [3, 63, 64])
def test_packed_masks_at_length_edges(L):
    assert int(packed.length_mask(L)) == (1 << L) - 1
    top = np.zeros(L, dtype=np.uint8)
    top[L - 1] = 1
    word = packed.pack(top)
    # rule 16 shifts right with wrap: the top cell moves to cell 0; rule 2 shifts left
    assert int(packed.step_word(word[0], 16, L)) == 1
    assert int(packed.step_word(word[0], 2, L)) == 1 << (L - 2)
    # a flip of the top cell and no bits above L after any step
    masks = packed.rule_masks(255)
    assert int(packed.transition_word(np.uint64(0), L - 1, masks, L, np.uint64(packed.length_mask(L)))) == (1 << L) - 1
    assert int(packed.step_word(np.uint64((1 << L) - 1), 255, L)) == (1 << L) - 1


@SETTINGS
@given(tape_and_length())
def test_pack_unpack_round_trip(tape_L):
    tape, L = tape_L
    word = packed.pack(tape)
    assert word.dtype == np.uint64
    assert int(word[0]) == int(sum(int(c) << i for i, c in enumerate(tape)))
    assert np.array_equal(packed.unpack(word, L)[0], tape)
    assert int(packed.popcount(word[0])) == int(tape.sum())


def test_pack_rejects_bad_length():
    with pytest.raises(ValueError, match="3..64"):
        packed.pack(np.zeros((2, 65), dtype=np.uint8))


# --- torch kernel ---------------------------------------------------------------------------

@SETTINGS
@given(lengths, st.data())
def test_torch_flip_and_step_match_reference(L, data):
    n = data.draw(st.integers(1, 10))
    tapes = np.stack([bits(data.draw(st.integers(0, 2**L - 1)), L) for _ in range(n)])
    rules = data.draw(st.lists(rules_st, min_size=n, max_size=n))
    actions = data.draw(st.lists(st.integers(0, L - 1), min_size=n, max_size=n))
    t_tapes, t_rules, t_actions = torch.from_numpy(tapes), torch.tensor(rules), torch.tensor(actions)

    flipped = torch_kernel.flip(t_tapes, t_actions)
    assert np.array_equal(flipped.numpy(), np.stack([reference.flip(t, a) for t, a in zip(tapes, actions)]))
    assert np.array_equal(t_tapes.numpy(), tapes)  # flip returns a new tensor
    expected = np.stack([reference.transition(t, a, z) for t, a, z in zip(tapes, actions, rules)])
    assert np.array_equal(torch_kernel.transition(t_tapes, t_actions, t_rules).numpy(), expected)

    # the in-place padded form used by the environment
    padded = torch_kernel.pad_periodic(t_tapes)
    torch_kernel.flip_padded_(padded, t_actions, torch_kernel.flat_row_offsets(n, L))
    torch_kernel.step_padded_(padded, torch_kernel.rule_plane(t_rules, L), torch.empty(n, L, dtype=torch.uint8))
    assert np.array_equal(torch_kernel.interior(padded).numpy(), expected)


def test_torch_kernel_repeated_steps_match_reference_rollout():
    rng = np.random.default_rng(3)
    L, rules = 13, torch.tensor([30, 110, 90, 184, 54])
    tapes = rng.integers(0, 2, (5, L), dtype=np.uint8)
    state = torch.from_numpy(tapes)
    for _ in range(20):
        state = torch_kernel.ca_step(state, rules)
    expected = np.stack([reference.rollout(t, int(z), 20)[-1] for t, z in zip(tapes, rules)])
    assert np.array_equal(state.numpy(), expected)
