"""The in-context world model (docs/methods/context_mpc.md): a rule table read out of a context of
transitions of any length, with a learned prior where the context is silent.

A rule of the family (k colours, radius r) maps the neighbourhood of every cell (its window of 2r + 1 cells,
index `sum_{j=-r..r} x[i+j] k^(r-j)`, `RuleFamily` numbering) of the post-action tape to the cell's next value.
The model reads a context of transitions (post-action tape s + e_a, next tape s') as a soft table, linear
attention keyed by the window: every cell of every context transition writes its next value (one-hot over the
k colours) under its window's key (one-hot over the k^(2r+1) windows), and the writes are summed over cells and
transitions,

    counts[w, v] = #{(transition, cell): window = w, next value = v}.

A query cell reads the row of its own window. Where the context showed the window, the read dominates; where it
never did, a learned prior fills in: a network (the fallback) maps the window and the whole table (which windows
were shown, the frequency of each next value) to a distribution over the k colours, trained across the training
rules to guess unseen entries from the seen ones. The prediction is the Dirichlet posterior mean with the prior
as base measure and a learned pseudo-count a in (0, 1):

    P(next = v | window w) = (counts[w, v] + a * prior(w, table)[v]) / (sum_v counts[w, v] + a).

By construction:

* the prediction commutes with shifts of the tape (the table pools over cells, a cell reads its own window) and
  does not depend on the order of the context's transitions (the table is a sum);
* on a context that shows a window, its most likely next value is the one the context showed (a < 1 <= counts),
  for every rule, seen in training or not: a context that shows every window pins the rule exactly;
* under cell-update noise the counts become frequencies (the read is the empirical distribution).

Open-loop rollouts (`world_model_rollout`, agent contract) step the tape through the predicted table: the most
likely next value of every cell becomes the next tape. The context stays the prefix's transitions.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tapebench.rule_family import RuleFamily


def windows(tapes: torch.Tensor, k: int, r: int) -> torch.Tensor:
    """(..., L) long window index of every cell (periodic tape): sum_{j=-r..r} x[i+j] k^(r-j)."""
    tapes = tapes.long()
    index = torch.zeros_like(tapes)
    for j in range(-r, r + 1):
        index = index * k + torch.roll(tapes, -j, dims=-1)
    return index


def increment(tapes: torch.Tensor, actions: torch.Tensor, k: int) -> torch.Tensor:
    """(N, L) post-action tapes: cell a_i of row i incremented mod k (a flip for k = 2)."""
    out = tapes.long().clone()
    rows = torch.arange(len(out), device=out.device)
    out[rows, actions.long()] = (out[rows, actions.long()] + 1) % k
    return out


def context_counts(posts: torch.Tensor, nexts: torch.Tensor, k: int, r: int, valid=None) -> torch.Tensor:
    """(N, k^(2r+1), k) float: the soft table of N contexts. posts / nexts (N, T, L) post-action tapes and their
    successors; `valid` (N, T) bool keeps only the transitions it marks (default: all)."""
    return entry_counts(windows(posts, k, r), nexts, k ** (2 * r + 1), k, valid)


def entry_counts(index: torch.Tensor, nexts: torch.Tensor, entries: int, k: int, valid=None) -> torch.Tensor:
    """(N, entries, k) float: the soft table of N contexts keyed by any rule entry. index (N, T, L) long the entry
    each cell of each transition's post-action tape is read at (its window, or on the grid its (state,
    live-neighbour count)), nexts (N, T, L) the cells' next values; `valid` (N, T) bool as `context_counts`."""
    n, T, L = index.shape
    slot = index * k + nexts.long()                                          # (N, T, L)
    weight = torch.ones(slot.shape, dtype=torch.float32, device=index.device)
    if valid is not None:
        weight = weight * valid.to(weight.device).float().unsqueeze(-1)
    counts = torch.zeros(n, entries * k, dtype=torch.float32, device=index.device)
    counts.scatter_add_(1, slot.reshape(n, T * L), weight.reshape(n, T * L))
    return counts.view(n, entries, k)


