"""The evaluation-policy contract: what the runner drives on the common-random-number episodes.

Every method evaluates through one interface (docs/methods.md, "The method contract"). The runner
plays a batch of episodes that all start together; it calls

* `begin(batch)` once, before the first step: every row of `batch` starts a new episode, so a
  stateful policy (recurrent core, context of transitions, belief over rules, planner) resets its
  per-episode state here;
* `act(obs)` each step: (N, L+1) float observations -> (N,) long cell indices;
* `observe(obs, actions, rewards, next_obs, terminated, truncated)` after each step: the batched
  transition. Rows whose episode already ended keep being stepped (their records are frozen);
  their actions and transitions are to be ignored.

A row's actions may depend only on that row's own observations and transitions and on the row's
`batch.keys` (its episode identity, for reproducible per-episode randomness), never on the other rows
or on how the episodes were batched. Only reference methods (`Method.sees_true_rule`) get
`batch.rules`; for everyone else it is None.

A plain callable `obs -> actions` is accepted wherever a policy is expected (a stateless policy).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np
import torch


@dataclass(frozen=True)
class EpisodeBatch:
    """What a policy learns about the episodes it is about to play."""

    L: int
    H: int
    keys: np.ndarray               # (N,) uint64 episode identities (see evaluation.episodes.episode_key)
    goal: np.ndarray               # (L,) uint8 goal tape
    success_bonus: float
    device: torch.device
    rules: np.ndarray | None = None   # (N,) true rules: only for reference methods
    family: Any = None                # the episodes' RuleFamily (None: elementary; cells 0..k-1, action +1 mod k)
    noise: float = 0.0                # the protocol's cell-update noise epsilon (0: noise-free dynamics)

    def __len__(self) -> int:
        return len(self.keys)


@runtime_checkable
class EvalPolicy(Protocol):
    def begin(self, batch: EpisodeBatch) -> None: ...

    def act(self, obs: torch.Tensor) -> torch.Tensor: ...

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None: ...


class StatelessPolicy:
    """An EvalPolicy around a function obs -> actions (greedy agents, fixed controllers)."""

    def __init__(self, act: Callable[[torch.Tensor], torch.Tensor]):
        self._act = act

    def begin(self, batch: EpisodeBatch) -> None:
        pass

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self._act(obs)

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        pass


def as_policy(policy) -> EvalPolicy:
    """An EvalPolicy as it is, or a callable obs -> actions wrapped as a stateless one."""
    if isinstance(policy, EvalPolicy):
        return policy
    if callable(policy):
        return StatelessPolicy(policy)
    raise TypeError(f"an evaluation policy needs begin/act/observe or must be a callable obs -> actions, "
                    f"got {type(policy).__name__}")


def greedy_policy(agent) -> EvalPolicy:
    """The evaluation policy of a trained agent: its own `evaluation_policy()` if it keeps per-episode
    state, else its greedy action `act(obs, greedy=True)`."""
    make = getattr(agent, "evaluation_policy", None)
    if make is not None:
        return as_policy(make())
    return StatelessPolicy(lambda obs: agent.act(obs, greedy=True))


def step_keys(keys: np.ndarray, t: int, salt: int) -> np.ndarray:
    """Counter-based 64-bit random words, one per episode, for step t under a method's `salt` (its seed).

    SplitMix64 of (key, salt, t): a pure function of the episode's identity, so a method's randomness
    does not depend on the other episodes in the batch, on batch sizes or on thread scheduling.
    """
    with np.errstate(over="ignore"):
        x = keys.astype(np.uint64) ^ mix64(np.uint64(salt) * np.uint64(0xD1B54A32D192ED03) + np.uint64(t + 1))
        return mix64(x + np.uint64(0x9E3779B97F4A7C15))


def uniform_below(words: np.ndarray, n: int) -> np.ndarray:
    """Map uniform 64-bit words to integers in [0, n) (multiply-shift on the high 32 bits)."""
    return ((words >> np.uint64(32)) * np.uint64(n) >> np.uint64(32)).astype(np.int64)


def mix64(x):
    """The SplitMix64 finaliser of uint64 words (elementwise): the counter-based streams' hash."""
    with np.errstate(over="ignore"):
        x = np.asarray(x, dtype=np.uint64)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))
