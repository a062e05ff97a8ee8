"""Bayes filters on grids (docs/protocol.md#grid-oracles): `methods.bayes_filter` lifted to n × n grids, n ≤ 8.

**Over a rule set** (`GridBayesFilter`; the split's training rules, or all 1,024 von Neumann rules): a uniform
prior over the candidates; an observed transition (s, a, s') has per-cell likelihood 1 − ε where the
candidate's prediction F_z(flip(s, a)) matches s' and ε where it does not, so the filter keeps each candidate's
mispredicted-cell count M_z and b(z) ∝ r^(M_z − min M), r = ε / (1 − ε). A rule that reproduces every observed
next grid keeps M_z = 0 and the largest weight.

**Over the whole family** (`GridBayesFilterFull`): a uniform prior over all rules is a product of independent
fair bits, one per table entry T[state, count] (18 Moore entries, 10 von Neumann), and each cell's likelihood
depends on the one entry its (post-flip state, live-neighbour count) reads, so the posterior stays a product:
entry e has seen c1[e] cells become 1 and c0[e] become 0, and P(T[e] = 1) = 1 / (1 + r^(c1[e] − c0[e])).

**Acting** (both, as the tape filter): one-step greedy, the action maximising
    score(a) = −Σ_z b(z) · dist(F_z(flip(s, a))) + β · IG(a),
IG(a) (nats) the entropy of the noise-free predictive distribution of the next grid. For the rule set the
candidates are grouped by predicted grid (the tape filter's canonical summation order, so structurally equal
actions tie exactly). For the factorised posterior both terms are exact sums over cells and entries: the
expected live fraction is Σ_cells P(T[e_cell] = 1) / n², and since the next grid is a one-to-one function of
the entries the post-flip grid reads, IG(a) is the sum of their binary entropies. Ties are broken uniformly at
random from a counter-based word of (seed, episode key, step) (`bayes_filter._pick`).
"""
from __future__ import annotations

import math

import numba as nb
import numpy as np
import torch

from tapebench import defaults
from tapebench.ca.grid_packed import check_packed_size, masks, pack, step_word_masks, transition_words
from tapebench.ca.packed import popcount
from tapebench.episodes.accounting import results_dict
from tapebench.episodes.streams import U64, step_keys
from tapebench.grid_rules import GridFamily
from tapebench.methods.bayes_filter import BAYES_DOMAIN, Config, _pick, _weights, candidate_rules, grouped_terms
from tapebench.methods.grid_mpc import account_steps, check_batch, flip_word
from tapebench.validation import check_horizon, check_success_bonus, grid_side


# ---------------------------------------------------------------------------------------------- rule set

@nb.njit(cache=True)
def _action_scores(s, b, rules, n, moore, beta, scores, igs):
    """scores[a] and IG[a] of every action from grid s under posterior b over candidate `rules`."""
    valid, col0, last = masks(n)
    cells = n * n
    order = np.argsort(b, kind="mergesort")
    live = order[b[order] > 0.0]
    k = live.shape[0]
    wl = b[live]
    rl = rules[live]
    gp = np.empty(k, dtype=np.float64)
    gm = np.empty(k, dtype=np.float64)
    bits = 4
    while (1 << bits) < 4 * k:
        bits += 1
    size = 1 << bits
    slot_key = np.zeros(size, dtype=np.uint64)
    slot_group = np.zeros(size, dtype=np.int64)
    slot_stamp = np.full(size, -1, dtype=np.int64)
    shift = U64(64 - bits)
    for a in range(cells):
        x = flip_word(s, a, n)
        n_groups = 0
        for j in range(k):
            p = step_word_masks(x, rl[j], n, moore, valid, col0, last)
            h = np.int64((p * U64(0x9E3779B97F4A7C15)) >> shift)
            while slot_stamp[h] == a and slot_key[h] != p:
                h = (h + 1) & (size - 1)
            if slot_stamp[h] != a:
                slot_stamp[h], slot_key[h], slot_group[h] = a, p, n_groups
                gp[n_groups] = 0.0
                gm[n_groups] = np.float64(popcount(p))
                n_groups += 1
            gp[slot_group[h]] += wl[j]
        expected, ent = grouped_terms(gp, gm, n_groups)
        igs[a] = ent
        scores[a] = -expected / cells + beta * ent


