"""Exact finite-horizon dynamic programming over all 2^L tapes (L <= 20): feasibility and the optimum.

Tables, per rule z and goal g, with T(s, a) = F_z(s XOR e_a) (flip then update, docs/protocol.md#environment):

  W[0][s] = mismatches(s, g)
  W[r][s] = min_a U[r-1](T(s, a)),   U[k](u) = 0 if u == g else W[k][u]     (r = 1..H)

W[r][s] is the least number of wrong cells at the end of an episode with r steps left from s when
reaching g ends the episode (success, 0 wrong cells). So W[r][s] == 0 exactly when strict success is
reachable within r steps, and d[s] = min{r >= 1 : W[r][s] == 0} (255 if none <= H) is the minimal
number of steps to the goal; when no success is reachable no trajectory touches g, so W[r][s] is the
least achievable final distance. One layer costs 2^L lookups of F plus a min over the L hypercube
neighbours (s XOR e_a), done bit by bit on contiguous blocks; a layer is 2^L bytes.

The exact controller, with r steps left in tape s, plays the lowest action a minimising
U[k](T(s, a)) with k = min(d[s], r) - 1: if the goal is reachable within r steps this reaches it in
the fewest steps, d[s]; otherwise it ends at the least reachable final distance. Ties between
actions go to the lowest action index. So the controller is optimal for strict success (it succeeds
whenever any action sequence can), then for final distance, then for time to success.
"""
from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from tapebench import defaults
from tapebench.ca.packed import pack, popcount, step_words
from tapebench.episodes.accounting import add_step, results_dict
from tapebench.episodes.sets import EpisodeSet
from tapebench.validation import MIN_L, check_goal, check_horizon, check_length, check_rule
from tapebench.vocabulary import MAX_EXACT_L

UNREACHABLE = 255   # d[s] when the goal is not reachable within H steps


def check_exact_length(L) -> int:
    L = check_length(L)
    if L > MAX_EXACT_L:
        raise ValueError(f"exact dynamic programming enumerates all 2^L tapes and needs L in "
                         f"{MIN_L}..{MAX_EXACT_L}, got L={L}")
    return L


def check_exact_horizon(H) -> int:
    H = check_horizon(H)
    if H > 254:
        raise ValueError(f"exact dynamic programming stores steps-to-goal in a byte and needs H <= 254, got H={H}")
    return H


@nb.njit(cache=True)
def _transition_table(rule, L):
    return step_words(np.arange(1 << L).astype(np.uint64), rule, L).astype(np.uint32)


def transition_table(rule: int, L: int) -> np.ndarray:
    """F_z over all 2^L tapes (packed words as indices), uint32."""
    return _transition_table(check_rule(rule), check_exact_length(L))


@nb.njit(cache=True)
def _hypercube_min(Q, L, out):
    """out[s] = min over a of Q[s XOR 2^a]."""
    n = Q.shape[0]
    for s in range(n):
        out[s] = 255
    for a in range(L):
        b = 1 << a
        if b >= 16:
            for base in range(0, n, 2 * b):
                lo, hi = out[base:base + b], out[base + b:base + 2 * b]
                q_lo, q_hi = Q[base:base + b], Q[base + b:base + 2 * b]
                for j in range(b):
                    lo[j] = min(lo[j], q_hi[j])
                for j in range(b):
                    hi[j] = min(hi[j], q_lo[j])
        else:
            for s in range(n):
                out[s] = min(out[s], Q[s ^ b])


@nb.njit(cache=True)
def _value_layers(F, L, H, goal, layers, d):
    """Fill d (steps to goal) and W layers; `layers` holds all H+1 layers, or 2 used cyclically."""
    n = F.shape[0]
    keep = layers.shape[0]
    q = np.empty(n, dtype=np.uint8)
    for s in range(n):
        layers[0, s] = popcount(np.uint64(s) ^ np.uint64(goal))
        d[s] = 255
    for r in range(1, H + 1):
        prev = layers[(r - 1) % keep]
        for u in range(n):
            f = F[u]
            q[u] = 0 if f == goal else prev[f]
        cur = layers[r % keep]
        _hypercube_min(q, L, cur)
        for s in range(n):
            if cur[s] == 0 and d[s] == 255:
                d[s] = r


def value_tables(rule: int, L: int, H: int, goal=None, keep_layers: bool = True):
    """(F, d, W) for one rule: W has all H+1 layers if keep_layers, else only the last two."""
    L, H = check_exact_length(L), check_exact_horizon(H)
    goal_word = int(pack(check_goal(goal, L))[0])
    F = transition_table(rule, L)
    n = 1 << L
    layers = np.empty((H + 1 if keep_layers else 2, n), dtype=np.uint8)
    d = np.empty(n, dtype=np.uint8)
    _value_layers(F, L, H, np.uint32(goal_word), layers, d)
    return F, d, layers


@nb.njit(cache=True)
def _exact_action(s, remaining, F, d, W, L, goal):
    """The controller's action in tape s with `remaining` steps left (lowest action among the best)."""
    k = min(np.int64(d[s]), remaining) - 1
    best_a, best_v = 0, 256
    for a in range(L):
        u = F[s ^ (1 << a)]
        v = 0 if u == goal else np.int64(W[k, u])
        if v < best_v:
            best_a, best_v = a, v
    return best_a


