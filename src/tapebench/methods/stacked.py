"""Stacked layers for seed blocks: the same layer of S seeds' networks as one tensor with a leading seed dimension.

`stacked_linear(x, weight, bias)` is S `nn.Linear` layers at once: x (S, n, in), weight (S, out, in), bias (S, out)
-> (S, n, out), one batched matrix product (`torch.baddbmm`) forward and backward. Its backward computes each
gradient with the operand layout `nn.Linear`'s own backward uses (weight gradient gᵀ·x, input gradient g·W), so a
seed's products are the products its one-seed network computes.

Bit for bit on the CPU: the BLAS rounds a batched product like the single one for most shapes, but not for all
(tiny products take torch's naive loop, a one-column output a matrix-vector kernel, some narrow outputs another
kernel). So on the CPU each shape (S, n, in, out) is probed once per process and thread count, on data from a
private generator: the batched forward and both gradients against `nn.functional.linear` seed by seed. A shape whose
batched product does not reproduce the one-seed bits runs seed by seed (`nn.functional.linear` on each seed's
slice, exactly the one-seed computation); tiny products cost little either way. With `exact=False` (the
callers pass it off the CPU, where no bit-identity is claimed) the batched product is used throughout.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

_EXACT: dict[tuple, bool] = {}   # (S, n, in, out, dtype, threads) -> the batched product gives the one-seed bits


class _BatchedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = torch.bmm(grad, weight) if ctx.needs_input_grad[0] else None
        grad_weight = torch.bmm(grad.transpose(1, 2), x) if ctx.needs_input_grad[1] else None
        grad_bias = grad.sum(1) if ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


def _per_seed(x, weight, bias):
    return torch.stack([F.linear(x[k], weight[k], bias[k]) for k in range(x.shape[0])])


def _batched_is_exact(S: int, n: int, fan_in: int, fan_out: int, dtype: torch.dtype) -> bool:
    key = (S, n, fan_in, fan_out, dtype, torch.get_num_threads())
    if key not in _EXACT:
        generator = torch.Generator().manual_seed(0)   # never a seed's generator nor torch's global one
        x, weight, bias, grad = (torch.randn(shape, generator=generator, dtype=dtype)
                                 for shape in ((S, n, fan_in), (S, fan_out, fan_in), (S, fan_out), (S, n, fan_out)))
        with torch.enable_grad():
            leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
            out = _BatchedLinear.apply(*leaves)
            out.backward(grad)
            exact = True
            for k in range(S):
                one = [t[k].clone().requires_grad_() for t in (x, weight, bias)]
                reference = F.linear(*one)
                reference.backward(grad[k])
                exact = exact and torch.equal(out[k], reference) and all(
                    torch.equal(leaf.grad[k], o.grad) for leaf, o in zip(leaves, one))
        _EXACT[key] = exact
    return _EXACT[key]


def stacked_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, exact: bool = True) -> torch.Tensor:
    """S linear layers: x (S, n, in), weight (S, out, in), bias (S, out) -> (S, n, out); `exact`: each seed's
    one-seed bits (batched only for shapes where the probe finds the batched product exact)."""
    S, n, fan_in = x.shape
    if not exact or _batched_is_exact(S, n, fan_in, weight.shape[1], x.dtype):
        return _BatchedLinear.apply(x, weight, bias)
    return _per_seed(x, weight, bias)


class StackedSequential:
    """S seeds' copies of one `nn.Sequential` of `nn.Linear` and `nn.Tanh` layers, stacked.

    `parameters` lists the stacked tensors in the order of `nn.Sequential.parameters()`; `names` their
    `state_dict` keys (so seed k's slice k is its one-seed network's tensor of that name). `exact`: see
    `stacked_linear`.
    """

    def __init__(self, networks: list[nn.Sequential], device: torch.device, unsupported: type[Exception],
                 exact: bool = True):
        template, self.exact = networks[0], exact
        self.layers: list[tuple[str, int | None]] = []
        self.parameters: list[nn.Parameter] = []
        self.names: list[str] = []
        for index, module in enumerate(template):
            if isinstance(module, nn.Linear):
                for name in ("weight", "bias"):
                    self.parameters.append(nn.Parameter(torch.stack(
                        [getattr(network[index], name).detach() for network in networks]).to(device)))
                    self.names.append(f"{index}.{name}")
                self.layers.append(("linear", len(self.parameters) - 2))
            elif isinstance(module, nn.Tanh):
                self.layers.append(("tanh", None))
            else:
                raise unsupported(f"no stacked form of the layer {type(module).__name__}")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(S, n, in) -> (S, n, out), every seed through its own layers."""
        for kind, i in self.layers:
            x = (stacked_linear(x, self.parameters[i], self.parameters[i + 1], self.exact) if kind == "linear"
                 else torch.tanh(x))
        return x

    def one_seed(self, k: int, x: torch.Tensor) -> torch.Tensor:
        """Seed k's network alone on x (n, in): the one-seed computation (`nn.Linear`) on seed k's slices."""
        for kind, i in self.layers:
            x = F.linear(x, self.parameters[i][k], self.parameters[i + 1][k]) if kind == "linear" else torch.tanh(x)
        return x
