"""Small pieces the agent modules share."""
from __future__ import annotations

import torch


def adam(parameters, lr: float, eps: float = 1e-8) -> "LazyAdam":
    """Adam, using the fused kernel where this torch build has it (about 20% faster per update on CPU), built at its
    first use (`LazyAdam`).

    Fused and unfused Adam agree to rounding, not bit for bit; a run always uses the same one.
    """
    return LazyAdam(parameters, lr, eps)


class LazyAdam:
    """A `torch.optim.Adam` that is built the first time anything of it is used; every attribute is that optimiser's.

    Building a torch optimiser imports torch._dynamo (~1.8 CPU-seconds); a job that only evaluates a trained policy
    builds the agent but never updates it, so it never pays that.
    """

    def __init__(self, parameters, lr: float, eps: float):
        self._parameters, self._lr, self._eps, self._built = list(parameters), lr, eps, None

    @property
    def built(self) -> torch.optim.Adam:
        if self._built is None:
            try:
                self._built = torch.optim.Adam(self._parameters, lr=self._lr, eps=self._eps, fused=True)
            except (RuntimeError, TypeError):  # torch builds without fused Adam for this device
                self._built = torch.optim.Adam(self._parameters, lr=self._lr, eps=self._eps)
        return self._built

    def __getattr__(self, name: str):
        if name.startswith("_"):   # copy/pickle probes and a half-initialised object: no optimiser to ask
            raise AttributeError(name)
        return getattr(self.built, name)


@torch.no_grad()
def gae(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, next_value: torch.Tensor,
        gamma: float, gae_lambda: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over a rollout; returns (advantages, returns).

    rewards, values, dones: (T, N); dones[t] = 1 where the episode ended at step t (terminated or
    truncated: the recursion stops there; a truncated step's reward already carries γ·V(last obs)).
    next_value: (N,) value of the observation after the rollout's last step.
    """
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    last_gae = torch.zeros_like(next_value)
    for t in reversed(range(num_steps)):
        following_value = next_value if t == num_steps - 1 else values[t + 1]
        not_done = 1.0 - dones[t]
        delta = rewards[t] + gamma * following_value * not_done - values[t]
        last_gae = delta + gamma * gae_lambda * not_done * last_gae
        advantages[t] = last_gae
    return advantages, advantages + values


def due_updates(agent, config) -> tuple[int, int]:
    """The off-policy schedule of the DQN family after the latest environment steps.

    One gradient step per `config.train_frequency` environment steps once `config.learning_starts`
    steps are collected, one target-network update per `config.target_update_frequency` steps.
    Advances `agent.next_train_step` / `agent.next_target_step` (part of the agent's resumable state)
    and returns (gradient steps due, target updates due); run the gradient steps first.
    """
    gradient_steps = target_updates = 0
    while agent.env_steps >= agent.next_train_step:
        agent.next_train_step += config.train_frequency
        gradient_steps += agent.env_steps >= config.learning_starts
    while agent.env_steps >= agent.next_target_step:
        agent.next_target_step += config.target_update_frequency
        target_updates += 1
    return gradient_steps, target_updates


@torch.no_grad()
def soft_update_(target: torch.nn.Module, online: torch.nn.Module, tau: float) -> None:
    """target <- tau * online + (1 - tau) * target, parameter by parameter (tau = 1 copies)."""
    for t, o in zip(target.parameters(), online.parameters()):
        t.data.copy_(tau * o.data + (1.0 - tau) * t.data)