@nb.njit(cache=True, parallel=True)
def _decide(states, M, active, rules, words, n, moore, log_r, beta):
    count = states.shape[0]
    out = np.zeros(count, dtype=np.int64)
    for i in nb.prange(count):
        if active[i]:
            scores = np.empty(n * n, dtype=np.float64)
            igs = np.empty(n * n, dtype=np.float64)
            _action_scores(states[i], _weights(M[i], log_r), rules, n, moore, beta, scores, igs)
            out[i] = _pick(scores, words[i], n * n)
    return out


@nb.njit(cache=True, parallel=True)
def _update(M, states, actions, next_states, active, rules, n, moore):
    """M[i, z] += mispredicted cells of candidate z on the observed transition of row i."""
    valid, col0, last = masks(n)
    for i in nb.prange(states.shape[0]):
        if active[i]:
            x = flip_word(states[i], actions[i], n)
            for j in range(rules.shape[0]):
                M[i, j] += popcount(step_word_masks(x, rules[j], n, moore, valid, col0, last) ^ next_states[i])


class _Filter:
    """What both filters share: the episode keys, the tie-breaking words and the active rows."""

    def __init__(self, family: GridFamily, n: int, config: Config, seed: int):
        if not isinstance(family, GridFamily):
            raise ValueError(f"family must be a GridFamily (MOORE or VON_NEUMANN), got {family!r}")
        config.check()
        self.family, self.n, self.config, self.seed = family, check_packed_size(n), config, int(seed)
        self.moore = family.neighbours == 8
        self.log_r = math.log(config.epsilon) - math.log1p(-config.epsilon)

    def begin(self, keys) -> None:
        """Start one episode per 64-bit episode key."""
        self.keys = step_keys(np.asarray(keys, dtype=np.uint64), BAYES_DOMAIN, self.seed)
        self.t = 0
        self.active = np.ones(len(self.keys), dtype=np.bool_)
        self._reset(len(self.keys))

    def words(self) -> np.ndarray:
        return step_keys(self.keys, self.t, self.seed)

    def observe(self, states, actions, next_states, done) -> None:
        """Update on the transitions of the active rows (packed grids), then retire the rows that ended."""
        self._update(np.asarray(states, dtype=np.uint64), np.asarray(actions, dtype=np.int64),
                     np.asarray(next_states, dtype=np.uint64))
        self.active &= ~np.asarray(done, dtype=np.bool_)
        self.t += 1


