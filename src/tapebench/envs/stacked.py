"""The training environments of a seed block stepped as one (docs/protocol.md#seed-blocks).

A block's S seeds each own a `BatchedTapeEnv` of n rows with its own generator. Stepped one by one they cost S
streams of small tensor operations per block step, which is most of a stacked block's time on a GPU (the
environments run on the CPU). `StackedEnvs` keeps every seed's env object and random stream, but moves their state
into one buffer of S x n rows: each env's tensors become views of its n rows, so the CA update, observation and
outcomes of all seeds run as one batch, and a seed's resets still run through its own env (its own generator, in
the order its one-seed run draws). Every operation of a step works row by row (the distance is a sum of 0/1 cells,
exact in any order), so each seed's rows get the bits its env alone would give.

`StackedEnvs.of(envs)` returns None for envs it does not cover (another env class, rule families beyond the
elementary, goals in the observation, per-row goals, no auto-reset); the caller then steps the envs one by one.
"""
from __future__ import annotations

import torch

from tapebench.ca import torch_kernel
from tapebench.envs.batched import BatchedTapeEnv
from tapebench.envs.outcome import step_outcomes


class StackedEnvs:
    """S elementary `BatchedTapeEnv`s of n rows each (same L, H, goal, success bonus, CPU) stepped as one."""

    @classmethod
    def of(cls, envs: list) -> "StackedEnvs | None":
        """The stacked form of `envs`, or None where they cannot share one buffer."""
        first = envs[0] if envs else None
        if first is None or any(type(env) is not BatchedTapeEnv for env in envs):
            return None
        for env in envs:
            if (not env.family.elementary or not env.autoreset or env.goal_in_obs or env.goal_sampler is not None
                    or env._row_goals is not None or env.device.type != "cpu"):
                return None
            if (env.num_envs, env.L, env.H, env.success_bonus) != (first.num_envs, first.L, first.H,
                                                                    first.success_bonus):
                return None
            if not torch.equal(env.goal, first.goal):
                return None
        return cls(envs)

    def __init__(self, envs: list[BatchedTapeEnv]):
        self.envs = envs
        first = envs[0]
        self.S, self.n, self.L, self.H = len(envs), first.num_envs, first.L, first.H
        self.success_bonus = first.success_bonus
        self._goal_sign, self._goal_ones = first._goal_sign, first._goal_ones
        self._noisy = any(env._noisy for env in envs)
        rows = self.S * self.n
        self._padded = torch.cat([env._padded for env in envs])
        self._plane = torch.cat([env._plane for env in envs])
        self._scratch = torch.empty(rows, self.L, dtype=torch.uint8)
        self._row_offsets = torch_kernel.flat_row_offsets(rows, self.L)
        self.rules = torch.cat([env.rules for env in envs])
        self.t = torch.cat([env.t for env in envs])
        for k, env in enumerate(envs):   # from here on each env's state is its rows of the stacked buffers
            own = slice(k * self.n, (k + 1) * self.n)
            env._padded, env._plane, env.rules, env.t = (self._padded[own], self._plane[own], self.rules[own],
                                                         self.t[own])
            env._scratch = self._scratch[own]

    @property
    def tapes(self) -> torch.Tensor:
        return torch_kernel.interior(self._padded)

    def observation(self) -> torch.Tensor:
        """(S, n, L + 1): every seed's `env.observation()`."""
        obs = torch.empty(self.S * self.n, self.L + 1, dtype=torch.float32)
        obs[:, :self.L] = self.tapes
        torch.div(self.t, self.H, out=obs[:, -1])
        return obs.view(self.S, self.n, -1)

    def _check_actions(self, actions) -> torch.Tensor:
        actions = torch.as_tensor(actions)
        if actions.shape != (self.S, self.n):
            raise ValueError(f"actions must have shape ({self.S}, {self.n}), got {tuple(actions.shape)}")
        if actions.dtype.is_floating_point or actions.dtype.is_complex or actions.dtype == torch.bool:
            raise ValueError(f"actions must be integer cell indices in 0..{self.L - 1}, got dtype {actions.dtype}")
        low, high = (int(v) for v in torch.aminmax(actions))
        if low < 0 or high >= self.L:
            raise ValueError(f"actions must be cell indices in 0..{self.L - 1}, got range {low}..{high}")
        return actions.reshape(-1).long()

    def step(self, actions):
        """actions (S, n) -> (obs, reward, terminated, truncated, final_obs), each (S, n, ...): seed k's slice is
        what `envs[k].step(actions[k])` returns (final_obs is its info["final_obs"])."""
        actions = self._check_actions(actions)
        torch_kernel.flip_padded_(self._padded, actions, self._row_offsets)
        torch_kernel.step_padded_(self._padded, self._plane, self._scratch)
        if self._noisy:   # each seed's noise from its own generator, as its env draws it
            flips = torch.cat([(torch.rand(env.num_envs, self.L, generator=env.generator)
                                < env.row_noise.unsqueeze(1)).to(torch.uint8) if env._noisy
                               else torch.zeros(env.num_envs, self.L, dtype=torch.uint8) for env in self.envs])
            self.tapes.bitwise_xor_(flips)
        self.t += 1
        obs = self.observation().view(self.S * self.n, -1)
        mismatches = torch.mv(obs[:, :self.L], self._goal_sign)
        if self._goal_ones:
            mismatches += self._goal_ones
        reward, terminated, truncated = step_outcomes(mismatches.div_(self.L), self.t, self.H, self.success_bonus)
        final_obs = obs
        done = terminated | truncated
        if bool(done.any()):
            obs = obs.clone()
            done_rows = done.view(self.S, self.n)
            for k, env in enumerate(self.envs):
                rows = done_rows[k].nonzero().squeeze(1)
                if rows.numel():
                    env._reset_rows(rows)
            rows = done.nonzero().squeeze(1)
            obs[rows, :self.L] = self.tapes[rows].float()
            obs[rows, -1] = 0.0
        shape = (self.S, self.n)
        return (obs.view(*shape, -1), reward.view(shape), terminated.view(shape), truncated.view(shape),
                final_obs.view(*shape, -1))