class ContextModel(nn.Module):
    """The table reader: `log_table(counts) -> (N, E, k)` log-probabilities of every window's next value."""

    def __init__(self, family: RuleFamily, hidden_size: int = 64, hidden_layers: int = 2):
        super().__init__()
        self.k, self.r = family.k, family.r
        self.entries = family.neighbourhoods
        inputs = self.entries + self.entries * (self.k + 1)      # the window, then (shown, frequencies) per window
        layers, width = [], inputs
        for _ in range(hidden_layers):
            layers += [nn.Linear(width, hidden_size), nn.ReLU()]
            width = hidden_size
        layers.append(nn.Linear(width, self.k))
        self.fallback = nn.Sequential(*layers)
        self.raw_pseudo_count = nn.Parameter(torch.zeros(()))
        self.register_buffer("keys", torch.eye(self.entries), persistent=False)

    def pseudo_count(self) -> torch.Tensor:
        """a in (0, 1): the prior's weight against the context's counts."""
        return torch.sigmoid(self.raw_pseudo_count)

    def log_prior(self, counts: torch.Tensor) -> torch.Tensor:
        """(N, E, k) log-probabilities of the learned fallback for every window, given the whole table."""
        n = counts.shape[0]
        total = counts.sum(-1, keepdim=True)
        summary = torch.cat([(total > 0).float(), counts / total.clamp_min(1.0)], dim=-1).reshape(n, 1, -1)
        x = torch.cat([self.keys.expand(n, -1, -1), summary.expand(-1, self.entries, -1)], dim=-1)
        return F.log_softmax(self.fallback(x), dim=-1)

    def log_table(self, counts: torch.Tensor) -> torch.Tensor:
        """(N, E, k) log P(next = v | window w): the context's counts, the learned prior where they are silent."""
        log_a = F.logsigmoid(self.raw_pseudo_count)
        prior = log_a + self.log_prior(counts)
        read = torch.log(counts.clamp_min(0.0)).clamp_min(-1e4)           # log 0 -> a very negative number
        written = torch.logaddexp(read, prior)
        return written - torch.log(counts.sum(-1, keepdim=True) + torch.exp(log_a))

    def table(self, counts: torch.Tensor) -> torch.Tensor:
        return self.log_table(counts).exp()


def cell_probs(table: torch.Tensor, posts: torch.Tensor, k: int, r: int) -> torch.Tensor:
    """(N, L, k): each cell's row of its window in the (N, E, k) table (posts (N, L) post-action tapes)."""
    idx = windows(posts, k, r)
    return table.gather(1, idx.unsqueeze(-1).expand(-1, -1, table.shape[-1]))


def most_likely(table: torch.Tensor) -> torch.Tensor:
    """(N, E) long: every window's most likely next value (ties: the lowest colour)."""
    return table.argmax(-1)


def rollout(model: ContextModel, L: int, obs_prefix: torch.Tensor, action_prefix: torch.Tensor,
            actions: torch.Tensor, repeat: int = 1) -> torch.Tensor:
    """The agent contract's `world_model_rollout` on binary tapes of L cells: (N * repeat, D, L) probability that
    each cell is 1 after each of the D `actions`, open loop through the table the prefix's transitions predict
    (each prefix serves `repeat` consecutive rows of `actions`)."""
    if model.k != 2:
        raise ValueError(f"world_model_rollout returns the probability of a 1 and reads binary tapes; this in-context "
                         f"model has k = {model.k} colours")
    if obs_prefix.dim() != 3 or action_prefix.dim() != 2 or actions.dim() != 2 or obs_prefix.shape[2] < L \
            or action_prefix.shape != (obs_prefix.shape[0], obs_prefix.shape[1] - 1) \
            or actions.shape[0] != obs_prefix.shape[0] * repeat:
        raise ValueError(f"world_model_rollout: obs_prefix (N, C+1, obs_dim), action_prefix (N, C) and actions "
                         f"(N * repeat, D), got {tuple(obs_prefix.shape)}, {tuple(action_prefix.shape)}, "
                         f"{tuple(actions.shape)} (repeat {repeat})")
    device = model.raw_pseudo_count.device
    tapes = obs_prefix[..., :L].to(device).round().long()
    n, steps = tapes.shape[0], tapes.shape[1] - 1
    prefix_actions = action_prefix.to(device).long()
    if steps > 0:
        posts = torch.stack([increment(tapes[:, t], prefix_actions[:, t], 2) for t in range(steps)], dim=1)
        counts = context_counts(posts, tapes[:, 1:], 2, model.r)
    else:
        counts = torch.zeros(n, model.entries, 2, device=device)
    with torch.no_grad():
        table = model.table(counts)
    if repeat != 1:
        table = table.repeat_interleave(repeat, 0)
    current = tapes[:, -1].repeat_interleave(repeat, 0)
    actions = actions.to(device).long()
    out = torch.empty(actions.shape[0], actions.shape[1], L, device=device)
    for d in range(actions.shape[1]):
        probs = cell_probs(table, increment(current, actions[:, d], 2), 2, model.r)
        out[:, d] = probs[..., 1]
        current = probs.argmax(-1)
    return out
