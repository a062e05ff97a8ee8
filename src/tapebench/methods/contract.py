"""The method contract: what every method implements, learned or not (docs/methods/README.md).

Evaluation
----------
The evaluation-policy contract: what the runner drives on the common-random-number episodes.

Every method evaluates through one interface (docs/methods/README.md, "The method contract"). The runner
plays a batch of episodes that all start together; it calls

* `begin(batch)` once, before the first step: every row of `batch` starts a new episode, so a
  stateful policy (recurrent core, context of transitions, belief over rules, planner) resets its
  per-episode state here;
* `act(obs)` each step: (N, L+1) float observations [s, t/H] -> (N,) long cell indices; in the multi-goal
  protocol (docs/protocol.md#multi-goal) (N, 2L+1) observations [s, g, t/H] and `batch.goals` holds every
  row's goal (`batch.row_goals()` gives the rows' goals in either protocol);
* `observe(obs, actions, rewards, next_obs, terminated, truncated)` after each step: the batched
  transition. Rows whose episode already ended keep being stepped (their records are frozen);
  their actions and transitions are to be ignored.

A policy that infers the rule in context (a recurrent core, a context of transitions, a belief) may also define

* `carry(batch)`: like `begin`, every row starts a new episode (of `batch`), but the row keeps what it has
  gathered about its rule over the episodes it played since `begin` (its context, hidden state or posterior);
  per-episode bookkeeping (step counter, previous action, which rows are still playing) starts over. The
  few-shot study (docs/protocol.md#few-shot) adapts such a policy by carrying its context across the adaptation
  episodes into the test episode; row i of `batch` continues row i of the previous episodes.

A row's actions may depend only on that row's own observations and transitions and on the row's
`batch.keys` (its episode identity, for reproducible per-episode randomness), never on the other rows
or on how the episodes were batched. Only reference methods (`Method.sees_true_rule`) get
`batch.rules`; for everyone else it is None.

A plain callable `obs -> actions` is accepted wherever a policy is expected (a stateless policy).

Training (learned agents)
-------------------------
The agent contract: what a method that trains provides (its registry entry is in `tapebench.methods`).

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
  `evaluation_policy() -> EvalPolicy` (contract in `tapebench.methods.contract`): a fresh policy object
  with its own per-episode state, told when episodes begin and shown every transition.
* world models (registry entry `world_model=True`): `world_model_rollout(obs_prefix, action_prefix,
  actions) -> probabilities`. `obs_prefix` (N, C+1, obs_dim) float is the start of N episodes
  (`obs_prefix[:, 0]` the first observation, `obs_prefix[:, j+1]` the observation after
  `action_prefix[:, j]`, C >= 0), `actions` (N, D) long the D actions that follow. Returns (N, D, L) float:
  the model's probability that each cell is 1 after each of the D steps, predicted open loop from the
  prefix (no observation after `obs_prefix[:, C]` is used). Deterministic and side-effect free: no draws
  from the global generators, no change to any state (the pipeline's prediction-error diagnostics call it).
  Optionally a keyword `repeat` (default 1): `actions` has N x repeat rows, rows i*repeat..(i+1)*repeat-1
  following prefix i, so a planner scores many candidates from one filtered prefix (the world test uses it
  when the signature has it).

Seed blocks
-----------
A method may train many seeds in one process as a *seed block* (stacked parameters with a leading seed
dimension S, batched products, one optimiser step over the stacked tensors). Its module then provides

* `make_block(agents, generators) -> block`: `agents` are S single agents built exactly as S one-seed runs
  build them (for seed k: `seed_everything(seed_k)`, then `make(config, env_spec, total_steps, device)`), and
  `generators[k]` a `torch.Generator` holding the state of torch's global generator right after agent k was
  built, so it continues the stream a one-seed run continues. The agents must share config, total_steps and
  device. `make_block` raises `NotImplementedError` (with the reason) for a configuration it cannot stack; the
  loop then trains those seeds one after another.

The block has:

* `act(obs, greedy=False) -> actions`: obs (S, n, obs_dim) float -> (S, n) long. Seed k draws only from
  `generators[k]`, the same draws in the same order and shapes as its single agent draws from the global
  generator.
* `observe(obs, actions, rewards, next_obs, terminated, truncated)`: each with leading dimensions (S, n).
* `update() -> list[dict]`: learns when due (every seed has taken the same environment steps) and returns S
  metric dicts with the single agent's keys.
* `export_seed(k, agent)`: writes seed k's complete training state into the single agent `agent`, so that its
  `state_dict()` and `policy_state_dict()` are what a one-seed run holds at the same step (checkpoints and
  resume files are written through the single agent). `import_seed(k, agent)`: the reverse; every seed must be at
  the block's step (ValueError otherwise). To resume, the loop loads each seed's resume state into its agent and
  generator and calls `make_block` on them again, so a block takes its step from its first agent.
* `generators`: the S generators (the loop saves their states for resume).

Nothing may mix seeds: each seed's loss is its own mean (the losses are summed over seeds for one backward
pass, never averaged), gradient-norm clipping takes one norm per seed over that seed's slices
(`stacked.clip_grad_norm_per_seed_`), and Adam is element-wise (`stacked.SeedAdam`: one update call over
every seed's slices, each slice a tensor of its own, so it rounds as a one-seed run's Adam does). `methods/stacked.py` holds the stacked pieces.
A method whose block is bit for bit its one-seed runs on some devices says so on its `make_block`
(`make_block.bit_exact_devices`, e.g. ("cpu",)); elsewhere a seed's run fingerprint includes its block's seeds, so a
rerun of the same config reproduces it. `stacked.stacked_linear` computes the forward pass and the gradients with
products that round as `F.linear`'s do (one batched product for the shapes where a probe finds it exact, seed by
seed elsewhere). Which methods stack, and how exactly: docs/methods/README.md#seed-blocks.
"""
from __future__ import annotations

