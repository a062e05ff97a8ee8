"""Identifiability of the latent rule (benchmark health report): how many observed transitions until the
rule tables consistent with them are a single rule (docs/protocol.md#identifiability).

For every rule of both sides of a split, on the protocol's common-random-number episodes (the initial
tapes every method plays), a uniformly random action each step (a counter-based stream of the episode
identity and `action_seed`), the true rule's update, and the episode's own termination (success ends it).
Each transition pins the table bits of the neighbourhoods its post-action tape shows
(`methods.identify_then_plan.pinned_bits`); `steps` is the number of transitions after which all 8 bits
are pinned, H + 1 when that does not happen within the episode (H steps, or an earlier success).

After one step the rule is identified exactly when the post-action tape shows all 8 neighbourhoods
cyclically; the tape is uniform (a uniform tape flipped at a uniform cell), so that probability is
`all_windows_count(L) / (2^L - 1)` (`one_step_probability`, ~0.84 at L = 32).
"""
from __future__ import annotations

import numba as nb
import numpy as np
import pandas as pd

from tapebench.ca.packed import length_mask, pack, popcount, step_word_rule
from tapebench.episodes.sets import EpisodeSet
from tapebench.episodes.streams import candidate_action, step_key, step_keys
from tapebench.evaluation.protocol import protocol_episodes
from tapebench.methods.identify_then_plan import FULL, pinned_bits
from tapebench.schemas import IDENTIFIABILITY_COLUMNS
from tapebench.utils.io import provenance, write_parquet
from tapebench.validation import check_goal, check_horizon
from tapebench.vocabulary import SPLIT_SIDES

U64 = np.uint64
IDENT_DOMAIN = 0x494446   # separates the random-action stream from the methods' streams
TYPE_ORDER = ("stable", "periodic", "chaotic")


def all_windows_count(L: int) -> int:
    """Number of cyclic binary strings of length L in which all 8 windows of 3 cells occur (exact, DP over
    the de Bruijn graph: the first two cells fixed, then (last two cells, windows seen) states)."""
    if L < 3:
        return 0
    total = 0
    for first in range(4):                   # cells 0, 1
        counts = {(first, 0): 1}             # (last two cells, set of windows seen as a bit mask)
        for _ in range(2, L):
            nxt: dict = {}
            for (last, seen), c in counts.items():
                for bit in (0, 1):
                    window = (last << 1) | bit   # (x[i-2], x[i-1], x[i])
                    key = (window & 3, seen | (1 << window))
                    nxt[key] = nxt.get(key, 0) + c
            counts = nxt
        for (last, seen), c in counts.items():
            # the two wrap-around windows: (x[L-2], x[L-1], x[0]) and (x[L-1], x[0], x[1])
            w1 = (last << 1) | (first >> 1)
            w2 = ((last & 1) << 2) | first
            if seen | (1 << w1) | (1 << w2) == 0xFF:
                total += c
    return total


def one_step_probability(L: int) -> float:
    """P(identified after one transition) for a uniform non-goal start tape and a uniform action: every tape
    with all 8 windows has weight >= 2, so it arises from exactly L (start, action) pairs with a non-zero
    start, giving count / (2^L - 1)."""
    return all_windows_count(L) / (2 ** L - 1)


@nb.njit(cache=True, parallel=True)
def _identify(starts, rules, keys, L, H, goal):
    n = starts.shape[0]
    steps = np.full(n, H + 1, dtype=np.int64)
    length = np.zeros(n, dtype=np.int64)
    mask = length_mask(L)
    for i in nb.prange(n):
        s = starts[i]
        known = 0
        for t in range(H):
            a = candidate_action(step_key(keys[i], t), 0, L)
            x = s ^ (U64(1) << U64(a))
            s = step_word_rule(x, rules[i], L, mask)
            km, kv, ok = pinned_bits(x, s, L)
            known |= km
            length[i] = t + 1
            if known == FULL:
                steps[i] = t + 1
                break
            if popcount(s ^ goal) == 0:
                break
    return steps, length


def identification_steps(episodes: EpisodeSet, H: int, *, goal=None, action_seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(steps until identified, H + 1 if not; transitions observed) per episode under uniformly random actions."""
    H = check_horizon(H)
    L = episodes.tapes.shape[1]
    goal_word = pack(check_goal(goal, L))[0]
    keys = step_keys(np.asarray(episodes.keys, dtype=np.uint64), IDENT_DOMAIN, int(action_seed))
    return _identify(pack(episodes.tapes), episodes.rules.astype(np.int64), keys, L, H, goal_word)


def identifiability_frame(split, *, L: int, H: int, episodes_per_rule: int, eval_seed: int, action_seed: int = 0,
                          splits_dir=None) -> pd.DataFrame:
    """Per-episode rows (columns IDENTIFIABILITY_COLUMNS) for both sides of a split."""

    kwargs = {} if splits_dir is None else {"splits_dir": splits_dir}
    frames = []
    for side in SPLIT_SIDES:
        episodes, protocol, types = protocol_episodes(L=L, H=H, episodes_per_rule=episodes_per_rule,
                                                      eval_seed=eval_seed, split=split, side=side, **kwargs)
        steps, length = identification_steps(episodes, H, goal=protocol.goal_tape(), action_seed=action_seed)
        frames.append(pd.DataFrame({
            "split": protocol.split, "side": side, "rule": episodes.rules.astype(np.int64),
            "type": [types.get(int(z), "") for z in episodes.rules], "episode": episodes.episodes.astype(np.int64),
            "L": int(L), "H": int(H), "steps": steps, "identified": steps <= H, "episode_steps": length}))
    return pd.concat(frames, ignore_index=True)[list(IDENTIFIABILITY_COLUMNS)]


def write_identifiability(path, split, *, L: int, H: int, episodes_per_rule: int, eval_seed: int,
                          action_seed: int = 0, splits_dir=None) -> pd.DataFrame:

    frame = identifiability_frame(split, L=L, H=H, episodes_per_rule=episodes_per_rule, eval_seed=eval_seed,
                                  action_seed=action_seed, splits_dir=splits_dir)
    config = {"split": str(split), "L": int(L), "H": int(H), "episodes_per_rule": int(episodes_per_rule),
              "eval_seed": int(eval_seed), "action_seed": int(action_seed)}
    write_parquet(path, frame, meta=provenance(config, int(action_seed), table="identifiability",
                                               one_step_probability=one_step_probability(L)))
    return frame


def summary_rows(frame: pd.DataFrame) -> list[dict]:
    """Per operational type (then all): rules, episodes, mean and median steps (H + 1 when not identified),
    fraction identified after one step, fraction not identified within the episode."""
    H = int(frame["H"].iloc[0])
    present = [t for t in TYPE_ORDER if (frame["type"] == t).any()]
    present += sorted(set(frame["type"].astype(str)) - set(TYPE_ORDER))
    groups = [(t, frame[frame["type"] == t]) for t in present] + [("all", frame)]
    rows = []
    for label, g in groups:
        rows.append({"type": label, "rules": int(g["rule"].nunique()), "episodes": int(len(g)),
                     "mean": float(g["steps"].mean()), "median": float(g["steps"].median()),
                     "one_step": float((g["steps"] == 1).mean()), "not_identified": float((g["steps"] > H).mean())})
    return rows
