"""Identifiability report: the exact count of cyclic tapes showing all 8 neighbourhoods (brute force and a
hand-checked case), the empirical one-step fraction against that closed form, hand-checked episodes, the
CLI and the rendered table."""
from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest

from tapebench.cli import main
from tapebench.episodes.sets import EpisodeSet, episode_set
from tapebench.episodes.streams import candidate_action, step_key, step_keys
from tapebench.health.identifiability import (IDENT_DOMAIN, all_windows_count, identification_steps,
                                              one_step_probability, summary_rows)


def _brute_count(L):
    n = 0
    for bits in itertools.product((0, 1), repeat=L):
        windows = {4 * bits[i - 2] + 2 * bits[i - 1] + bits[i] for i in range(L)}
        n += len(windows) == 8
    return n


def test_all_windows_count_matches_brute_force_and_the_de_bruijn_hand_case():
    assert [all_windows_count(L) for L in range(1, 8)] == [0] * 7     # 8 windows need 8 cells
    # L = 8: each window exactly once = a de Bruijn cycle B(2, 3); there are 2 (00010111 and 00011101),
    # each with 8 rotations
    assert all_windows_count(8) == 16
    for L in range(8, 15):
        assert all_windows_count(L) == _brute_count(L), L
    assert 0.83 < one_step_probability(32) < 0.845


def _first_action(key, L, action_seed=0):
    k = step_keys(np.array([key], np.uint64), IDENT_DOMAIN, action_seed)[0]
    return int(candidate_action(np.uint64(step_key(k, 0)), 0, L))


def _episodes(rule, tapes, keys):
    tapes = np.asarray(tapes, dtype=np.uint8)
    n = len(tapes)
    return EpisodeSet(np.full(n, rule), np.arange(n), tapes, "rules", 0, np.asarray(keys, dtype=np.uint64))


def test_hand_checked_episodes():
    L, key = 8, 12345
    a = _first_action(key, L)
    de_bruijn = np.array([0, 0, 0, 1, 0, 1, 1, 1], dtype=np.uint8)
    start = de_bruijn.copy()
    start[a] ^= 1                                  # the first action turns it into the de Bruijn tape
    steps, length = identification_steps(_episodes(30, [start], [key]), 8)
    assert steps.tolist() == [1] and length.tolist() == [1]
    # rule 0 solves any tape in one step: the episode ends before the rule can be identified (H + 1)
    # unless the first post-action tape already shows every neighbourhood
    steps, length = identification_steps(_episodes(0, [start, np.eye(8, dtype=np.uint8)[a]], [key, key]), 8)
    assert steps.tolist() == [1, 9] and length.tolist() == [1, 1]
    # rule 204 (identity) from a tape with a single 1 after the flip: only 000, 001, 010, 100 ever appear
    # while the tape stays sparse -> not identified within a short horizon
    start = np.zeros(L, np.uint8)
    start[(a + 3) % L] = 1                          # the flip adds a second, distant 1
    steps, _ = identification_steps(_episodes(204, [start], [key]), 1)
    assert steps.tolist() == [2]


def test_one_step_fraction_matches_the_closed_form_within_binomial_tolerance():
    L, H = 32, 4
    episodes = episode_set(list(range(256)), 20, L, eval_seed=7, side="rules")
    steps, _ = identification_steps(episodes, H, action_seed=3)
    p = one_step_probability(L)
    n = len(steps)
    got = float(np.mean(steps == 1))
    assert abs(got - p) < 4 * math.sqrt(p * (1 - p) / n), (got, p)


def test_steps_are_a_pure_function_of_the_episode_and_the_action_seed():
    episodes = episode_set([30, 110, 0, 204, 4], 8, 16, eval_seed=2, side="test", key=4)
    a, _ = identification_steps(episodes, 16, action_seed=1)
    b, _ = identification_steps(episodes.subset(slice(8, 24)), 16, action_seed=1)
    assert np.array_equal(a[8:24], b)
    c, _ = identification_steps(episodes, 16, action_seed=2)
    assert not np.array_equal(a, c)
    assert ((a >= 1) & (a <= 17)).all()


def test_cli_writes_per_episode_rows_and_the_per_type_table(tmp_path):
    features = tmp_path / "features.parquet"
    split = tmp_path / "main.json"
    assert main(["features", "--out", str(features), "--trials", "8", "--steps", "16"]) == 0
    assert main(["split", "--features", str(features), "--name", "main", "--test-size", "10", "--out", str(split)]) == 0
    out = tmp_path / "ident.parquet"
    assert main(["identifiability", "--split", str(split), "--L", "16", "--H", "8", "--episodes-per-rule", "2",
                 "--eval-seed", "5", "--out", str(out)]) == 0
    frame = pd.read_parquet(out)
    assert len(frame) == 256 * 2 and set(frame["side"]) == {"train", "test"}
    assert set(frame.columns) >= {"rule", "side", "type", "steps"}
    assert frame["steps"].between(1, 9).all() and (frame["identified"] == (frame["steps"] <= 8)).all()
    test_rules = set(json.loads(split.read_text())["test"])
    assert set(frame.loc[frame["side"] == "test", "rule"]) == test_rules
    tex = tmp_path / "ident.tex"
    assert main(["render", "identifiability", "--identifiability", str(out), "--out", str(tex)]) == 0
    text = tex.read_text()
    rows = {r["type"]: r for r in summary_rows(frame)}
    assert "\\begin{tabular}" in text and "All & 256 & 512" in text
    for label, key in (("Stable", "stable"), ("Periodic", "periodic"), ("Chaotic", "chaotic")):
        if key in rows:
            r = rows[key]
            assert f"{label} & {r['rules']} & {r['episodes']} & {r['mean']:.2f} & {r['median']:.1f}" in text
    # a file of another kind is refused with its writer's name
    assert main(["render", "identifiability", "--identifiability", str(features), "--out", str(tex)]) == 2
