"""Batched torch kernel: (N, L) uint8 tapes on CPU or CUDA, a different rule per row."""
from __future__ import annotations

import torch


def ca_step(tapes: torch.Tensor, rules: torch.Tensor) -> torch.Tensor:
    """One CA update of each row under its own rule. tapes: (N, L) uint8 in {0,1}; rules: (N,)."""
    left = torch.roll(tapes, shifts=1, dims=1)     # x[i-1]
    right = torch.roll(tapes, shifts=-1, dims=1)   # x[i+1]
    idx = (left << 2) | (tapes << 1) | right
    return (rules.to(torch.uint8).unsqueeze(1) >> idx) & 1


def flip(tapes: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Flip cell actions[n] of row n (returns a new tensor)."""
    out = tapes.clone()
    rows = torch.arange(tapes.shape[0], device=tapes.device)
    out[rows, actions] ^= 1
    return out


def transition(tapes: torch.Tensor, actions: torch.Tensor, rules: torch.Tensor) -> torch.Tensor:
    return ca_step(flip(tapes, actions), rules)
