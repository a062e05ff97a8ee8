"""Batched torch environment: N tapes stepped together, a rule per row, auto-reset (SPEC §1).

This is what training and evaluation use. Semantics match `TapeEnv` step for step (tested).
Auto-reset is same-step: the returned observation of a finished row is already the next
episode's first observation; the finished episode's last observation is in info["final_obs"].
"""
from __future__ import annotations

import numpy as np
import torch

from ..ca import torch_kernel
from ..validation import check_goal, check_horizon, check_length, check_rules


class BatchedTapeEnv:
    def __init__(self, num_envs: int, L: int = 32, H: int = 32, rules=(30,), goal=None,
                 success_bonus: float = 1.0, device: str | torch.device = "cpu", seed: int = 0,
                 autoreset: bool = True):
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs = int(num_envs)
        self.L = check_length(L)
        self.H = check_horizon(H)
        self.device = torch.device(device)
        self.rule_set = torch.tensor(check_rules(rules), dtype=torch.uint8, device=self.device)
        self.goal = torch.as_tensor(check_goal(goal, self.L), device=self.device)
        self.success_bonus = float(success_bonus)
        self.autoreset = autoreset
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(int(seed))
        self.tapes = torch.zeros(self.num_envs, self.L, dtype=torch.uint8, device=self.device)
        self.rules = torch.zeros(self.num_envs, dtype=torch.uint8, device=self.device)
        self.t = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        self._rows = torch.arange(self.num_envs, device=self.device)

    # --- state -----------------------------------------------------------------------------
    def observation(self) -> torch.Tensor:
        return torch.cat([self.tapes.float(), (self.t.float() / self.H).unsqueeze(1)], dim=1)

    def distance(self) -> torch.Tensor:
        return (self.tapes != self.goal).sum(dim=1).float() / self.L

    def _draw_tapes(self, n: int) -> torch.Tensor:
        goal_cpu = self.goal.cpu()
        tapes = torch.randint(0, 2, (n, self.L), generator=self.generator, dtype=torch.uint8)
        same = (tapes == goal_cpu).all(dim=1)
        while same.any():
            tapes[same] = torch.randint(0, 2, (int(same.sum()), self.L), generator=self.generator,
                                        dtype=torch.uint8)
            same = (tapes == goal_cpu).all(dim=1)
        return tapes.to(self.device)

    def _draw_rules(self, n: int) -> torch.Tensor:
        idx = torch.randint(0, len(self.rule_set), (n,), generator=self.generator)
        return self.rule_set[idx.to(self.device)]

    def _reset_rows(self, mask: torch.Tensor) -> None:
        n = int(mask.sum())
        if n:
            self.tapes[mask] = self._draw_tapes(n)
            self.rules[mask] = self._draw_rules(n)
            self.t[mask] = 0

    def reset(self, seed: int | None = None) -> torch.Tensor:
        if seed is not None:
            self.generator.manual_seed(int(seed))
        self._reset_rows(torch.ones(self.num_envs, dtype=torch.bool, device=self.device))
        return self.observation()

    def load(self, tapes, rules) -> torch.Tensor:
        """Start episodes from explicit initial tapes (N, L) and rules (N,): evaluation uses this."""
        tapes = torch.as_tensor(np.asarray(tapes), dtype=torch.uint8, device=self.device)
        rules = torch.as_tensor(np.asarray(check_rules(list(np.asarray(rules).tolist()))),
                                dtype=torch.uint8, device=self.device)
        if tapes.shape != (self.num_envs, self.L) or rules.shape != (self.num_envs,):
            raise ValueError(f"load expects tapes {(self.num_envs, self.L)} and rules ({self.num_envs},), "
                             f"got {tuple(tapes.shape)} and {tuple(rules.shape)}")
        self.tapes, self.rules = tapes.clone(), rules.clone()
        self.t.zero_()
        return self.observation()

    # --- dynamics --------------------------------------------------------------------------
    def step(self, actions: torch.Tensor):
        actions = torch.as_tensor(actions, device=self.device).long()
        if actions.shape != (self.num_envs,):
            raise ValueError(f"actions must have shape ({self.num_envs},), got {tuple(actions.shape)}")
        if actions.numel() and (int(actions.min()) < 0 or int(actions.max()) >= self.L):
            raise ValueError(f"actions must be cell indices in 0..{self.L - 1}, "
                             f"got range {int(actions.min())}..{int(actions.max())}")
        self.tapes[self._rows, actions] ^= 1
        self.tapes = torch_kernel.ca_step(self.tapes, self.rules)
        self.t += 1
        dist = self.distance()
        terminated = dist == 0
        truncated = ~terminated & (self.t >= self.H)
        reward = -dist + self.success_bonus * terminated.float()
        info = {"dist": dist, "rule": self.rules.clone(), "t": self.t.clone()}
        done = terminated | truncated
        if self.autoreset:
            info["final_obs"] = self.observation()
            self._reset_rows(done)
        return self.observation(), reward, terminated, truncated, info
