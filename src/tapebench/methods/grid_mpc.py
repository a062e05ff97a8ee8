"""True-dynamics random-shooting MPC on grids (docs/protocol.md#grid-oracles): `methods.mpc` lifted to n × n.

The budget semantics are the tape planner's (`methods.mpc`, `MPCConfig`): at every step it draws `candidates`
random action sequences of length `horizon` (truncated at the episode's remaining steps), rolls each forward
with the episode's true rule, scores it by its return under the episode's own reward — minus the live-cell
count after each step, the success bonus × n² at the first all-zero grid, nothing after it (the return × n²,
exact in floats) — and executes the first action of the best candidate (ties: lowest candidate index), then
replans. A candidate action is a cell index in 0..n² − 1 (flip cell (a // n, a mod n)), drawn by the same
counter-based stream (`episodes.streams.candidate_action` with n² cells): a pure function of (planner seed,
episode key, step, candidate, depth), so results do not depend on batching or threads.

`GridMPCPolicy` is the same planner as an evaluation policy: the registry's `mpc` plays grid episodes through
the runner with it (`make_policy`, the entry's `grid_policy`). Grids of side n ≤ 8 are one uint64 word each
(`ca.grid_packed`); the kernels run over episodes in parallel.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from tapebench import defaults
from tapebench.ca.grid_packed import ROW_STRIDE, check_packed_size, masks, pack, step_word_masks
from tapebench.ca.grid_reference import check_grids
from tapebench.ca.packed import popcount
from tapebench.episodes.accounting import add_step, results_dict
from tapebench.episodes.streams import U64, candidate_action, episode_keys, step_key
from tapebench.grid_rules import GridFamily
from tapebench.methods.mpc import MPCConfig, MPCMethodConfig
from tapebench.validation import check_horizon, check_success_bonus, grid_side


@nb.njit(cache=True, inline="always")
def flip_word(w, a, n):
    """Flip cell (a // n, a mod n) of a packed grid."""
    return w ^ (U64(1) << U64(ROW_STRIDE * (a // n) + a % n))


@nb.njit(cache=True)
def _score_candidates(s, rule, k_t, depth, n, moore, score_bonus, horizon, candidates, grids, score, alive):
    """score[c] = n² × return of candidate c (`depth` steps from grid s under `rule`), exact in floats."""
    valid, col0, last = masks(n)
    cells = n * n
    for c in range(candidates):
        grids[c] = s
        score[c] = 0.0
        alive[c] = 1.0
    for k in range(depth):
        n_alive = 0
        for c in range(candidates):
            a = candidate_action(k_t, c * horizon + k, cells)
            w = step_word_masks(flip_word(grids[c], a, n), rule, n, moore, valid, col0, last)
            grids[c] = w
            live = np.float64(popcount(w))
            hit = live == 0.0
            score[c] += alive[c] * (score_bonus if hit else -live)
            alive[c] = 0.0 if hit else alive[c]
            n_alive += alive[c] > 0.0
        if n_alive == 0:
            break


@nb.njit(cache=True)
def _plan_action(s, rule, k_t, depth, n, moore, score_bonus, horizon, candidates, grids, score, alive):
    """First action of the best of `candidates` random sequences of `depth` steps from grid s (one decision)."""
    _score_candidates(s, rule, k_t, depth, n, moore, score_bonus, horizon, candidates, grids, score, alive)
    best = 0
    for c in range(1, candidates):
        if score[c] > score[best]:
            best = c
    return candidate_action(k_t, best * horizon, n * n)


@nb.njit(cache=True, parallel=True)
def _plan_episodes(starts, rules, keys, n, moore, H, bonus32, score_bonus, horizon, candidates):
    count = starts.shape[0]
    metrics = np.zeros((count, 4), dtype=np.float64)
    steps = np.zeros(count, dtype=np.int64)
    actions = np.full((count, H), -1, dtype=np.int16)
    valid, col0, last = masks(n)
    for i in nb.prange(count):
        grids = np.empty(candidates, dtype=np.uint64)
        score = np.empty(candidates, dtype=np.float64)
        alive = np.empty(candidates, dtype=np.float64)
        s = starts[i]
        for t in range(H):
            a = _plan_action(s, rules[i], step_key(keys[i], t), min(horizon, H - t), n, moore, score_bonus, horizon,
                             candidates, grids, score, alive)
            s = step_word_masks(flip_word(s, a, n), rules[i], n, moore, valid, col0, last)
            actions[i, t] = a
            live = popcount(s)
            add_step(metrics, i, live, n * n, bonus32)
            steps[i] = t + 1
            if live == 0:
                break
    return metrics, steps, actions


@nb.njit(cache=True)
def account_steps(metrics, steps, actions_log, states, actions, active, t, cells, bonus32):
    """Account step t of every active episode whose new packed grid is states[i] (`episodes.accounting`)."""
    for i in range(states.shape[0]):
        if active[i]:
            live = popcount(states[i])
            add_step(metrics, i, live, cells, bonus32)
            actions_log[i, t] = actions[i]
            steps[i] = t + 1


def check_batch(starts, rules, family: GridFamily, keys):
    grids = check_grids(starts, what="start grid")
    grids = grids[None] if grids.ndim == 2 else grids
    n = check_packed_size(grids.shape[-1])
    if not isinstance(family, GridFamily):
        raise ValueError(f"family must be a GridFamily (MOORE or VON_NEUMANN), got {family!r}")
    ids = np.asarray(family.check_rules(rules), dtype=np.int64)
    if len(ids) != len(grids):
        raise ValueError(f"rules must give one rule per start grid: {len(grids)} grids, {len(ids)} rules")
    keys = np.arange(len(grids), dtype=np.uint64) if keys is None else np.asarray(keys, dtype=np.uint64)
    if keys.shape != (len(grids),):
        raise ValueError(f"keys must give one 64-bit episode key per start grid ({len(grids)}), got shape {keys.shape}")
    if (popcount_np(pack(grids)) == 0).any():
        raise ValueError("a start grid is the all-zero goal; episodes start from a non-goal grid")
    return pack(grids), ids, n, keys


def popcount_np(words: np.ndarray) -> np.ndarray:
    """Live cells of packed grids (numpy)."""
    return np.unpackbits(np.asarray(words, dtype=np.uint64).view(np.uint8).reshape(-1, 8), axis=1).sum(axis=1)


def run_grid_mpc(starts, rules, family: GridFamily, H: int, config: MPCConfig = MPCConfig(), *, keys=None,
                 success_bonus: float = defaults.SUCCESS_BONUS) -> dict:
    """Play one grid episode per start grid (N, n, n), n ≤ 8, under its rule (N rules of `family`: notation,
    `GridRule`s or ids) with random-shooting MPC; `keys` (N uint64) are the episodes' identity keys (default
    0..N − 1), mixed with `config.seed` into the planner keys. Returns per-episode arrays: success, final_dist,
    auc_dist, return, steps and the action log (N, H), −1 after the end."""
    H = check_horizon(H)
    success_bonus = check_success_bonus(success_bonus)
    words, ids, n, keys = check_batch(starts, rules, family, keys)
    metrics, steps, actions = _plan_episodes(words, ids, episode_keys(keys, config.seed), n,
                                             family.neighbours == 8, H, np.float32(success_bonus),
                                             float(success_bonus) * n * n, int(config.horizon),
                                             int(config.candidates))
    return results_dict(metrics, steps, actions, H)


def plan_action(grid, rule, family: GridFamily, step_key_word: int, depth: int, config: MPCConfig = MPCConfig(),
                success_bonus: float = defaults.SUCCESS_BONUS) -> tuple[int, np.ndarray]:
    """One decision from one grid (n, n) under step key `step_key_word` with `depth` steps of lookahead:
    (the action, the n²-scaled scores of the candidates). For tests and inspection."""
    words, ids, n, _ = check_batch(np.asarray(grid)[None], [rule], family, None)
    candidates, horizon = int(config.candidates), int(config.horizon)
    score = np.empty(candidates, dtype=np.float64)
    action = _plan_action(words[0], ids[0], U64(step_key_word), int(depth), n, family.neighbours == 8,
                          float(success_bonus) * n * n, horizon, candidates, np.empty(candidates, dtype=np.uint64),
                          score, np.empty(candidates, dtype=np.float64))
    return int(action), score


@nb.njit(cache=True, parallel=True)
def _plan_actions(states, rules, keys, active, t, H, n, moore, score_bonus, horizon, candidates):
    """One decision for every active episode at step t from its packed grid (inactive rows get action 0)."""
    count = states.shape[0]
    out = np.zeros(count, dtype=np.int64)
    depth = min(horizon, H - t)
    for i in nb.prange(count):
        if active[i]:
            grids = np.empty(candidates, dtype=np.uint64)
            score = np.empty(candidates, dtype=np.float64)
            alive = np.empty(candidates, dtype=np.float64)
            out[i] = _plan_action(states[i], rules[i], step_key(keys[i], t), depth, n, moore, score_bonus, horizon,
                                  candidates, grids, score, alive)
    return out


class GridMPCPolicy:
    """Grid MPC as an evaluation policy of the runner (`mpc`'s policy when the episodes are grids): plays what
    `run_grid_mpc` plays on the same episodes (tested), one decision per step for every episode still running."""

    def __init__(self, family: GridFamily, config: MPCConfig = MPCConfig()):
        if not isinstance(family, GridFamily):
            raise ValueError(f"family must be a GridFamily (MOORE or VON_NEUMANN), got {family!r}")
        self.family, self.config = family, config

    def begin(self, batch) -> None:
        if batch.rules is None:
            raise ValueError("MPC is a reference method and needs each episode's true rule "
                             "(run it with reveal_rules=True)")
        if batch.goal is not None and np.asarray(batch.goal).any():
            raise ValueError("grid MPC plays toward the all-zero grid; the batch has another goal")
        self.n = check_packed_size(grid_side(batch.L))
        self.H, self.t, self.device = batch.H, 0, batch.device
        self.rules = np.asarray(self.family.check_rules(np.asarray(batch.rules).tolist()) if len(batch.rules)
                                else [], dtype=np.int64)
        self.keys = episode_keys(np.asarray(batch.keys, dtype=np.uint64), self.config.seed)
        self.score_bonus = float(batch.success_bonus) * batch.L
        self.active = np.ones(len(self.rules), dtype=np.bool_)

    def act(self, obs):
        # torch is heavy: loaded only when this runs
        import torch

        cells = obs[:, :self.n * self.n].to(torch.uint8).cpu().numpy().reshape(-1, self.n, self.n)
        actions = _plan_actions(pack(cells), self.rules, self.keys, self.active, self.t, self.H, self.n,
                                self.family.neighbours == 8, self.score_bonus, int(self.config.horizon),
                                int(self.config.candidates))
        return torch.from_numpy(actions).to(self.device)

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        self.active &= ~(terminated | truncated).cpu().numpy()
        self.t += 1


def make_policy(config: MPCMethodConfig, context) -> GridMPCPolicy:
    """`mpc` on the 2D grid family (its registry entry's `grid_policy`)."""
    return GridMPCPolicy(context.family, MPCConfig(horizon=config.horizon, candidates=config.candidates,
                                                   seed=context.seed))
