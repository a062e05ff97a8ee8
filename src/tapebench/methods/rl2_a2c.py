"""RL2 (RL², Duan et al., 2016; Wang et al., 2016) with A2C and GAE: a recurrent actor-critic.

Its hidden state can infer the episode's rule from the transitions it has seen.

Network: the input [observation, one-hot previous action, previous reward, first-step flag] goes
through a tanh layer and a GRU cell, then an MLP head; the actor and the critic each have their own
(as PPO's actor and critic are separate networks). A trial is one episode (the rule is resampled at
every reset), so the hidden state, the previous action and reward are reset (zeros, first-step
flag 1) at every episode start.

Training (A2C, synchronous): each update collects `num_steps` steps from each of `num_envs`
environments, computes GAE(λ) advantages, and takes one gradient step on the policy-gradient loss
with an entropy bonus and a value loss. The loss is back-propagated through the whole rollout
(truncated BPTT): the GRUs are re-run from the hidden state stored at the rollout start, with a row's
hidden state reset inside the rollout where its episode ended.

Truncation (t = H) is not termination: on a truncated step the reward is augmented with γ·V of the
episode's true last observation (the value after the critic's GRU has also read the last transition),
and the advantage recursion stops there as it does on termination.

Evaluation (`evaluation_policy()`): the greedy action of the actor, one hidden state per row,
reset at every episode start and fed the row's previous action and reward.

A seed block (`make_block`, methods/contract.py "Seed blocks") trains S seeds as one stacked model (`stacked.py`):
input layers, GRU cells and heads with a leading seed dimension, the rollout and episode memory stacked, everything
else per seed (GAE, advantage normalisation, loss, gradient-norm clipping, Adam slices, action draws from the seed's
own generator). On the CPU every seed computes its one-seed run's numbers bit for bit when num_envs and hidden_size
are multiples of 4 (other sizes are refused there); on a GPU to rounding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Categorical

from tapebench.methods.common import adam, gae
from tapebench.methods.contract import BlockUnsupported
from tapebench.methods.ppo import layer_init, mlp
from tapebench.methods.stacked import (SeedAdam, StackedGRUCell, StackedSequential, clip_grad_norm_per_seed_,
                                       export_adam_state, import_adam_state)


GREEDY_REFUSED = ("RL2-A2C keeps a recurrent state per episode: evaluate it through evaluation_policy(), not "
                  "act(obs, greedy=True)")


@dataclass
class Config:
    num_envs: int = 16
    """environments stepped in parallel; every one of their steps counts toward the budget"""
    num_steps: int = 16
    """rollout length per environment, also the BPTT length; one update consumes num_envs * num_steps
    environment steps"""
    hidden_size: int = 128
    """width of the input layer, the GRU state and the head's hidden layer, in the actor and in the critic"""
    learning_rate: float = 3e-3
    """Adam learning rate"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over the training budget"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """λ of generalised advantage estimation"""
    norm_adv: bool = True
    """normalise advantages over each rollout"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """gradient-norm clipping threshold"""

    def check(self) -> None:
        for name in ("num_steps", "hidden_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"RL2-A2C hyperparameter {name} must be >= 1, got {getattr(self, name)}")
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"RL2-A2C hyperparameter {name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("ent_coef", "vf_coef"):
            if getattr(self, name) < 0:
                raise ValueError(f"RL2-A2C hyperparameter {name} must be >= 0, got {getattr(self, name)}")
        if self.learning_rate <= 0 or self.max_grad_norm <= 0:
            raise ValueError("RL2-A2C hyperparameters learning_rate and max_grad_norm must be > 0, got "
                             f"{self.learning_rate}, {self.max_grad_norm}")
        if self.num_envs * self.num_steps < 2 and self.norm_adv:
            raise ValueError("RL2-A2C: norm_adv needs num_envs * num_steps >= 2")


def policy_inputs(obs, prev_action_onehot, prev_reward, first) -> torch.Tensor:
    """[observation, one-hot previous action, previous reward, first-step flag]."""
    return torch.cat([obs, prev_action_onehot, prev_reward.unsqueeze(-1), first.unsqueeze(-1)], dim=-1)


class RecurrentCore(nn.Module):
    """tanh input layer, then a GRU cell."""

    def __init__(self, input_dim: int, hidden_size: int):
        super().__init__()
        self.embed = nn.Sequential(layer_init(nn.Linear(input_dim, hidden_size)), nn.Tanh())
        self.gru = nn.GRUCell(hidden_size, hidden_size)
        for name, param in self.gru.named_parameters():
            if "weight" in name:
                nn.init.orthogonal_(param, 1.0)
            else:
                nn.init.zeros_(param)

    def forward(self, inputs: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return self.gru(self.embed(inputs), hidden)


class RecurrentActorCritic(nn.Module):
    """Separate recurrent cores for the actor and the critic (as PPO keeps separate networks: a value
    loss back-propagated into a shared core swamps the policy gradient here). The hidden state is the
    two cores' states side by side: (N, 2 * hidden_size)."""

    def __init__(self, env_spec, hidden_size: int):
        super().__init__()
        input_dim = env_spec.obs_dim + env_spec.num_actions + 2
        self.hidden_size = hidden_size
        self.actor_core = RecurrentCore(input_dim, hidden_size)
        self.critic_core = RecurrentCore(input_dim, hidden_size)
        self.actor = mlp(hidden_size, env_spec.num_actions, hidden_size, 1, out_std=0.01)
        self.critic = mlp(hidden_size, 1, hidden_size, 1, out_std=1.0)

    def step(self, inputs: torch.Tensor, hidden: torch.Tensor):
        """One step of the cores: (logits, value, next hidden state)."""
        actor_hidden = self.actor_core(inputs, hidden[:, :self.hidden_size])
        critic_hidden = self.critic_core(inputs, hidden[:, self.hidden_size:])
        return (self.actor(actor_hidden), self.critic(critic_hidden).squeeze(-1),
                torch.cat([actor_hidden, critic_hidden], dim=1))


