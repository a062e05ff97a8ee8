"""Stacked layers for seed blocks: the same layer of S seeds' networks as one tensor with a leading seed dimension
(methods/contract.py, "Seed blocks"). Nothing here mixes seeds: every product is a batched product over the seed
dimension, gradient-norm clipping takes one norm per seed (the same `torch._foreach_norm` calls
`nn.utils.clip_grad_norm_` makes, on the seed's slices), and `SeedAdam` steps each seed's slices as tensors of
their own.

`StackedSequential` stacks an MLP (`nn.Linear` and `nn.Tanh`), `StackedGRUCell` a GRU cell, `StackedEquivariant` an
equivariant network of `equivariant.py`, on the tape or the grid (its convolutions as one grouped convolution over the
seeds' channels, `stacked_conv`, 1-D or 2-D on the operands `equivariant.circular_operands` gives).

`stacked_linear(x, weight, bias)` is S `nn.Linear` layers at once: x (S, n, in), weight (S, out, in), bias (S, out)
-> (S, n, out), one batched matrix product (`torch.baddbmm`) forward and backward. Its backward computes each
gradient with the operand layout `nn.Linear`'s own backward uses (weight gradient gᵀ·x, input gradient g·W), so a
seed's products are the products its one-seed network computes.

Bit for bit on the CPU: the BLAS rounds a batched product like the single one for most shapes, but not for all
(tiny products take torch's naive loop, a one-column output a matrix-vector kernel, some narrow outputs another
kernel). So on the CPU each shape (S, n, in, out) is probed once per process and thread count, on data from a
private generator: the batched forward and both gradients against `nn.functional.linear` seed by seed. A shape whose
batched product does not reproduce the one-seed bits runs seed by seed (`nn.functional.linear` on each seed's
slice, exactly the one-seed computation); tiny products cost little either way. The BLAS (MKL) also rounds some
small products by their operands' alignment. A one-seed run's tensors each start an allocation (64-byte aligned);
seed k's slice of a stacked tensor starts wherever k times its size puts it. So a layer run seed by seed takes
`aligned` operands (a slice that does not start on an allocation boundary is copied) and hands back `aligned`
gradients (`aligned_gradient`), whatever the per-seed sizes. A batched product has no such copies: where a method's
own activations are sliced per seed it checks its sizes itself (RL2-A2C: multiples of 4 floats). With `exact=False`
(the callers pass it off the CPU, where no bit-identity is claimed) the batched product is used throughout. The
grouped convolutions are probed and used the same way.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from tapebench.methods import equivariant
from tapebench.methods.common import Adam
from tapebench.methods.contract import BlockUnsupported
from tapebench.methods.equivariant import PerCellNetwork, circular_operands, conv_of


def check_block_agents(agents: list, generators: list, agent_type: type, label: str, shared: dict) -> None:
    """What every block checks of the agents it is given: one generator per agent, each agent exactly of
    `agent_type` (else `BlockUnsupported`: the loop trains them one after another), and the same value of
    `shared[name](agent)` for every agent."""
    if not agents or len(agents) != len(generators):
        raise ValueError(f"a seed block ({label}) needs one generator per agent, got {len(agents)} agents and "
                         f"{len(generators)} generators")
    if any(type(a) is not agent_type for a in agents):
        raise BlockUnsupported(f"{label} stacks {agent_type.__name__} only, got "
                               f"{sorted({type(a).__name__ for a in agents})}")
    for name, value in shared.items():
        if any(value(a) != value(agents[0]) for a in agents):
            raise ValueError(f"the agents of a seed block ({label}) must share {', '.join(shared)}; {name} differs")


def check_same_step(k: int, seed_step: dict, block_step: dict) -> None:
    """A seed imported into a block must be at the block's step (its counters and replay position)."""
    if seed_step != block_step:
        raise ValueError(f"seed {k} is at {seed_step}, the block at {block_step}: a block's seeds must be at the "
                         f"same step")


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


ALLOCATION_ALIGNMENT = 64   # bytes: where torch's CPU allocator starts every tensor