@nb.njit(cache=True)
def _control_episodes(rows, starts, F, d, W, L, H, goal, bonus32, metrics, steps, actions):
    for i in rows:
        s = starts[i]
        for t in range(H):
            best_a = _exact_action(s, H - t, F, d, W, L, goal)
            s = F[s ^ (1 << best_a)]
            actions[i, t] = best_a
            mism = popcount(np.uint64(s) ^ np.uint64(goal))
            add_step(metrics, i, mism, L, bonus32)
            steps[i] = t + 1
            if mism == 0:
                break


@nb.njit(cache=True)
def _exact_actions(states, remaining, F, d, W, L, goal):
    out = np.zeros(states.shape[0], dtype=np.int64)
    for i in range(states.shape[0]):
        out[i] = _exact_action(states[i], remaining, F, d, W, L, goal)
    return out


@dataclass
class ExactConfig:
    """The exact optimum has no hyperparameters (it needs L <= 20 and H <= 254)."""


class ExactPolicy:
    """The exact optimal controller as an evaluation policy (a reference method: it needs the true rule).

    Value tables are built per (rule, goal), so the runner plays it one rule per batch (`Method.by_rule`);
    a batch with several rules builds each rule's tables (2^L x (H+1) bytes each) in turn, and in the multi-goal
    protocol (docs/protocol.md#multi-goal) each distinct goal of a rule's episodes its own.
    """

    def begin(self, batch) -> None:
        if batch.rules is None:
            raise ValueError("the exact optimum is a reference method and needs each episode's true rule "
                             "(run it with reveal_rules=True)")
        self.L, self.H = check_exact_length(batch.L), check_exact_horizon(batch.H)
        self.t, self.device = 0, batch.device
        goals = np.ascontiguousarray(batch.row_goals())
        self.goals = pack(goals).astype(np.uint32)
        self.rules = np.asarray(batch.rules)
        self.tables = {}
        for i in range(len(self.rules)):
            pair = (int(self.rules[i]), int(self.goals[i]))
            if pair not in self.tables:
                self.tables[pair] = value_tables(pair[0], self.L, self.H, goals[i])

    def act(self, obs):
        # torch is heavy: loaded only when this runs
        import torch

        states = pack(obs[:, :self.L].to(torch.uint8).cpu().numpy()).astype(np.uint32)
        actions = np.zeros(len(states), dtype=np.int64)
        for (z, goal), (F, d, W) in self.tables.items():
            rows = (self.rules == z) & (self.goals == goal)
            actions[rows] = _exact_actions(states[rows], self.H - self.t, F, d, W, self.L, np.uint32(goal))
        return torch.from_numpy(actions).to(self.device)

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        self.t += 1


def make_policy(config: ExactConfig, context) -> ExactPolicy:
    check_exact_length(context.L)
    check_exact_horizon(context.H)
    return ExactPolicy()


def run_exact(episodes: EpisodeSet, H: int, *, goal=None, success_bonus: float = defaults.SUCCESS_BONUS) -> dict:
    """Play every episode with the exact optimal controller; returns per-episode arrays like `run_mpc`."""
    L = check_exact_length(episodes.tapes.shape[1])
    H = check_exact_horizon(H)
    goal_word = np.uint32(pack(check_goal(goal, L))[0])
    starts = pack(episodes.tapes).astype(np.uint32)
    n = len(episodes)
    metrics = np.zeros((n, 4), dtype=np.float64)
    steps = np.zeros(n, dtype=np.int64)
    actions = np.full((n, H), -1, dtype=np.int16)
    for rule in np.unique(episodes.rules):
        F, d, W = value_tables(int(rule), L, H, goal)
        rows = np.flatnonzero(episodes.rules == rule)
        _control_episodes(rows, starts, F, d, W, L, H, goal_word, np.float32(success_bonus), metrics, steps,
                          actions)
    return results_dict(metrics, steps, actions, H)


@nb.njit(cache=True, parallel=True)
def _feasibility_kernel(rules, L, H, goal):
    """Per rule: histogram of d over non-goal tapes (column k = d, column H+1 = unreachable)
    and the sum over non-goal tapes of the least final mismatch count W[H]."""
    n_rules, n = rules.shape[0], 1 << L
    hist = np.zeros((n_rules, H + 2), dtype=np.int64)
    final_sum = np.zeros(n_rules, dtype=np.int64)
    for j in nb.prange(n_rules):
        layers = np.empty((2, n), dtype=np.uint8)
        d = np.empty(n, dtype=np.uint8)
        _value_layers(_transition_table(rules[j], L), L, H, goal, layers, d)
        last = layers[H % 2]
        for s in range(n):
            if s == goal:
                continue
            hist[j, H + 1 if d[s] == 255 else d[s]] += 1
            final_sum[j] += last[s]
    return hist, final_sum


def feasibility_arrays(rules, L: int, H: int, goal=None) -> tuple[np.ndarray, np.ndarray]:
    """(hist, final_sum) for each rule: hist[:, k] = non-goal tapes with k minimal steps to the goal
    (k = 1..H; column H+1 = not reachable within H), final_sum = sum of least final mismatch counts."""
    L, H = check_exact_length(L), check_exact_horizon(H)
    goal_word = np.uint32(pack(check_goal(goal, L))[0])
    rules = np.asarray([check_rule(z) for z in rules], dtype=np.int64)
    return _feasibility_kernel(rules, L, H, goal_word)
