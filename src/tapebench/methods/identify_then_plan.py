"""Identify-then-plan (belief family, beyond the paper): the set of rule tables consistent with what was
seen, then true-dynamics random-shooting MPC averaged over that set.

Identification. The dynamics are noise-free at evaluation, and an observed transition (s, a, s') shows,
for every cell i, the neighbourhood idx of the post-action tape G(s, a) at i and the rule's output s'_i:
table bit idx is pinned to s'_i. The filter keeps two bytes per episode, the pinned bits (`known_mask`) and
their values (`known_values`); the consistent set is {z in 0..255 : (z ^ known_values) & known_mask == 0},
2^(8 - popcount(known_mask)) rules. All 256 tables are possible a priori (no candidate restriction: the
method is not told the training rules, so it identifies held-out rules as readily as training ones).
A transition that contradicts an earlier one cannot happen in the noise-free environment; it raises. Under
cell-update noise (the protocol's epsilon > 0, docs/protocol.md#noise) it can, and the row starts identifying
afresh: it keeps only what the contradicting transition pins (nothing if that transition contradicts itself).

Planning. Each step draws the same candidate action sequences as the true-dynamics MPC (`oracle.mpc`:
planner key from the episode identity and the seed, `candidate_action`, default 8 x 512), scores each by
the sum over the consistent rules of its return under that rule (the mean up to a constant factor; the
per-rule return is MPC's, exact in floats), and plays the first action of the best (ties: lowest
candidate index, as MPC). Once the consistent set is the true rule alone, the decision is exactly MPC's.
With more than `max_rules` consistent rules it averages over `max_rules` of them, evenly spaced in
ascending rule order (deterministic); the default 256 never caps.
It never sees the true rule.

Prior-only planning (`mpc_prior`, rule-agnostic family, docs/protocol.md#rule-agnostic-floors). The same
planner (`decide`) over a rule set that never changes: the split's training rules, a uniform prior, so each
candidate sequence is scored by its expected return under the prior and nothing observed updates it. It is
what planning buys without identification; the difference to identify-then-plan is what identifying buys.
`max_rules` caps the prior set as it caps the consistent set (evenly spaced in ascending rule order).
"""
from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np
import torch

from tapebench.ca.packed import length_mask, pack
from tapebench.episodes.streams import candidate_action, episode_keys, step_key
from tapebench.methods.mpc import MPCConfig, _score_flips, candidate_flips
from tapebench.validation import check_integer

U64 = np.uint64
FULL = 0xFF


@dataclass
class Config:
    """Hyperparameters of identify-then-plan."""

    horizon: int = 8
    """length of each candidate action sequence (truncated at the episode's remaining steps), as the MPC"""
    candidates: int = 512
    """random action sequences scored per decision, as the MPC"""
    max_rules: int = 256
    """most consistent rules a candidate's return is averaged over (evenly spaced subset beyond it); 1..256"""

    def check(self) -> None:
        MPCConfig(self.horizon, self.candidates, 0)
        check_integer(self.max_rules, "identify-then-plan max_rules", minimum=1, maximum=256)


@nb.njit(cache=True)
def pinned_bits(x, s_next, L):
    """(mask, values, ok) of the rule-table bits an observed update x -> s_next pins (x: post-action tape).

    ok is False if two cells with the same neighbourhood disagree (impossible for a deterministic rule)."""
    mask = length_mask(L)
    one = U64(1)
    left = ((x << one) | (x >> U64(L - 1))) & mask
    right = ((x >> one) | (x << U64(L - 1))) & mask
    km = 0
    kv = 0
    ok = True
    for k in range(8):
        sel = mask
        sel &= left if (k >> 2) & 1 else ~left
        sel &= x if (k >> 1) & 1 else ~x
        sel &= right if k & 1 else ~right
        if sel != U64(0):
            km |= 1 << k
            out = s_next & sel
            if out == sel:
                kv |= 1 << k
            elif out != U64(0):
                ok = False
    return km, kv, ok


