"""True-dynamics random-shooting MPC (docs/protocol.md#oracle, #decisions): the budgeted planning reference.

At every step of an episode the planner draws `candidates` random action sequences of length
`horizon` (truncated at the episode's remaining steps), rolls each forward with the episode's true
rule on the packed numba kernel, scores it by its return under the episode's own reward — the sum of
-dist after each step plus the success bonus, stopping at the first success — and executes the
first action of the best candidate (ties: lowest candidate index). Then it replans.

Candidate actions are a pure function of (planner seed, episode identity, step, candidate, depth):
a counter-based SplitMix64 hash, no sequential generator state. So results do not depend on thread
scheduling, on which other episodes run in the same batch, or on H (an episode played at H = 32 and
H = 64 sees the same candidates at the same step). The episode identity is
(evaluation seed, split key, side, rule, episode index), the same tuple that fixes its initial tape.

Scores are compared exactly: a candidate's score times L is -(sum of mismatch counts) + b*L.

Rule families (docs/protocol.md#rule-sets): for k colours / radius r the same planner (same candidate
keys, same scoring, same tie rule) rolls candidates forward on unpacked uint8 tapes with the family's
numba table kernel (`ca.table_kernel`), the action incrementing a cell mod k. Only `MPCPolicy` (the
path the pipeline uses) has the family path; the fused whole-episode kernel `run_mpc` stays elementary.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numba as nb
import numpy as np

from tapebench import defaults
from tapebench.ca.packed import length_mask, pack, popcount, step_word_masks
from tapebench.ca.table_kernel import _step_row
from tapebench.episodes.accounting import add_step, results_dict
from tapebench.episodes.sets import EpisodeSet
from tapebench.episodes.streams import U64, candidate_action, episode_keys, step_key
from tapebench.rule_family import ELEMENTARY
from tapebench.validation import check_goal, check_horizon, check_integer


MAX_HORIZON, MAX_CANDIDATES = 256, 65_536    # as the config's oracle.horizon and oracle.candidates


@dataclass(frozen=True)
class MPCConfig:
    """Random-shooting planner budget (paper: horizon 8, 512 candidates)."""

    horizon: int = 8
    """length of each candidate action sequence (truncated at the episode's remaining steps)"""
    candidates: int = 512
    """random action sequences scored per decision"""
    seed: int = 0
    """planner seed; candidate actions are a pure function of (seed, episode identity, step)"""

    def __post_init__(self):
        check_integer(self.horizon, "MPC horizon", minimum=1, maximum=MAX_HORIZON)
        check_integer(self.candidates, "MPC candidates", minimum=1, maximum=MAX_CANDIDATES)
        check_integer(self.seed, "MPC seed", minimum=0)

    def as_dict(self) -> dict:
        return {k: int(v) for k, v in asdict(self).items()}


@nb.njit(cache=True, inline="always")
def _rule_masks(rule):
    return (U64(0) - U64(rule & 1), U64(0) - U64((rule >> 1) & 1), U64(0) - U64((rule >> 2) & 1),
            U64(0) - U64((rule >> 3) & 1), U64(0) - U64((rule >> 4) & 1), U64(0) - U64((rule >> 5) & 1),
            U64(0) - U64((rule >> 6) & 1), U64(0) - U64((rule >> 7) & 1))


@nb.njit(cache=True)
def candidate_flips(k_t, depth, L, horizon, candidates):
    """One decision's candidate actions as one-hot words, depth-major: flips[k * candidates + c] flips the cell
    of candidate c's action at depth k. Drawn once, they serve every rule a decision scores."""
    flips = np.empty(depth * candidates, dtype=np.uint64)
    for k in range(depth):
        for c in range(candidates):
            flips[k * candidates + c] = U64(1) << U64(candidate_action(k_t, c * horizon + k, L))
    return flips


@nb.njit(cache=True)
def _score_flips(s, rule, flips, depth, L, goal, score_bonus, candidates, tapes, score, alive):
    """score[c] = L x return of candidate sequence c (`depth` steps from tape s under `rule`, its actions in
    `flips`), exact in floats: minus the mismatch count after each step, `score_bonus` at the first success,
    nothing after it. The inner loop has no branch and an integer count, so it vectorises over candidates."""
    mask = length_mask(L)
    m0, m1, m2, m3, m4, m5, m6, m7 = _rule_masks(rule)
    for c in range(candidates):
        tapes[c] = s
        score[c] = 0.0
        alive[c] = 1.0
    for k in range(depth):
        n_alive = 0
        base = k * candidates
        for c in range(candidates):
            w = step_word_masks(tapes[c] ^ flips[base + c], m0, m1, m2, m3, m4, m5, m6, m7, L, mask)
            tapes[c] = w
            mism = np.float64(popcount(w ^ goal))
            hit = mism == 0.0
            score[c] += alive[c] * (score_bonus if hit else -mism)
            alive[c] = 0.0 if hit else alive[c]
            n_alive += alive[c] > 0.0
        if n_alive == 0:
            break


@nb.njit(cache=True)
def _score_candidates(s, rule, k_t, depth, L, goal, score_bonus, horizon, candidates, tapes, score, alive):
    """`_score_flips` of one decision's candidates (drawn from the step key k_t) under one rule."""
    _score_flips(s, rule, candidate_flips(k_t, depth, L, horizon, candidates), depth, L, goal, score_bonus,
                 candidates, tapes, score, alive)


@nb.njit(cache=True)
def _plan_action(s, rule, k_t, depth, L, goal, score_bonus, horizon, candidates, tapes, score, alive):
    """First action of the best of `candidates` random sequences of `depth` steps from tape s (one decision)."""
    _score_candidates(s, rule, k_t, depth, L, goal, score_bonus, horizon, candidates, tapes, score, alive)
    best = 0
    for c in range(1, candidates):
        if score[c] > score[best]:
            best = c
    return candidate_action(k_t, best * horizon, L)


@nb.njit(cache=True)
def _plan_episode(i, start, rule, key, L, H, goal, bonus32, score_bonus, horizon, candidates,
                  metrics, steps, actions):
    mask = length_mask(L)
    m0, m1, m2, m3, m4, m5, m6, m7 = _rule_masks(rule)
    tapes = np.empty(candidates, dtype=np.uint64)
    score = np.empty(candidates, dtype=np.float64)
    alive = np.empty(candidates, dtype=np.float64)
    s = start
    for t in range(H):
        a = _plan_action(s, rule, step_key(key, t), min(horizon, H - t), L, goal, score_bonus, horizon, candidates,
                         tapes, score, alive)
        s = step_word_masks(s ^ (U64(1) << U64(a)), m0, m1, m2, m3, m4, m5, m6, m7, L, mask)
        actions[i, t] = a
        mism = popcount(s ^ goal)
        add_step(metrics, i, mism, L, bonus32)
        steps[i] = t + 1
        if mism == 0:
            break


@nb.njit(cache=True, parallel=True)
def _plan_episodes(starts, rules, keys, L, H, goal, bonus32, score_bonus, horizon, candidates):
    n = starts.shape[0]
    metrics = np.zeros((n, 4), dtype=np.float64)
    steps = np.zeros(n, dtype=np.int64)
    actions = np.full((n, H), -1, dtype=np.int16)
    for i in nb.prange(n):
        _plan_episode(i, starts[i], rules[i], keys[i], L, H, goal, bonus32, score_bonus, horizon, candidates,
                      metrics, steps, actions)
    return metrics, steps, actions


@nb.njit(cache=True, parallel=True)
def _plan_actions(states, rules, keys, active, t, H, L, goals, score_bonus, horizon, candidates):
    """One decision for every active episode at step t (inactive rows get action 0); goals (N,) packed per row."""
    n = states.shape[0]
    out = np.zeros(n, dtype=np.int64)
    depth = min(horizon, H - t)
    for i in nb.prange(n):
        if active[i]:
            tapes = np.empty(candidates, dtype=np.uint64)
            score = np.empty(candidates, dtype=np.float64)
            alive = np.empty(candidates, dtype=np.float64)
            out[i] = _plan_action(states[i], rules[i], step_key(keys[i], t), depth, L, goals[i], score_bonus,
                                  horizon, candidates, tapes, score, alive)
    return out


@nb.njit(cache=True)
def _plan_action_family(s, table, k_t, depth, L, goal, score_bonus, horizon, candidates, k, r):
    """`_plan_action` for a family: tapes of cells 0..k-1, the action increments a cell mod k."""
    top = k ** (2 * r)
    tape = np.empty(L, dtype=np.uint8)
    nxt = np.empty(L, dtype=np.uint8)
    ext = np.empty(L + 2 * r, dtype=np.int64)
    best, best_score = 0, -np.inf
    for c in range(candidates):
        tape[:] = s
        score = 0.0
        for d in range(depth):
            a = candidate_action(k_t, c * horizon + d, L)
            tape[a] = (tape[a] + 1) % k
            _step_row(tape, table, k, r, top, ext, nxt)
            tape[:] = nxt
            mism = 0
            for i in range(L):
                mism += tape[i] != goal[i]
            if mism == 0:
                score += score_bonus
                break
            score -= np.float64(mism)
        if score > best_score:
            best, best_score = c, score
    return candidate_action(k_t, best * horizon, L)


@nb.njit(cache=True, parallel=True)
def _plan_actions_family(states, tables, keys, active, t, H, L, goal, score_bonus, horizon, candidates, k, r):
    n = states.shape[0]
    out = np.zeros(n, dtype=np.int64)
    depth = min(horizon, H - t)
    for i in nb.prange(n):
        if active[i]:
            out[i] = _plan_action_family(states[i], tables[i], step_key(keys[i], t), depth, L, goal, score_bonus,
                                         horizon, candidates, k, r)
    return out


@dataclass
class MPCMethodConfig:
    """Hyperparameters of the `mpc` method (its seed is the evaluation seed stream of the pipeline)."""

    horizon: int = 8
    """length of each candidate action sequence (truncated at the episode's remaining steps)"""
    candidates: int = 512
    """random action sequences scored per decision"""

    def check(self) -> None:
        MPCConfig(self.horizon, self.candidates, 0)


class MPCPolicy:
    """Random-shooting MPC as an evaluation policy (a reference method: it needs the true rules).

    Plays exactly what `run_mpc` plays on the same episodes (tested): the same decision kernel, the same
    candidate keys, one decision per step for every episode still running.
    """

    def __init__(self, config: MPCConfig = MPCConfig()):
        self.config = config
        self.family = ELEMENTARY

    def begin(self, batch) -> None:
        if batch.rules is None:
            raise ValueError("MPC is a reference method and needs each episode's true rule "
                             "(run it with reveal_rules=True)")
        self.L, self.H, self.t, self.device = batch.L, batch.H, 0, batch.device
        self.family = batch.family or ELEMENTARY
        self.rules = np.asarray(batch.rules, dtype=np.int64)
        self.keys = episode_keys(batch.keys, self.config.seed)
        if not self.family.elementary:
            self.tables = self.family.tables(self.rules.tolist()) if len(self.rules) else np.zeros(
                (0, self.family.neighbourhoods), dtype=np.uint8)
            self.goal = check_goal(batch.goal, batch.L, family=self.family)
        else:   # one packed goal per row: the episodes' own goals in the multi-goal protocol
            self.goals = pack(np.ascontiguousarray(batch.row_goals()))
        self.score_bonus = float(batch.success_bonus) * batch.L
        self.active = np.ones(len(self.rules), dtype=np.bool_)

    def act(self, obs):
        # torch is heavy: loaded only when this runs
        import torch

        cells = obs[:, :self.L].to(torch.uint8).cpu().numpy()
        if not self.family.elementary:
            actions = _plan_actions_family(cells, self.tables, self.keys, self.active, self.t, self.H, self.L,
                                           self.goal, self.score_bonus, int(self.config.horizon),
                                           int(self.config.candidates), self.family.k, self.family.r)
            return torch.from_numpy(actions).to(self.device)
        states = pack(cells)
        actions = _plan_actions(states, self.rules, self.keys, self.active, self.t, self.H, self.L, self.goals,
                                self.score_bonus, int(self.config.horizon), int(self.config.candidates))
        return torch.from_numpy(actions).to(self.device)

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        self.active &= ~(terminated | truncated).cpu().numpy()
        self.t += 1


def make_policy(config: MPCMethodConfig, context) -> MPCPolicy:
    return MPCPolicy(MPCConfig(horizon=config.horizon, candidates=config.candidates, seed=context.seed))


def run_mpc(episodes: EpisodeSet, H: int, config: MPCConfig = MPCConfig(), *, goal=None,
            success_bonus: float = defaults.SUCCESS_BONUS) -> dict:
    """Play every episode with random-shooting MPC in one fused kernel; returns per-episode arrays
    (the runner's keys + the action log). The pipeline plays MPC through the runner (`MPCPolicy`); this
    whole-episode kernel is the cross-check and the throughput benchmark."""
    H = check_horizon(H)
    if not episodes.family.elementary:
        raise ValueError(f"run_mpc is the elementary fused kernel; play {episodes.family.describe()} episodes "
                         f"with MPCPolicy through evaluation.runner.run_episodes")
    L = episodes.tapes.shape[1]
    goal_word = pack(check_goal(goal, L))[0]
    keys = episode_keys(episodes.keys, config.seed)
    bonus32 = np.float32(success_bonus)
    metrics, steps, actions = _plan_episodes(pack(episodes.tapes), episodes.rules.astype(np.int64), keys, L, H,
                                             goal_word, bonus32, float(success_bonus) * L, int(config.horizon),
                                             int(config.candidates))
    return results_dict(metrics, steps, actions, H)
