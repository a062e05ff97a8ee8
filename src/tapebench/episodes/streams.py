"""The counter-based random streams, in one place (docs/protocol.md#decisions).

Every random number a method or the evaluation draws is a pure function of an identity, never of a
sequential generator's state, so results do not depend on batching, thread scheduling or which other
episodes run:

* an episode's identity (evaluation seed, split key, side, rule, episode index) fixes its initial tape
  (`episodes.sets.episode_tape`), its key `episode_key` (methods' per-episode randomness), its noise
  stream `noise_key` and, in the multi-goal protocol, its derived goal (`goal_stream`), four separate
  SeedSequence streams; a training episode's derived goal comes from (env seed, row, the row's episode count)
  (`training_goal_stream`);
* `step_keys(keys, t, salt)`: one 64-bit word per episode for step t under a method's salt (its seed);
* the planners' candidate actions: `episode_keys` (per-episode planner key) -> `step_key` (per step) ->
  `candidate_action` (per candidate and depth), numba functions the planning kernels inline;
* `noise_uniforms`: the cell-update noise's uniforms per episode, step and cell;
* the few-shot study's adaptation episodes (docs/protocol.md#few-shot): the evaluation episodes of the seed
  `adaptation_seed(eval_seed)` (spawn key 5 of the evaluation seed), a stream disjoint from the test episodes;
  a gradient-adapting agent's own draws start from `adaptation_torch_seed` (spawn key 6) per seed, side and rule.

All of them hash with SplitMix64's finaliser `mix64` (numba, for kernels and scalars) / `mix64_array`
(numpy arrays); both run the same three lines.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from tapebench.vocabulary import RULES_SIDE, SPLIT_SIDES, ladder_level

U64 = np.uint64
GAMMA = np.uint64(0x9E3779B97F4A7C15)   # SplitMix64 increment
MPC_DOMAIN = 0x4D5043   # separates the planner's keys from other per-episode random streams of the same seed

SIDE_CODES = {SPLIT_SIDES[0]: 0, SPLIT_SIDES[1]: 1, RULES_SIDE: 2}
LADDER_SIDE_CODE = 100        # ladder level d (side "d<d>", docs/protocol.md#severity-ladders): code 100 + d


def _splitmix64_finaliser(x):
    x = (x ^ (x >> U64(30))) * U64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> U64(27))) * U64(0x94D049BB133111EB)
    return x ^ (x >> U64(31))


mix64 = nb.njit(cache=True, inline="always")(_splitmix64_finaliser)
mix64.__doc__ = "SplitMix64 output function: a bijective 64-bit mixer (numba; uint64 scalars in kernels)."


def mix64_array(x):
    """The SplitMix64 finaliser of uint64 words, elementwise on numpy arrays (wraps on overflow)."""
    with np.errstate(over="ignore"):
        return _splitmix64_finaliser(np.asarray(x, dtype=np.uint64))


# --- per-episode identities -------------------------------------------------------------------------
def split_key(content_hash: str | None) -> int:
    """Integer key of a split from its content hash (0 for an explicit rule list)."""
    return int(content_hash[:16], 16) if content_hash else 0


def check_side(side: str) -> str:
    if side not in SIDE_CODES and ladder_level(side) is None:
        raise ValueError(f"side must be one of {sorted(SIDE_CODES)} or a ladder level 'd1', 'd2', ..., got {side!r}")
    return side


def side_code(side: str) -> int:
    return SIDE_CODES[side] if side in SIDE_CODES else LADDER_SIDE_CODE + ladder_level(check_side(side))


def identity(eval_seed: int, key: int, side: str, rule: int, episode: int) -> list[int]:
    """The entropy of one evaluation episode's streams: (evaluation seed, split key, side code, rule, index)."""
    return [int(eval_seed), int(key), side_code(side), int(rule), int(episode)]


def episode_key(eval_seed: int, key: int, side: str, rule: int, episode: int) -> np.uint64:
    """A 64-bit identity of one evaluation episode, for methods' per-episode randomness.

    Derived from the same tuple as the initial tape but from a separate stream, so it reveals neither
    the rule nor the tape.
    """
    seq = np.random.SeedSequence(identity(eval_seed, key, side, rule, episode), spawn_key=(1,))
    return seq.generate_state(1, np.uint64)[0]


def noise_key(eval_seed: int, key: int, side: str, rule: int, episode: int) -> np.uint64:
    """A 64-bit key of one evaluation episode's noise stream (separate from the tape and `episode_key`)."""
    seq = np.random.SeedSequence(identity(eval_seed, key, side, rule, episode), spawn_key=(2,))
    return seq.generate_state(1, np.uint64)[0]


