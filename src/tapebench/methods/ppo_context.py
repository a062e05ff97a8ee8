"""PPO (context) (docs/methods/ppo_context.md): the equivariant PPO with what the episode so far says about the rule
as extra input channels of every cell.

The context is the soft rule table of the in-context world model (`context_model.context_counts`): every
transition the episode has shown writes its cells' next values under their windows. A looked-up window gives k
numbers: whether the context showed it and the frequencies of next values 1..k-1 (0 where it did not). Cell a gets
k·(2r + 2) channels (8 for the elementary family): the lookup of its own window in the tape (what a step without
acting near it does), then of the windows of cells a-r..a+r once a is incremented (what acting on a does to its
neighbourhood, as far as the context has seen). With `lookahead` (default 2) cell a also gets the value of acting on
it one and two rule steps ahead through the context's table (its frequencies, uniform 1/k where it has not shown the
window; `lookahead_values`): the expected reward of the transition, then that plus the best second step's, the
episode's return over two steps when the context pins the rule. The lookups and the lookahead commute with shifts
of the tape (and goal) and the table does not depend on the transitions' order, so the actor stays
shift-equivariant: cell a's logit is read from cell a's features, and those see a's own channels.

Everything else is `ppo_equivariant`'s (`ppo.py`: its Config fields and defaults, rollouts, GAE, clipped loss). The
training agent keeps each environment row's context (emptied when the row's episode ends) and stores the augmented
observations [observation, channels] in its rollout; the evaluation policy (`evaluation_policy()`) keeps one per
episode, empty at `begin`, each observed transition of a running episode added. No seed blocks: seeds train one
after another.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from tapebench.grid_rules import MOORE_NAME, GridFamily
from tapebench.methods import equivariant
from tapebench.methods.common import adam
from tapebench.methods.context_model import entry_counts, increment, windows
from tapebench.methods.ppo import ActorCritic, EquivariantConfig, PPOAgent, Rollout, equivariant_network
from tapebench.rule_family import RuleFamily


@dataclass
class Config(EquivariantConfig):
    colours: int = 2
    """k of the rule family the context is read in (cells 0..k-1); must be the split's family (2: elementary)"""
    radius: int = 1
    """r of the rule family the context is read in (windows of 2r + 1 cells); must be the split's family"""
    neighbourhood: str = MOORE_NAME
    """on the 2D grid family only: the neighbourhood the context is read in ('moore' or 'von_neumann'; a cell's
    entry is its state and live-neighbour count); must be the split's family"""
    lookahead: int = 2
    """rule steps of the context table's lookahead channels (docs/methods/ppo_context.md): 0 none, 1 the value of
    acting on the cell one rule step ahead, 2 that and the value of acting on it, then on the best cell, two steps
    ahead"""
    lookahead_gain: float = 32.0
    """the actor's logit of cell a adds g times a's last lookahead value, g a learned scalar that starts here (0: no
    such path, the logit read from the trunk alone); a large start makes the untrained policy's argmax the lookahead's
    best cell (32: one nat per cell of expected mismatch at L = 32)"""

    def check(self) -> None:
        super().check()
        RuleFamily(self.colours, self.radius)
        try:
            GridFamily(self.neighbourhood)
        except ValueError as error:
            raise ValueError(f"PPO (context) hyperparameter {error}") from None
        if self.network != "equivariant":
            raise ValueError(f"PPO (context) hyperparameter network must be 'equivariant', got {self.network!r}")
        if isinstance(self.lookahead, bool) or self.lookahead not in LOOKAHEADS:
            raise ValueError(f"PPO (context) hyperparameter lookahead must be one of {list(LOOKAHEADS)}, got "
                             f"{self.lookahead!r}")
        if self.lookahead_gain != 0 and not self.lookahead:
            raise ValueError(f"PPO (context) hyperparameter lookahead_gain = {self.lookahead_gain} needs lookahead "
                             f"channels (lookahead 1 or 2), got lookahead = 0")
        if not math.isfinite(self.lookahead_gain) or not 0 <= self.lookahead_gain <= MAX_LOOKAHEAD_GAIN:
            raise ValueError(f"PPO (context) hyperparameter lookahead_gain must be a number in [0, "
                             f"{MAX_LOOKAHEAD_GAIN:g}], got {self.lookahead_gain}")


