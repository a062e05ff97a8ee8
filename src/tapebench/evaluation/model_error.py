"""Prediction error of a learned world model on ID and OOD rules (docs/protocol.md#model-error).

Every method registered with `world_model=True` provides `world_model_rollout` (agent contract in
`tapebench.methods.contract`). Its error is measured on probe trajectories that are the same for every model,
seed and checkpoint: each episode of the protocol's common-random-number set starts from its own
initial tape and is driven by uniformly random cells from a counter-based stream of the episode's
identity (`step_keys` under PROBE_DOMAIN) through the true rule, `context + depth` steps long. The
model sees the first `context` transitions (what it may infer the rule from), then predicts the next
`depth` tapes open loop from the actions alone. The error at depth d is the fraction of cells whose
predicted bit (probability > 0.5) differs from the true cell; depth 1 is the one-step error.

A trajectory stops counting where the real episode would have ended: a depth whose prediction starts
from a tape at the goal (the episode already terminated) is excluded, and so is an episode that reaches
the goal within its context. `n` records how many episodes each value averages.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from tapebench.ca import grid_packed, table_kernel
from tapebench.ca.packed import pack, step_words_rules, unpack
from tapebench.defaults import MODEL_ERROR_CONTEXT, MODEL_ERROR_DEPTH
from tapebench.episodes.sets import EpisodeSet
from tapebench.episodes.streams import step_keys, uniform_below
from tapebench.grid_rules import GridFamily
from tapebench.schemas import MODEL_ERROR_PROBE_COLUMNS
from tapebench.validation import grid_side

PROBE_DOMAIN = 0x50524F   # separates the probe actions from the other per-episode streams


def probe_trajectories(episodes: EpisodeSet, steps: int, goal=None) -> tuple[np.ndarray, np.ndarray]:
    """(N, steps+1, L) uint8 true tapes and (N, steps) int64 uniformly random actions of the probe. Episodes of the
    2D grid family step their n x n torus (cells row-major, L = n * n) under their grid rule; tapes of a k-colour
    family increment the acted cell mod k and update under their rule's table."""
    L = episodes.tapes.shape[1]
    rules, family = episodes.rules.astype(np.int64), episodes.family
    tapes = np.empty((len(episodes), steps + 1, L), dtype=np.uint8)
    tapes[:, 0] = episodes.tapes
    actions = np.empty((len(episodes), steps), dtype=np.int64)
    for t in range(steps):                      # the probe's actions do not depend on the tapes
        actions[:, t] = uniform_below(step_keys(episodes.keys, t, PROBE_DOMAIN), L)
    if isinstance(family, GridFamily):
        n, moore = grid_side(L), family.neighbours == 8
        words = grid_packed.pack(episodes.tapes.reshape(-1, n, n))
        for t in range(steps):
            words = grid_packed.transition_words(words, actions[:, t], rules, n, moore)
            tapes[:, t + 1] = grid_packed.unpack(words, n).reshape(-1, L)
    elif not family.elementary:
        distinct, index = np.unique(rules, return_inverse=True)
        tables = family.tables(distinct)
        for t in range(steps):
            tapes[:, t + 1] = table_kernel.transition(tapes[:, t], actions[:, t], tables, index, family.k, family.r)
    else:
        words = pack(episodes.tapes)
        for t in range(steps):
            flipped = words ^ (np.uint64(1) << actions[:, t].astype(np.uint64))
            words = step_words_rules(flipped, rules, L)
            tapes[:, t + 1] = unpack(words, L)
    return tapes, actions


def observations(tapes: np.ndarray, H: int) -> np.ndarray:
    """(N, T, L) tapes -> (N, T, L+1) observations [tape, t/H] as the environment emits them."""
    n, T, L = tapes.shape
    time = np.broadcast_to((np.arange(T, dtype=np.float32) / float(H))[None, :, None], (n, T, 1))
    return np.concatenate([tapes.astype(np.float32), time], axis=2)


def rollout_errors(agent, episodes: EpisodeSet, H: int, *, context: int = MODEL_ERROR_CONTEXT,
                   depth: int = MODEL_ERROR_DEPTH, goal=None, batch_size: int = 1024,
                   device="cpu") -> tuple[np.ndarray, np.ndarray]:
    """Per-episode open-loop errors: (N, depth) float error and (N, depth) bool valid mask."""
    check_probe(context, depth)
    goal = np.zeros(episodes.tapes.shape[1], dtype=np.uint8) if goal is None else np.asarray(goal, np.uint8)
    tapes, actions = probe_trajectories(episodes, context + depth)
    obs = observations(tapes, H)
    at_goal = (tapes == goal).all(axis=2)                      # (N, T+1)
    ended_before = np.cumsum(at_goal, axis=1) > 0              # the episode has terminated at or before t
    valid = ~ended_before[:, context:context + depth]          # prediction of step k starts from tape k-1
    errors = np.empty((len(episodes), depth), dtype=np.float64)
    for start in range(0, len(episodes), batch_size):
        rows = slice(start, start + batch_size)
        with torch.inference_mode():
            probs = agent.world_model_rollout(torch.as_tensor(obs[rows, :context + 1], device=device),
                                              torch.as_tensor(actions[rows, :context], device=device),
                                              torch.as_tensor(actions[rows, context:], device=device))
        probs = _checked(probs, (tapes[rows].shape[0], depth, tapes.shape[2]))
        predicted = probs > 0.5
        errors[rows] = (predicted != tapes[rows, context + 1:].astype(bool)).mean(axis=2)
    return errors, valid


def _checked(probs, shape: tuple) -> np.ndarray:
    array = probs.detach().float().cpu().numpy() if isinstance(probs, torch.Tensor) else np.asarray(probs)
    if array.shape != shape:
        raise ValueError(f"world_model_rollout returned shape {array.shape}, expected {shape} "
                         f"(episodes, depth, L)")
    if not np.all((array >= 0) & (array <= 1)):
        raise ValueError("world_model_rollout must return probabilities in [0, 1]")
    return array


def check_probe(context: int, depth: int) -> None:
    for name, value, low in (("context", context, 0), ("depth", depth, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"model-error {name} must be an integer >= {low}, got {value!r}")


def error_table(errors: np.ndarray, valid: np.ndarray, episodes: EpisodeSet, side: str,
                rule_types: dict[int, str]) -> pd.DataFrame:
    """Per (rule, depth): mean error over the valid episodes and their count."""
    depth = errors.shape[1]
    frame = pd.DataFrame({"rule": np.repeat(episodes.rules, depth), "depth": np.tile(np.arange(1, depth + 1),
                                                                                      len(episodes)),
                          "error": errors.reshape(-1), "valid": valid.reshape(-1)})
    frame = frame[frame["valid"]]
    table = frame.groupby(["rule", "depth"], sort=True)["error"].agg(["mean", "size"]).reset_index()
    table = table.rename(columns={"mean": "error", "size": "n"})
    table.insert(0, "side", side)
    table.insert(2, "type", [rule_types.get(int(z), "") for z in table["rule"]])
    return table[MODEL_ERROR_PROBE_COLUMNS].astype({"rule": "int64", "depth": "int64", "error": "float64", "n": "int64"})


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per (side, depth): the episode-weighted mean error over rules (what a run's one number is)."""
    weighted = table.assign(total=table["error"] * table["n"])
    out = weighted.groupby(["side", "depth"], sort=True)[["total", "n"]].sum().reset_index()
    out["error"] = out["total"] / out["n"]
    return out[["side", "depth", "error", "n"]]