def goal_stream(eval_seed: int, key: int, side: str, rule: int, episode: int) -> np.random.Generator:
    """The generator of one evaluation episode's derived goal (docs/protocol.md#multi-goal): its own stream of the
    episode's identity, separate from the tape, `episode_key` and `noise_key`."""
    return np.random.default_rng(np.random.SeedSequence(identity(eval_seed, key, side, rule, episode), spawn_key=(3,)))


def training_goal_stream(env_seed: int, row: int, episode: int) -> np.random.Generator:
    """The generator of one training episode's derived goal (docs/protocol.md#multi-goal): the `episode`-th episode
    of row `row` of a training environment seeded with `env_seed`; a stream of its own (spawn key 4), so the
    goals depend on neither the env's generator nor the other rows."""
    return np.random.default_rng(np.random.SeedSequence([int(env_seed), int(row), int(episode)], spawn_key=(4,)))


def adaptation_seed(eval_seed: int) -> int:
    """The evaluation seed of the few-shot study's adaptation episodes (docs/protocol.md#few-shot): a 64-bit word of
    its own stream of `eval_seed` (spawn key 5), so the adaptation episodes are disjoint from the test episodes (the
    evaluation episodes of `eval_seed`) and are the same for every method, seed and k."""
    seq = np.random.SeedSequence([int(eval_seed)], spawn_key=(5,))
    return int(seq.generate_state(1, np.uint64)[0])


def adaptation_torch_seed(seed: int, key: int, side: str, rule: int) -> int:
    """The torch seed of a gradient-adapting agent's own draws (exploration, minibatches) on one rule of the few-shot
    study: a stream (spawn key 6) of (method seed, split key, side code, rule), the same for every k, so the first
    k episodes of a longer adaptation are the k-shot adaptation."""
    seq = np.random.SeedSequence([int(seed), int(key), side_code(side), int(rule)], spawn_key=(6,))
    return int(seq.generate_state(1, np.uint64)[0] >> np.uint64(1))


def noise_uniforms(noise_keys: np.ndarray, t: int, L: int) -> np.ndarray:
    """(N, L) uniforms in [0, 1) of step t for episodes with these noise keys: SplitMix64 of (key, t, cell),
    the top 53 bits as a float64."""
    if isinstance(t, bool) or int(t) < 0:
        raise ValueError(f"step t must be an integer >= 0, got {t!r}")
    counters = (np.uint64(int(t)) << np.uint64(32)) | np.arange(L, dtype=np.uint64)
    with np.errstate(over="ignore"):
        words = np.asarray(noise_keys, dtype=np.uint64)[:, None] ^ mix64_array(counters + np.uint64(1))[None, :]
        words = mix64_array(words + GAMMA)
    return (words >> np.uint64(11)).astype(np.float64) * (1.0 / 2.0 ** 53)


# --- methods' per-step streams ------------------------------------------------------------------------
def step_keys(keys: np.ndarray, t: int, salt: int) -> np.ndarray:
    """Counter-based 64-bit random words, one per episode, for step t under a method's `salt` (its seed).

    SplitMix64 of (key, salt, t): a pure function of the episode's identity, so a method's randomness
    does not depend on the other episodes in the batch, on batch sizes or on thread scheduling.
    """
    with np.errstate(over="ignore"):
        x = keys.astype(np.uint64) ^ mix64_array(np.uint64(salt) * np.uint64(0xD1B54A32D192ED03) + np.uint64(t + 1))
        return mix64_array(x + GAMMA)


def uniform_below(words: np.ndarray, n: int) -> np.ndarray:
    """Map uniform 64-bit words to integers in [0, n) (multiply-shift on the high 32 bits)."""
    return ((words >> np.uint64(32)) * np.uint64(n) >> np.uint64(32)).astype(np.int64)


# --- the planners' candidate actions ----------------------------------------------------------------
def episode_keys(identity_keys: np.ndarray, planner_seed: int) -> np.ndarray:
    """One 64-bit planner key per episode from its identity (`EpisodeSet.keys`) and the planner seed."""
    return step_keys(np.asarray(identity_keys, dtype=np.uint64), MPC_DOMAIN, int(planner_seed))


@nb.njit(cache=True, inline="always")
def step_key(episode_key, t):
    return mix64(episode_key + U64(t + 1) * GAMMA)


@nb.njit(cache=True, inline="always")
def candidate_action(key, counter, L):
    """Action of candidate sequence element `counter` (= c * horizon + depth) under a step key."""
    z = mix64(key + U64(counter + 1) * GAMMA)
    return np.int64(((z >> U64(32)) * U64(L)) >> U64(32))


@nb.njit(cache=True)
def candidate_actions(key, candidates, horizon, L):
    """(candidates, horizon) actions of one decision; what the fused kernel draws on the fly."""
    out = np.empty((candidates, horizon), dtype=np.int64)
    for c in range(candidates):
        for k in range(horizon):
            out[c, k] = candidate_action(key, c * horizon + k, L)
    return out