import dataclasses
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
    goals: np.ndarray | None = None   # (N, L) uint8 per-episode goals (multi-goal protocol); None: `goal` for all

    def __len__(self) -> int:
        return len(self.keys)

    def row_goals(self) -> np.ndarray:
        """(N, L) uint8: each row's goal tape, per-episode goals or `goal` in every row."""
        if self.goals is not None:
            return self.goals
        return np.broadcast_to(np.asarray(self.goal, dtype=np.uint8), (len(self.keys), self.L))


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


class ContractError(ValueError):
    """A method broke the method contract: the message names the method and the rule it broke (no traceback from
    deep inside the runner or the loop)."""


POLICY_METHODS = ("begin", "act", "observe")
AGENT_METHODS = ("act", "observe", "update", "state_dict", "load_state_dict", "policy_state_dict",
                 "load_policy_state_dict")


def check_actions(actions, n: int, who: str, call: str = "act(obs)"):
    """`actions` as the contract asks of `act`: an (n,) tensor (or array) of integer cell indices; else
    ContractError naming `who` (e.g. "method 'x'") and what it returned."""
    shape = getattr(actions, "shape", None)
    dtype = getattr(actions, "dtype", None)
    integer = dtype is not None and (not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool
                                     if isinstance(dtype, torch.dtype) else np.issubdtype(dtype, np.integer))
    if shape is None or tuple(shape) != (n,) or not integer:
        got = "None" if actions is None else f"a {type(actions).__name__}" + (
            f" of shape {tuple(shape)} and dtype {dtype}" if shape is not None else "")
        raise ContractError(f"{who}: {call} returned {got}; the method contract (tapebench.methods.contract) asks "
                            f"for an integer tensor of cell indices of shape ({n},), one per row")
    return actions


class BlockUnsupported(NotImplementedError):
    """Raised by a method's `make_block(agents, generators)` for a configuration it cannot stack (another
    network, say): the seed block then trains its seeds one after another, bit for bit one-seed runs."""


