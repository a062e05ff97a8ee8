"""Agent registry and the contract every agent module follows.

To add an agent, write one module (see `dqn.py` / `ppo.py`) and add one entry to `REGISTRY`.
The training loop (`tapebench.training.loop`) is shared; an agent module only holds the algorithm.

An agent module provides:

* `Config` — a dataclass of hyperparameters, each field documented, all with defaults. It must have
  `num_envs: int` (how many environments the shared loop steps in parallel for this agent).
  `tapebench train --params '{"agent": {...}}'` overrides its fields; unknown keys are an error.
* `make(config, env_spec, total_steps, device) -> agent`, where `env_spec` is an `EnvSpec` and
  `total_steps` is the training budget in environment steps (for schedules such as ε decay).

The object returned by `make` has:

* `act(obs, greedy=False) -> actions` — obs (N, obs_dim) float tensor → (N,) long tensor of cell
  indices. `greedy=True` is the evaluation policy and must not change any state.
  Randomness comes from torch's global generator (the loop seeds and checkpoints it).
* `observe(obs, actions, rewards, next_obs, terminated, truncated)` — one batched transition.
  `next_obs` is the true successor observation (the episode's last observation on rows that ended,
  not the auto-reset one): bootstrap from it on truncation, never on termination.
* `update() -> dict[str, float]` — called after every `observe`; learns when it is time
  (e.g. every few steps for DQN, when the rollout is full for PPO); returns metrics to log (may be empty).
* `state_dict()` / `load_state_dict(state)` — the *complete* training state (networks, optimiser,
  replay buffer or partial rollout, counters), so a resumed run continues bit-identically.
* `policy_state_dict()` / `load_policy_state_dict(state)` — only what the greedy policy needs;
  this is what evaluation checkpoints store.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import ModuleType

from . import dqn, ppo

REGISTRY: dict[str, ModuleType] = {
    "dqn": dqn,
    "ppo": ppo,
}


@dataclass(frozen=True)
class EnvSpec:
    """What an agent needs to know about the environment to build its networks."""

    L: int             # tape length; also the number of actions (flip cell 0..L-1)
    H: int             # training horizon
    obs_dim: int       # L + 1: the tape plus the time feature t/H
    num_actions: int   # L

    @classmethod
    def for_tape(cls, L: int, H: int) -> "EnvSpec":
        return cls(L=int(L), H=int(H), obs_dim=int(L) + 1, num_actions=int(L))


def get_agent(name: str) -> ModuleType:
    """The agent module registered under `name`; unknown names list the registered agents."""
    if name not in REGISTRY:
        raise ValueError(f"unknown agent {name!r}; registered agents: {sorted(REGISTRY)}")
    return REGISTRY[name]


def check_hyperparameters(name: str, overrides: dict | None) -> dict:
    """Validate override keys against the agent's `Config` fields; returns the full resolved dict."""
    return dataclasses.asdict(build_config(name, overrides))


def build_config(name: str, overrides: dict | None):
    """The agent's `Config` with `overrides` applied; unknown keys name the allowed ones."""
    module = get_agent(name)
    if overrides is None:
        overrides = {}
    if not isinstance(overrides, dict):
        raise ValueError(f"hyperparameters of agent {name!r} must be a mapping, got {overrides!r}")
    fields = {f.name: f for f in dataclasses.fields(module.Config)}
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ValueError(f"unknown hyperparameter(s) {unknown} for agent {name!r}; allowed: {list(fields)}")
    for key, value in overrides.items():
        _check_type(name, key, value, fields[key].type)
    config = module.Config(**overrides)
    if int(config.num_envs) < 1:
        raise ValueError(f"hyperparameter num_envs of agent {name!r} must be >= 1, got {config.num_envs}")
    check = getattr(config, "check", None)
    if check is not None:
        check()
    return config


_SCALAR_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,)}


def _check_type(agent: str, key: str, value, annotation) -> None:
    expected = _SCALAR_TYPES.get(annotation if isinstance(annotation, str) else getattr(annotation, "__name__", ""))
    if expected is None:
        return
    if isinstance(value, bool) and bool not in expected or not isinstance(value, expected):
        raise ValueError(f"hyperparameter {key!r} of agent {agent!r} must be {annotation}, got {value!r}")