LOOKAHEADS = (0, 1, 2)
MAX_LOOKAHEAD_GAIN = 1024.0   # g x a lookahead value (at most L = 64 mismatches) stays a finite float32 logit; the
                              # default, 32, already makes the untrained argmax the lookahead's best cell
# entries of one (rows, L, L, k^(2r+1)) window-probability tensor of the lookahead (32 MB of float32): rows are
# batched to stay under it (1,024 rows at L = 32 in the elementary family)
LOOKAHEAD_ENTRIES = 2 ** 23


def feature_channels(family: RuleFamily, lookahead: int) -> int:
    """Context channels per cell: k per looked-up window (shown, then the frequencies of next values 1..k-1), for
    the cell's own window and for the 2r + 1 windows the increment of the cell changes: k·(2r + 2); then one
    lookahead value per step of `lookahead`."""
    return family.k * (2 * family.r + 2) + lookahead


def window_features(counts: torch.Tensor) -> torch.Tensor:
    """(N, E, k) counts -> (N, E, k): per window, shown (0/1), then the frequencies of next values 1..k-1."""
    total = counts.sum(-1, keepdim=True)
    return torch.cat([(total > 0).float(), counts[..., 1:] / total.clamp_min(1.0)], dim=-1)


def cell_features(tapes: torch.Tensor, counts: torch.Tensor, k: int, r: int) -> torch.Tensor:
    """(N, k·(2r+2), L) context channels of every cell a: the table's features of a's own window in the tape, then
    of the windows of cells a-r..a+r once cell a is incremented (what acting on a does, as the context has seen it).
    Rolling the tape by s rolls the channels by s."""
    features = window_features(counts)                                        # (N, E, k)
    index = windows(tapes, k, r)                                              # (N, L)
    delta = (tapes.long() + 1) % k - tapes.long()                             # the increment's change at a
    looked = [index] + [torch.roll(index, -j, dims=1) + delta * k ** (r + j) for j in range(-r, r + 1)]
    rows = torch.stack(looked, dim=1)                                         # (N, 2r+2, L)
    return looked_up(features, rows)