class EpisodeMemory:
    """Per-row recurrent state: GRU hidden state and the previous action / reward / first-step flag.
    `rows`: the number of rows, or their shape ((S, n) in a seed block)."""

    def __init__(self, rows: int | tuple[int, ...], hidden_size: int, num_actions: int, device):
        rows = (rows,) if isinstance(rows, int) else tuple(rows)
        self.hidden = torch.zeros(*rows, hidden_size, device=device)
        self.prev_action = torch.zeros(*rows, num_actions, device=device)   # one-hot, zeros at a start
        self.prev_reward = torch.zeros(rows, device=device)
        self.first = torch.ones(rows, device=device)

    def inputs(self, obs: torch.Tensor) -> torch.Tensor:
        return policy_inputs(obs, self.prev_action, self.prev_reward, self.first)

    def advance(self, hidden, actions, rewards, done) -> None:
        """After a step: carry the new hidden state, action and reward; rows whose episode ended start over."""
        keep = (~done).to(hidden.dtype)
        self.hidden = hidden * keep.unsqueeze(-1)
        self.prev_action = F.one_hot(actions, self.prev_action.shape[-1]).to(hidden.dtype) * keep.unsqueeze(-1)
        self.prev_reward = rewards.to(hidden.dtype) * keep
        self.first = 1.0 - keep

    FIELDS = ("hidden", "prev_action", "prev_reward", "first")

    def state_dict(self) -> dict:
        return {name: getattr(self, name).cpu().clone() for name in self.FIELDS}

    def load_state_dict(self, state: dict) -> None:
        for name in self.FIELDS:
            setattr(self, name, state[name].to(getattr(self, name).device).clone())


class Rollout:
    """One rollout: (num_steps, num_envs) tensors filled step by step, and the hidden state at its start.
    With `seeds` (a seed block): (num_steps, seeds, num_envs) and (seeds, num_envs)."""

    STEP_FIELDS = ("inputs", "actions", "logprobs", "rewards", "dones", "values")   # one row per rollout step
    FIELDS = STEP_FIELDS + ("start_hidden", "last_next_obs")

    def __init__(self, num_steps: int, num_envs: int, input_dim: int, obs_dim: int, hidden_size: int, device,
                 seeds: int | None = None):
        rows = (num_envs,) if seeds is None else (seeds, num_envs)
        self.inputs = torch.zeros(num_steps, *rows, input_dim, device=device)
        self.actions = torch.zeros(num_steps, *rows, dtype=torch.long, device=device)
        self.logprobs = torch.zeros(num_steps, *rows, device=device)
        self.rewards = torch.zeros(num_steps, *rows, device=device)
        self.dones = torch.zeros(num_steps, *rows, device=device)
        self.values = torch.zeros(num_steps, *rows, device=device)
        self.start_hidden = torch.zeros(*rows, hidden_size, device=device)
        self.last_next_obs = torch.zeros(*rows, obs_dim, device=device)
        self.position = 0

    def state_dict(self) -> dict:
        state = {name: getattr(self, name).cpu().clone() for name in self.FIELDS}
        state["position"] = self.position
        return state

    def load_state_dict(self, state: dict) -> None:
        for name in self.FIELDS:
            getattr(self, name).copy_(state[name])
        self.position = state["position"]


