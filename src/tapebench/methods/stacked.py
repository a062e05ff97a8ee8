"""Stacked parameters for seed blocks: S copies of a network trained as one (methods/contract.py, "Seed blocks").

A seed block holds S seeds' tensors with a leading seed dimension S. Nothing here mixes seeds: every product is a
batched product over the seed dimension, gradient-norm clipping takes one norm per seed, and Adam is element-wise.
`SeedAdam` steps each seed's slices as tensors of their own.
The formulations are chosen to reproduce the single-seed code path bit for bit on the CPU (tests/test_seed_blocks.py):
`torch.baddbmm` gives what `F.linear` gives on each slice (and `stacked_linear`'s backward
what `F.linear`'s does), the per-seed gradient norms are the same
`torch._foreach_norm` calls `nn.utils.clip_grad_norm_` makes, on the seed's slices.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tapebench.methods.common import Adam, adam_update
from tapebench.methods.equivariant import PerCellNetwork, circular_pad


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


# below this many multiply-adds per matrix (rows x contraction x columns) the CPU's batched product runs its own
# summation loop rather than the BLAS kernel `F.linear` uses, and rounds differently
SMALL_PRODUCT = 400


def stacked_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """`F.linear` on each seed's slice, bit for bit what `F.linear` gives on the CPU: one batched product, or seed
    by seed where the product is small (`SMALL_PRODUCT`)."""
    if x.shape[1] * weight.shape[1] * weight.shape[2] < SMALL_PRODUCT:
        return torch.stack([F.linear(x[k], weight[k], bias[k]) for k in range(weight.shape[0])])
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


class StackedPerCellNetwork:
    """S equivariant per-cell networks (`equivariant.PerCellNetwork` with ReLU, no extra inputs) as one:
    obs (S, N, L+1) -> (S, N, L), cell features (S, N, channels, L). The convolutions run seed by seed on each seed's
    slice (`_conv`), the pooled term goes through `stacked_linear`, the rest is element-wise over the block.
    Parameters in `PerCellNetwork.parameters()` order, each with a leading S. Every tensor is used as the one-seed
    network uses it (the same consumers in the same order), so autograd sums each seed's gradient contributions
    in the same order as a one-seed run."""

    def __init__(self, parameters: list[torch.Tensor], module: PerCellNetwork):
        trunk = module.trunk
        self.L, self.layers, self.global_pool = trunk.L, len(trunk.convs), trunk.global_pool
        self.dilations = [conv.conv.dilation[0] for conv in trunk.convs]
        self.pads = [conv.pad for conv in trunk.convs]
        self.parameters = parameters

    @staticmethod
    def check(module: nn.Module) -> None:
        """Fail unless `module` is a per-cell network this class stacks."""
        ok = (isinstance(module, PerCellNetwork) and isinstance(module.trunk.act, nn.ReLU)
              and not module.trunk.extra and module.trunk.inp.in_channels == 2)
        if not ok:
            raise NotImplementedError(f"a seed block stacks equivariant per-cell networks with ReLU and the two "
                                      f"observation channels only, got {module}")

    @staticmethod
    def _conv(x, weight, bias, dilation: int = 1):
        """x (S, N, C_in, L') -> (S, N, C_out, L): seed k's weight (S, C_out, C_in, kernel)[k] on x[k].

        Seed by seed: one grouped convolution (groups = S) computes the same map, but on the CPU it rounds
        differently from a one-seed run's convolution at some batch sizes (forward at N = 4, the weight gradient of
        the 1x1 convolutions), so a seed's numbers would depend on the block.
        """
        return torch.stack([F.conv1d(x[k], weight[k], bias[k], dilation=dilation) for k in range(weight.shape[0])])

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        L = self.L
        x = torch.stack([obs[..., :L], obs[..., L:L + 1].expand(-1, -1, L)], dim=2)     # (S, N, 2, L)
        p = self.parameters
        h = torch.relu(self._conv(x, p[0], p[1]))
        convs = p[2:2 + 2 * self.layers]
        pools = p[2 + 2 * self.layers:2 + 4 * self.layers] if self.global_pool else None
        for i in range(self.layers):
            pad = self.pads[i]
            u = self._conv(circular_pad(h, pad) if pad else h, convs[2 * i], convs[2 * i + 1], self.dilations[i])
            if self.global_pool:
                u = u + stacked_linear(h.mean(dim=-1), pools[2 * i], pools[2 * i + 1]).unsqueeze(-1)
            h = h + torch.relu(u)
        return self._conv(h, p[-2], p[-1]).squeeze(2)


def stacked_network(parameters: list[torch.Tensor], module: nn.Module):
    """The stacked form of `module` (an MLP or an equivariant per-cell network) over `parameters`."""
    if isinstance(module, PerCellNetwork):
        StackedPerCellNetwork.check(module)
        return StackedPerCellNetwork(parameters, module)
    StackedMLP.check(module)
    return StackedMLP(parameters)


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


class SeedAdam(Adam):
    """The project's Adam (`common.Adam`) over stacked parameters, stepping each seed's slice as its own tensor.

    One call of torch's Adam update on the S x P slices: the kernel treats each tensor on its own, so seed k's
    slices take exactly the path a one-seed run's tensors take (one Adam over a stacked (S, 4) bias rounds
    differently from four-element tensors: the vectorised loop covers elements a one-seed run's scalar tail does).
    State per parameter: "step" (S,) and the moments (S, *shape).
    """

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state.get(p)
            if state is None:
                state = self.state[p] = {
                    "step": torch.zeros(p.shape[0], dtype=torch.float32, device=p.device if group["fused"] else "cpu"),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
            for k in range(p.shape[0]):
                params.append(p[k])
                grads.append(p.grad[k])
                exp_avgs.append(state["exp_avg"][k])
                exp_avg_sqs.append(state["exp_avg_sq"][k])
                steps.append(state["step"][k])
        beta1, beta2 = group["betas"]
        adam_update(params, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=group["foreach"], fused=group["fused"],
                    amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"],
                    eps=group["eps"], maximize=False)


def export_adam_state(block_optimizer, block_parameters: list[torch.Tensor], k: int, optimizer,
                      parameters: list[torch.Tensor]) -> None:
    """Write seed k's Adam state (moments, step count) into a single agent's optimiser over `parameters`."""
    optimizer.state = {}
    for s, p in zip(block_parameters, parameters, strict=True):
        state = block_optimizer.state.get(s)
        if state is not None:
            optimizer.state[p] = {"step": state["step"][k].clone(), "exp_avg": state["exp_avg"][k].clone(),
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
            block_state = block_optimizer.state[s] = {"step": state["step"].expand(s.shape[0]).clone(),
                                                      "exp_avg": torch.zeros_like(s.detach()),
                                                      "exp_avg_sq": torch.zeros_like(s.detach())}
        elif block_state["step"][k].item() != state["step"].item():
            raise ValueError(f"seed {k}'s optimiser is at step {state['step'].item()}, the block's at "
                             f"{block_state['step'][k].item()}: a block's seeds must be resumed from the same step")
        block_state["step"][k].copy_(state["step"])
        block_state["exp_avg"][k].copy_(state["exp_avg"])
        block_state["exp_avg_sq"][k].copy_(state["exp_avg_sq"])
