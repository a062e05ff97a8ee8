"""PPO (Schulman et al., 2017) with clipped surrogate, GAE and vectorised rollouts.

Actor and critic are separate MLPs (tanh, orthogonal init) on the observation [tape, t/H], or with
`network = "equivariant"` separate shift-equivariant networks (`equivariant.py`, row `ppo_equivariant`):
the logit of cell a read from cell a's features, the value from the mean over cells.
Each update collects `num_steps` steps from each of `num_envs` environments
(`num_envs * num_steps` environment steps), computes GAE(λ) advantages, then runs
`update_epochs` passes of `num_minibatches` minibatches of the clipped PPO loss with an entropy
bonus. The learning rate optionally anneals linearly to 0 over the budget.

A seed block (`make_block`, docs/protocol.md#seed-blocks) trains S seeds as one stacked model (`stacked.py`, MLP
or equivariant network): each seed's actor and critic layers stacked along a leading seed dimension, one Adam over the stacked
tensors, everything else per seed (rollout, GAE, advantage normalisation, minibatch permutations from the seed's
own generator, gradient-norm clipping); on the CPU every seed's numbers are its one-seed run's, bit for bit.

Truncation (t = H) is not termination: on a truncated step the reward is augmented with
γ·V(last observation), and the advantage recursion stops there as it does on termination.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

from tapebench.methods import equivariant
from tapebench.methods.common import adam, gae
from tapebench.methods.contract import BlockUnsupported
from tapebench.methods.stacked import (SeedAdam, StackedEquivariant, StackedSequential, clip_grad_norm_per_seed_,
                                       export_adam_state, import_adam_state)


@dataclass
class Config:
    num_envs: int = 16
    """environments stepped in parallel; every one of their steps counts toward the budget"""
    num_steps: int = 128
    """rollout length per environment; one update consumes num_envs * num_steps environment steps"""
    hidden_size: int = 256
    """width of each hidden layer (actor and critic)"""
    hidden_layers: int = 2
    """number of hidden layers (tanh)"""
    learning_rate: float = 2.5e-4
    """Adam learning rate"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over the training budget"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """λ of generalised advantage estimation"""
    num_minibatches: int = 4
    """minibatches per epoch"""
    update_epochs: int = 4
    """passes over each rollout"""
    norm_adv: bool = True
    """normalise advantages within each minibatch"""
    clip_coef: float = 0.2
    """surrogate clipping ε"""
    clip_vloss: bool = True
    """clip the value loss around the rollout's value estimates"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """gradient-norm clipping threshold"""
    network: str = "mlp"
    """actor and critic: "mlp" (hidden_size x hidden_layers on [tape, t/H]) or "equivariant" (circular
    convolutions over the cells: cell a's logit from cell a's features, the value pooled over cells;
    docs/methods/dqn_equivariant.md#equivariant-networks)"""
    conv_channels: int = equivariant.CHANNELS
    """equivariant network: feature channels per cell (actor and critic each)"""
    conv_layers: int = equivariant.LAYERS
    """equivariant network: residual circular-convolution blocks, dilations 1, 2, 4, ..., 2^(conv_layers - 1)"""
    conv_kernel: int = equivariant.KERNEL
    """equivariant network: kernel size of each circular convolution (odd)"""
    global_pool: bool = equivariant.GLOBAL_POOL
    """equivariant network: each block adds a linear map of the mean over cells to every cell (whole tape in view)"""

    def check(self) -> None:
        equivariant.check_network(self, "PPO")
        for name in ("num_steps", "hidden_size", "hidden_layers", "num_minibatches", "update_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"PPO hyperparameter {name} must be >= 1, got {getattr(self, name)}")
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"PPO hyperparameter {name} must be in [0, 1], got {getattr(self, name)}")
        if (self.num_envs * self.num_steps) % self.num_minibatches:
            raise ValueError(f"PPO: num_envs * num_steps = {self.num_envs * self.num_steps} must be divisible "
                             f"by num_minibatches = {self.num_minibatches}")
        if self.learning_rate <= 0 or self.clip_coef <= 0 or self.max_grad_norm <= 0:
            raise ValueError("PPO hyperparameters learning_rate, clip_coef and max_grad_norm must be > 0, got "
                             f"{self.learning_rate}, {self.clip_coef}, {self.max_grad_norm}")


def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, out_dim: int, hidden_size: int, hidden_layers: int, out_std: float) -> nn.Sequential:
    layers, width = [], in_dim
    for _ in range(hidden_layers):
        layers += [layer_init(nn.Linear(width, hidden_size)), nn.Tanh()]
        width = hidden_size
    layers.append(layer_init(nn.Linear(width, out_dim), std=out_std))
    return nn.Sequential(*layers)


