"""Shift-equivariant networks on the circular tape, shared by DQN, PPO, PEARL-DQN and the ensemble MPC's next-tape
model (`network = "equivariant"`).

The CA step commutes with circular shifts of the tape, the goal (all zeros) and the initial tapes are
shift invariant, and an action is a cell: rolling the tape by k moves the best cell by k. A network that
respects this reads every cell with the same weights:

* **input**: two channels per cell, the cell's value and the time feature t/H (the same for every cell); in the
  multi-goal protocol (observations [s, g, t/H], docs/protocol.md#multi-goal) three: the cell, the goal's cell, t/H;
  PEARL-DQN adds its task latent z as `extra` channels, likewise broadcast to every cell; the ensemble MPC's
  next-tape model reads four channels per cell instead (`EquivariantTrunk.cells`: the context transition's two
  tapes, the context flag, the post-action tape);
* **trunk** (`EquivariantTrunk`): a 1x1 convolution to `channels`, then `layers` residual blocks
  h <- h + act(conv_d(h) + W·mean_cells(h)), conv_d a circular convolution of kernel `kernel_size` and
  dilation d = 1, 2, 4, ..., 2^(layers-1); the pooled term (`global_pool`) mixes a summary of the whole tape
  back into every cell, so from the first block on every cell sees the whole tape; the convolutions alone see
  1 + (kernel_size - 1)·(2^layers - 1) cells (63 with the defaults, more than L = 32);
* **heads**: `per_cell_head` (a 1x1 convolution to one channel: Q(s, a) or the policy logit of cell a read from
  cell a's features) and `pooled_head` (a linear map of the mean over cells: PPO's value, shift invariant).

On the 2D family (`EnvSpec.grid` = n: an n x n torus, cells flattened row-major, L = n·n) the same trunk runs its
residual convolutions in 2-D (`CircularConv` with `grid`): kernel `kernel_size` x `kernel_size`, dilation d in both
directions, circular padding on both axes, so the network commutes with every translation (dy, dx) of the torus;
the 1x1 input map, the pooled term and both heads read the flattened cells unchanged (a per-cell logit for every
action a = r·n + c, a value from the mean over all n² cells). The convolutions alone see a square of side
1 + (kernel_size - 1)·(2^layers - 1) (63 with the defaults, more than n = 8). A dilation d reads the same cells as
d mod n, so the grid convolution runs at that effective dilation, and where d is a multiple of n (8 and 16 at n = 8)
every tap reads the cell itself: the 1x1 convolution of the kernel's summed taps (`circular_operands`).

Circular padding is done by `circular_pad` (cells i - p .. L - 1 + p, mod L) rather than `padding_mode="circular"`,
which refuses padding wider than the tape (dilation 16 at L = 8); both are the same map where both work.
Equivariance is exact up to floating-point rounding of the mean (tests/test_equivariant.py: every shift).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

NETWORKS = ("mlp", "equivariant")
# the Config fields of the network choice; an "mlp" run leaves them out of its fingerprint (its fingerprint is
# the plain agent's, and the trunk's fields cannot change an MLP run)
NETWORK_FIELDS = ("network", "conv_channels", "conv_layers", "conv_kernel", "global_pool")
MAX_CONV_LAYERS = 12
# defaults of the trunk's Config fields (the same in every method that offers the network)
CHANNELS, LAYERS, KERNEL, GLOBAL_POOL = 32, 5, 3, True


def check_network(config, method: str) -> None:
    """Fail early on a bad network choice or trunk hyperparameter, naming the value and what is allowed."""
    if config.network not in NETWORKS:
        raise ValueError(f"{method} hyperparameter network must be one of {list(NETWORKS)}, got {config.network!r}")
    if config.conv_channels < 1:
        raise ValueError(f"{method} hyperparameter conv_channels must be >= 1, got {config.conv_channels}")
    if not 1 <= config.conv_layers <= MAX_CONV_LAYERS:
        raise ValueError(f"{method} hyperparameter conv_layers must be in 1..{MAX_CONV_LAYERS}, "
                         f"got {config.conv_layers}")
    if config.conv_kernel < 1 or config.conv_kernel % 2 == 0:
        raise ValueError(f"{method} hyperparameter conv_kernel must be an odd number >= 1, got {config.conv_kernel}")


def fingerprint_hyperparameters(hyperparameters: dict) -> dict:
    """The resolved hyperparameters a run's fingerprint hashes: without the network fields for an MLP."""
    if hyperparameters.get("network", "mlp") != "mlp":
        return hyperparameters
    return {k: v for k, v in hyperparameters.items() if k not in NETWORK_FIELDS}


def receptive_field(layers: int, kernel_size: int) -> int:
    """Cells the stacked dilated convolutions see along each axis (without pooling): 1 + (kernel - 1)·(2^layers - 1);
    on the grid a square of that side."""
    return 1 + (kernel_size - 1) * (2 ** layers - 1)


