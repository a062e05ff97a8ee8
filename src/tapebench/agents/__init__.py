"""The agent contract: what a method that trains provides (its registry entry is in `tapebench.methods`).

An agent module (CleanRL style, one module per algorithm, see `dqn.py` / `ppo.py`) provides:

* `Config` — a dataclass of hyperparameters, each field documented, all with defaults. It must have
  `num_envs: int` (how many environments the shared loop steps in parallel for this agent).
  The pipeline's `agents.<id>` mapping overrides its fields; unknown keys are an error.
* `make(config, env_spec, total_steps, device) -> agent`, where `env_spec` is an `EnvSpec` and
  `total_steps` is the training budget in environment steps (for schedules such as ε decay).
* optionally `training_env(config) -> dict`: extra `BatchedTapeEnv` arguments for the training
  environment only (domain randomisation); evaluation always uses the protocol's environment.

The object returned by `make` has:

* `act(obs, greedy=False) -> actions` — obs (N, obs_dim) float tensor → (N,) long tensor of cell
  indices, used by the training loop. Randomness comes from torch's global generator (the loop seeds
  and checkpoints it).
* `observe(obs, actions, rewards, next_obs, terminated, truncated)` — one batched transition.
  `next_obs` is the true successor observation (the episode's last observation on rows that ended,
  not the auto-reset one): bootstrap from it on truncation, never on termination. A row whose
  episode ended starts a new episode (a new rule) at the next `act`: agents that keep per-episode
  state reset it for that row here.
* `update() -> dict[str, float]` — called after every `observe`; learns when it is time
  (e.g. every few steps for DQN, when the rollout is full for PPO); returns metrics to log (may be empty).
* `state_dict()` / `load_state_dict(state)` — the *complete* training state (networks, optimiser,
  replay buffer or partial rollout, per-episode state, counters), so a resumed run continues bit-identically.
* `policy_state_dict()` / `load_policy_state_dict(state)` — only what the evaluation policy needs;
  this is what evaluation checkpoints store.
* evaluation: `act(obs, greedy=True)` is the greedy policy and must not change any state; an agent
  that keeps per-episode state (a recurrent core, a context of transitions) instead defines
  `evaluation_policy() -> EvalPolicy` (contract in `tapebench.evaluation.policy`): a fresh policy object
  with its own per-episode state, told when episodes begin and shown every transition.
* world models (registry entry `world_model=True`): `world_model_rollout(obs_prefix, action_prefix,
  actions) -> probabilities`. `obs_prefix` (N, C+1, obs_dim) float is the start of N episodes
  (`obs_prefix[:, 0]` the first observation, `obs_prefix[:, j+1]` the observation after
  `action_prefix[:, j]`, C >= 0), `actions` (N, D) long the D actions that follow. Returns (N, D, L) float:
  the model's probability that each cell is 1 after each of the D steps, predicted open loop from the
  prefix (no observation after `obs_prefix[:, C]` is used). Deterministic and side-effect free: no draws
  from the global generators, no change to any state (the pipeline's prediction-error diagnostics call it).
"""
from __future__ import annotations

from dataclasses import dataclass


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
