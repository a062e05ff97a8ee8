"""Stacked layers for seed blocks: the same layer of S seeds' networks as one tensor with a leading seed dimension.

`StackedSequential` stacks an MLP (`nn.Linear` and `nn.Tanh`), `StackedEquivariant` an equivariant network of
`equivariant.py` (its convolutions as one grouped convolution over the seeds' channels, `stacked_conv1d`).

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
callers pass it off the CPU, where no bit-identity is claimed) the batched product is used throughout. The
grouped convolutions are probed and used the same way.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from tapebench.methods import equivariant

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


def _grouped_conv_is_exact(S: int, n: int, c_in: int, c_out: int, length: int, kernel: int, dilation: int,
                           dtype: torch.dtype) -> bool:
    key = ("conv", S, n, c_in, c_out, length, kernel, dilation, dtype, torch.get_num_threads())
    if key not in _EXACT:
        generator = torch.Generator().manual_seed(0)
        x, weight, bias = (torch.randn(shape, generator=generator, dtype=dtype)
                           for shape in ((n, S * c_in, length), (S, c_out, c_in, kernel), (S, c_out)))
        with torch.enable_grad():
            leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
            out = _grouped_conv(*leaves, dilation)
            grad = torch.randn(out.shape, generator=generator, dtype=dtype)
            out.backward(grad)
            exact = True
            for k in range(S):
                one = [x[:, k * c_in:(k + 1) * c_in].clone().requires_grad_(), weight[k].clone().requires_grad_(),
                       bias[k].clone().requires_grad_()]
                reference = F.conv1d(*one, dilation=dilation)
                reference.backward(grad[:, k * c_out:(k + 1) * c_out])
                exact = (exact and torch.equal(out[:, k * c_out:(k + 1) * c_out], reference)
                         and torch.equal(leaves[0].grad[:, k * c_in:(k + 1) * c_in], one[0].grad)
                         and torch.equal(leaves[1].grad[k], one[1].grad) and torch.equal(leaves[2].grad[k], one[2].grad))
        _EXACT[key] = exact
    return _EXACT[key]


def _grouped_conv(x, weight, bias, dilation):
    S = weight.shape[0]
    return F.conv1d(x, weight.reshape(-1, *weight.shape[2:]), bias.reshape(-1), dilation=dilation, groups=S)


def stacked_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, dilation: int,
                   exact: bool = True) -> torch.Tensor:
    """S 1-D convolutions: x (n, S·in, length) (seed k's channels k·in .. (k+1)·in - 1), weight (S, out, in, kernel),
    bias (S, out) -> (n, S·out, length'): one grouped convolution, or seed by seed where it would not give the
    one-seed bits (see `stacked_linear`)."""
    S, c_out, c_in, kernel = weight.shape
    n, _, length = x.shape
    if not exact or _grouped_conv_is_exact(S, n, c_in, c_out, length, kernel, dilation, x.dtype):
        return _grouped_conv(x, weight, bias, dilation)
    return torch.cat([F.conv1d(x[:, k * c_in:(k + 1) * c_in], weight[k], bias[k], dilation=dilation)
                      for k in range(S)], dim=1)


class StackedEquivariant:
    """S seeds' copies of one equivariant network (`equivariant.PerCellNetwork` or `PooledNetwork`, no `extra`
    channels), stacked: grouped circular convolutions over the seeds' channels, stacked linear pooling maps.

    Same interface as `StackedSequential`: `parameters` and `names` in the order of the network's own
    `named_parameters()`, `__call__` on (S, n, L+1) observations, `one_seed(k, obs)` the one-seed computation.
    """

    def __init__(self, networks: list[nn.Module], device: torch.device, unsupported: type[Exception],
                 exact: bool = True):
        template = networks[0]
        self.template, self.exact = template, exact
        if not isinstance(template, (equivariant.PerCellNetwork, equivariant.PooledNetwork)) or template.trunk.extra:
            raise unsupported(f"no stacked form of {type(template).__name__}")
        if not isinstance(template.trunk.act, nn.Tanh):
            raise unsupported(f"no stacked form of the activation {type(template.trunk.act).__name__}")
        self.pooled = isinstance(template, equivariant.PooledNetwork)
        self.names = [name for name, _ in template.named_parameters()]
        own = [dict(network.named_parameters()) for network in networks]
        self.params = {name: nn.Parameter(torch.stack([p[name].detach() for p in own]).to(device))
                       for name in self.names}
        self.parameters = [self.params[name] for name in self.names]
        trunk = template.trunk
        self.L, self.global_pool = trunk.L, trunk.global_pool
        self.convs = [(conv.pad, conv.conv.dilation[0]) for conv in trunk.convs]

    def _conv(self, x, name, dilation=1):
        w = self.params[f"{name}.weight"]
        return stacked_conv1d(x, w, self.params[f"{name}.bias"], dilation, self.exact)

    def _linear(self, x, name):
        return stacked_linear(x, self.params[f"{name}.weight"], self.params[f"{name}.bias"], self.exact)

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        """(S, n, L+1) -> (S, n, L) per-cell outputs, or (S, n, 1) for the pooled network."""
        S, n, _ = obs.shape
        L = self.L
        x = torch.stack([obs[..., :L], obs[..., L:L + 1].expand(-1, -1, L)], dim=2)    # (S, n, 2, L)
        h = torch.tanh(self._conv(x.transpose(0, 1).reshape(n, -1, L), "trunk.inp"))  # (n, S·C, L)
        for i, (pad, dilation) in enumerate(self.convs):
            u = self._conv(equivariant.circular_pad(h, pad) if pad else h, f"trunk.convs.{i}.conv", dilation)
            if self.global_pool:
                pooled = self._linear(h.mean(dim=-1).reshape(n, S, -1).transpose(0, 1).contiguous(), f"trunk.pools.{i}")
                u = u + pooled.transpose(0, 1).reshape(n, -1).unsqueeze(-1)
            h = h + torch.tanh(u)
        if self.pooled:
            return self._linear(h.mean(dim=-1).reshape(n, S, -1).transpose(0, 1).contiguous(), "head")
        return self._conv(h, "head").transpose(0, 1)   # (n, S, L) -> (S, n, L)

    def one_seed(self, k: int, obs: torch.Tensor) -> torch.Tensor:
        """Seed k's network alone on obs (n, L+1): the one-seed module run on seed k's slices."""
        return torch.func.functional_call(self.template, {name: p[k] for name, p in self.params.items()}, (obs,))