def aligned(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a copy of it where it does not start where an allocation would: MKL rounds some products by their
    operands' alignment, and a one-seed run's tensors each start an allocation (seed k's slice of a stacked tensor
    starts mid-tensor, e.g. x (25, 25) -> 8 outputs, or a (1, 30) weight at an odd k)."""
    return t if t.data_ptr() % ALLOCATION_ALIGNMENT == 0 else t.clone()


class _AlignedGradient(torch.autograd.Function):
    """The identity, whose backward pass hands on the gradient as `aligned` gives it: a seed's slice of the gradient
    of a stacked result starts mid-tensor, and the products of the seed's own layer would round by that."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return aligned(grad)


def aligned_gradient(x: torch.Tensor) -> torch.Tensor:
    """x, its gradient aligned in the backward pass (`_AlignedGradient`)."""
    return _AlignedGradient.apply(x) if x.requires_grad else x


def _per_seed(x, weight, bias):
    return torch.stack([aligned_gradient(F.linear(aligned(x[k]), aligned(weight[k]), aligned(bias[k])))
                        for k in range(x.shape[0])])


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
    one-seed bits on a CPU (batched only for shapes where the probe finds the batched product exact). A GPU
    promises no bit-exactness: there the product is always batched."""
    S, n, fan_in = x.shape
    if not exact or x.device.type != "cpu" or _batched_is_exact(S, n, fan_in, weight.shape[1], x.dtype):
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
            x = (F.linear(x, aligned(self.parameters[i][k]), aligned(self.parameters[i + 1][k])) if kind == "linear"
                 else torch.tanh(x))
        return x


class StackedGRUCell:
    """S seeds' `nn.GRUCell`s, stacked: x (S, n, in), hidden (S, n, h) -> (S, n, h).

    The operations of ATen's `gru_cell` on the CPU, batched over the seeds: the input and hidden products
    (`stacked_linear`), each chunked into three gates, reset = sigmoid(h_r + i_r), update = sigmoid(h_z + i_z),
    new = tanh(i_n + h_n * reset), h' = (h - new) * update + new, in place where ATen works in place. A gate is a
    (S, n, h) view with the one-seed layout inside each seed's slice (rows of h, stride 3h), so the sigmoid kernel,
    whose vector loop and scalar tail round differently, takes each element down the path the one-seed kernel takes;
    tanh, the products, sums and the backward kernels round alike on either path.

    `parameters` in `nn.GRUCell.parameters()` order (weight_ih, weight_hh, bias_ih, bias_hh), `names` their
    `state_dict` keys; `exact`: see `stacked_linear`.
    """

    def __init__(self, cells: list[nn.GRUCell], device: torch.device, exact: bool = True):
        self.exact = exact
        self.names = [name for name, _ in cells[0].named_parameters()]
        own = [dict(cell.named_parameters()) for cell in cells]
        self.parameters = [nn.Parameter(torch.stack([p[name].detach() for p in own]).to(device)) for name in self.names]

    def __call__(self, x: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        weight_ih, weight_hh, bias_ih, bias_hh = self.parameters
        input_gates = stacked_linear(x, weight_ih, bias_ih, self.exact).unsafe_chunk(3, -1)
        hidden_gates = stacked_linear(hidden, weight_hh, bias_hh, self.exact).unsafe_chunk(3, -1)
        reset = hidden_gates[0].add_(input_gates[0]).sigmoid_()
        update = hidden_gates[1].add_(input_gates[1]).sigmoid_()
        new = input_gates[2].add(hidden_gates[2].mul_(reset)).tanh_()
        return (hidden - new).mul_(update).add_(new)

    def one_seed(self, k: int, x: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Seed k's cell alone on x (n, in), hidden (n, h): `nn.GRUCell`'s own computation on seed k's slices."""
        return torch.gru_cell(x, hidden, *(aligned(p[k]) for p in self.parameters))


def _grouped_conv_is_exact(S: int, n: int, c_in: int, c_out: int, spatial: tuple, kernel: tuple, dilation: int,
                           dtype: torch.dtype) -> bool:
    key = ("conv", S, n, c_in, c_out, spatial, kernel, dilation, dtype, torch.get_num_threads())
    if key not in _EXACT:
        generator = torch.Generator().manual_seed(0)
        x, weight, bias = (torch.randn(shape, generator=generator, dtype=dtype)
                           for shape in ((n, S * c_in, *spatial), (S, c_out, c_in, *kernel), (S, c_out)))
        conv = conv_of(x)
        with torch.enable_grad():
            leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
            out = _grouped_conv(*leaves, dilation)
            grad = torch.randn(out.shape, generator=generator, dtype=dtype)
            out.backward(grad)
            exact = True
            for k in range(S):
                one = [x[:, k * c_in:(k + 1) * c_in].clone().requires_grad_(), weight[k].clone().requires_grad_(),
                       bias[k].clone().requires_grad_()]
                reference = conv(*one, dilation=dilation)
                reference.backward(grad[:, k * c_out:(k + 1) * c_out])
                exact = (exact and torch.equal(out[:, k * c_out:(k + 1) * c_out], reference)
                         and torch.equal(leaves[0].grad[:, k * c_in:(k + 1) * c_in], one[0].grad)
                         and torch.equal(leaves[1].grad[k], one[1].grad) and torch.equal(leaves[2].grad[k], one[2].grad))
        _EXACT[key] = exact
    return _EXACT[key]


def _grouped_conv(x, weight, bias, dilation):
    S = weight.shape[0]
    return conv_of(x)(x, weight.reshape(-1, *weight.shape[2:]), bias.reshape(-1), dilation=dilation, groups=S)


def grouped_seed_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, dilation: int = 1) -> torch.Tensor:
    """x (S, N, C_in, *spatial) -> (S, N, C_out, L), seed k's weight[k] on x[k] as one grouped convolution (1-D or
    2-D by the input's rank), the output cells flattened."""
    S, N, c_in = x.shape[:3]
    y = _grouped_conv(x.transpose(0, 1).reshape(N, S * c_in, *x.shape[3:]), weight, bias, dilation)
    return y.reshape(N, S, -1, *y.shape[2:]).transpose(0, 1).flatten(3)