class GridBayesFilter(_Filter):
    """The filter over a finite rule set of one family (ids, notation or `GridRule`s)."""

    def __init__(self, candidates, family: GridFamily, n: int, config: Config = Config(), seed: int = 0):
        super().__init__(family, n, config, seed)
        self.rules = np.asarray(sorted(set(family.check_rules(candidates))), dtype=np.int64)

    def _reset(self, count: int) -> None:
        self.M = np.zeros((count, len(self.rules)), dtype=np.int64)

    def posterior(self) -> np.ndarray:
        """(N, candidates) posterior of every row, candidates in `self.rules` order."""
        w = np.exp((self.M - self.M.min(axis=1, keepdims=True)) * self.log_r)
        return w / w.sum(axis=1, keepdims=True)

    def action_scores(self, state, row: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(score, IG) of every action from one packed grid under row `row`'s posterior (for tests, inspection)."""
        scores, igs = np.empty(self.n * self.n), np.empty(self.n * self.n)
        _action_scores(U64(state), _weights(self.M[row], self.log_r), self.rules, self.n, self.moore,
                       float(self.config.beta), scores, igs)
        return scores, igs

    def act(self, states) -> np.ndarray:
        return _decide(np.asarray(states, dtype=np.uint64), self.M, self.active, self.rules, self.words(), self.n,
                       self.moore, self.log_r, float(self.config.beta))

    def _update(self, states, actions, next_states) -> None:
        _update(self.M, states, actions, next_states, self.active, self.rules, self.n, self.moore)


# ---------------------------------------------------------------------------------------------- whole family

@nb.njit(cache=True)
def _entries(x, n, dr, dc, m1, out):
    """out[cell] = the table entry state·(m + 1) + count that cell reads from packed grid x."""
    for r in range(n):
        for c in range(n):
            count = 0
            for q in range(dr.shape[0]):
                rr, cc = (r + dr[q]) % n, (c + dc[q]) % n
                count += np.int64((x >> U64(8 * rr + cc)) & U64(1))
            out[r * n + c] = np.int64((x >> U64(8 * r + c)) & U64(1)) * m1 + count


@nb.njit(cache=True)
def _entry_probabilities(C, log_r):
    """P(T[e] = 1) = 1 / (1 + r^(c1 − c0)) from the counts C[e] = (c0, c1)."""
    p = np.empty(C.shape[0], dtype=np.float64)
    for e in range(C.shape[0]):
        p[e] = 1.0 / (1.0 + math.exp(np.float64(C[e, 1] - C[e, 0]) * log_r))
    return p


@nb.njit(cache=True)
def _factorised_scores(s, C, n, dr, dc, m1, log_r, beta, scores, igs):
    p = _entry_probabilities(C, log_r)
    h = np.zeros(p.shape[0], dtype=np.float64)
    for e in range(p.shape[0]):
        if 0.0 < p[e] < 1.0:
            h[e] = -p[e] * math.log(p[e]) - (1.0 - p[e]) * math.log1p(-p[e])
    cells = n * n
    ent = np.empty(cells, dtype=np.int64)
    seen = np.zeros(p.shape[0], dtype=np.bool_)
    for a in range(cells):
        _entries(flip_word(s, a, n), n, dr, dc, m1, ent)
        seen[:] = False
        expected = 0.0
        for cell in range(cells):
            expected += p[ent[cell]]
        ig = 0.0
        for e in range(p.shape[0]):     # distinct entries in a fixed order: equal sets tie exactly
            for cell in range(cells):
                if ent[cell] == e:
                    seen[e] = True
                    break
            if seen[e]:
                ig += h[e]
        igs[a] = ig
        scores[a] = -expected / cells + beta * ig


@nb.njit(cache=True, parallel=True)
def _decide_full(states, C, active, words, n, dr, dc, m1, log_r, beta):
    count = states.shape[0]
    out = np.zeros(count, dtype=np.int64)
    for i in nb.prange(count):
        if active[i]:
            scores = np.empty(n * n, dtype=np.float64)
            igs = np.empty(n * n, dtype=np.float64)
            _factorised_scores(states[i], C[i], n, dr, dc, m1, log_r, beta, scores, igs)
            out[i] = _pick(scores, words[i], n * n)
    return out


@nb.njit(cache=True)
def _update_full(C, states, actions, next_states, active, n, dr, dc, m1):
    """C[i, e, v] += cells of row i that read entry e and became v."""
    ent = np.empty(n * n, dtype=np.int64)
    for i in range(states.shape[0]):
        if active[i]:
            _entries(flip_word(states[i], actions[i], n), n, dr, dc, m1, ent)
            for r in range(n):
                for c in range(n):
                    v = np.int64((next_states[i] >> U64(8 * r + c)) & U64(1))
                    C[i, ent[r * n + c], v] += 1


class GridBayesFilterFull(_Filter):
    """The filter over every rule of the family, factorised over the 2(m + 1) table entries."""

    def __init__(self, family: GridFamily, n: int, config: Config = Config(), seed: int = 0):
        super().__init__(family, n, config, seed)
        self.dr = np.array([o[0] for o in family.offsets], dtype=np.int64)
        self.dc = np.array([o[1] for o in family.offsets], dtype=np.int64)
        self.m1 = family.counts

    def _reset(self, count: int) -> None:
        self.C = np.zeros((count, 2 * self.m1, 2), dtype=np.int64)

    def entry_probabilities(self) -> np.ndarray:
        """(N, 2, m + 1): P(T[state, count] = 1) of every row."""
        return np.stack([_entry_probabilities(c, self.log_r) for c in self.C]).reshape(len(self.C), 2, self.m1)

    def action_scores(self, state, row: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(score, IG) of every action from one packed grid under row `row`'s posterior (for tests, inspection)."""
        scores, igs = np.empty(self.n * self.n), np.empty(self.n * self.n)
        _factorised_scores(U64(state), self.C[row], self.n, self.dr, self.dc, self.m1, self.log_r,
                           float(self.config.beta), scores, igs)
        return scores, igs

    def act(self, states) -> np.ndarray:
        return _decide_full(np.asarray(states, dtype=np.uint64), self.C, self.active, self.words(), self.n, self.dr,
                            self.dc, self.m1, self.log_r, float(self.config.beta))

    def _update(self, states, actions, next_states) -> None:
        _update_full(self.C, states, actions, next_states, self.active, self.n, self.dr, self.dc, self.m1)


# ---------------------------------------------------------------------------------------------- episodes

def run_grid_bayes_filter(starts, rules, family: GridFamily, H: int, policy: _Filter, *, keys=None,
                          success_bonus: float = defaults.SUCCESS_BONUS) -> dict:
    """Play one episode per start grid (N, n, n) under its true rule (N rules of `family`) with a grid Bayes
    filter (`GridBayesFilter` or `GridBayesFilterFull` of the same family and n); per-episode arrays as
    `grid_mpc.run_grid_mpc`."""
    H = check_horizon(H)
    success_bonus = check_success_bonus(success_bonus)
    states, ids, n, keys = check_batch(starts, rules, family, keys)
    if policy.family != family or policy.n != n:
        raise ValueError(f"the filter is for {policy.family.name} grids of side {policy.n}, the episodes are "
                         f"{family.name} grids of side {n}")
    count = len(states)
    metrics = np.zeros((count, 4), dtype=np.float64)
    steps = np.zeros(count, dtype=np.int64)
    log = np.full((count, H), -1, dtype=np.int16)
    policy.begin(keys)
    moore = family.neighbours == 8
    for t in range(H):
        active = policy.active.copy()
        if not active.any():
            break
        actions = policy.act(states)
        nxt = transition_words(states, actions, ids, n, moore)
        nxt = np.where(active, nxt, states)
        account_steps(metrics, steps, log, nxt, actions, active, t, n * n, np.float32(success_bonus))
        policy.observe(states, actions, nxt, (nxt == 0) | (t + 1 >= H))
        states = nxt
    return results_dict(metrics, steps, log, H)



# ---------------------------------------------------------------------------------------------- policy

class GridBayesFilterPolicy:
    """A grid filter (`GridBayesFilter` or `GridBayesFilterFull`) as an evaluation policy of the runner: the
    registry's `bayes_filter` / `bayes_filter_full` on the 2D grid family (`make_policy`, `make_policy_full`).
    Plays what `run_grid_bayes_filter` plays on the same episodes (tested)."""

    def __init__(self, make_filter):
        self.make_filter = make_filter   # n -> a fresh filter for grids of side n

    def begin(self, batch) -> None:
        if batch.goal is not None and np.asarray(batch.goal).any():
            raise ValueError("the grid Bayes filter plays toward the all-zero grid; the batch has another goal")
        self.n = check_packed_size(grid_side(batch.L))
        self.filter = self.make_filter(self.n)
        self.device = batch.device
        self.filter.begin(np.asarray(batch.keys, dtype=np.uint64))

    def _pack(self, obs) -> np.ndarray:
        return pack(obs[:, :self.n * self.n].to(torch.uint8).cpu().numpy().reshape(-1, self.n, self.n))

    def act(self, obs):
        return torch.from_numpy(np.asarray(self.filter.act(self._pack(obs)), dtype=np.int64)).to(self.device)

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        self.filter.observe(self._pack(obs), actions.cpu().numpy().astype(np.int64), self._pack(next_obs),
                            (terminated | truncated).cpu().numpy())


def make_policy(config: Config, context) -> GridBayesFilterPolicy:
    """`bayes_filter` on the 2D grid family (its registry entry's `grid_policy`): the filter over the split's
    training rules."""
    family = context.family
    rules = family.check_rules(list(candidate_rules("train", context)))
    return GridBayesFilterPolicy(lambda n: GridBayesFilter(rules, family, n, config, context.seed))


def make_policy_full(config: Config, context) -> GridBayesFilterPolicy:
    """`bayes_filter_full` on the 2D grid family: the factorised posterior over every rule of the family."""
    return GridBayesFilterPolicy(lambda n: GridBayesFilterFull(context.family, n, config, context.seed))
