"""Explicit finite-rule Bayes filter (belief family): a posterior over candidate rules, one-step greedy.

Candidates are the split's training rules (`bayes_filter`, "Bayes filter (train)") or all 256 rules
(`bayes_filter_full`, "Bayes filter (full)"), with a uniform prior. An observed transition (s, a, s')
has per-cell likelihood (1 - eps) where the candidate's prediction F_z(G(s, a)) matches s' and eps
where it does not, so the log posterior of z is const + M_z * log(eps / (1 - eps)), where M_z is the
candidate's total number of mispredicted cells so far. The filter keeps the integer counts M_z and
forms the posterior b(z) = r^(M_z - min M) / sum, r = eps / (1 - eps) (log space: the largest term is 1).

Each step it plays the action maximising
    score(a) = -sum_z b(z) * dist(F_z(G(s, a)), g) + beta * IG(a),
where IG(a) (nats) is the entropy of the noise-free predictive distribution of the next tape under b
(candidates grouped by predicted next tape, their weights summed). One-step greedy.

Exact ties. Candidates with equal M_z have bit-identical weights; each action's score is computed from
its groups (candidates with the same predicted tape) in a canonical order — within a group weights
are summed in ascending order, groups are summed in ascending (weight, mismatch) order — so two actions
whose groups form the same multiset of (weights, distance) get bit-identical scores and tie exactly.
(Actions with mathematically equal but structurally different scores may differ in the last bit; with a
single candidate and beta = 0 the score is -mismatches / L, so ties there are exactly the ties of the
mismatch counts.) Candidates whose weight underflowed to 0.0 change no sum and are skipped.
Ties are broken uniformly at random: the k-th tied action in ascending cell order, k from a
counter-based word of (seed, episode identity, step), so a row's choice depends only on its own episode
and the seed.

The numba kernels run over episodes (prange) x actions x candidates on packed tapes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numba as nb
import numpy as np
import torch

from tapebench.ca.packed import length_mask, pack, popcount, step_word_rule
from tapebench.episodes.streams import step_keys
from tapebench.methods.contract import EpisodeBatch
from tapebench.validation import check_goal

U64 = np.uint64
BAYES_DOMAIN = 0x424159   # separates the filter's tie-breaking stream from other streams of the same seed
CANDIDATE_SETS = ("train", "full")


@dataclass
class Config:
    """Hyperparameters of the Bayes filter (both candidate sets)."""

    epsilon: float = 0.01
    """per-cell mismatch floor of the likelihood: a mispredicted cell has likelihood eps, a matched one 1 - eps;
    in (0, 0.5)"""
    beta: float = 0.25
    """weight of the information gain (nats) in the action score; >= 0 (0: pure expected-distance greedy)"""

    def check(self) -> None:
        for name in ("epsilon", "beta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"Bayes filter {name} must be a finite number, got {value!r}")
        if not 0.0 < self.epsilon < 0.5:
            raise ValueError(f"Bayes filter epsilon must be in (0, 0.5) (mismatch floor of the likelihood), "
                             f"got {self.epsilon!r}")
        if self.beta < 0.0:
            raise ValueError(f"Bayes filter beta must be >= 0 (weight of the information gain), got {self.beta!r}")


# ---------------------------------------------------------------------------------------------- kernels

@nb.njit(cache=True)
def _weights(M, log_r):
    """Posterior b over candidates from the mismatch counts M (log space, largest term exactly 1)."""
    lo = M.min()
    w = np.empty(M.shape[0], dtype=np.float64)
    for j in range(M.shape[0]):
        w[j] = math.exp(np.float64(M[j] - lo) * log_r)
    return w / w.sum()


GROUP_TABLE_BITS = 10   # open-addressing table of the predicted tapes of one action: 1024 slots >= 4 x 256 rules


@nb.njit(cache=True)
def grouped_terms(gp, gm, n_groups):
    """(expected mismatch, entropy) over the first n_groups outcome groups (weight gp, mismatch gm), summed in
    ascending (weight, mismatch) order so that the result does not depend on the groups' order (groups equal in
    both add equal terms)."""
    o1 = np.argsort(gm[:n_groups], kind="mergesort")
    o2 = np.argsort(gp[:n_groups][o1], kind="mergesort")
    expected = 0.0
    ent = 0.0
    for q in range(n_groups):
        g = o1[o2[q]]
        expected += gp[g] * gm[g]
        ent -= gp[g] * math.log(gp[g])
    return expected, ent


@nb.njit(cache=True)
def _action_scores(s, b, rules, L, goal, beta, scores, igs):
    """scores[a] and IG[a] for every action from tape s under posterior b over candidate `rules`."""
    mask = length_mask(L)
    # the candidates that carry weight, in ascending weight (ties by candidate index): group sums canonical
    order = np.argsort(b, kind="mergesort")
    live = order[b[order] > 0.0]
    k = live.shape[0]
    wl = b[live]
    rl = rules[live]
    gp = np.empty(k, dtype=np.float64)
    gm = np.empty(k, dtype=np.float64)
    # candidates are grouped by predicted tape through a hash table whose slots are stamped with the action, so
    # it is never cleared; a group's weights are summed in ascending candidate order (ascending weight)
    size = 1 << GROUP_TABLE_BITS
    slot_key = np.zeros(size, dtype=np.uint64)
    slot_group = np.zeros(size, dtype=np.int64)
    slot_stamp = np.full(size, -1, dtype=np.int64)
    shift = U64(64 - GROUP_TABLE_BITS)
    for a in range(L):
        x = s ^ (U64(1) << U64(a))
        n_groups = 0
        for j in range(k):
            p = step_word_rule(x, rl[j], L, mask)
            h = np.int64((p * U64(0x9E3779B97F4A7C15)) >> shift)
            while slot_stamp[h] == a and slot_key[h] != p:
                h = (h + 1) & (size - 1)
            if slot_stamp[h] != a:
                slot_stamp[h], slot_key[h], slot_group[h] = a, p, n_groups
                gp[n_groups] = 0.0
                gm[n_groups] = np.float64(popcount(p ^ goal))
                n_groups += 1
            gp[slot_group[h]] += wl[j]
        expected, ent = grouped_terms(gp, gm, n_groups)
        igs[a] = ent
        scores[a] = -expected / L + beta * ent


@nb.njit(cache=True)
def _pick(scores, word, L):
    """The k-th best-scoring action in ascending cell order, k uniform over the ties from `word`."""
    best = scores[0]
    for a in range(1, L):
        if scores[a] > best:
            best = scores[a]
    n_ties = 0
    for a in range(L):
        if scores[a] == best:
            n_ties += 1
    k = np.int64(((word >> U64(32)) * U64(n_ties)) >> U64(32))
    for a in range(L):
        if scores[a] == best:
            if k == 0:
                return a
            k -= 1
    return -1   # unreachable


@nb.njit(cache=True, parallel=True)
def _decide(states, M, active, rules, words, L, goals, log_r, beta):
    n = states.shape[0]
    out = np.zeros(n, dtype=np.int64)
    for i in nb.prange(n):
        if active[i]:
            scores = np.empty(L, dtype=np.float64)
            igs = np.empty(L, dtype=np.float64)
            _action_scores(states[i], _weights(M[i], log_r), rules, L, goals[i], beta, scores, igs)
            out[i] = _pick(scores, words[i], L)
    return out


@nb.njit(cache=True, parallel=True)
def _update(M, states, actions, next_states, active, rules, L):
    """M[i, z] += mispredicted cells of candidate z on the observed transition of row i."""
    mask = length_mask(L)
    for i in nb.prange(states.shape[0]):
        if active[i]:
            x = states[i] ^ (U64(1) << U64(actions[i]))
            for j in range(rules.shape[0]):
                M[i, j] += popcount(step_word_rule(x, rules[j], L, mask) ^ next_states[i])


def action_scores(tape, posterior, rules, goal, beta: float) -> tuple[np.ndarray, np.ndarray]:
    """(score, IG) of every action of one tape (L,) under `posterior` over `rules` (for tests and inspection)."""
    tape = np.asarray(tape, dtype=np.uint8)
    L = len(tape)
    scores, igs = np.empty(L), np.empty(L)
    _action_scores(pack(tape)[0], np.asarray(posterior, dtype=np.float64), np.asarray(rules, dtype=np.int64), L,
                   pack(check_goal(goal, L))[0], float(beta), scores, igs)
    return scores, igs


# ---------------------------------------------------------------------------------------------- policy

class BayesFilterPolicy:
    """The Bayes filter as an evaluation policy: per-episode mismatch counts over the candidate rules."""

    def __init__(self, candidates, config: Config = Config(), seed: int = 0):
        config.check()
        rules = np.asarray(sorted(set(int(z) for z in candidates)), dtype=np.int64)
        if len(rules) == 0:
            raise ValueError("the Bayes filter needs at least one candidate rule (the split's training rules "
                             "for the 'train' candidate set)")
        if rules.min() < 0 or rules.max() > 255:
            raise ValueError(f"candidate rules must be in 0..255, got {rules.tolist()}")
        self.rules, self.config, self.seed = rules, config, int(seed)
        self.log_r = math.log(config.epsilon) - math.log1p(-config.epsilon)
        self.M = np.zeros((0, len(rules)), dtype=np.int64)

    def begin(self, batch: EpisodeBatch) -> None:
        self.L, self.t, self.device = batch.L, 0, batch.device
        self.goals = pack(np.ascontiguousarray(batch.row_goals()))   # (N,) packed: each row's goal
        self.keys = step_keys(np.asarray(batch.keys, dtype=np.uint64), BAYES_DOMAIN, self.seed)
        self.M = np.zeros((len(batch), len(self.rules)), dtype=np.int64)
        self.active = np.ones(len(batch), dtype=np.bool_)

    def posterior(self) -> np.ndarray:
        """(N, candidates) posterior of every row, candidates in `self.rules` order."""
        w = np.exp((self.M - self.M.min(axis=1, keepdims=True)) * self.log_r)
        return w / w.sum(axis=1, keepdims=True)

    def _pack(self, obs) -> np.ndarray:
        return pack(obs[:, :self.L].to(torch.uint8).cpu().numpy())

    def act(self, obs):
        words = step_keys(self.keys, self.t, self.seed)
        actions = _decide(self._pack(obs), self.M, self.active, self.rules, words, self.L, self.goals, self.log_r,
                          float(self.config.beta))
        return torch.from_numpy(actions).to(self.device)

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        _update(self.M, self._pack(obs), actions.cpu().numpy().astype(np.int64), self._pack(next_obs), self.active,
                self.rules, self.L)
        self.active &= ~(terminated | truncated).cpu().numpy()
        self.t += 1


def candidate_rules(candidate_set: str, context) -> tuple[int, ...]:
    if candidate_set == "full":
        return tuple(range(256))
    if candidate_set == "train":
        if not context.train_rules:
            raise ValueError("the Bayes filter with the 'train' candidate set needs the split's training rules "
                             "(PolicyContext.train_rules is empty)")
        return tuple(context.train_rules)
    raise ValueError(f"candidate set must be one of {list(CANDIDATE_SETS)}, got {candidate_set!r}")


def make_policy(config: Config, context) -> BayesFilterPolicy:
    """`bayes_filter`: candidates = the split's training rules."""
    return BayesFilterPolicy(candidate_rules("train", context), config, context.seed)


def make_policy_full(config: Config, context) -> BayesFilterPolicy:
    """`bayes_filter_full`: candidates = all 256 rules."""
    return BayesFilterPolicy(candidate_rules("full", context), config, context.seed)