def stacked_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, dilation: int,
                 exact: bool = True) -> torch.Tensor:
    """S 1-D or 2-D convolutions: x (n, S·in, *spatial) (seed k's channels k·in .. (k+1)·in - 1), weight
    (S, out, in, *kernel), bias (S, out) -> (n, S·out, *spatial'): one grouped convolution, or seed by seed where it
    would not give the one-seed bits on a CPU (see `stacked_linear`)."""
    S, c_out, c_in = weight.shape[:3]
    if not exact or x.device.type != "cpu" or _grouped_conv_is_exact(
            S, x.shape[0], c_in, c_out, tuple(x.shape[2:]), tuple(weight.shape[3:]), dilation, x.dtype):
        return _grouped_conv(x, weight, bias, dilation)
    conv = conv_of(x)
    return torch.cat([conv(x[:, k * c_in:(k + 1) * c_in], aligned(weight[k]), aligned(bias[k]), dilation=dilation)
                      for k in range(S)], dim=1)


class StackedEquivariant:
    """S seeds' copies of one equivariant network (`equivariant.PerCellNetwork` or `PooledNetwork`, no `extra`
    channels), stacked: grouped circular convolutions over the seeds' channels, stacked linear pooling maps.

    Same interface as `StackedSequential`: `parameters` and `names` in the order of the network's own
    `named_parameters()`, `__call__` on (S, n, L+1) observations ((S, n, 2L+1) with the goal), `one_seed(k, obs)`
    the one-seed computation.
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
        self.L, self.global_pool, self.grid = trunk.L, trunk.global_pool, trunk.grid
        self.dilations = [conv.dilation for conv in trunk.convs]

    def _conv(self, x, name, dilation=1):
        w = self.params[f"{name}.weight"]
        return stacked_conv(x, w, self.params[f"{name}.bias"], dilation, self.exact)

    def _circular_conv(self, x, name, dilation):
        """The seeds' circular convolution `name` over cells x (n, S·C, L) (tape or grid, as the trunk's)."""
        x, weight, dilation = circular_operands(x, self.params[f"{name}.weight"], dilation, self.grid)
        return stacked_conv(x, weight, self.params[f"{name}.bias"], dilation, self.exact).flatten(2)

    def _linear(self, x, name):
        return stacked_linear(x, self.params[f"{name}.weight"], self.params[f"{name}.bias"], self.exact)

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        """(S, n, L+1) -> (S, n, L) per-cell outputs, or (S, n, 1) for the pooled network."""
        S, n, _ = obs.shape
        L = self.L
        x = self.template.trunk.observation_channels(obs)                               # (S, n, 2 or 3, L)
        h = torch.tanh(self._conv(x.transpose(0, 1).reshape(n, -1, L), "trunk.inp"))  # (n, S·C, L)
        for i, dilation in enumerate(self.dilations):
            u = self._circular_conv(h, f"trunk.convs.{i}.conv", dilation)
            if self.global_pool:
                pooled = self._linear(h.mean(dim=-1).reshape(n, S, -1).transpose(0, 1).contiguous(), f"trunk.pools.{i}")
                u = u + pooled.transpose(0, 1).reshape(n, -1).unsqueeze(-1)
            h = h + torch.tanh(u)
        if self.pooled:
            return self._linear(h.mean(dim=-1).reshape(n, S, -1).transpose(0, 1).contiguous(), "head")
        return self._conv(h, "head").transpose(0, 1)   # (n, S, L) -> (S, n, L)

    def one_seed(self, k: int, obs: torch.Tensor) -> torch.Tensor:
        """Seed k's network alone on obs (n, L+1): the one-seed module run on seed k's slices."""
        return torch.func.functional_call(self.template, {name: aligned(p[k]) for name, p in self.params.items()},
                                          (obs,))


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
            raise BlockUnsupported(f"a seed block stacks MLPs of Linear/ReLU layers, got {module}")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n = len(self.parameters) // 2
        for i in range(n):
            weight, bias = self.parameters[2 * i], self.parameters[2 * i + 1]
            x = stacked_linear(x, weight, bias)
            if i < n - 1:
                x = torch.relu(x)
        return x

    def each_seed(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Seed k's MLP on inputs[k] (n_k, in), for inputs whose row counts differ from seed to seed: the one-seed
        products (`F.linear`) on each seed's slices, bit for bit where each input is a tensor of its own (not a view
        into the middle of another, see `_per_seed`). The slices come from `unbind`, so each seed's gradient lands in
        its slice as it is, never added to the other seeds' zeros."""
        per_seed = list(zip(*(p.unbind(0) for p in self.parameters)))
        outputs = []
        for parameters, x in zip(per_seed, inputs, strict=True):
            n = len(parameters) // 2
            for i in range(n):
                x = F.linear(x, parameters[2 * i], parameters[2 * i + 1])
                if i < n - 1:
                    x = torch.relu(x)
            outputs.append(x)
        return outputs