def looked_up(features: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """(N, E, k) per-entry features, (N, W, L) entries -> (N, W·k, L): the k features of each looked-up entry."""
    n, w, L = rows.shape
    k = features.shape[-1]
    picked = features.gather(1, rows.reshape(n, w * L, 1).expand(-1, -1, k))  # (N, W·L, k)
    return picked.view(n, w, L, k).permute(0, 1, 3, 2).reshape(n, w * k, L)


def table_probabilities(counts: torch.Tensor) -> torch.Tensor:
    """(N, E, k) counts -> (N, E, k) next-value probabilities: the context's frequencies, uniform (1/k) where it has
    not shown the window."""
    total = counts.sum(-1, keepdim=True)
    return torch.where(total > 0, counts / total.clamp_min(1.0), torch.full_like(counts, 1.0 / counts.shape[-1]))


def window_probabilities(marginals: torch.Tensor, r: int, offset: int | None = None,
                         incremented: torch.Tensor | None = None) -> torch.Tensor:
    """(..., L, k) independent cell marginals -> (..., L, k^(2r+1)): every cell's window distribution, window
    indices as `context_model.windows` (cell i-r most significant). With `offset` j the window of cell i reads cell
    i + j from `incremented` (the marginals of every cell incremented): the window cell i has when i + j is acted
    on."""
    out = None
    for j in range(-r, r + 1):
        cell = torch.roll(incremented if j == offset else marginals, -j, dims=-2)
        out = cell if out is None else (out.unsqueeze(-1) * cell.unsqueeze(-2)).flatten(-2)
    return out


def lookahead_values(tapes: torch.Tensor, goals: torch.Tensor, table: torch.Tensor, r: int, steps: int
                     ) -> torch.Tensor:
    """(N, steps, L) values of acting on every cell a, in the episode's reward (per L cells: -mismatches / L, +1 on
    reaching the goal, nothing after it) through the next-value probabilities `table` (N, E, k), cells treated as
    independent after the first rule step:

    * v1(a) = -E[d1] / L + P(goal after one step), d1 the mismatches after acting on a and one rule step;
    * v2(a) = v1(a) + (1 - P(goal after one step)) · max_b [-E[d2] / L + P(goal)] after acting on b, one more step.

    Exact for a table that is 0/1 on the windows it needs (a pinned rule): v1 the reward of the transition, v2 the
    best two-step return. Rolling tapes and goals by s rolls the values by s."""
    n, L = tapes.shape
    k = table.shape[-1]
    cells = torch.arange(L, device=tapes.device)
    post = tapes.long()[:, None, :].repeat(1, L, 1)                               # (N, A, L): acted on a
    post[:, cells, cells] = (post[:, cells, cells] + 1) % k
    index = windows(post, k, r)
    first = table[:, None].expand(n, L, -1, k).gather(2, index.unsqueeze(-1).expand(n, L, L, k))   # (N, A, L, k)
    goal = goals.long()[:, None, :, None].expand(n, L, L, 1)

    def at_goal(marginals):
        return marginals.gather(-1, goal).squeeze(-1)                              # (N, A, L) P(cell = goal's)

    hit1 = at_goal(first)
    reached1 = torch.log(hit1.clamp_min(1e-30)).sum(-1).exp()
    v1 = -(1 - hit1).sum(-1) / L + reached1
    if steps == 1:
        return v1[:, None]
    step = table[:, None]                                                          # (N, 1, E, k)
    hit2 = at_goal(window_probabilities(first, r) @ step)                          # no second action's change
    log_hit2 = torch.log(hit2.clamp_min(1e-30))
    misses, log_reached = (1 - hit2).sum(-1, keepdim=True), log_hit2.sum(-1, keepdim=True)
    incremented = torch.roll(first, 1, dims=-1)                                    # P(c) <- P(c - 1 mod k)
    for j in range(-r, r + 1):                                                     # cell i's window when b = i + j
        changed = at_goal(window_probabilities(first, r, j, incremented) @ step)
        misses = misses + torch.roll(hit2 - changed, j, dims=-1)                   # indexed by b
        log_reached = log_reached + torch.roll(torch.log(changed.clamp_min(1e-30)) - log_hit2, j, dims=-1)
    best = (-misses / L + log_reached.exp()).max(-1).values                        # (N, A)
    return torch.stack([v1, v1 + (1 - reached1) * best], dim=1)


class TapeCells:
    """Where the context is read on tapes: a cell's rule entry is its window of 2r + 1 cells (`RuleFamily`)."""

    def __init__(self, family: RuleFamily):
        self.family, self.k, self.entries = family, family.k, family.neighbourhoods

    def channels(self, lookahead: int) -> int:
        return feature_channels(self.family, lookahead)

    def matches(self, family) -> bool:
        return isinstance(family, RuleFamily) and (family.k, family.r) == (self.family.k, self.family.r)

    def describe(self) -> str:
        return f"k = {self.family.k}, r = {self.family.r} (hyperparameters colours, radius)"

    def index(self, tapes: torch.Tensor) -> torch.Tensor:
        return windows(tapes, self.family.k, self.family.r)

    def features(self, tapes: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return cell_features(tapes, counts, self.family.k, self.family.r)

    def lookahead(self, tapes: torch.Tensor, goals: torch.Tensor, table: torch.Tensor, steps: int) -> torch.Tensor:
        L = tapes.shape[1]
        rows = max(1, LOOKAHEAD_ENTRIES // (L * L * self.family.neighbourhoods))
        values = [lookahead_values(tapes[i:i + rows], goals[i:i + rows], table[i:i + rows], self.family.r, steps)
                  for i in range(0, len(tapes), rows)]
        return torch.cat(values) if values else torch.zeros(0, steps, L, device=tapes.device)


class GridCells:
    """Where the context is read on the 2D grid family (an n x n torus, cells row-major): a cell's rule entry is
    (state, live-neighbour count), index state·(m + 1) + count, as `GridFamily` numbers the rule table. Flipping
    cell a changes a's entry (its state) and each neighbour's (its count by ±1), so cell a gets 2·(m + 2) channels
    (20 for Moore): its own entry, then a's and its m neighbours' entries after the flip. The lookahead is one rule
    step (`lookahead_values`' v1, computed from the m + 1 cells the flip changes). Rolling the grid by (dy, dx)
    rolls every channel the same way."""

    k = 2

    def __init__(self, family: GridFamily, n: int):
        self.family, self.n = family, n
        self.m = family.neighbours
        self.entries = 2 * (self.m + 1)
        self.offsets = ((0, 0),) + family.offsets     # the cells a flip of cell a changes: a, then its neighbours

    def channels(self, lookahead: int) -> int:
        return self.k * (self.m + 2) + lookahead

    def matches(self, family) -> bool:
        return family == self.family

    def describe(self) -> str:
        return f"the {self.family.name_in_text} neighbourhood (hyperparameter neighbourhood)"

    def at(self, x: torch.Tensor, offset) -> torch.Tensor:
        """(..., L) -> (..., L): entry a is x's value at cell a + offset on the torus."""
        dr, dc = offset
        return torch.roll(x.unflatten(-1, (self.n, self.n)), shifts=(-dr, -dc), dims=(-2, -1)).flatten(-2)

    def index(self, tapes: torch.Tensor) -> torch.Tensor:
        tapes = tapes.long()
        return tapes * (self.m + 1) + sum(self.at(tapes, offset) for offset in self.family.offsets)

    def flipped(self, tapes: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """(N, m + 1, L): the entry of cell a + offset once cell a is flipped, for each offset of `offsets`."""
        delta = 1 - 2 * tapes.long()
        return torch.stack([index + delta * (self.m + 1)]
                           + [self.at(index, offset) + delta for offset in self.family.offsets], dim=1)

    def features(self, tapes: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        index = self.index(tapes)
        rows = torch.cat([index[:, None], self.flipped(tapes, index)], dim=1)          # (N, m + 2, L)
        return looked_up(window_features(counts), rows)

    def lookahead(self, tapes: torch.Tensor, goals: torch.Tensor, table: torch.Tensor, steps: int) -> torch.Tensor:
        """(N, 1, L) v1 of `lookahead_values` (one rule step, the only one `context_cells` allows on grids; cells
        independent given their entries)."""
        L = tapes.shape[1]
        table, goals = table.double(), goals.long()

        def hit(index, goal):                    # P(the cell's next value = the goal's) for (N, ..., L) entries
            rows = table.gather(1, index.flatten(1).unsqueeze(-1).expand(-1, -1, self.k)).view(*index.shape, self.k)
            return rows.gather(-1, goal.unsqueeze(-1)).squeeze(-1)

        index = self.index(tapes)
        base = hit(index, goals)                                                       # no flip near the cell
        changed = hit(self.flipped(tapes, index), torch.stack([self.at(goals, o) for o in self.offsets], dim=1))
        before = torch.stack([self.at(base, o) for o in self.offsets], dim=1)           # those cells, no flip
        log = lambda p: torch.log(p.clamp_min(1e-30))                                   # noqa: E731
        misses = (1 - base).sum(-1, keepdim=True) - (1 - before).sum(1) + (1 - changed).sum(1)
        reached = (log(base).sum(-1, keepdim=True) - log(before).sum(1) + log(changed).sum(1)).exp()
        return (-misses / L + reached).float()[:, None]


def context_cells(config: Config, env_spec):
    """The reader's geometry for this environment: `GridCells` on the grid family, else `TapeCells`."""
    if env_spec.grid is None:
        return TapeCells(RuleFamily(config.colours, config.radius))
    if config.lookahead > 1:
        raise ValueError(f"PPO (context) on the grid family looks one rule step ahead: set its hyperparameter "
                         f"lookahead to 0 or 1 (got {config.lookahead})")
    return GridCells(GridFamily(config.neighbourhood), env_spec.grid)


class ContextNetwork(nn.Module):
    """The equivariant trunk on per-cell inputs [cell, (goal's cell,) t/H, context channels] and a per-cell head (the
    actor: cell a's logit from cell a's features) or a pooled head (the critic), tanh and orthogonal init as PPO's.
    Input: augmented observations [observation (obs_dim), context channels (C·L, channel-major)]."""

    def __init__(self, config, env_spec, channels: int, pooled: bool, out_std: float, gain: float = 0.0):
        super().__init__()
        self.obs_dim, self.L, self.channels, self.pooled = env_spec.obs_dim, env_spec.L, channels, pooled
        own = 3 if env_spec.obs_dim == 2 * env_spec.L + 1 else 2
        builder = equivariant.pooled_network if pooled else equivariant.per_cell_network
        network = equivariant_network(lambda c, spec, activation: builder(c, spec, activation=activation,
                                                                          in_channels=own + channels),
                                      config, env_spec, out_std)
        self.trunk, self.head = network.trunk, network.head
        # the actor's path from the last lookahead channel to the logit (Config.lookahead_gain)
        self.gain = nn.Parameter(torch.tensor(float(gain))) if gain else None

    def forward(self, augmented: torch.Tensor) -> torch.Tensor:
        obs = augmented[..., :self.obs_dim]
        context = augmented[..., self.obs_dim:].reshape(*augmented.shape[:-1], self.channels, self.L)
        h = self.trunk.cells(torch.cat([self.trunk.observation_channels(obs), context], dim=-2))
        if self.pooled:
            return self.head(h.mean(dim=-1))
        logits = self.head(h).squeeze(-2)
        return logits if self.gain is None else logits + self.gain * context[..., -1, :]


class ContextActorCritic(ActorCritic):
    def __init__(self, config: Config, env_spec, channels: int):
        nn.Module.__init__(self)
        self.actor = ContextNetwork(config, env_spec, channels, pooled=False, out_std=0.01,
                                    gain=config.lookahead_gain)
        self.critic = ContextNetwork(config, env_spec, channels, pooled=True, out_std=1.0)


class ContextReader:
    """Per-row contexts (counts) and the augmented observations they give."""

    def __init__(self, cells, L: int, rows: int, device: torch.device, lookahead: int):
        self.cells, self.L, self.device, self.lookahead = cells, L, device, lookahead
        self.counts = torch.zeros(rows, cells.entries, cells.k, device=device)
        self.fixed_goals = None   # (rows, L) the episodes' goals where the observation does not show them

    def tapes(self, obs: torch.Tensor) -> torch.Tensor:
        tapes = obs[:, :self.L].to(self.device).round().long()
        if len(tapes) and (tapes.min() < 0 or tapes.max() >= self.cells.k):
            raise ValueError(f"PPO (context) reads k = {self.cells.k} colours (hyperparameter colours) but the tape "
                             f"holds values up to {int(tapes.max())}; set agents.ppo_context.colours to the split's "
                             f"family")
        return tapes

    def goals(self, obs: torch.Tensor) -> torch.Tensor:
        """(N, L) each row's goal: the observation's goal cells [s, g, t/H], else `fixed_goals`, else the all-zero
        tape (training's goal when the observation shows none)."""
        L = self.L
        if obs.shape[-1] == 2 * L + 1:
            return obs[:, L:2 * L].to(self.device).round().long()
        if self.fixed_goals is not None:
            return self.fixed_goals
        return torch.zeros(len(obs), L, dtype=torch.long, device=self.device)

    def augment(self, obs: torch.Tensor, counts: torch.Tensor | None = None) -> torch.Tensor:
        """[observation, the context channels of every cell (flattened)]."""
        counts = self.counts if counts is None else counts
        tapes = self.tapes(obs)
        channels = [self.cells.features(tapes, counts)]
        if self.lookahead:
            channels.append(self.cells.lookahead(tapes, self.goals(obs), table_probabilities(counts), self.lookahead))
        return torch.cat([obs.to(self.device), torch.cat(channels, dim=1).flatten(1)], dim=-1)

    def after(self, obs, actions, next_obs, rows=None) -> torch.Tensor:
        """The counts with each row's transition added (only `rows`, (N,) bool, when given)."""
        k = self.cells.k
        post = increment(self.tapes(obs), actions.to(self.device), k)
        valid = None if rows is None else rows.to(self.device)[:, None]
        return self.counts + entry_counts(self.cells.index(post[:, None]), self.tapes(next_obs)[:, None],
                                          self.cells.entries, k, valid)


class PPOContextAgent(PPOAgent):
    def __init__(self, config: Config, env_spec, total_steps: int, device):
        self.config, self.device = config, torch.device(device)
        self.cells = context_cells(config, env_spec)
        channels = self.cells.channels(config.lookahead)
        extra = channels * env_spec.L
        self.network = ContextActorCritic(config, env_spec, channels).to(self.device)
        self.optimizer = adam(self.network.parameters(), lr=config.learning_rate, eps=1e-5)
        self.rollout = Rollout(config.num_steps, config.num_envs, env_spec.obs_dim + extra, self.device)
        self.num_updates = max(1, math.ceil(total_steps / (config.num_envs * config.num_steps)))
        self.updates_done = 0
        self._pending = None
        self._augmented = None   # act()'s augmented observation, which observe() stores
        self.context = ContextReader(self.cells, env_spec.L, config.num_envs, self.device, config.lookahead)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, greedy: bool = False) -> torch.Tensor:
        if greedy:
            raise ValueError("PPO (context) reads the episode so far: evaluate it through evaluation_policy(), not "
                             "act(obs, greedy=True)")
        self._augmented = self.context.augment(obs)   # observe() stores it: PPO observes the obs it just acted on
        return super().act(self._augmented).to(obs.device)

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        following = self.context.after(obs, actions, next_obs)
        augmented_next = self.context.augment(next_obs, following)   # the successor as the episode has shown it
        super().observe(self._augmented, actions.to(self.device), rewards.to(self.device), augmented_next,
                        terminated.to(self.device), truncated.to(self.device))
        following[(terminated | truncated).to(self.device)] = 0.0     # a row whose episode ended starts afresh
        self.context.counts = following

    def evaluation_policy(self) -> "ContextPolicy":
        return ContextPolicy(self.network.actor, self.cells, self.device, self.config.lookahead)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "counts": self.context.counts.cpu().clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.context.counts = state["counts"].to(self.device).clone()


class ContextPolicy:
    """The greedy actor on [observation, the episode's rule features] (an EvalPolicy)."""

    def __init__(self, actor: nn.Module, cells, device, lookahead: int):
        self.actor, self.cells, self.device, self.lookahead = actor, cells, torch.device(device), lookahead

    def begin(self, batch) -> None:
        family = batch.family or RuleFamily()
        if not self.cells.matches(family):
            what = family.describe() if hasattr(family, "describe") else repr(family)
            raise ValueError(f"PPO (context) evaluation: the context is read in {self.cells.describe()}, not {what}")
        self.context = ContextReader(self.cells, batch.L, len(batch), self.device, self.lookahead)
        self.context.fixed_goals = torch.as_tensor(np.array(batch.row_goals()), dtype=torch.long, device=self.device)
        self.active = torch.ones(len(batch), dtype=torch.bool, device=self.device)

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor(self.context.augment(obs)).argmax(dim=1).to(obs.device)

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        self.context.counts = self.context.after(obs, actions, next_obs, self.active)
        self.active &= ~(terminated | truncated).to(self.device)


def make(config: Config, env_spec, total_steps: int, device) -> PPOContextAgent:
    return PPOContextAgent(config, env_spec, total_steps, device)
