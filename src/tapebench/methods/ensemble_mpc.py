"""Ensemble MPC (paper v1; PETS-style, Chua et al., 2018), optionally with an information-gain bonus.

Model: an ensemble of `ensemble_size` MLP next-tape models, each a per-cell Bernoulli (sigmoid
outputs, binary cross-entropy), independently initialised. The rule is resampled at every reset and
never observed, so a model of (s_t, a_t) alone could only predict the *average* dynamics of the
training rules; the model is therefore given the episode's last transition as context:

    input  = [G(s_{t-1}, a_{t-1}), s_t, context flag, G(s_t, a_t)]   (3L + 1 values in {0, 1})
    output = P(s_{t+1}[i] = 1), i = 0..L-1

G is the intervention (flip cell a), which is known physics, so the model is fed the post-action tape
G(s_t, a_t) rather than a one-hot action: what it has to learn is the rule's update F_z alone. The
context pair is the previous post-action tape and its observed successor (which is the current tape
s_t); at t = 0 there is none: zeros and flag 0 (flag 1 once a transition has been seen). In open-loop
rollouts the model's own (thresholded) prediction becomes the next step's context.

`network = "equivariant"` (row `ensemble_mpc_equivariant`) makes every member the shift-equivariant network
of `equivariant.py` on the same inputs read as four channels per cell (context post-action tape, its
successor, the flag, the post-action tape) with a per-cell head: the CA step commutes with shifts, and the
trunk's pooling over cells lets every cell read the rule's neighbourhood -> successor pairs out of the
context transition anywhere on the tape.

Training (through the shared loop): data are collected with uniformly random actions (planning at
every training step would cost orders of magnitude more than the training itself); every transition
(with its context) goes into one replay; every `train_frequency` environment steps (once
`learning_starts` steps are collected) each member takes one Adam step on its *own* minibatch drawn
with replacement from the replay (online bootstrap), so members differ by initialisation and data.

Evaluation (`evaluation_policy()`): random-shooting MPC on the ensemble-mean probability. At every step
`candidates` action sequences of length `plan_horizon` (truncated at the episode's remaining steps)
are the *same* counter-based candidates as the true-dynamics MPC's (`oracle.mpc.episode_keys` +
`candidate_actions`, keyed by `planner_seed` and the episode identity), so the two planners face
common random numbers. Each sequence is rolled out open loop: the ensemble-mean probability thresholded
at 0.5 is the predicted next tape. The model predicts tapes only, never goals: in the multi-goal protocol
(observations [s, g, t/H]) the model's inputs are the tapes as with a fixed goal, and the planner scores each
predicted tape against the episode's own goal (`EpisodeBatch.row_goals`). It is scored exactly like the
true-dynamics MPC — the sum over its
steps of -dist plus the success bonus, stopping at the first predicted success, ties to the lowest
candidate index — plus, in the IG variant, `ig_weight` x the ensemble disagreement of each scored step.
The first action of the best sequence is executed, then the planner replans from the new context.

Disagreement of a step (nats): sum over cells of the Jensen-Shannon divergence of the members'
Bernoulli predictions, H(mean_e p_e) - mean_e H(p_e), i.e. the information the next tape carries about
which member is right (BALD under the per-cell factorisation). It is added like a per-step intrinsic
reward: score = sum_k (r_k + beta * IG_k), the sequence form of the Bayes filter's -E[dist] + beta * IG.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numba as nb
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tapebench.episodes.streams import candidate_action, episode_keys, step_key
from tapebench.methods import equivariant, stacked
from tapebench.methods.common import adam
from tapebench.methods.contract import BlockUnsupported


@dataclass
class Config:
    num_envs: int = 16
    """environments stepped in parallel; every one of their steps counts toward the budget"""
    ensemble_size: int = 5
    """number of independently initialised next-tape models"""
    hidden_size: int = 128
    """width of each hidden layer of every member (the planner's cost grows with it)"""
    hidden_layers: int = 2
    """number of hidden layers (ReLU) of every member"""
    learning_rate: float = 1e-3
    """Adam learning rate"""
    buffer_size: int = 200_000
    """replay capacity, in transitions (the paper budget keeps every transition)"""
    batch_size: int = 128
    """transitions per member per gradient step (each member draws its own)"""
    learning_starts: int = 1_000
    """environment steps collected before the first gradient step"""
    train_frequency: int = 4
    """environment steps per gradient step of the ensemble"""
    plan_horizon: int = 8
    """length of each candidate action sequence (truncated at the episode's remaining steps)"""
    candidates: int = 512
    """random action sequences scored per decision"""
    ig_weight: float = 0.0
    """beta: weight of the ensemble disagreement (nats) added to each scored step; 0 = plain ensemble MPC"""
    planner_seed: int = 0
    """seed of the planner's counter-based candidate sequences (with the episode identity)"""
    plan_rows: int = 32_768
    """episodes x candidates evaluated per forward pass (bounds the planner's memory)"""
    network: str = "mlp"
    """each member: "mlp" (hidden_size x hidden_layers on the 3L + 1 inputs) or "equivariant" (circular convolutions
    over the cells, cell i's prediction read from cell i's features; docs/methods/dqn_equivariant.md#equivariant-networks)"""
    conv_channels: int = equivariant.CHANNELS
    """equivariant network: feature channels per cell"""
    conv_layers: int = equivariant.LAYERS
    """equivariant network: residual circular-convolution blocks, dilations 1, 2, 4, ..., 2^(conv_layers - 1)"""
    conv_kernel: int = equivariant.KERNEL
    """equivariant network: kernel size of each circular convolution (odd)"""
    global_pool: bool = equivariant.GLOBAL_POOL
    """equivariant network: each block adds a linear map of the mean over cells to every cell (whole tape in view)"""

    def check(self) -> None:
        equivariant.check_network(self, "Ensemble MPC")
        positive = ("ensemble_size", "hidden_size", "hidden_layers", "buffer_size", "batch_size", "train_frequency",
                    "plan_horizon", "candidates", "plan_rows")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"Ensemble MPC hyperparameter {name} must be >= 1, got {getattr(self, name)}")
        if self.learning_rate <= 0:
            raise ValueError(f"Ensemble MPC hyperparameter learning_rate must be > 0, got {self.learning_rate}")
        for name in ("learning_starts", "planner_seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"Ensemble MPC hyperparameter {name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.ig_weight <= 100.0:
            raise ValueError(f"Ensemble MPC hyperparameter ig_weight must be in [0, 100], got {self.ig_weight}")
        if self.plan_rows < self.candidates:
            raise ValueError(f"Ensemble MPC hyperparameter plan_rows must be >= candidates ({self.candidates}), "
                             f"got {self.plan_rows}")


@dataclass
class IGConfig(Config):
    ig_weight: float = 0.25
    """beta: weight of the ensemble disagreement (nats) added to each scored step (0.25, the Bayes filter's)"""


@dataclass
class EquivariantConfig(Config):
    """The ensemble MPC's Config with shift-equivariant members (registry row `ensemble_mpc_equivariant`)."""

    network: str = "equivariant"
    """each member: "mlp" (hidden_size x hidden_layers on the 3L + 1 inputs) or "equivariant" (circular convolutions
    over the cells, cell i's prediction read from cell i's features; docs/methods/dqn_equivariant.md#equivariant-networks)"""


# --- the model ----------------------------------------------------------------------------------
def flip_cells(tapes: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """The intervention G on (..., L) tapes of 0/1 values: flip cell actions[...] (a new tensor)."""
    flipped = tapes.clone()
    cell = flipped.gather(-1, actions.unsqueeze(-1))
    flipped.scatter_(-1, actions.unsqueeze(-1), 1 - cell)
    return flipped


def model_inputs(ctx_post, ctx_next, has_ctx, post) -> torch.Tensor:
    """[previous post-action tape, its successor, context flag, post-action tape] as float32 (..., 3L + 1)."""
    return torch.cat([ctx_post.float(), ctx_next.float(), has_ctx.float().unsqueeze(-1), post.float()], dim=-1)


class EnsembleLinear(nn.Module):
    """`members` independent linear layers applied together: (E, B, in) -> (E, B, out) with one batched
    matmul. Each member is initialised like nn.Linear (uniform in +-1/sqrt(in)) from the global generator."""

    def __init__(self, members: int, in_dim: int, out_dim: int):
        super().__init__()
        bound = 1.0 / math.sqrt(in_dim)
        self.weight = nn.Parameter(torch.empty(members, in_dim, out_dim).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(members, 1, out_dim).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class Ensemble(nn.Module):
    """E MLP next-tape models: inputs (E, B, 3L + 1), each member its own -> logits (E, B, L) of each cell
    being 1 after the step. `probs` takes inputs shared by all members (planning, rollouts)."""

    def __init__(self, members: int, L: int, hidden_size: int, hidden_layers: int):
        super().__init__()
        layers, width = [], 3 * L + 1
        for _ in range(hidden_layers):
            layers += [EnsembleLinear(members, width, hidden_size), nn.ReLU()]
            width = hidden_size
        layers.append(EnsembleLinear(members, width, L))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def probs(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3L + 1) inputs shared by every member -> (E, B, L) member probabilities (no gradient).

        The planner's hot path: one fused GEMM + bias per member and layer on contiguous blocks, ReLUs in
        place (the batched form that expands x to (E, B, in) spends more time moving memory than computing)."""
        layers = [m for m in self.net if isinstance(m, EnsembleLinear)]
        with torch.no_grad():
            out = []
            for e in range(layers[0].weight.shape[0]):
                h = x
                for i, layer in enumerate(layers):
                    h = torch.addmm(layer.bias[e], h, layer.weight[e])
                    h = h.relu_() if i < len(layers) - 1 else h.sigmoid_()
                out.append(h)
            return torch.stack(out)


class EquivariantEnsemble(nn.Module):
    """E shift-equivariant next-tape models with the MLP ensemble's interface: inputs (E, B, 3L + 1) -> logits
    (E, B, L), `probs` (B, 3L + 1) -> (E, B, L). The inputs are read as four channels per cell (context post-action
    tape, its successor, the context flag at every cell, the post-action tape); rolling the three tapes by k rolls
    every member's prediction by k."""

    def __init__(self, members: int, config: Config, env_spec):
        super().__init__()
        self.L = env_spec.L
        self.members = nn.ModuleList(equivariant.per_cell_network(config, env_spec, in_channels=4)
                                     for _ in range(members))

    def per_cell_inputs(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3L + 1) -> (B, 4, L)."""
        L = self.L
        return torch.stack([x[:, :L], x[:, L:2 * L], x[:, 2 * L:2 * L + 1].expand(-1, L), x[:, 2 * L + 1:]], dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([member.cells(self.per_cell_inputs(x[e])) for e, member in enumerate(self.members)])

    def probs(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3L + 1) inputs shared by every member -> (E, B, L) member probabilities (no gradient)."""
        with torch.no_grad():
            cells = self.per_cell_inputs(x)
            return torch.stack([member.cells(cells).sigmoid_() for member in self.members])


def next_tape_model(config: Config, env_spec) -> nn.Module:
    """The ensemble `config.network` asks for: MLP members or shift-equivariant ones."""
    if config.network == "equivariant":
        return EquivariantEnsemble(config.ensemble_size, config, env_spec)
    return Ensemble(config.ensemble_size, env_spec.L, config.hidden_size, config.hidden_layers)


def bernoulli_entropy(p: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of Bernoulli(p), elementwise (0 at p = 0 and p = 1)."""
    return -(torch.special.xlogy(p, p) + torch.special.xlogy(1 - p, 1 - p))


def disagreement(member_probs: torch.Tensor) -> torch.Tensor:
    """Ensemble disagreement of (E, rows, L) member probabilities -> (rows,) nats: the sum over cells of
    the Jensen-Shannon divergence across members, H(mean p) - mean H(p) (0 iff all members agree)."""
    jsd = bernoulli_entropy(member_probs.mean(0)) - bernoulli_entropy(member_probs).mean(0)
    return jsd.clamp_min(0.0).sum(-1)


# --- replay -------------------------------------------------------------------------------------
class Replay:
    """Ring buffer of transitions with their context, tapes stored as uint8."""

    FIELDS = ("ctx_post", "has_ctx", "tape", "action", "next_tape")

    def __init__(self, capacity: int, L: int, device: torch.device):
        self.capacity, self.device = capacity, device
        self.ctx_post = torch.zeros(capacity, L, dtype=torch.uint8, device=device)
        self.has_ctx = torch.zeros(capacity, dtype=torch.uint8, device=device)
        self.tape = torch.zeros(capacity, L, dtype=torch.uint8, device=device)
        self.action = torch.zeros(capacity, dtype=torch.long, device=device)
        self.next_tape = torch.zeros(capacity, L, dtype=torch.uint8, device=device)
        self.position = 0
        self.size = 0

    def add(self, ctx_post, has_ctx, tape, action, next_tape) -> None:
        slots = ((self.position + torch.arange(len(action))) % self.capacity).to(self.device)
        self.ctx_post[slots], self.has_ctx[slots], self.tape[slots] = ctx_post, has_ctx, tape
        self.action[slots], self.next_tape[slots] = action, next_tape
        self.position = (self.position + len(action)) % self.capacity
        self.size = min(self.capacity, self.size + len(action))

    def sample(self, members: int, batch_size: int):
        """Each member its own minibatch, drawn with replacement: (inputs (E, B, 3L+1), targets (E, B, L))."""
        idx = torch.randint(0, self.size, (members, batch_size)).to(self.device)
        tape = self.tape[idx]
        inputs = model_inputs(self.ctx_post[idx], tape, self.has_ctx[idx], flip_cells(tape, self.action[idx]))
        return inputs, self.next_tape[idx].float()

    def state_dict(self) -> dict:
        n = self.size
        return {"position": self.position, "size": n,
                **{name: getattr(self, name)[:n].cpu().clone() for name in self.FIELDS}}

    def load_state_dict(self, state: dict) -> None:
        n = state["size"]
        if n > self.capacity:
            raise ValueError(f"replay state holds {n} transitions but buffer_size is {self.capacity}")
        for name in self.FIELDS:
            getattr(self, name)[:n] = state[name].to(self.device)
        self.position, self.size = state["position"], n


# --- the agent ----------------------------------------------------------------------------------
class EnsembleMPCAgent:
    def __init__(self, config: Config, env_spec, total_steps: int, device):
        self.config, self.device = config, torch.device(device)
        self.L = env_spec.L
        self.ensemble = next_tape_model(config, env_spec).to(self.device)
        self.optimizer = adam(self.ensemble.parameters(), lr=config.learning_rate)
        self.replay = Replay(config.buffer_size, self.L, self.device)
        # per-row context of the training environments: the last post-action tape and whether there is one
        self.ctx_post = torch.zeros(config.num_envs, self.L, dtype=torch.uint8, device=self.device)
        self.has_ctx = torch.zeros(config.num_envs, dtype=torch.uint8, device=self.device)
        self.env_steps = 0
        self.gradient_steps = 0
        self.next_train_step = config.train_frequency

    def act(self, obs: torch.Tensor, greedy: bool = False) -> torch.Tensor:
        """Training data collection: a uniformly random cell per row (torch's global generator)."""
        if greedy:
            raise ValueError("Ensemble MPC plans with a per-episode context: evaluate it through "
                             "evaluation_policy(), not act(obs, greedy=True)")
        return torch.randint(0, self.L, (obs.shape[0],)).to(obs.device)

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        tape = obs[:, :self.L].to(self.device).to(torch.uint8)
        actions = actions.to(self.device)
        next_tape = next_obs[:, :self.L].to(self.device).to(torch.uint8)
        self.replay.add(self.ctx_post, self.has_ctx, tape, actions, next_tape)
        self.env_steps += len(actions)
        # the context of the next step is this transition; a row whose episode ended starts without one
        keep = (~(terminated | truncated)).to(self.device).to(torch.uint8)
        self.ctx_post = flip_cells(tape, actions) * keep.unsqueeze(1)
        self.has_ctx = keep

    def update(self) -> dict:
        metrics = {}
        while self.env_steps >= self.next_train_step:
            self.next_train_step += self.config.train_frequency
            if self.env_steps >= self.config.learning_starts:
                metrics = self._gradient_step()
        return metrics

    def _gradient_step(self) -> dict:
        c = self.config
        inputs, targets = self.replay.sample(c.ensemble_size, c.batch_size)
        logits = self.ensemble(inputs)
        # summed over members: each member's parameters get the gradient of its own mean BCE
        loss = F.binary_cross_entropy_with_logits(logits, targets, reduction="none").mean(dim=(1, 2)).sum()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.gradient_steps += 1
        with torch.no_grad():
            error = ((logits > 0).float() != targets).float().mean()
        return {"model_loss": loss.item() / c.ensemble_size, "model_cell_error": error.item()}

    # --- evaluation -------------------------------------------------------------------------
    def evaluation_policy(self) -> "EnsemblePlanner":
        return EnsemblePlanner(self.ensemble.probs, self.config, self.device)

    @torch.no_grad()
    def world_model_rollout(self, obs_prefix, action_prefix, actions, repeat: int = 1) -> torch.Tensor:
        """(N * repeat, D, L) ensemble-mean probability of each cell after each of the D `actions`, open loop from
        the prefix's last transition (agent contract; each prefix serves `repeat` consecutive rows of `actions`);
        the thresholded mean is fed back as the next tape."""
        L, C = self.L, action_prefix.shape[1]
        obs_prefix, actions = obs_prefix.to(self.device), actions.to(self.device)
        tapes = obs_prefix[:, C, :L].round()
        if C > 0:
            ctx_post = flip_cells(obs_prefix[:, C - 1, :L].round(), action_prefix[:, C - 1].to(self.device))
            has_ctx = torch.ones(len(tapes), device=self.device)
        else:
            ctx_post, has_ctx = torch.zeros_like(tapes), torch.zeros(len(tapes), device=self.device)
        if repeat != 1:
            tapes, ctx_post, has_ctx = (x.repeat_interleave(repeat, 0) for x in (tapes, ctx_post, has_ctx))
        out = torch.empty(len(tapes), actions.shape[1], L, device=self.device)
        for d in range(actions.shape[1]):
            post = flip_cells(tapes, actions[:, d])
            mean = self.ensemble.probs(model_inputs(ctx_post, tapes, has_ctx, post)).mean(0)
            out[:, d] = mean
            ctx_post, tapes, has_ctx = post, (mean > 0.5).float(), torch.ones_like(has_ctx)
        return out

    # --- checkpointing ----------------------------------------------------------------------
    def policy_state_dict(self) -> dict:
        return {"ensemble": self.ensemble.state_dict()}

    def load_policy_state_dict(self, state: dict) -> None:
        self.ensemble.load_state_dict(state["ensemble"])

    def state_dict(self) -> dict:
        return {"ensemble": self.ensemble.state_dict(), "optimizer": self.optimizer.state_dict(),
                "replay": self.replay.state_dict(),
                "context": {"ctx_post": self.ctx_post.cpu().clone(), "has_ctx": self.has_ctx.cpu().clone()},
                "counters": {"env_steps": self.env_steps, "gradient_steps": self.gradient_steps,
                             "next_train_step": self.next_train_step}}

    def load_state_dict(self, state: dict) -> None:
        self.ensemble.load_state_dict(state["ensemble"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.replay.load_state_dict(state["replay"])
        self.ctx_post = state["context"]["ctx_post"].to(self.device).clone()
        self.has_ctx = state["context"]["has_ctx"].to(self.device).clone()
        for name, value in state["counters"].items():
            setattr(self, name, value)


# --- the planner --------------------------------------------------------------------------------
@nb.njit(cache=True)
def candidate_sequences(keys, t, candidates, horizon, L):
    """(episodes, candidates, horizon) candidate actions at step t: per episode exactly
    `oracle.mpc.candidate_actions(step_key(key, t), candidates, horizon, L)`, the true-dynamics MPC's."""
    out = np.empty((keys.shape[0], candidates, horizon), dtype=np.int64)
    for i in range(keys.shape[0]):
        k_t = step_key(keys[i], t)
        for c in range(candidates):
            for k in range(horizon):
                out[i, c, k] = candidate_action(k_t, c * horizon + k, L)
    return out


class EnsemblePlanner:
    """Random-shooting MPC on the ensemble (an EvalPolicy). Per-episode state: the context transition.

    `member_probs(inputs (rows, 3L+1)) -> (E, rows, L)` is the model it plans with (the trained ensemble's
    sigmoid outputs; tests swap in the true dynamics).
    """

    def __init__(self, member_probs, config: Config, device):
        self.member_probs, self.config, self.device = member_probs, config, torch.device(device)

    def begin(self, batch) -> None:
        n, self.L, self.H, self.t = len(batch), batch.L, batch.H, 0
        self.keys = episode_keys(batch.keys, self.config.planner_seed)
        # each row's goal: the episode's own in the multi-goal protocol, `batch.goal` in every row otherwise
        self.goals = torch.as_tensor(np.array(batch.row_goals(), dtype=np.uint8), device=self.device)
        self.score_bonus = float(batch.success_bonus) * batch.L
        self.active = torch.ones(n, dtype=torch.bool, device=self.device)
        self.ctx_post = torch.zeros(n, self.L, dtype=torch.uint8, device=self.device)
        self.has_ctx = torch.zeros(n, dtype=torch.uint8, device=self.device)

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        c = self.config
        tapes = obs[:, :self.L].to(self.device).to(torch.uint8)
        actions = torch.zeros(len(tapes), dtype=torch.long, device=self.device)
        rows = torch.nonzero(self.active).squeeze(1).cpu().numpy()
        depth = min(c.plan_horizon, self.H - self.t)
        chunk = max(1, c.plan_rows // c.candidates)
        for start in range(0, len(rows), chunk):
            part = rows[start:start + chunk]
            sequences = candidate_sequences(self.keys[part], self.t, c.candidates, c.plan_horizon, self.L)
            index = torch.from_numpy(part).to(self.device)
            actions[index] = self.plan(self.ctx_post[index], self.has_ctx[index], tapes[index],
                                       torch.from_numpy(sequences).to(self.device), depth, self.goals[index])
        return actions.to(obs.device)

    def plan(self, ctx_post, has_ctx, tapes, sequences, depth, goals) -> torch.Tensor:
        """First action of the best candidate of each episode. ctx_post/tapes/goals (n, L) uint8, has_ctx (n,),
        sequences (n, C, horizon) long; `depth` <= horizon steps are rolled out and scored against each
        episode's goal."""
        n, C, L = sequences.shape[0], sequences.shape[1], self.L
        beta = float(self.config.ig_weight)
        # scores in units of cells: L x (return + beta * sum of disagreements); exact integers when beta = 0
        score = torch.zeros(n, C, dtype=torch.float64, device=self.device)
        alive = torch.ones(n, C, dtype=torch.bool, device=self.device)
        # depth 0: the context and the tape are the episode's own, so only L distinct inputs per episode
        first = torch.arange(L, device=self.device).expand(n, L)
        post = flip_cells(tapes.unsqueeze(1).expand(n, L, L), first)                       # (n, L, L)
        nxt, ig = self._predict(ctx_post.unsqueeze(1).expand(n, L, L), tapes.unsqueeze(1).expand(n, L, L),
                                has_ctx.unsqueeze(1).expand(n, L), post, beta > 0)
        gather = sequences[:, :, 0]
        pick = gather.unsqueeze(-1).expand(n, C, L)
        post, nxt = post.gather(1, pick), nxt.gather(1, pick)                               # (n, C, L)
        ig = ig.gather(1, gather) if ig is not None else None
        for k in range(depth):
            if k > 0:
                post = flip_cells(nxt, sequences[:, :, k])
                nxt, ig = self._predict(ctx_post, tapes, torch.ones_like(alive, dtype=torch.uint8), post, beta > 0)
            mismatches = (nxt != goals.unsqueeze(1)).sum(-1).to(torch.float64)
            hit = mismatches == 0
            gain = torch.where(hit, torch.full_like(mismatches, self.score_bonus), -mismatches)
            if ig is not None:
                gain = gain + (beta * L) * ig.to(torch.float64)
            score += torch.where(alive, gain, torch.zeros_like(gain))
            alive &= ~hit
            ctx_post, tapes = post, nxt
            if not bool(alive.any()):
                break
        best = score.max(dim=1, keepdim=True).values
        candidate = torch.arange(C, device=self.device).expand(n, C)
        first_best = torch.where(score == best, candidate, C).min(dim=1).values            # ties: lowest index
        return sequences[:, :, 0].gather(1, first_best.unsqueeze(1)).squeeze(1)

    def _predict(self, ctx_post, tapes, has_ctx, post, with_ig):
        """Thresholded ensemble-mean next tapes (uint8, same shape as `post`) and, if asked, the disagreement."""
        shape = post.shape
        inputs = model_inputs(ctx_post.reshape(-1, shape[-1]), tapes.reshape(-1, shape[-1]), has_ctx.reshape(-1),
                              post.reshape(-1, shape[-1]))
        member = self.member_probs(inputs)
        nxt = (member.mean(0) > 0.5).to(torch.uint8).view(shape)
        return nxt, (disagreement(member).view(shape[:-1]) if with_ig else None)

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        tapes = obs[:, :self.L].to(self.device).to(torch.uint8)
        self.ctx_post = flip_cells(tapes, actions.to(self.device))
        self.has_ctx = torch.ones_like(self.has_ctx)
        self.active &= ~(terminated | truncated).to(self.device)
        self.t += 1


def make(config: Config, env_spec, total_steps: int, device) -> EnsembleMPCAgent:
    return EnsembleMPCAgent(config, env_spec, total_steps, device)


# --- seed blocks --------------------------------------------------------------------------------
COUNTERS = ("env_steps", "gradient_steps", "next_train_step")
SHARED = {"config": lambda a: a.config, "tape length": lambda a: a.L, "device": lambda a: a.device}


def block_step(block_or_agent, position: int, size: int) -> dict:
    """Where an ensemble MPC block or agent is: its counters and its replay's position and size."""
    return {**{name: getattr(block_or_agent, name) for name in COUNTERS}, "replay": (position, size)}


def ensemble_logits(parameters: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """`Ensemble.forward` on its parameters [W0, b0, W1, b1, ...]: x (E, B, in) -> logits (E, B, L); with a leading
    seed dimension on every tensor, S ensembles at once (their S x E members as one batch of products)."""
    lead, x = x.shape[:-2], x.flatten(0, -3)
    layers = len(parameters) // 2
    for i in range(layers):
        weight, bias = parameters[2 * i], parameters[2 * i + 1]
        x = torch.baddbmm(bias.flatten(0, -3), x, weight.flatten(0, -3))
        if i < layers - 1:
            x = torch.relu(x)
    return x.view(*lead, *x.shape[-2:])


class EnsembleMPCBlock:
    """S seeds of ensemble MPC trained as one seed block (methods/contract.py, "Seed blocks"): the S ensembles'
    parameters stacked (S, E, ...), one SeedAdam, a stacked replay and training contexts; seed k's random actions and
    minibatch indices drawn from `generators[k]` in its one-seed order; each seed's loss its own (the sum over its
    members of their mean cross-entropies).

    On the CPU a seed's forward and loss run seed by seed (`ensemble_logits` on its own tensors: its one-seed
    products, bit for bit); elsewhere the S x E members are one batch of products.
    """

    def __init__(self, agents: list[EnsembleMPCAgent], generators: list[torch.Generator]):
        stacked.check_block_agents(agents, generators, EnsembleMPCAgent, "EnsembleMPCBlock", SHARED)
        first = agents[0]
        if first.config.network != "mlp":
            raise BlockUnsupported("ensemble MPC stacks MLP members only: the equivariant members are separate "
                                   "per-cell networks run one after another, with nothing to batch over seeds")
        self.config, self.device, self.L = first.config, first.device, first.L
        self.num_seeds, self.generators = len(agents), generators
        self.parameters = stacked.stack_parameters([a.ensemble for a in agents], requires_grad=True)
        self.optimizer = stacked.SeedAdam(self.parameters, lr=self.config.learning_rate,
                                          eps=first.optimizer.param_groups[0]["eps"])
        S, replay = self.num_seeds, first.replay
        self.replay = {name: torch.zeros((S,) + getattr(replay, name).shape, dtype=getattr(replay, name).dtype,
                                         device=self.device) for name in Replay.FIELDS}
        self.position, self.size = replay.position, replay.size
        self.ctx_post = torch.stack([a.ctx_post for a in agents])
        self.has_ctx = torch.stack([a.has_ctx for a in agents])
        for name in COUNTERS:
            setattr(self, name, getattr(first, name))
        for k, agent in enumerate(agents):
            self.import_seed(k, agent)

    def act(self, obs: torch.Tensor, greedy: bool = False) -> torch.Tensor:
        """obs (S, n, obs_dim) -> uniformly random cells (S, n), seed k's from generators[k]."""
        if greedy:
            raise ValueError("Ensemble MPC plans with a per-episode context: evaluate it through "
                             "evaluation_policy(), not act(obs, greedy=True)")
        n = obs.shape[1]
        return torch.stack([torch.randint(0, self.L, (n,), generator=g) for g in self.generators]).to(obs.device)

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        L, n = self.L, actions.shape[1]
        tape = obs[..., :L].to(self.device).to(torch.uint8)
        actions = actions.to(self.device)
        next_tape = next_obs[..., :L].to(self.device).to(torch.uint8)
        slots = ((self.position + torch.arange(n)) % self.config.buffer_size).to(self.device)
        for name, value in zip(Replay.FIELDS, (self.ctx_post, self.has_ctx, tape, actions, next_tape)):
            self.replay[name][:, slots] = value
        self.position = (self.position + n) % self.config.buffer_size
        self.size = min(self.config.buffer_size, self.size + n)
        self.env_steps += n
        keep = (~(terminated | truncated)).to(self.device).to(torch.uint8)
        self.ctx_post = flip_cells(tape, actions) * keep.unsqueeze(-1)
        self.has_ctx = keep

    def update(self) -> list[dict]:
        metrics = [{} for _ in range(self.num_seeds)]
        while self.env_steps >= self.next_train_step:
            self.next_train_step += self.config.train_frequency
            if self.env_steps >= self.config.learning_starts:
                metrics = self._gradient_step()
        return metrics

    def _gradient_step(self) -> list[dict]:
        c, S, E = self.config, self.num_seeds, self.config.ensemble_size
        idx = torch.stack([torch.randint(0, self.size, (E, c.batch_size), generator=g) for g in self.generators])
        seeds = torch.arange(S).view(S, 1, 1)
        seeds, idx = seeds.to(self.device), idx.to(self.device)
        r = self.replay
        tape = r["tape"][seeds, idx]
        inputs = model_inputs(r["ctx_post"][seeds, idx], tape, r["has_ctx"][seeds, idx],
                              flip_cells(tape, r["action"][seeds, idx]))
        targets = r["next_tape"][seeds, idx].float()
        if self.device.type != "cpu":   # the S x E members as one batch of products
            logits = ensemble_logits(self.parameters, inputs)
            losses = F.binary_cross_entropy_with_logits(logits, targets, reduction="none").mean(dim=(2, 3)).sum(1)
        else:   # seed by seed: each seed's own products and sums
            per_seed = zip(*(p.unbind(0) for p in self.parameters))
            logits = [ensemble_logits(list(params), x) for params, x in zip(per_seed, inputs.unbind(0))]
            losses = torch.stack([F.binary_cross_entropy_with_logits(seed_logits, seed_targets, reduction="none")
                                  .mean(dim=(1, 2)).sum() for seed_logits, seed_targets in zip(logits, targets)])
        self.optimizer.zero_grad()
        losses.sum().backward()   # a sum: seed k's gradient is its own loss's
        self.optimizer.step()
        self.gradient_steps += 1
        with torch.no_grad():
            errors = [((logits[k] > 0).float() != targets[k]).float().mean().item() for k in range(S)]
        return [{"model_loss": loss / E, "model_cell_error": error} for loss, error in zip(losses.tolist(), errors)]

    # --- one seed in and out of the block ------------------------------------------------------------
    def export_seed(self, k: int, agent: EnsembleMPCAgent) -> None:
        """Write seed k's complete training state into `agent` (what a one-seed run holds at this step)."""
        stacked.write_parameters(self.parameters, k, agent.ensemble)
        stacked.export_adam_state(self.optimizer, self.parameters, k, agent.optimizer,
                                  list(agent.ensemble.parameters()))
        n = self.size
        for name in Replay.FIELDS:
            getattr(agent.replay, name)[:n] = self.replay[name][k, :n]
        agent.replay.position, agent.replay.size = self.position, n
        agent.ctx_post, agent.has_ctx = self.ctx_post[k].clone(), self.has_ctx[k].clone()
        for name in COUNTERS:
            setattr(agent, name, getattr(self, name))

    def import_seed(self, k: int, agent: EnsembleMPCAgent) -> None:
        """Write `agent`'s complete training state into seed k; its counters must be the block's."""
        stacked.check_same_step(k, block_step(agent, agent.replay.position, agent.replay.size),
                                block_step(self, self.position, self.size))
        stacked.read_parameters(self.parameters, k, agent.ensemble)
        stacked.import_adam_state(self.optimizer, self.parameters, k, agent.optimizer,
                                  list(agent.ensemble.parameters()))
        n = self.size
        for name in Replay.FIELDS:
            self.replay[name][k, :n] = getattr(agent.replay, name)[:n]
        self.ctx_post[k], self.has_ctx[k] = agent.ctx_post, agent.has_ctx


def make_block(agents: list[EnsembleMPCAgent], generators: list[torch.Generator]) -> EnsembleMPCBlock:
    """S ensemble MPC agents (built as one-seed runs build them) trained as one seed block (methods/contract.py)."""
    return EnsembleMPCBlock(agents, generators)


make_block.bit_exact_devices = ("cpu",)   # where a block's seeds are bit for bit one-seed runs