class StackedPerCellNetwork:
    """S equivariant per-cell networks (`equivariant.PerCellNetwork` with ReLU, on the tape's observation channels
    and optional per-row `extra` features broadcast to every cell) as one: obs (S, N, L+1) [, extra (S, N, extra)]
    -> (S, N, L), cell features (S, N, channels, L). The convolutions run seed by seed on each seed's
    slice (`_conv`), the pooled term goes through `stacked_linear`, the rest is element-wise over the block.
    Parameters in `PerCellNetwork.parameters()` order, each with a leading S. Every tensor is used as the one-seed
    network uses it (the same consumers in the same order), so autograd sums each seed's gradient contributions
    in the same order as a one-seed run."""

    def __init__(self, parameters: list[torch.Tensor], module: PerCellNetwork):
        trunk = module.trunk
        self.L, self.layers, self.global_pool, self.grid = trunk.L, len(trunk.convs), trunk.global_pool, trunk.grid
        self.dilations = [conv.dilation for conv in trunk.convs]
        self.extra = trunk.extra
        self.parameters = parameters

    @staticmethod
    def check(module: nn.Module) -> None:
        """Fail unless `module` is a per-cell network this class stacks."""
        ok = (isinstance(module, PerCellNetwork) and isinstance(module.trunk.act, nn.ReLU)
              and module.trunk.inp.in_channels == 2 + module.trunk.extra)
        if not ok:
            raise BlockUnsupported(f"a seed block stacks equivariant per-cell networks with ReLU on the two "
                                      f"observation channels (and per-row extra features) only, got {module}")

    @staticmethod
    def _conv(x, weight, bias, dilation: int = 1):
        """x (S, N, C_in, *spatial) -> (S, N, C_out, L): seed k's weight (S, C_out, C_in, *kernel)[k] on x[k] (1-D or
        2-D by the input's rank), the output cells flattened.

        Seed by seed on a CPU: one grouped convolution (groups = S) computes the same map, but on the CPU it rounds
        differently from a one-seed run's convolution at some batch sizes (forward at N = 4, the weight gradient of
        the 1x1 convolutions), so a seed's numbers would depend on the block. On a GPU, one grouped convolution.
        """
        if x.device.type != "cpu":
            return grouped_seed_conv(x, weight, bias, dilation)
        return torch.stack([aligned_gradient(conv_of(x[k])(aligned(x[k]), aligned(weight[k]), aligned(bias[k]),
                                                           dilation=dilation)).flatten(2)
                            for k in range(weight.shape[0])])

    def __call__(self, obs: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        L = self.L
        if (extra is None) != (not self.extra):
            raise ValueError(f"this per-cell network takes {self.extra} extra features per row, got "
                             f"{None if extra is None else extra.shape[-1]}")
        x = torch.stack([obs[..., :L], obs[..., L:L + 1].expand(-1, -1, L)], dim=2)     # (S, N, 2, L)
        if extra is not None:
            x = torch.cat([x, extra.unsqueeze(-1).expand(-1, -1, -1, L)], dim=2)       # (S, N, 2 + extra, L)
        p = self.parameters
        h = torch.relu(self._conv(x, p[0], p[1]))
        convs = p[2:2 + 2 * self.layers]
        pools = p[2 + 2 * self.layers:2 + 4 * self.layers] if self.global_pool else None
        for i in range(self.layers):
            x, weight, dilation = circular_operands(h, convs[2 * i], self.dilations[i], self.grid)
            u = self._conv(x, weight, convs[2 * i + 1], dilation)
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

    On the CPU the same operations as the single-seed call (per-tensor `torch._foreach_norm`, the norm of their
    stack, coefficient max_norm / (norm + 1e-6) clamped at 1), so each seed's gradients match a one-seed run's; on a
    GPU the same norm, summed in another order.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    S = grads[0].shape[0]
    if grads[0].device.type == "cpu":
        norms = torch._foreach_norm([g[k] for k in range(S) for g in grads], 2.0)
        P = len(grads)
        total = torch.stack([torch.linalg.vector_norm(torch.stack(norms[k * P:(k + 1) * P]), 2.0) for k in range(S)])
    else:   # no bit-exactness to keep on a GPU: a few kernels instead of S chains of small ones
        total = torch.stack([g.reshape(S, -1).square().sum(1) for g in grads]).sum(0).sqrt()
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

    def _new_state(self, p: torch.Tensor, fused: bool) -> dict:
        state = super()._new_state(p, fused)
        state["step"] = state["step"].expand(p.shape[0]).clone()
        return state

    def _update_tensors(self, p: torch.Tensor, state: dict):
        for k in range(p.shape[0]):
            yield p[k], p.grad[k], state["exp_avg"][k], state["exp_avg_sq"][k], state["step"][k]


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