def equivariant_network(make, config: Config, env_spec, out_std: float) -> nn.Module:
    """An equivariant actor (`per_cell_network`) or critic (`pooled_network`), tanh, orthogonal init as the MLP's."""
    network = make(config, env_spec, activation=nn.Tanh)
    for module in network.trunk.modules():
        if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d)):
            layer_init(module)
    layer_init(network.head, std=out_std)
    return network


# The few-shot study's gradient adaptation (docs/protocol.md#few-shot): the trained hyperparameters with these
# overrides (and num_envs = 1: one adaptation episode at a time). A PPO update every 8 steps of the adaptation
# episodes, on one minibatch, at the trained learning rate without annealing; `studies.fewshot.adapt.<method>`
# overrides any of them.
FEWSHOT_ADAPTATION = {"num_steps": 8, "num_minibatches": 1, "anneal_lr": False}


class ActorCritic(nn.Module):
    def __init__(self, config: Config, env_spec):
        super().__init__()
        if config.network == "equivariant":
            self.actor = equivariant_network(equivariant.per_cell_network, config, env_spec, out_std=0.01)
            self.critic = equivariant_network(equivariant.pooled_network, config, env_spec, out_std=1.0)
            return
        obs_dim, num_actions, hidden_size, hidden_layers = (env_spec.obs_dim, env_spec.num_actions,
                                                            config.hidden_size, config.hidden_layers)
        self.actor = mlp(obs_dim, num_actions, hidden_size, hidden_layers, out_std=0.01)
        self.critic = mlp(obs_dim, 1, hidden_size, hidden_layers, out_std=1.0)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def action_and_value(self, obs: torch.Tensor, actions: torch.Tensor | None = None):
        dist = Categorical(logits=self.actor(obs))
        if actions is None:
            actions = dist.sample()
        return actions, dist.log_prob(actions), dist.entropy(), self.value(obs)


class Rollout:
    """Storage for one rollout: (num_steps, num_envs) tensors, filled step by step."""

    FIELDS = ("obs", "actions", "logprobs", "rewards", "dones", "values")

    def __init__(self, num_steps: int, num_envs: int, obs_dim: int, device: torch.device):
        self.obs = torch.zeros(num_steps, num_envs, obs_dim, device=device)
        self.actions = torch.zeros(num_steps, num_envs, dtype=torch.long, device=device)
        self.logprobs = torch.zeros(num_steps, num_envs, device=device)
        self.rewards = torch.zeros(num_steps, num_envs, device=device)
        self.dones = torch.zeros(num_steps, num_envs, device=device)
        self.values = torch.zeros(num_steps, num_envs, device=device)
        self.last_next_obs = torch.zeros(num_envs, obs_dim, device=device)
        self.position = 0

    def state_dict(self) -> dict:
        state = {name: getattr(self, name).cpu() for name in self.FIELDS + ("last_next_obs",)}
        state["position"] = self.position
        return state

    def load_state_dict(self, state: dict) -> None:
        for name in self.FIELDS + ("last_next_obs",):
            getattr(self, name).copy_(state[name])
        self.position = state["position"]