class RL2A2CAgent:
    def __init__(self, config: Config, env_spec, total_steps: int, device):
        self.config, self.device = config, torch.device(device)
        self.num_actions = env_spec.num_actions
        self.network = RecurrentActorCritic(env_spec, config.hidden_size).to(self.device)
        self.optimizer = adam(self.network.parameters(), lr=config.learning_rate, eps=1e-5)
        input_dim = env_spec.obs_dim + env_spec.num_actions + 2
        self.rollout = Rollout(config.num_steps, config.num_envs, input_dim, env_spec.obs_dim, 2 * config.hidden_size,
                               self.device)
        self.memory = EpisodeMemory(config.num_envs, 2 * config.hidden_size, env_spec.num_actions, self.device)
        self.num_updates = max(1, math.ceil(total_steps / (config.num_envs * config.num_steps)))
        self.updates_done = 0
        self._pending = None  # inputs, next hidden state, log-probs and values of the last `act`

    @torch.no_grad()
    def act(self, obs: torch.Tensor, greedy: bool = False) -> torch.Tensor:
        if greedy:
            raise ValueError(GREEDY_REFUSED)
        if self.rollout.position == 0:
            self.rollout.start_hidden.copy_(self.memory.hidden)
        inputs = self.memory.inputs(obs)
        logits, values, hidden = self.network.step(inputs, self.memory.hidden)
        dist = Categorical(logits=logits)
        actions = dist.sample()
        self._pending = (inputs, hidden, dist.log_prob(actions), values)
        return actions

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        if self._pending is None:
            raise RuntimeError("RL2-A2C observe() needs the preceding act(obs, greedy=False)")
        inputs, hidden, logprobs, values = self._pending
        self._pending = None
        rewards = rewards.float()
        bootstrapped = rewards.clone()
        if truncated.any():
            # the value of the true last observation, after the core has also read the last transition
            rows = truncated.nonzero().squeeze(1)
            onehot = F.one_hot(actions[rows], self.num_actions).to(rewards.dtype)
            last_inputs = policy_inputs(next_obs[rows], onehot, rewards[rows], torch.zeros_like(rewards[rows]))
            _, last_values, _ = self.network.step(last_inputs, hidden[rows])
            bootstrapped[rows] += self.config.gamma * last_values
        r, t = self.rollout, self.rollout.position
        r.inputs[t], r.actions[t], r.logprobs[t], r.values[t] = inputs, actions, logprobs, values
        r.rewards[t], r.dones[t] = bootstrapped, (terminated | truncated).float()
        r.last_next_obs.copy_(next_obs)
        r.position += 1
        self.memory.advance(hidden, actions, rewards, terminated | truncated)

    def replay_rollout(self):
        """Re-run the core over the rollout from its stored start hidden state (with gradients):
        (logits (T, N, A), values (T, N))."""
        r = self.rollout
        hidden, all_logits, all_values = r.start_hidden, [], []
        for t in range(r.position):
            logits, values, hidden = self.network.step(r.inputs[t], hidden)
            hidden = hidden * (1.0 - r.dones[t]).unsqueeze(1)
            all_logits.append(logits)
            all_values.append(values)
        return torch.stack(all_logits), torch.stack(all_values)

    @torch.no_grad()
    def advantages(self):
        """GAE(λ) advantages and returns of the full rollout, bootstrapping from the value of the step
        after it (the rows' current recurrent state and last observation)."""
        c, r = self.config, self.rollout
        _, next_value, _ = self.network.step(self.memory.inputs(r.last_next_obs), self.memory.hidden)
        return gae(r.rewards, r.values, r.dones, next_value, c.gamma, c.gae_lambda)

    def update(self) -> dict:
        c, r = self.config, self.rollout
        if r.position < c.num_steps:
            return {}
        if c.anneal_lr:
            self.optimizer.param_groups[0]["lr"] = c.learning_rate * (1.0 - self.updates_done / self.num_updates)
        advantages, returns = self.advantages()
        if c.norm_adv:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        logits, values = self.replay_rollout()
        dist = Categorical(logits=logits)
        policy_loss = -(advantages * dist.log_prob(r.actions)).mean()
        value_loss = 0.5 * (values - returns).square().mean()
        entropy = dist.entropy().mean()
        loss = policy_loss - c.ent_coef * entropy + c.vf_coef * value_loss
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.network.parameters(), c.max_grad_norm)
        self.optimizer.step()
        self.updates_done += 1
        r.position = 0
        return {"policy_loss": policy_loss.item(), "value_loss": value_loss.item(), "entropy": entropy.item()}

    def evaluation_policy(self) -> "RL2EvalPolicy":
        return RL2EvalPolicy(self.network, 2 * self.config.hidden_size, self.num_actions)

    # --- checkpointing ---------------------------------------------------------------------
    def policy_state_dict(self) -> dict:
        return {"network": self.network.state_dict()}

    def load_policy_state_dict(self, state: dict) -> None:
        self.network.load_state_dict(state["network"])

    def state_dict(self) -> dict:
        return {"network": self.network.state_dict(), "optimizer": self.optimizer.state_dict(),
                "rollout": self.rollout.state_dict(), "memory": self.memory.state_dict(),
                "updates_done": self.updates_done}

    def load_state_dict(self, state: dict) -> None:
        self.network.load_state_dict(state["network"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rollout.load_state_dict(state["rollout"])
        self.memory.load_state_dict(state["memory"])
        self.updates_done = state["updates_done"]


class RL2EvalPolicy:
    """The greedy actor with one hidden state per row, reset at `begin`, fed each row's previous action
    and reward by `observe`."""

    def __init__(self, network: RecurrentActorCritic, hidden_size: int, num_actions: int):
        self.network, self.hidden_size, self.num_actions = network, hidden_size, num_actions
        self._next_hidden = None

    def begin(self, batch) -> None:
        device = next(self.network.parameters()).device
        self.memory = EpisodeMemory(len(batch), self.hidden_size, self.num_actions, device)
        self._next_hidden = None

    def carry(self, batch) -> None:
        """New episodes on the same rows, the hidden state kept (the few-shot study, docs/protocol.md#few-shot): the
        first step's inputs are an episode start's (no previous action or reward, first-step flag set)."""
        if len(batch) != self.memory.hidden.shape[0]:
            raise ValueError(f"carry needs the {self.memory.hidden.shape[0]} rows of the previous episodes, got "
                             f"{len(batch)}")
        hidden = self.memory.hidden
        self.begin(batch)
        self.memory.hidden = hidden
        self._next_hidden = None

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        logits, _, self._next_hidden = self.network.step(self.memory.inputs(obs), self.memory.hidden)
        return logits.argmax(dim=1)

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        # a row whose episode ended keeps being stepped by the runner with frozen records; what it
        # feeds its own state then does not matter, and no row starts a new episode before begin()
        done = torch.zeros_like(terminated)
        self.memory.advance(self._next_hidden, actions, rewards, done)
        self._next_hidden = None


def make(config: Config, env_spec, total_steps: int, device) -> RL2A2CAgent:
    return RL2A2CAgent(config, env_spec, total_steps, device)


# --- seed blocks ---------------------------------------------------------------------------------------------------
class StackedRecurrentActorCritic:
    """S seeds' `RecurrentActorCritic`s, stacked (`stacked.py`): each core's input layer and each head a
    `StackedSequential`, each GRU cell a `StackedGRUCell`. `named` lists the stacked tensors under the one-seed
    network's `state_dict` keys, in its `parameters()` order; `parameters` the tensors alone."""

    def __init__(self, networks: list[RecurrentActorCritic], device: torch.device, exact: bool):
        self.hidden_size = networks[0].hidden_size
        self.parts = {}
        for core in ("actor_core", "critic_core"):
            self.parts[f"{core}.embed"] = StackedSequential([getattr(n, core).embed for n in networks], device,
                                                            BlockUnsupported, exact)
            self.parts[f"{core}.gru"] = StackedGRUCell([getattr(n, core).gru for n in networks], device, exact)
        for head in ("actor", "critic"):
            self.parts[head] = StackedSequential([getattr(n, head) for n in networks], device, BlockUnsupported, exact)
        self.named = [(f"{prefix}.{name}", p) for prefix, part in self.parts.items()
                      for name, p in zip(part.names, part.parameters)]
        self.parameters = [p for _, p in self.named]
        if [name for name, _ in self.named] != [name for name, _ in networks[0].named_parameters()]:
            raise BlockUnsupported("the stacked RL2 network's parameters are not the one-seed network's")

    def _core(self, name: str, inputs, hidden, seed: int | None):
        embed, gru = self.parts[f"{name}.embed"], self.parts[f"{name}.gru"]
        if seed is None:
            return gru(embed(inputs), hidden)
        return gru.one_seed(seed, embed.one_seed(seed, inputs), hidden)

    def _head(self, name: str, x, seed: int | None):
        return self.parts[name](x) if seed is None else self.parts[name].one_seed(seed, x)

    def step(self, inputs: torch.Tensor, hidden: torch.Tensor, seed: int | None = None):
        """`RecurrentActorCritic.step` of every seed on inputs (S, n, in) and hidden (S, n, 2 * hidden_size), or
        with `seed` = k of seed k alone on (n, in) and (n, 2 * hidden_size), its one-seed computation."""
        h = self.hidden_size
        actor_hidden = self._core("actor_core", inputs, hidden[..., :h], seed)
        critic_hidden = self._core("critic_core", inputs, hidden[..., h:], seed)
        return (self._head("actor", actor_hidden, seed), self._head("critic", critic_hidden, seed).squeeze(-1),
                torch.cat([actor_hidden, critic_hidden], dim=-1))


class RL2Block:
    """S seeds of RL2-A2C as one stacked model (methods/contract.py, "Seed blocks").

    Seed k's actor and critic (input layer, GRU cell, head) are slice k of the stacked layers; the rollout is
    (num_steps, S, num_envs, ...), the episode memory (S, num_envs, ...). An update runs every seed's one-seed update
    side by side: its GAE, its advantage normalisation, its truncated BPTT through its own GRUs, its loss (the S
    losses are summed for one backward pass), its gradient-norm clipping over its own slices; `SeedAdam` steps each
    seed's slices. Seed k's actions are drawn from generators[k] as its one-seed agent draws them from torch's global
    generator. On the devices of `BIT_EXACT_DEVICES` (the CPU) every seed computes its one-seed run's numbers bit for
    bit; elsewhere every product is batched and a seed agrees with its one-seed run to rounding.
    """

    BIT_EXACT_DEVICES = ("cpu",)
    ALIGNED_FLOATS = 4   # num_envs and hidden_size multiples of this: every seed's operands 16-byte aligned as alone

    def __init__(self, agents: list[RL2A2CAgent], generators: list[torch.Generator]):
        if len(agents) != len(generators) or not agents:
            raise ValueError(f"an RL2-A2C seed block needs one generator per agent, got {len(agents)} agents and "
                             f"{len(generators)} generators")
        first = agents[0]
        for agent in agents[1:]:
            if agent.config != first.config or agent.num_updates != first.num_updates or agent.device != first.device:
                raise ValueError("the agents of an RL2-A2C seed block must share their configuration, budget and "
                                 "device")
        c, self.config, self.device, self.generators = first.config, first.config, first.device, list(generators)
        self.S, self.num_actions = len(agents), first.num_actions
        self.exact = self.device.type in self.BIT_EXACT_DEVICES
        if self.exact and (c.num_envs % self.ALIGNED_FLOATS or c.hidden_size % self.ALIGNED_FLOATS):
            raise BlockUnsupported(
                f"an RL2-A2C block is bit for bit its one-seed runs on the CPU only with num_envs and hidden_size "
                f"multiples of {self.ALIGNED_FLOATS} (got {c.num_envs} and {c.hidden_size}): the BLAS rounds small "
                f"products by their operands' {4 * self.ALIGNED_FLOATS}-byte alignment, which a seed's slice of the "
                f"stacked tensors then shares with its one-seed run's tensors")
        self.network = StackedRecurrentActorCritic([a.network for a in agents], self.device, self.exact)
        self.optimizer = SeedAdam(self.network.parameters, lr=c.learning_rate, eps=1e-5)
        rollout = first.rollout
        self.rollout = Rollout(c.num_steps, c.num_envs, rollout.inputs.shape[-1], rollout.last_next_obs.shape[-1],
                               2 * c.hidden_size, self.device, seeds=self.S)
        self.memory = EpisodeMemory((self.S, c.num_envs), 2 * c.hidden_size, self.num_actions, self.device)
        self.num_updates, self.updates_done = first.num_updates, 0
        self._pending = None
        for k, agent in enumerate(agents):
            self.import_seed(k, agent)

    # --- the loop's calls -----------------------------------------------------------------------------------------
    @torch.no_grad()
    def act(self, obs: torch.Tensor, greedy: bool = False) -> torch.Tensor:
        """obs (S, n, obs_dim) -> (S, n) actions, seed k sampling from generators[k] as its one-seed agent does."""
        if greedy:
            raise ValueError(GREEDY_REFUSED)
        if self.rollout.position == 0:
            self.rollout.start_hidden.copy_(self.memory.hidden)
        inputs = self.memory.inputs(obs)
        logits, values, hidden = self.network.step(inputs, self.memory.hidden)
        dist = Categorical(logits=logits)
        probs = dist.probs.cpu()   # the seeds' generators are CPU generators: one copy off the device, not S
        # Categorical.sample: one multinomial draw per row of the (n, num_actions) probabilities
        actions = torch.stack([torch.multinomial(probs[k], 1, True, generator=g).T.reshape(-1)
                               for k, g in enumerate(self.generators)]).to(self.device)
        self._pending = (inputs, hidden, dist.log_prob(actions), values)
        return actions

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        if self._pending is None:
            raise RuntimeError("RL2-A2C block observe() needs the preceding act(obs)")
        inputs, hidden, logprobs, values = self._pending
        self._pending = None
        rewards = rewards.float()
        bootstrapped = rewards.clone()
        if not self.exact:   # every row at once, no per-seed device sync
            onehot = F.one_hot(actions, self.num_actions).to(rewards.dtype)
            _, last_values, _ = self.network.step(policy_inputs(next_obs, onehot, rewards, torch.zeros_like(rewards)),
                                                  hidden)
            bootstrapped += torch.where(truncated, self.config.gamma * last_values, torch.zeros_like(last_values))
        elif truncated.any():
            for k in range(self.S):   # each seed's truncated rows alone, as its one-seed agent evaluates them
                rows = truncated[k].nonzero().squeeze(1)
                if len(rows):
                    onehot = F.one_hot(actions[k][rows], self.num_actions).to(rewards.dtype)
                    last_inputs = policy_inputs(next_obs[k][rows], onehot, rewards[k][rows],
                                                torch.zeros_like(rewards[k][rows]))
                    _, last_values, _ = self.network.step(last_inputs, hidden[k][rows], seed=k)
                    bootstrapped[k][rows] += self.config.gamma * last_values
        r, t = self.rollout, self.rollout.position
        r.inputs[t], r.actions[t], r.logprobs[t], r.values[t] = inputs, actions, logprobs, values
        r.rewards[t], r.dones[t] = bootstrapped, (terminated | truncated).float()
        r.last_next_obs.copy_(next_obs)
        r.position += 1
        self.memory.advance(hidden, actions, rewards, terminated | truncated)

    def replay_rollout(self):
        """`RL2A2CAgent.replay_rollout` of every seed: (logits (T, S, n, A), values (T, S, n))."""
        r = self.rollout
        hidden, all_logits, all_values = r.start_hidden, [], []
        for t in range(r.position):
            logits, values, hidden = self.network.step(r.inputs[t], hidden)
            hidden = hidden * (1.0 - r.dones[t]).unsqueeze(-1)
            all_logits.append(logits)
            all_values.append(values)
        return torch.stack(all_logits), torch.stack(all_values)

    @torch.no_grad()
    def advantages(self):
        """Every seed's GAE(λ) advantages and returns, (T, S, n): element-wise over (step, seed, env)."""
        c, r = self.config, self.rollout
        _, next_value, _ = self.network.step(self.memory.inputs(r.last_next_obs), self.memory.hidden)
        return gae(r.rewards, r.values, r.dones, next_value, c.gamma, c.gae_lambda)

    def update(self) -> list[dict]:
        c, r, S = self.config, self.rollout, self.S
        if r.position < c.num_steps:
            return [{} for _ in range(S)]
        if c.anneal_lr:
            self.optimizer.param_groups[0]["lr"] = c.learning_rate * (1.0 - self.updates_done / self.num_updates)
        advantages, returns = self.advantages()
        if c.norm_adv:   # each seed over its own rollout, on a (T, n) tensor of its own as in its one-seed update
            per_seed = [advantages[:, k].contiguous() for k in range(S)]
            advantages = torch.stack([(a - a.mean()) / (a.std() + 1e-8) for a in per_seed], dim=1)
        logits, values = self.replay_rollout()
        dist = Categorical(logits=logits)
        seed_means = lambda x: x.transpose(0, 1).reshape(S, -1).mean(dim=1)   # (T, S, n) -> (S,)
        policy_loss = -seed_means(advantages * dist.log_prob(r.actions))
        value_loss = 0.5 * seed_means((values - returns).square())
        entropy = seed_means(dist.entropy())
        loss = policy_loss - c.ent_coef * entropy + c.vf_coef * value_loss   # (S,): one loss per seed
        self.optimizer.zero_grad()
        loss.sum().backward()
        clip_grad_norm_per_seed_(self.network.parameters, c.max_grad_norm)
        self.optimizer.step()
        self.updates_done += 1
        r.position = 0
        return [{"policy_loss": p, "value_loss": v, "entropy": e}
                for p, v, e in zip(policy_loss.tolist(), value_loss.tolist(), entropy.tolist())]

    # --- one seed in and out --------------------------------------------------------------------------------------
    def _seed_rollout(self, k: int) -> dict:
        r = self.rollout
        state = {name: getattr(r, name)[:, k] for name in Rollout.STEP_FIELDS}
        state.update(start_hidden=r.start_hidden[k], last_next_obs=r.last_next_obs[k], position=r.position)
        return state

    @torch.no_grad()
    def export_seed(self, k: int, agent: RL2A2CAgent) -> None:
        """Seed k's complete training state into the one-seed `agent` (its own tensors, no views of the block's)."""
        agent.network.load_state_dict({name: p[k] for name, p in self.network.named})
        export_adam_state(self.optimizer, self.network.parameters, k, agent.optimizer, list(agent.network.parameters()))
        agent.rollout.load_state_dict(self._seed_rollout(k))
        agent.memory.load_state_dict({name: getattr(self.memory, name)[k] for name in EpisodeMemory.FIELDS})
        agent.updates_done, agent._pending = self.updates_done, None

    @torch.no_grad()
    def import_seed(self, k: int, agent: RL2A2CAgent) -> None:
        """The reverse of `export_seed`: the one-seed `agent`'s state becomes seed k's slice of the block; the block
        takes its step from seed 0, and every other seed must be at that step."""
        if k and (agent.updates_done, agent.rollout.position) != (self.updates_done, self.rollout.position):
            raise ValueError(f"seed {k} of an RL2-A2C block is at update {agent.updates_done}, rollout step "
                             f"{agent.rollout.position}; the block at {self.updates_done}, {self.rollout.position}: "
                             f"a block's seeds must be resumed from the same step")
        self.updates_done, self.rollout.position = agent.updates_done, agent.rollout.position
        for (_, p), mine in zip(self.network.named, agent.network.parameters(), strict=True):
            p[k].copy_(mine)
        import_adam_state(self.optimizer, self.network.parameters, k, agent.optimizer, list(agent.network.parameters()))
        self.optimizer.param_groups[0]["lr"] = agent.optimizer.param_groups[0]["lr"]
        for name, tensor in self._seed_rollout(k).items():
            if name != "position":
                tensor.copy_(getattr(agent.rollout, name))
        for name in EpisodeMemory.FIELDS:
            getattr(self.memory, name)[k].copy_(getattr(agent.memory, name))


def make_block(agents: list[RL2A2CAgent], generators: list[torch.Generator]) -> RL2Block:
    """S RL2-A2C agents (built as one-seed runs build them) trained as one seed block (methods/contract.py)."""
    return RL2Block(agents, generators)


make_block.bit_exact_devices = RL2Block.BIT_EXACT_DEVICES   # where a block's seeds are bit for bit one-seed runs
