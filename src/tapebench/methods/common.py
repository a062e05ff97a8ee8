"""Small pieces the agent modules share."""
from __future__ import annotations

import torch
from torch.optim.adam import adam as adam_update

FUSED_ADAM_DEVICES = ("cpu", "cuda")   # where torch 2.x has the fused Adam kernel


def adam(parameters, lr: float, eps: float = 1e-8) -> "Adam":
    """Adam, using the fused kernel where this torch build has it (about 20% faster per update on CPU).

    Fused and unfused Adam agree to rounding, not bit for bit; a run always uses the same one.
    """
    return Adam(parameters, lr, eps)


class Adam:
    """`torch.optim.Adam(parameters, lr=lr, eps=eps, fused=True)` (unfused where the parameters' device has no fused
    kernel), bit for bit, without `torch.optim.Optimizer`: it calls torch's own update, `torch.optim.adam.adam`, on
    state kept in torch's layout, and its `state_dict` is interchangeable with torch's. Constructing or stepping a
    torch optimiser imports torch._dynamo (~1.3 CPU-seconds in every training job, which compiles nothing).

    Used as agents use an optimiser: `zero_grad()`, `step()`, `param_groups[0]["lr"]` (annealing), `state_dict()`,
    `load_state_dict()`; one parameter group, no weight decay, no AMSGrad.
    """

    def __init__(self, parameters, lr: float, eps: float):
        params = list(parameters)
        fused = all(p.is_floating_point() and p.device.type in FUSED_ADAM_DEVICES for p in params)
        self.param_groups = [{"params": params, "lr": lr, "betas": (0.9, 0.999), "eps": eps, "weight_decay": 0,
                              "amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
                              "differentiable": False, "fused": True if fused else None,
                              "decoupled_weight_decay": False}]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def zero_grad(self) -> None:
        for p in self.param_groups[0]["params"]:
            p.grad = None

    def _new_state(self, p: torch.Tensor, fused: bool) -> dict:
        """torch's first-step state: the step count on the device when fused, else on the CPU."""
        return {"step": torch.zeros((), dtype=torch.float32, device=p.device if fused else "cpu"),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}

    def _update_tensors(self, p: torch.Tensor, state: dict):
        """(parameter, gradient, first moment, second moment, step) tensors torch's update gets for `p`."""
        yield p, p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"]

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state.get(p)
            if state is None:
                state = self.state[p] = self._new_state(p, bool(group["fused"]))
            for param, grad, exp_avg, exp_avg_sq, step in self._update_tensors(p, state):
                params.append(param)
                grads.append(grad)
                exp_avgs.append(exp_avg)
                exp_avg_sqs.append(exp_avg_sq)
                steps.append(step)
        beta1, beta2 = group["betas"]
        adam_update(params, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=group["foreach"], fused=group["fused"],
                    amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"],
                    eps=group["eps"], maximize=False)

    def state_dict(self) -> dict:
        group = self.param_groups[0]
        index = {id(p): i for i, p in enumerate(group["params"])}
        return {"state": {index[id(p)]: dict(state) for p, state in self.state.items()},
                "param_groups": [{**{k: v for k, v in group.items() if k != "params"},
                                  "params": list(range(len(group["params"])))}]}

    def load_state_dict(self, state_dict: dict) -> None:
        (saved,) = state_dict["param_groups"]
        params = self.param_groups[0]["params"]
        if len(saved["params"]) != len(params):
            raise ValueError(f"optimiser state for {len(saved['params'])} parameters, this optimiser has {len(params)}")
        fused = bool(saved.get("fused"))
        self.state = {}
        for i, state in state_dict["state"].items():
            p = params[int(i)]
            self.state[p] = {k: (v.to(dtype=torch.float32, device=p.device if fused else "cpu") if k == "step"
                                 else v.to(dtype=p.dtype, device=p.device)) for k, v in state.items()}
        self.param_groups[0].update({k: v for k, v in saved.items() if k != "params"})


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