def as_policy(policy, who: str = "an evaluation policy") -> EvalPolicy:
    """An EvalPolicy as it is, or a callable obs -> actions wrapped as a stateless one; else ContractError naming
    `who` and the methods it lacks."""
    if isinstance(policy, EvalPolicy):
        return policy
    if callable(policy):
        return StatelessPolicy(policy)
    missing = [m for m in POLICY_METHODS if not callable(getattr(policy, m, None))]
    raise ContractError(f"{who}: its evaluation policy (a {type(policy).__name__}) has no {'/'.join(missing)}; the "
                        f"method contract (tapebench.methods.contract) asks for begin(batch), act(obs) and "
                        f"observe(...), or a callable obs -> actions")


def greedy_policy(agent) -> EvalPolicy:
    """The evaluation policy of a trained agent: its own `evaluation_policy()` if it keeps per-episode
    state, else its greedy action `act(obs, greedy=True)`."""
    make = getattr(agent, "evaluation_policy", None)
    if make is not None:
        return as_policy(make())
    return StatelessPolicy(lambda obs: agent.act(obs, greedy=True))

@dataclass(frozen=True)
class EnvSpec:
    """What an agent needs to know about the environment to build its networks."""

    L: int             # tape length; also the number of actions (flip cell 0..L-1)
    H: int             # training horizon
    obs_dim: int       # L + 1: the tape plus the time feature t/H; 2L + 1 with the goal ([s, g, t/H])
    num_actions: int   # L
    grid: int | None = None   # the 2D family (docs/protocol.md#grid): the torus side n, with L = n * n cells
                              # flattened row-major; None on tapes
    success_bonus: float | None = None   # the multi-goal protocol: the reward b on success (r = -d + b 1[d = 0]),
                                         # for hindsight relabelling; None with the fixed goal (not needed there)

    @property
    def goal_in_obs(self) -> bool:
        """The observation carries the episode's goal: [s, g, t/H] (the multi-goal protocol)."""
        return self.grid is None and self.obs_dim == 2 * self.L + 1

    @classmethod
    def for_tape(cls, L: int, H: int, goal_in_obs: bool = False, success_bonus: float | None = None) -> "EnvSpec":
        """`goal_in_obs`: the multi-goal protocol's observation [s, g, t/H] (docs/protocol.md#multi-goal), with its
        environment's `success_bonus`."""
        if success_bonus is not None and not goal_in_obs:
            raise ValueError("EnvSpec.success_bonus is for the multi-goal protocol (goal_in_obs=True)")
        return cls(L=int(L), H=int(H), obs_dim=(2 if goal_in_obs else 1) * int(L) + 1, num_actions=int(L),
                   success_bonus=None if success_bonus is None else float(success_bonus))

    def as_dict(self) -> dict:
        """The fields as checkpoints store them: `success_bonus` only where set (a fixed-goal checkpoint is byte for
        byte what it was before the field)."""
        fields = dataclasses.asdict(self)
        if fields["success_bonus"] is None:
            del fields["success_bonus"]
        return fields

    @classmethod
    def for_grid(cls, n: int, H: int) -> "EnvSpec":
        """An n x n torus grid: observation [grid row-major, t/H] (n * n + 1), action = a cell (n * n)."""
        cells = int(n) * int(n)
        return cls(L=cells, H=int(H), obs_dim=cells + 1, num_actions=cells, grid=int(n))


def split_observation(obs: torch.Tensor, L: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(..., L+1) observations [s, t/H] or (..., 2L+1) [s, g, t/H] (the multi-goal protocol) -> (tape (..., L),
    goal (..., L) or None where the observation has none, t/H (..., 1)): views, not copies. The one place that
    knows the observation's layout; every method that reads the goal reads it through here."""
    width = obs.shape[-1]
    if width == L + 1:
        return obs[..., :L], None, obs[..., L:]
    if width == 2 * L + 1:
        return obs[..., :L], obs[..., L:2 * L], obs[..., 2 * L:]
    raise ValueError(f"an observation of a tape of L = {L} cells has L + 1 = {L + 1} ([s, t/H]) or 2L + 1 = "
                     f"{2 * L + 1} ([s, g, t/H]) entries, got {width}")