class PPOAgent:
    def __init__(self, config: Config, env_spec, total_steps: int, device):
        self.config, self.device = config, torch.device(device)
        self.network = ActorCritic(config, env_spec).to(self.device)
        self.optimizer = adam(self.network.parameters(), lr=config.learning_rate, eps=1e-5)
        self.rollout = Rollout(config.num_steps, config.num_envs, env_spec.obs_dim, self.device)
        self.num_updates = max(1, math.ceil(total_steps / (config.num_envs * config.num_steps)))
        self.updates_done = 0
        self._pending = None  # log-probs and values of the last exploring `act`, consumed by `observe`

    @torch.no_grad()
    def act(self, obs: torch.Tensor, greedy: bool = False) -> torch.Tensor:
        if greedy:
            return self.network.actor(obs).argmax(dim=1)
        actions, logprobs, _, values = self.network.action_and_value(obs)
        self._pending = (logprobs, values)
        return actions

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        if self._pending is None:
            raise RuntimeError("PPO observe() needs the preceding act(obs, greedy=False)")
        logprobs, values = self._pending
        self._pending = None
        rewards = rewards.float().clone()
        if truncated.any():
            rewards[truncated] += self.config.gamma * self.network.value(next_obs[truncated])
        r, t = self.rollout, self.rollout.position
        r.obs[t], r.actions[t], r.logprobs[t], r.values[t] = obs, actions, logprobs, values
        r.rewards[t], r.dones[t] = rewards, (terminated | truncated).float()
        r.last_next_obs = next_obs.clone()
        r.position += 1

    def update(self) -> dict:
        if self.rollout.position < self.config.num_steps:
            return {}
        c, r = self.config, self.rollout
        if c.anneal_lr:
            self.optimizer.param_groups[0]["lr"] = c.learning_rate * (1.0 - self.updates_done / self.num_updates)
        advantages, returns = self._gae()
        b_obs = r.obs.reshape(-1, r.obs.shape[-1])
        b_actions, b_logprobs, b_values = r.actions.reshape(-1), r.logprobs.reshape(-1), r.values.reshape(-1)
        b_advantages, b_returns = advantages.reshape(-1), returns.reshape(-1)
        batch_size = b_obs.shape[0]
        minibatch_size = batch_size // c.num_minibatches
        clip_fractions = []
        for _ in range(c.update_epochs):
            order = torch.randperm(batch_size).to(self.device)
            for start in range(0, batch_size, minibatch_size):
                mb = order[start:start + minibatch_size]
                _, new_logprob, entropy, new_value = self.network.action_and_value(b_obs[mb], b_actions[mb])
                log_ratio = new_logprob - b_logprobs[mb]
                ratio = log_ratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - log_ratio).mean()
                    clip_fractions.append(((ratio - 1.0).abs() > c.clip_coef).float().mean().item())
                mb_adv = b_advantages[mb]
                if c.norm_adv:
                    mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                policy_loss = torch.max(-mb_adv * ratio,
                                        -mb_adv * torch.clamp(ratio, 1 - c.clip_coef, 1 + c.clip_coef)).mean()
                if c.clip_vloss:
                    v_clipped = b_values[mb] + torch.clamp(new_value - b_values[mb], -c.clip_coef, c.clip_coef)
                    value_loss = 0.5 * torch.max((new_value - b_returns[mb]) ** 2,
                                                 (v_clipped - b_returns[mb]) ** 2).mean()
                else:
                    value_loss = 0.5 * ((new_value - b_returns[mb]) ** 2).mean()
                entropy_loss = entropy.mean()
                loss = policy_loss - c.ent_coef * entropy_loss + c.vf_coef * value_loss
                self.optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(self.network.parameters(), c.max_grad_norm)
                self.optimizer.step()
        self.updates_done += 1
        r.position = 0
        return {"policy_loss": policy_loss.item(), "value_loss": value_loss.item(),
                "entropy": entropy_loss.item(), "approx_kl": approx_kl.item(),
                "clip_fraction": float(np.mean(clip_fractions))}

    @torch.no_grad()
    def _gae(self):
        r = self.rollout
        return gae(r.rewards, r.values, r.dones, self.network.value(r.last_next_obs), self.config.gamma,
                   self.config.gae_lambda)

    # --- checkpointing ---------------------------------------------------------------------
    def policy_state_dict(self) -> dict:
        return {"network": self.network.state_dict()}

    def load_policy_state_dict(self, state: dict) -> None:
        self.network.load_state_dict(state["network"])

    def state_dict(self) -> dict:
        return {"network": self.network.state_dict(), "optimizer": self.optimizer.state_dict(),
                "rollout": self.rollout.state_dict(), "updates_done": self.updates_done}

    def load_state_dict(self, state: dict) -> None:
        self.network.load_state_dict(state["network"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rollout.load_state_dict(state["rollout"])
        self.updates_done = state["updates_done"]


@dataclass
class EquivariantConfig(Config):
    """PPO's Config with the equivariant actor and critic (registry row `ppo_equivariant`)."""

    network: str = "equivariant"
    """actor and critic: "mlp" (hidden_size x hidden_layers on [tape, t/H]) or "equivariant" (circular
    convolutions over the cells: cell a's logit from cell a's features, the value pooled over cells;
    docs/methods/dqn_equivariant.md#equivariant-networks)"""


def make(config: Config, env_spec, total_steps: int, device) -> PPOAgent:
    return PPOAgent(config, env_spec, total_steps, device)


# --- seed blocks ---------------------------------------------------------------------------------------------------
class PPOBlock:
    """S seeds of PPO as one stacked model: the seed-block contract (`tapebench.training.blocks`).

    Seed k's actor and critic are slice k of the stacked layers; the rollout is (S, num_steps, num_envs, ...).
    An update runs every seed's one-seed update side by side: its GAE, its minibatch permutations drawn from
    generators[k] (as the one-seed agent draws them from torch's global generator), its advantage normalisation,
    its loss (the S losses are summed for one backward pass, so no gradient mixes seeds), its gradient-norm
    clipping over its own slices; one `stacked.SeedAdam` steps every seed's slices as tensors of their own.

    On the devices of `BIT_EXACT_DEVICES` (the CPU) every seed computes its one-seed run's numbers bit for bit;
    elsewhere every product is batched and a seed agrees with its one-seed run to rounding.
    """

    BIT_EXACT_DEVICES = ("cpu",)

    def __init__(self, agents: list[PPOAgent], generators: list[torch.Generator]):
        if len(agents) != len(generators) or not agents:
            raise ValueError(f"a PPO seed block needs one generator per agent, got {len(agents)} agents and "
                             f"{len(generators)} generators")
        config = agents[0].config
        for agent in agents[1:]:
            if agent.config != config or agent.num_updates != agents[0].num_updates:
                raise ValueError("the agents of a PPO seed block must share their configuration and budget")
        self.config, self.device, self.generators = config, agents[0].device, list(generators)
        self.S, self.exact = len(agents), self.device.type in self.BIT_EXACT_DEVICES
        stack = StackedEquivariant if config.network == "equivariant" else StackedSequential
        self.actor = stack([a.network.actor for a in agents], self.device, BlockUnsupported, self.exact)
        self.critic = stack([a.network.critic for a in agents], self.device, BlockUnsupported, self.exact)
        # the stacked tensors in the order of ActorCritic.parameters() (so the optimiser's state indices agree)
        self.named = ([(f"actor.{n}", p) for n, p in zip(self.actor.names, self.actor.parameters)]
                      + [(f"critic.{n}", p) for n, p in zip(self.critic.names, self.critic.parameters)])
        self.parameters = [p for _, p in self.named]
        self.optimizer = SeedAdam(self.parameters, lr=config.learning_rate, eps=1e-5)
        rollout = agents[0].rollout
        self.rollout = {name: torch.zeros((self.S,) + getattr(rollout, name).shape,
                                          dtype=getattr(rollout, name).dtype, device=self.device)
                        for name in Rollout.FIELDS + ("last_next_obs",)}
        self.position, self.num_updates, self.updates_done = 0, agents[0].num_updates, 0
        self._pending = None
        for k, agent in enumerate(agents):
            self.import_seed(k, agent)

    # --- the loop's calls -----------------------------------------------------------------------------------------
    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """obs (S, n, obs_dim) -> (S, n) actions, seed k sampling from generators[k] as its one-seed agent does."""
        dist = Categorical(logits=self.actor(obs))
        probs = dist.probs.cpu()   # the seeds' generators are CPU generators: one copy off the device, not S
        # Categorical.sample: one multinomial draw per row of the (n, num_actions) probabilities
        actions = torch.stack([torch.multinomial(probs[k], 1, True, generator=g).T.reshape(-1)
                               for k, g in enumerate(self.generators)]).to(self.device)
        self._pending = (dist.log_prob(actions), self.critic(obs).squeeze(-1))
        return actions

    @torch.no_grad()
    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        if self._pending is None:
            raise RuntimeError("PPO block observe() needs the preceding act(obs)")
        logprobs, values = self._pending
        self._pending = None
        rewards = rewards.float().clone()
        if not self.exact:   # every row at once, no per-seed device sync
            bootstrap = self.config.gamma * self.critic(next_obs).squeeze(-1)
            rewards += torch.where(truncated, bootstrap, torch.zeros_like(bootstrap))
        elif truncated.any():
            for k in range(self.S):   # each seed's truncated rows alone, as its one-seed agent evaluates them
                rows = truncated[k]
                if rows.any():
                    rewards[k][rows] += self.config.gamma * self.critic.one_seed(k, next_obs[k][rows]).squeeze(-1)
        r, t = self.rollout, self.position
        r["obs"][:, t], r["actions"][:, t], r["logprobs"][:, t], r["values"][:, t] = obs, actions, logprobs, values
        r["rewards"][:, t], r["dones"][:, t] = rewards, (terminated | truncated).float()
        r["last_next_obs"] = next_obs.clone()
        self.position += 1

    def update(self) -> list[dict]:
        if self.position < self.config.num_steps:
            return [{} for _ in range(self.S)]
        c, r, S = self.config, self.rollout, self.S
        if c.anneal_lr:
            self.optimizer.param_groups[0]["lr"] = c.learning_rate * (1.0 - self.updates_done / self.num_updates)
        with torch.no_grad():   # GAE is element-wise over (step, env): the seeds ride along as more environments
            next_value = self.critic(r["last_next_obs"]).squeeze(-1)
            advantages, returns = gae(*(r[name].transpose(0, 1) for name in ("rewards", "values", "dones")),
                                      next_value, c.gamma, c.gae_lambda)
        b_obs = r["obs"].reshape(S, -1, r["obs"].shape[-1])
        b_actions, b_logprobs, b_values = (r[name].reshape(S, -1) for name in ("actions", "logprobs", "values"))
        b_advantages, b_returns = advantages.transpose(0, 1).reshape(S, -1), returns.transpose(0, 1).reshape(S, -1)
        batch_size = b_obs.shape[1]
        minibatch_size = batch_size // c.num_minibatches
        seeds = torch.arange(S, device=self.device).unsqueeze(1)
        clip_fractions = []
        for _ in range(c.update_epochs):
            order = torch.stack([torch.randperm(batch_size, generator=g) for g in self.generators]).to(self.device)
            for start in range(0, batch_size, minibatch_size):
                mb = order[:, start:start + minibatch_size]
                dist = Categorical(logits=self.actor(b_obs[seeds, mb]))
                new_logprob, entropy = dist.log_prob(b_actions[seeds, mb]), dist.entropy()
                new_value = self.critic(b_obs[seeds, mb]).squeeze(-1)
                log_ratio = new_logprob - b_logprobs[seeds, mb]
                ratio = log_ratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - log_ratio).mean(dim=1)
                    clip_fractions.append(((ratio - 1.0).abs() > c.clip_coef).float().mean(dim=1))
                mb_adv = b_advantages[seeds, mb]
                if c.norm_adv:
                    mb_adv = (mb_adv - mb_adv.mean(dim=1, keepdim=True)) / (mb_adv.std(dim=1, keepdim=True) + 1e-8)
                policy_loss = torch.max(-mb_adv * ratio,
                                        -mb_adv * torch.clamp(ratio, 1 - c.clip_coef, 1 + c.clip_coef)).mean(dim=1)
                mb_values, mb_returns = b_values[seeds, mb], b_returns[seeds, mb]
                if c.clip_vloss:
                    v_clipped = mb_values + torch.clamp(new_value - mb_values, -c.clip_coef, c.clip_coef)
                    value_loss = 0.5 * torch.max((new_value - mb_returns) ** 2, (v_clipped - mb_returns) ** 2).mean(dim=1)
                else:
                    value_loss = 0.5 * ((new_value - mb_returns) ** 2).mean(dim=1)
                entropy_loss = entropy.mean(dim=1)
                loss = policy_loss - c.ent_coef * entropy_loss + c.vf_coef * value_loss   # (S,): one loss per seed
                self.optimizer.zero_grad()
                loss.sum().backward()
                clip_grad_norm_per_seed_(self.parameters, self.config.max_grad_norm)
                self.optimizer.step()
        self.updates_done += 1
        self.position = 0
        fractions = torch.stack(clip_fractions, dim=1).tolist()
        return [{"policy_loss": policy_loss[k].item(), "value_loss": value_loss[k].item(),
                 "entropy": entropy_loss[k].item(), "approx_kl": approx_kl[k].item(),
                 "clip_fraction": float(np.mean(fractions[k]))} for k in range(S)]

    @torch.no_grad()
    # --- one seed in and out --------------------------------------------------------------------------------------
    def export_seed(self, k: int, agent: PPOAgent) -> None:
        """Seed k's complete training state into the one-seed `agent` (its own tensors, no views of the block's)."""
        rollout = {name: tensor[k].clone() for name, tensor in self.rollout.items()}
        agent.network.load_state_dict({name: p[k].detach().clone() for name, p in self.named})
        agent.rollout.load_state_dict({**rollout, "position": self.position})
        agent.updates_done = self.updates_done
        export_adam_state(self.optimizer, self.parameters, k, agent.optimizer, list(agent.network.parameters()))
        agent._pending = None

    @torch.no_grad()
    def import_seed(self, k: int, agent: PPOAgent) -> None:
        """The reverse of `export_seed`: the one-seed `agent`'s state becomes seed k's slice of the block."""
        state = agent.state_dict()
        if k and (state["updates_done"] != self.updates_done or state["rollout"]["position"] != self.position):
            raise ValueError(f"seed {k} of a PPO block is at update {state['updates_done']}, rollout step "
                             f"{state['rollout']['position']}; the block at {self.updates_done}, {self.position}")
        self.updates_done, self.position = state["updates_done"], state["rollout"]["position"]
        for name, p in self.named:
            p[k].copy_(state["network"][name])
        import_adam_state(self.optimizer, self.parameters, k, agent.optimizer, list(agent.network.parameters()))
        self.optimizer.param_groups[0]["lr"] = agent.optimizer.param_groups[0]["lr"]
        for name, tensor in self.rollout.items():
            tensor[k].copy_(state["rollout"][name])


def make_block(agents: list[PPOAgent], generators: list[torch.Generator]) -> PPOBlock:
    return PPOBlock(agents, generators)


make_block.bit_exact_devices = PPOBlock.BIT_EXACT_DEVICES   # where a block's seeds are bit for bit one-seed runs
