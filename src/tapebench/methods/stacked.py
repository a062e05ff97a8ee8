"""Stacked parameters for seed blocks: S copies of a network trained as one (methods/contract.py, "Seed blocks").

A seed block holds S seeds' tensors with a leading seed dimension S. Nothing here mixes seeds: every product is a
batched product over the seed dimension, gradient-norm clipping takes one norm per seed, and Adam is element-wise.
The formulations are chosen to reproduce the single-seed code path bit for bit on the CPU (tests/test_seed_blocks.py):
`torch.baddbmm` gives what `F.linear` gives on each slice (and `stacked_linear`'s backward
what `F.linear`'s does), the per-seed gradient norms are the same
`torch._foreach_norm` calls `nn.utils.clip_grad_norm_` makes, on the seed's slices.
"""
from __future__ import annotations

import torch
from torch import nn


def stack_parameters(modules: list[nn.Module], requires_grad: bool) -> list[torch.Tensor]:
    """The S modules' parameters, each stacked to (S, *shape), in `module.parameters()` order."""
    per_module = [list(m.parameters()) for m in modules]
    return [torch.stack([p.detach() for p in ps]).clone().requires_grad_(requires_grad) for ps in zip(*per_module)]


@torch.no_grad()
def write_parameters(stacked: list[torch.Tensor], k: int, module: nn.Module) -> None:
    """Copy seed k's slices of `stacked` into `module`'s parameters."""
    for s, p in zip(stacked, module.parameters(), strict=True):
        p.copy_(s[k])


@torch.no_grad()
def read_parameters(stacked: list[torch.Tensor], k: int, module: nn.Module) -> None:
    """Copy `module`'s parameters into seed k's slices of `stacked`."""
    for s, p in zip(stacked, module.parameters(), strict=True):
        s[k].copy_(p)


class _StackedLinear(torch.autograd.Function):
    """y = x W^T + b on every seed: x (S, B, in), W (S, out, in), b (S, out) -> (S, B, out).

    The backward pass computes the weight gradient as g^T x, (S, out, in), as `F.linear`'s backward does for each
    slice (autograd's own baddbmm backward computes x^T g and transposes it: the same sums in another order, which
    differs from a one-seed run's gradient in the last bits).
    """

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = torch.bmm(grad, weight) if ctx.needs_input_grad[0] else None
        return grad_x, torch.bmm(grad.transpose(1, 2), x), grad.sum(dim=1)


def stacked_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """`F.linear` on each seed's slice, as one batched product: bit for bit what `F.linear` gives on the CPU."""
    if not torch.is_grad_enabled() or not (weight.requires_grad or bias.requires_grad or x.requires_grad):
        return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))
    return _StackedLinear.apply(x, weight, bias)


class StackedMLP:
    """S MLPs (Linear, ReLU, ..., Linear) as one: (S, B, in) -> (S, B, out), parameters [W0, b0, W1, b1, ...]
    with W (S, out, in) and b (S, out), the order of `nn.Sequential(...).parameters()`."""

    def __init__(self, parameters: list[torch.Tensor]):
        if len(parameters) % 2:
            raise ValueError(f"a stacked MLP needs weight/bias pairs, got {len(parameters)} tensors")
        self.parameters = parameters

    @staticmethod
    def check(module: nn.Module) -> None:
        """Fail unless `module` is an MLP this class stacks: Linear layers with ReLU between them."""
        layers = list(module.children()) if isinstance(module, nn.Sequential) else [module]
        ok = all(isinstance(m, nn.Linear) if i % 2 == 0 else isinstance(m, nn.ReLU) for i, m in enumerate(layers))
        if not ok or len(layers) % 2 == 0:
            raise NotImplementedError(f"a seed block stacks MLPs of Linear/ReLU layers, got {module}")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n = len(self.parameters) // 2
        for i in range(n):
            weight, bias = self.parameters[2 * i], self.parameters[2 * i + 1]
            x = stacked_linear(x, weight, bias)
            if i < n - 1:
                x = torch.relu(x)
        return x


@torch.no_grad()
def clip_grad_norm_per_seed_(parameters: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """`nn.utils.clip_grad_norm_` for each seed on its own slices of all `parameters`; returns the (S,) norms.

    The same operations as the single-seed call (per-tensor `torch._foreach_norm`, the norm of their stack,
    coefficient max_norm / (norm + 1e-6) clamped at 1), so each seed's gradients match a one-seed run's.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    S = grads[0].shape[0]
    norms = torch._foreach_norm([g[k] for k in range(S) for g in grads], 2.0)
    P = len(grads)
    total = torch.stack([torch.linalg.vector_norm(torch.stack(norms[k * P:(k + 1) * P]), 2.0) for k in range(S)])
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.view(S, *([1] * (g.dim() - 1))))
    return total


def export_adam_state(block_optimizer, block_parameters: list[torch.Tensor], k: int, optimizer,
                      parameters: list[torch.Tensor]) -> None:
    """Write seed k's Adam state (moments, step count) into a single agent's optimiser over `parameters`."""
    optimizer.state = {}
    for s, p in zip(block_parameters, parameters, strict=True):
        state = block_optimizer.state.get(s)
        if state is not None:
            optimizer.state[p] = {"step": state["step"].clone(), "exp_avg": state["exp_avg"][k].clone(),
                                  "exp_avg_sq": state["exp_avg_sq"][k].clone()}
    optimizer.param_groups[0]["lr"] = block_optimizer.param_groups[0]["lr"]


def import_adam_state(block_optimizer, block_parameters: list[torch.Tensor], k: int, optimizer,
                      parameters: list[torch.Tensor]) -> None:
    """Write a single agent's Adam state into seed k's slices of the block's; every seed must be at the same
    step count (a block's seeds step together)."""
    for s, p in zip(block_parameters, parameters, strict=True):
        state = optimizer.state.get(p)
        block_state = block_optimizer.state.get(s)
        if state is None:
            if block_state is not None:
                raise ValueError(f"seed {k} has no optimiser state but the block's other seeds have: a block's "
                                 f"seeds must be resumed from the same step")
            continue
        if block_state is None:
            block_state = block_optimizer.state[s] = {"step": state["step"].clone(),
                                                      "exp_avg": torch.zeros_like(s.detach()),
                                                      "exp_avg_sq": torch.zeros_like(s.detach())}
        elif block_state["step"].item() != state["step"].item():
            raise ValueError(f"seed {k}'s optimiser is at step {state['step'].item()}, the block's at "
                             f"{block_state['step'].item()}: a block's seeds must be resumed from the same step")
        block_state["exp_avg"][k].copy_(state["exp_avg"])
        block_state["exp_avg_sq"][k].copy_(state["exp_avg_sq"])