@nb.njit(cache=True)
def consistent_rules(known_mask, known_values, max_rules):
    """Rules z with (z ^ known_values) & known_mask == 0 in ascending order; beyond `max_rules`, an evenly
    spaced subset of them (indices floor(j * n / max_rules))."""
    allr = np.empty(256, dtype=np.int64)
    n = 0
    for z in range(256):
        if ((z ^ known_values) & known_mask) == 0:
            allr[n] = z
            n += 1
    if n <= max_rules:
        return allr[:n].copy()
    out = np.empty(max_rules, dtype=np.int64)
    for j in range(max_rules):
        out[j] = allr[(j * n) // max_rules]
    return out


@nb.njit(cache=True)
def decide(s, rules, k_t, depth, L, goal, score_bonus, horizon, candidates):
    """One decision: first action of the candidate sequence with the best summed return over `rules`."""
    tapes = np.empty(candidates, dtype=np.uint64)
    score = np.empty(candidates, dtype=np.float64)
    alive = np.empty(candidates, dtype=np.float64)
    total = np.zeros(candidates, dtype=np.float64)
    flips = candidate_flips(k_t, depth, L, horizon, candidates)
    for r in range(rules.shape[0]):
        _score_flips(s, rules[r], flips, depth, L, goal, score_bonus, candidates, tapes, score, alive)
        for c in range(candidates):
            total[c] += score[c]
    best = 0
    for c in range(1, candidates):
        if total[c] > total[best]:
            best = c
    return candidate_action(k_t, best * horizon, L)


@nb.njit(cache=True, parallel=True)
def _decide_all(states, known_mask, known_values, keys, active, t, H, L, goals, score_bonus, horizon, candidates,
                max_rules):
    n = states.shape[0]
    out = np.zeros(n, dtype=np.int64)
    depth = min(horizon, H - t)
    for i in nb.prange(n):
        if active[i]:
            rules = consistent_rules(known_mask[i], known_values[i], max_rules)
            out[i] = decide(states[i], rules, step_key(keys[i], t), depth, L, goals[i], score_bonus, horizon,
                            candidates)
    return out


@nb.njit(cache=True)
def _observe(known_mask, known_values, states, actions, next_states, active, L, restart):
    """Pin the table bits of every active row's transition; returns the first contradicting row or -1.
    With `restart` a contradicting row forgets its pins and keeps the transition's own (none if not ok)."""
    for i in range(states.shape[0]):
        if active[i]:
            km, kv, ok = pinned_bits(states[i] ^ (U64(1) << U64(actions[i])), next_states[i], L)
            clash = km & known_mask[i] & (kv ^ known_values[i])
            if not ok or clash != 0:
                if not restart:
                    return i
                known_mask[i] = km if ok else 0
                known_values[i] = kv if ok else 0
                continue
            known_mask[i] |= km
            known_values[i] |= kv
    return -1


@nb.njit(cache=True, parallel=True)
def _decide_fixed(states, rules, keys, active, t, H, L, goals, score_bonus, horizon, candidates):
    """`decide` for every active row over one fixed rule set (the prior-only planner)."""
    n = states.shape[0]
    out = np.zeros(n, dtype=np.int64)
    depth = min(horizon, H - t)
    for i in nb.prange(n):
        if active[i]:
            out[i] = decide(states[i], rules, step_key(keys[i], t), depth, L, goals[i], score_bonus, horizon,
                            candidates)
    return out


class IdentifyThenPlanPolicy:
    def __init__(self, config: Config = Config(), seed: int = 0):
        config.check()
        self.config, self.seed = config, int(seed)

    def begin(self, batch) -> None:
        self.L, self.H, self.t, self.device = batch.L, batch.H, 0, batch.device
        self.noisy = batch.noise > 0.0
        n = len(batch)
        self.keys = episode_keys(batch.keys, self.seed)
        self.goals = pack(np.ascontiguousarray(batch.row_goals()))   # (N,) packed: each row's goal
        self.score_bonus = float(batch.success_bonus) * batch.L
        self.known_mask = np.zeros(n, dtype=np.int64)
        self.known_values = np.zeros(n, dtype=np.int64)
        self.active = np.ones(n, dtype=np.bool_)

    def carry(self, batch) -> None:
        """New episodes on the same rows, the rule-table bits learned so far kept (the few-shot study,
        docs/protocol.md#few-shot): each row plans over the rules consistent with every episode since `begin`."""
        if len(batch) != len(self.known_mask):
            raise ValueError(f"carry needs the {len(self.known_mask)} rows of the previous episodes, got {len(batch)}")
        known = self.known_mask, self.known_values
        self.begin(batch)
        self.known_mask, self.known_values = known

    def _pack(self, obs) -> np.ndarray:
        return pack(obs[:, :self.L].to(torch.uint8).cpu().numpy())

    def consistent(self, row: int) -> np.ndarray:
        """The rules consistent with row's transitions so far (uncapped)."""
        return consistent_rules(self.known_mask[row], self.known_values[row], 256)

    def act(self, obs):
        c = self.config
        actions = _decide_all(self._pack(obs), self.known_mask, self.known_values, self.keys, self.active, self.t,
                              self.H, self.L, self.goals, self.score_bonus, int(c.horizon), int(c.candidates),
                              int(c.max_rules))
        return torch.from_numpy(actions).to(self.device)

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        bad = _observe(self.known_mask, self.known_values, self._pack(obs), actions.cpu().numpy().astype(np.int64),
                       self._pack(next_obs), self.active, self.L, self.noisy)
        if bad >= 0:
            raise ValueError(f"identify-then-plan: episode row {bad} observed a transition no elementary rule "
                             f"produces together with its earlier ones (it assumes noise-free dynamics)")
        self.active &= ~(terminated | truncated).cpu().numpy()
        self.t += 1


class PriorPlanPolicy(IdentifyThenPlanPolicy):
    """The identify-then-plan planner over a fixed prior rule set that no observation updates."""

    def __init__(self, prior_rules, config: Config = Config(), seed: int = 0):
        super().__init__(config, seed)
        rules = sorted(set(int(z) for z in prior_rules))
        if not rules:
            raise ValueError("the prior-only planner needs at least one prior rule (the split's training rules: "
                             "PolicyContext.train_rules is empty)")
        if rules[0] < 0 or rules[-1] > 255:
            raise ValueError(f"prior rules must be elementary rules in 0..255, got {rules}")
        n, cap = len(rules), int(config.max_rules)
        self.prior = np.asarray(rules if n <= cap else [rules[(j * n) // cap] for j in range(cap)], dtype=np.int64)

    def act(self, obs):
        c = self.config
        actions = _decide_fixed(self._pack(obs), self.prior, self.keys, self.active, self.t, self.H, self.L,
                                self.goals, self.score_bonus, int(c.horizon), int(c.candidates))
        return torch.from_numpy(actions).to(self.device)

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        self.active &= ~(terminated | truncated).cpu().numpy()
        self.t += 1


def make_policy(config: Config, context) -> IdentifyThenPlanPolicy:
    return IdentifyThenPlanPolicy(config, context.seed)


def make_prior_policy(config: Config, context) -> PriorPlanPolicy:
    """`mpc_prior`: the planner over the split's training rules, never updated."""
    return PriorPlanPolicy(context.train_rules, config, context.seed)