def circular_pad(x: torch.Tensor, pad: int, dim: int = -1) -> torch.Tensor:
    """Pad dimension `dim` (size L) circularly by `pad` on both sides, e.g. (N, C, L) -> (N, C, L + 2·pad): cells
    L - pad .. L - 1, the tape, cells 0 .. pad - 1 (indices mod L).

    Contiguous copies (a concatenation, or a tiling when pad > L): about twice as fast as a gather on the last
    dimension, which dominated the forward pass.
    """
    L = x.shape[dim]
    if pad <= L:
        return torch.cat([x.narrow(dim, L - pad, pad), x, x.narrow(dim, 0, pad)], dim=dim)
    reps = -(-pad // L)
    repeats = [1] * x.dim()
    repeats[dim] = 2 * reps + 1
    return x.repeat(*repeats).narrow(dim, reps * L - pad, L + 2 * pad)


def circular_operands(x: torch.Tensor, weight: torch.Tensor, dilation: int, grid: int | None):
    """(input, weight, dilation) of the plain convolution (no padding; `conv_of(input)`: 1-D or 2-D by the input's
    rank) that computes the circular convolution of `weight` over cells x (..., C, L); its output cells, flattened
    from dimension 2 on (`.flatten(2)`), are (N, C', L) again. A leading seed dimension on `weight` is carried through.

    On the tape: x circularly padded by d·(k - 1)/2 (k the kernel size, d the dilation), the weight and dilation as
    they are. On the n x n torus (`grid` = n, cells row-major): x as (..., C, n, n) padded circularly on both axes
    by the effective dilation d mod n (the taps d·j and (d mod n)·j are the same cells mod n, and the padded layout
    grows as (n + d·(k - 1))²: 40 x 40 for d = 16 at n = 8); where d is a multiple of n every tap reads the cell
    itself and the convolution is the 1x1 convolution with the kernel's summed taps.
    """
    kernel_size = weight.shape[-1]
    if grid is None:
        pad = dilation * (kernel_size - 1) // 2
        return (circular_pad(x, pad) if pad else x), weight, dilation
    effective = dilation % grid
    if effective == 0:
        return x, weight.sum(dim=(-2, -1)).unsqueeze(-1), 1
    pad = effective * (kernel_size - 1) // 2
    x = x.unflatten(-1, (grid, grid))
    return (circular_pad(circular_pad(x, pad, -2), pad, -1) if pad else x), weight, effective


def conv_of(x: torch.Tensor):
    """`F.conv1d` for an input (N, C, L), `F.conv2d` for (N, C, H, W)."""
    return F.conv1d if x.dim() == 3 else F.conv2d


class CircularConv(nn.Module):
    """A circular convolution over the cells (N, C, L) -> (N, C', L). On the tape (`grid` None) output cell i reads
    cells i + d·j (mod L), |j| <= kernel // 2 (an `nn.Conv1d`'s weight); on the n x n torus (`grid` = n, L = n·n
    row-major) output cell (r, s) reads cells (r + d·j, s + d·j') (mod n), |j|, |j'| <= kernel // 2 (an `nn.Conv2d`'s
    kernel x kernel weight). Computed by `circular_operands`."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int,
                 grid: int | None = None):
        super().__init__()
        self.dilation, self.grid = dilation, grid
        conv = nn.Conv1d if grid is None else nn.Conv2d
        self.conv = conv(in_channels, out_channels, kernel_size, dilation=dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, weight, dilation = circular_operands(x, self.conv.weight, self.dilation, self.grid)
        return conv_of(x)(x, weight, self.conv.bias, dilation=dilation).flatten(2)


class EquivariantTrunk(nn.Module):
    """Observations (N, L+1) [+ per-row features (N, extra)] -> cell features (N, channels, L).

    Rolling the tape (and the goal) by k rolls the output along the cells by k; t/H and `extra` are per row. With
    `goal` the observations are (N, 2L+1) [s, g, t/H] and the goal's cells are a channel of their own. `cells` is the
    same trunk on per-cell inputs a caller builds itself (N, in_channels, L): the ensemble MPC's next-tape model
    feeds it the context transition and the post-action tape (`in_channels` then replaces 2 + extra).

    `grid` = n: the cells are an n x n torus flattened row-major (L = n·n): the convolutions are 2-D (`CircularConv`),
    so rolling the grid by (dy, dx) rolls the output features the same way; everything else (the 1x1 input map, the
    pooled term, the heads) reads the flattened cells as on the tape.
    """

    def __init__(self, L: int, channels: int, layers: int, kernel_size: int = 3, global_pool: bool = True,
                 extra: int = 0, activation: type[nn.Module] = nn.ReLU, in_channels: int | None = None,
                 goal: bool = False, grid: int | None = None):
        super().__init__()
        if grid is not None and grid * grid != L:
            raise ValueError(f"an equivariant trunk on an n x n grid needs L = n * n cells, got L = {L} for n = {grid}")
        self.L, self.extra, self.global_pool, self.goal, self.grid = L, extra, global_pool, bool(goal), grid
        own = 3 if self.goal else 2
        self.inp = nn.Conv1d(own + extra if in_channels is None else in_channels, channels, 1)
        self.convs = nn.ModuleList(CircularConv(channels, channels, kernel_size, 2 ** i, grid) for i in range(layers))
        self.pools = nn.ModuleList(nn.Linear(channels, channels) for _ in range(layers)) if global_pool else None
        self.act = activation()

    def observation_channels(self, obs: torch.Tensor) -> torch.Tensor:
        """(..., obs_dim) observations -> (..., 2 or 3, L) per-cell channels: the cell, [the goal's cell,] t/H."""
        L = self.L
        channels = [obs[..., :L]] + ([obs[..., L:2 * L]] if self.goal else []) \
            + [obs[..., -1:].expand(*obs.shape[:-1], L)]
        return torch.stack(channels, dim=-2)

    def forward(self, obs: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        L = self.L
        x = self.observation_channels(obs)
        if self.extra:
            x = torch.cat([x, extra.unsqueeze(-1).expand(-1, -1, L)], dim=1)
        return self.cells(x)

    def cells(self, x: torch.Tensor) -> torch.Tensor:
        """(N, in_channels, L) per-cell inputs -> (N, channels, L) cell features."""
        h = self.act(self.inp(x))
        for i, conv in enumerate(self.convs):
            u = conv(h)
            if self.global_pool:
                u = u + self.pools[i](h.mean(dim=-1)).unsqueeze(-1)
            h = h + self.act(u)
        return h


class PerCellNetwork(nn.Module):
    """Trunk + per-cell head: (N, L+1) [, (N, extra)] -> (N, L), output a read from cell a's features only."""

    def __init__(self, trunk: EquivariantTrunk, channels: int):
        super().__init__()
        self.trunk = trunk
        self.head = nn.Conv1d(channels, 1, 1)

    def forward(self, obs: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.trunk(obs, extra)).squeeze(1)

    def cells(self, x: torch.Tensor) -> torch.Tensor:
        """(N, in_channels, L) per-cell inputs -> (N, L): output i read from cell i's features only."""
        return self.head(self.trunk.cells(x)).squeeze(1)


class PooledNetwork(nn.Module):
    """Trunk + pooled head: (N, L+1) -> (N, 1), a linear map of the mean over cells (shift invariant)."""

    def __init__(self, trunk: EquivariantTrunk, channels: int):
        super().__init__()
        self.trunk = trunk
        self.head = nn.Linear(channels, 1)

    def forward(self, obs: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.trunk(obs, extra).mean(dim=-1))


def trunk(config, env_spec, extra: int = 0, activation: type[nn.Module] = nn.ReLU,
          in_channels: int | None = None) -> EquivariantTrunk:
    """The trunk a Config with the network fields asks for (its actions must be the cells)."""
    if env_spec.num_actions != env_spec.L:
        raise ValueError(f"the equivariant network needs one action per cell, got {env_spec.num_actions} actions "
                         f"for L = {env_spec.L}")
    seen = receptive_field(config.conv_layers, config.conv_kernel)
    grid = env_spec.grid
    if not config.global_pool and seen < (env_spec.L if grid is None else grid):
        extent = (f"the tape's L = {env_spec.L}" if grid is None else
                  f"the grid's side n = {grid} (it sees {seen} x {seen} cells)")
        raise ValueError(f"the equivariant network without global_pool sees {seen} cells along each axis "
                         f"(conv_layers = {config.conv_layers}, conv_kernel = {config.conv_kernel}), fewer than "
                         f"{extent}: raise conv_layers or set global_pool = true")
    return EquivariantTrunk(env_spec.L, config.conv_channels, config.conv_layers, config.conv_kernel,
                            config.global_pool, extra=extra, activation=activation, in_channels=in_channels,
                            goal=env_spec.goal_in_obs, grid=grid)


def per_cell_network(config, env_spec, extra: int = 0, activation: type[nn.Module] = nn.ReLU,
                     in_channels: int | None = None) -> PerCellNetwork:
    return PerCellNetwork(trunk(config, env_spec, extra, activation, in_channels), config.conv_channels)


def pooled_network(config, env_spec, extra: int = 0, activation: type[nn.Module] = nn.ReLU,
                   in_channels: int | None = None) -> PooledNetwork:
    return PooledNetwork(trunk(config, env_spec, extra, activation, in_channels), config.conv_channels)
