"""Seed blocks of world-model methods: S seeds' `world_model.WorldModelLearner` (RSSM, heads, sequence replay,
losses) trained as one stacked model, shared by DreamerV3 (`dreamer_block.py`) and PlaNet-MPC (`planet.py`).

The seed-block contract (`training/blocks.py`): every parameter is held with a leading seed dimension S and every
layer is a batched product (`torch.baddbmm`; the GRU cell written out with stacked weights; layer norms per seed
through `addcmul`, bit for bit what `nn.LayerNorm` computes). The replay is one stacked ring (S, rows, capacity,
...); the one-seed agents' replay fields are views of it, so it is not held twice. Seed k draws every random number
(replay chunks, latent samples) from its own generator, in the order and shapes its one-seed agent draws them from
torch's global generator. Per-seed losses are summed over seeds for one backward pass; gradient-norm clipping is per
seed; one `stacked.SeedAdam` per optimiser (each seed's slices stepped as tensors of their own).

The computation is the one-seed learner's (`world_model.py`) rewritten over stacked tensors, not shared code: a
change to the one-seed world model must be made here too; `tests/test_seed_blocks_dreamer.py` compares the two on
every update and checkpoint. On a CUDA device the random numbers are drawn on the CPU from the seeds' generators and
moved (a one-seed CUDA run draws from the CUDA generator instead).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tapebench.methods.contract import BlockUnsupported
from tapebench.methods.stacked import SeedAdam, clip_grad_norm_per_seed_, export_adam_state, import_adam_state
from tapebench.methods.world_model import (REWARD_GRID, WorldModelLearner, class_major_logprobs, class_major_probs,
                                           kl_loss, to_class_major, to_group_major, unimix_logits)

# seeds per group of the world-model update's forward and backward passes (cache-sized working sets; the unroll is
# latency-bound and gains from more seeds at once)
WORLD_MODEL_GROUP = 10


def _attr(obj, dotted: str):
    for name in dotted.split("."):
        obj = getattr(obj, name)
    return obj


class _Slice:
    """The seeds `group` (a slice) of a `StackedParams` (views: gradients reach the stacked tensors)."""

    def __init__(self, params: "StackedParams", group: slice):
        self.params, self.group = params, group

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.params[name][self.group]


class StackedParams:
    """name -> (S, ...) tensor for one network of S agents (names as in the one-seed module)."""

    def __init__(self, modules, trainable: bool):
        self.names = [n for n, _ in modules[0].named_parameters()]
        self.p = {}
        for name in self.names:
            t = torch.stack([dict(m.named_parameters())[name].detach() for m in modules]).clone()
            self.p[name] = t.requires_grad_(trainable)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.p[name]

    def tensors(self) -> list:
        return [self.p[n] for n in self.names]


def rows(v: torch.Tensor, n: int) -> torch.Tensor:
    """v (S, H) repeated over n rows (S, n, H) by a product with ones: its backward, a sum over the rows, is then a
    matrix product too, whose result does not change with zero-gradient padding rows (a sum reduction's does)."""
    return torch.bmm(v.new_ones(v.shape[0], n, 1), v.unsqueeze(1))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, padded: bool = False) -> torch.Tensor:
    """Per seed x @ weight.T + bias: x (S, ..., in), weight (S, out, in), bias (S, out) -> (S, ..., out).
    `padded`: x holds padding rows (their gradients zero) whose number depends on the other seeds."""
    S = x.shape[0]
    x3 = x.reshape(S, -1, x.shape[-1])
    out = torch.baddbmm(rows(bias, x3.shape[1]) if padded else bias.unsqueeze(1), x3, weight.transpose(1, 2))
    return out.reshape(*x.shape[:-1], weight.shape[1])


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, padded: bool = False) -> torch.Tensor:
    """Per-seed LayerNorm (eps 1e-5) of x (S, ..., H) with weight, bias (S, H) (`padded` as in `linear`)."""
    if padded:
        x3 = x.reshape(x.shape[0], -1, x.shape[-1])
        n = x3.shape[1]
        return torch.addcmul(rows(bias, n), F.layer_norm(x3, x.shape[-1:]), rows(weight, n)).reshape(x.shape)
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
    return torch.addcmul(bias.reshape(shape), F.layer_norm(x, x.shape[-1:]), weight.reshape(shape))


def mlp(P, prefix: str, x: torch.Tensor, padded: bool = False) -> torch.Tensor:
    """`world_model.mlp` (Linear -> LayerNorm -> SiLU -> Linear) with stacked weights; prefix '' for a bare mlp."""
    x = linear(x, P[prefix + "0.weight"], P[prefix + "0.bias"], padded)
    x = F.silu(layer_norm(x, P[prefix + "1.weight"], P[prefix + "1.bias"], padded))
    return linear(x, P[prefix + "3.weight"], P[prefix + "3.bias"], padded)


def gru_cell(x, h, w_ih, w_hh, b_ih, b_hh):
    """`nn.GRUCell` with stacked weights (torch's CPU formula): x (S, N, in), h (S, N, D); w_ih, w_hh transposed
    (S, in, 3D)."""
    return gru_gates(torch.baddbmm(b_ih.unsqueeze(1), x, w_ih), torch.baddbmm(b_hh.unsqueeze(1), h, w_hh), h)


def gru_gates(gi, gh, h):
    """The GRU cell from its input and hidden products (biases included)."""
    i_r, i_z, i_n = gi.chunk(3, -1)
    h_r, h_z, h_n = gh.chunk(3, -1)
    reset = (i_r + h_r).sigmoid()
    update = (i_z + h_z).sigmoid()
    new = (i_n + h_n * reset).tanh()
    return (h - new) * update + new


def sample_index(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """`world_model.sample_index` with given uniforms (probs.shape[:-1] + (1,))."""
    return (uniform > probs.cumsum(-1)).sum(-1).clamp(max=probs.shape[-1] - 1)


def class_major_sample(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """`world_model.class_major_sample` over (..., K, G) with uniforms (..., 1, G)."""
    index = (uniform > probs[..., :-1, :].cumsum(-2)).sum(-2, keepdim=True)
    return torch.zeros_like(probs).scatter_(-2, index, 1.0)


class DeferredWeightGrad:
    """Per-step products x_t @ W of an unroll whose weight gradient is one product after the backward pass.

    Autograd would compute sum_t x_t^T g_t as one small product per step (a few rows each); here the steps'
    inputs and output gradients are concatenated and multiplied once (`backward`), then passed on to W."""

    def __init__(self, weight: torch.Tensor):
        self.weight, self.detached = weight, weight.detach()
        self.inputs, self.grads = [], []

    def __call__(self, bias: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        y = torch.baddbmm(bias, x, self.detached)
        if y.requires_grad and self.weight.requires_grad:
            self.inputs.append(x.detach())
            self.grads.append(None)
            y.register_hook(lambda g, i=len(self.grads) - 1: self.grads.__setitem__(i, g))
        return y

    def gradient(self):
        pairs = [(x, g) for x, g in zip(self.inputs, self.grads) if g is not None]
        if not pairs:
            return None
        x, g = torch.cat([x for x, _ in pairs], 1), torch.cat([g for _, g in pairs], 1)
        return torch.bmm(x.transpose(1, 2), g)

    @staticmethod
    def backward(deferred: list) -> None:
        """After the loss's backward pass: the deferred weights' gradients on to the parameters."""
        pairs = [(d.weight, d.gradient()) for d in deferred]
        pairs = [(w, g) for w, g in pairs if g is not None]
        if pairs:
            torch.autograd.backward([w for w, _ in pairs], [g for _, g in pairs])


class WorldModelBlock:
    """S seeds' world models as one stacked model: what every world-model method's block shares (stacking, the
    RSSM over stacked tensors, the replay, the world-model update, a seed's state in and out). A subclass names its
    agent type, the networks it stacks (`NETS`, "model" first; `FROZEN_NETS` get no gradients) and their optimisers
    (`OPTIMISERS`: name -> the one-seed agent's attribute path), and adds acting and the rest of its update."""

    label = "world-model"
    agent_type: type = object
    NETS: tuple = ("model",)
    FROZEN_NETS: tuple = ()
    OPTIMISERS: dict = {"model": "learner.optimizer"}

    def __init__(self, agents: list, generators: list):
        if not agents or len(agents) != len(generators):
            raise ValueError(f"a {self.label} block needs one generator per agent, got {len(agents)} agents and "
                             f"{len(generators)} generators")
        if not all(isinstance(a, self.agent_type) for a in agents):
            raise TypeError(f"make_block of {self.label} stacks {self.agent_type.__name__} objects only")
        if agents[0].model.goal_size:
            raise BlockUnsupported(f"the stacked {self.label} model has no goal-conditioned heads (the multi-goal "
                                   f"protocol's [h, z, g]): its seeds train one after another")
        first = agents[0]
        self.config, self.device, self.generators = first.config, first.device, list(generators)
        self.S, self.num_actions = len(agents), first.num_actions
        model = first.model
        self.L, self.G, self.K = model.L, model.groups, model.classes
        self.D, self.Z = model.deter_size, model.stoch_size
        self.order = model.class_major_order
        self.nets = {name: StackedParams([getattr(a, name) for a in agents], trainable=name not in self.FROZEN_NETS)
                     for name in self.NETS}
        self.optimizers = {name: SeedAdam(self.nets[name].tensors(), lr=_attr(first, path).param_groups[0]["lr"],
                                          eps=_attr(first, path).param_groups[0]["eps"])
                           for name, path in self.OPTIMISERS.items()}
        replay = first.learner.replay
        self.rows, self.capacity = replay.rows, replay.capacity
        # filled by import_seed below; the one-seed replays become views of the stacked one (held once)
        self.replay = {name: torch.zeros((self.S,) + getattr(replay, name).shape, dtype=getattr(replay, name).dtype,
                                         device=self.device) for name in replay.FIELDS}
        self.row_first = torch.stack([a.learner.replay.row_first for a in agents])
        self.position, self.size = replay.position, replay.size
        self.env_steps, self.next_update, self.updates = (first.learner.env_steps, first.learner.next_update,
                                                          first.learner.updates)
        self.stack_agent_state(agents)
        self.group = slice(0, self.S)   # the seeds the compute helpers work on (all but inside update())
        self._fresh = True
        for k, a in enumerate(agents):
            self.import_seed(k, a)
        self._fresh = False

    def stack_agent_state(self, agents: list) -> None:
        """A subclass's stacked per-seed state beside the networks and the replay (before the seeds are imported)."""

    # --- random draws: seed k's from generators[k], stacked ------------------------------------
    def _rand(self, *shapes, size: int | None = None) -> torch.Tensor:
        """torch.rand(shapes[k]) from each seed's generator, stacked; with `size`, each padded with 2.0 to that
        length in the first dimension (shapes that differ there)."""
        draws = [torch.rand(shape, generator=g) for shape, g in zip(shapes, self.generators[self.group])]
        if size is not None:
            draws = [torch.cat([d, torch.full((size - len(d),) + d.shape[1:], 2.0)]) for d in draws]
        return torch.stack(draws).to(self.device)

    def _rand_same(self, *shape) -> torch.Tensor:
        return self._rand(*([shape] * len(self.generators[self.group])))

    def _net(self, name: str) -> _Slice:
        return _Slice(self.nets[name], self.group)

    # --- the RSSM over stacked tensors -------------------------------------------------------------
    def _latent(self, raw: torch.Tensor) -> torch.Tensor:
        return unimix_logits(raw.reshape(*raw.shape[:-1], self.G, self.K), self.config.unimix)

    def _posterior(self, h, embed, padded=False):
        return self._latent(mlp(self._net("model"), "post_net.", torch.cat([h, embed], dim=-1), padded))

    def _prior(self, h, padded=False):
        return self._latent(mlp(self._net("model"), "prior_net.", h, padded))

    def _gru(self, x, h, transposed=None):
        P = self._net("model")
        w_ih, w_hh = transposed if transposed is not None else (P["gru.weight_ih"].transpose(1, 2),
                                                                P["gru.weight_hh"].transpose(1, 2))
        return gru_cell(x, h, w_ih, w_hh, P["gru.bias_ih"], P["gru.bias_hh"])

    def _ln_silu(self, x, name):
        P = self._net("model")
        return F.silu(layer_norm(x, P[name + ".weight"], P[name + ".bias"]))

    def _transition(self, h, z, actions):
        P = self._net("model")
        onehot = F.one_hot(actions, self.num_actions).to(h.dtype)
        x = linear(torch.cat([z, onehot], dim=-1), P["img_in.0.weight"], P["img_in.0.bias"])
        return self._gru(self._ln_silu(x, "img_in.1"), h)

    def _unroll_weights(self) -> dict:
        """`RSSM.unroll_weights` stacked, the per-step products' weights transposed: (S, in, out)."""
        P, Z, D, order = self._net("model"), self.Z, self.D, self.order
        img, post, prior = P["img_in.0.weight"], P["post_net.0.weight"], P["prior_net.3.weight"]
        return {"img_zT": img[:, :, :Z][:, :, order].transpose(1, 2).contiguous(),
                "img_a": img[:, :, Z:], "img_b": P["img_in.0.bias"],
                "post_hT": post[:, :, :D].transpose(1, 2).contiguous(), "post_e": post[:, :, D:],
                "post_b": P["post_net.0.bias"],
                "post_outT": P["post_net.3.weight"][:, order].transpose(1, 2).contiguous(),
                "post_out_b": P["post_net.3.bias"][:, order],
                "prior_out": prior[:, order], "prior_out_b": P["prior_net.3.bias"][:, order],
                "gru": (P["gru.weight_ih"].transpose(1, 2).contiguous(),
                        P["gru.weight_hh"].transpose(1, 2).contiguous())}

    def _prior_raw(self, w, h):
        P = self._net("model")
        x = self._ln_silu(linear(h, P["prior_net.0.weight"], P["prior_net.0.bias"]), "prior_net.1")
        return linear(x, w["prior_out"], w["prior_out_b"])

    def _action_inputs(self, w, actions):
        return linear(F.one_hot(actions, self.num_actions).to(w["img_a"].dtype), w["img_a"], w["img_b"])

    due = WorldModelLearner.due   # updates due after the latest environment steps (advances the schedule)

    def _store(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        """Every seed's transitions into its replay rows (`SequenceReplay.add`), and the step count."""
        p, r = self.position, self.replay
        r["obs"][:, :, p], r["next_obs"][:, :, p], r["actions"][:, :, p] = obs, next_obs, actions
        r["rewards"][:, :, p], r["terminated"][:, :, p], r["first"][:, :, p] = rewards, terminated, self.row_first
        self.row_first = (terminated | truncated).to(self.device)
        self.position = (p + 1) % self.capacity
        self.size = min(self.capacity, self.size + 1)
        self.env_steps += actions.shape[1]

    def _groups(self, size: int) -> list:
        """Consecutive groups of `size` seeds; none of one seed in a block of several (a trailing one joins the
        group before): torch runs a batched product of one matrix through other kernels, which round differently."""
        bounds = list(range(0, self.S, max(size, 2))) + [self.S]
        if len(bounds) > 2 and bounds[-1] - bounds[-2] == 1:
            del bounds[-2]
        return [slice(lo, hi) for lo, hi in zip(bounds, bounds[1:])]

    def _sample_chunks(self) -> dict:
        B, T = self.config.batch_size, self.config.sequence_length
        rows, starts = [], []
        for g in self.generators[self.group]:
            rows.append(torch.randint(0, self.rows, (B,), generator=g))
            starts.append(torch.randint(0, self.size - T + 1, (B,), generator=g))
        rows, starts = torch.stack(rows), torch.stack(starts)                        # (S, B)
        oldest = (self.position - self.size) % self.capacity
        slots = (oldest + starts.unsqueeze(-1) + torch.arange(T)) % self.capacity   # (S, B, T)
        seeds = torch.arange(self.S)[self.group].reshape(-1, 1, 1)
        index = (seeds.to(self.device), rows.unsqueeze(-1).to(self.device), slots.to(self.device))
        return {name: field[index] for name, field in self.replay.items()}

    def _world_model_update(self):
        """One world-model step of every seed; the forward and backward passes run in groups of seeds."""
        c, opt = self.config, self.optimizers["model"]
        metrics, states = [], []
        opt.zero_grad()
        try:
            for group in self._groups(WORLD_MODEL_GROUP):
                self.group = group
                loss, group_metrics, group_states, deferred = self._observe_chunk(self._sample_chunks())
                loss.sum().backward()     # per-seed losses summed: each seed's gradient is its own loss's
                DeferredWeightGrad.backward(deferred)
                metrics += group_metrics
                states.append(group_states)
        finally:
            self.group = slice(0, self.S)
        clip_grad_norm_per_seed_(self.nets["model"].tensors(), c.model_grad_clip)
        opt.step()
        self.updates += 1
        return metrics, states

    def _observe_chunk(self, chunk):
        """`world_model.observe_chunk` per seed: (losses (S,), per-seed metric dicts, states, the unroll's
        deferred weight gradients: `DeferredWeightGrad.backward` after the loss's backward pass)."""
        c, P = self.config, self._net("model")
        obs, next_obs, actions = chunk["obs"], chunk["next_obs"], chunk["actions"]
        S, B, T = actions.shape
        G, K, D, dev = self.G, self.K, self.D, self.device
        w = self._unroll_weights()
        embed = mlp(P, "encoder.", next_obs.transpose(1, 2))                     # (S, T, B, H)
        post_in = linear(embed, w["post_e"], w["post_b"])
        action_in = self._action_inputs(w, actions.transpose(1, 2))              # (S, T, B, H)
        uniform = self._rand_same(T, B, 1, G)                                     # (S, T, B, 1, G)
        starts = chunk["first"].clone()
        starts[:, :, 0] = True
        flat_starts = starts.reshape(S, B * T)
        counts = flat_starts.sum(1)
        M = int(counts.max())
        # each seed's start slots in row-major order of (b, t), padded to M (the start branch's products and
        # sums are padding-invariant: `padded`, the sequential start-loss sum)
        pick = torch.argsort((~flat_starts).to(torch.int8), dim=1, stable=True)[:, :M]
        valid = torch.arange(M, device=dev) < counts.unsqueeze(1)                 # (S, M)
        start_obs = obs.reshape(S, B * T, -1).gather(1, pick.unsqueeze(-1).expand(-1, -1, obs.shape[-1]))
        h0 = torch.zeros(S, M, D, device=dev)
        start_post = self._posterior(h0, mlp(P, "encoder.", start_obs, True), True)          # (S, M, G, K)
        start_probs = start_post.exp()
        start_uniform = self._rand(*[(int(n), G, 1) for n in counts.tolist()], size=M)   # (S, M, G, 1)
        start_sample = F.one_hot(sample_index(start_probs.detach(), start_uniform), K).to(start_probs.dtype)
        start_z = (start_sample + start_probs - start_probs.detach()).reshape(S, M, G * K)
        slot = (flat_starts.long().cumsum(1) - 1).reshape(S, B, T)
        seeds = torch.arange(S, device=dev).reshape(S, 1, 1)
        start_z_t = to_class_major(start_z, G, K)[seeds, slot]                    # (S, B, T, K*G)
        starts_t = starts.permute(2, 0, 1).unsqueeze(-1)                          # (T, S, B, 1)
        post_in, action_in = post_in.unbind(1), action_in.unbind(1)
        start_z_t = start_z_t.unbind(2)
        uniform = uniform.unbind(1)
        deferred = [DeferredWeightGrad(x) for x in (w["img_zT"], *w["gru"], w["post_hT"], w["post_outT"])]
        img_z, gru_ih, gru_hh, post_h, post_out = deferred
        b_ih, b_hh = P["gru.bias_ih"].unsqueeze(1), P["gru.bias_hh"].unsqueeze(1)
        post_out_b = w["post_out_b"].unsqueeze(1)
        hs, raws, zs = [], [], []
        h, z = torch.zeros(S, B, D, device=dev), start_z_t[0]
        for t in range(T):
            if t > 0:   # at every step (not only where a seed restarts): the same graph whatever the neighbours
                h = h.masked_fill(starts_t[t], 0.0)
                z = torch.where(starts_t[t], start_z_t[t], z)
            x = self._ln_silu(img_z(action_in[t], z), "img_in.1")
            h = gru_gates(gru_ih(b_ih, x), gru_hh(b_hh, h), h)
            raw = post_out(post_out_b, self._ln_silu(post_h(post_in[t], h), "post_net.1"))
            probs = class_major_probs(raw, K, c.unimix)                          # (S, B, K, G)
            sample = class_major_sample(probs.detach(), uniform[t])
            z = (sample + (probs - probs.detach())).reshape(S, B, K * G)
            hs.append(h)
            raws.append(raw)
            zs.append(z)
        h, z = torch.stack(hs, 2), to_group_major(torch.stack(zs, 2), G, K)      # (S, B, T, ...)
        post = class_major_logprobs(torch.stack(raws, 2), K, c.unimix)
        prior = class_major_logprobs(self._prior_raw(w, h), K, c.unimix)
        feat = torch.cat([h, z], dim=-1)
        tape = next_obs[..., :self.L]
        decoder_logits = mlp(P, "decoder.", feat)
        decoder_nll = F.binary_cross_entropy_with_logits(decoder_logits, tape, reduction="none").sum(-1)
        reward_nll = REWARD_GRID.loss(mlp(P, "reward_head.", feat), chunk["rewards"])
        cont_nll = F.binary_cross_entropy_with_logits(mlp(P, "cont_head.", feat).squeeze(-1),
                                                      1.0 - chunk["terminated"].float(), reduction="none")
        kl, kl_value = kl_loss(post, prior, c.free_bits, c.kl_dyn_scale, c.kl_rep_scale)
        start_nll = F.binary_cross_entropy_with_logits(mlp(P, "decoder.", torch.cat([h0, start_z], dim=-1), True),
                                                       start_obs[..., :self.L], reduction="none").sum(-1)
        start_kl, _ = kl_loss(start_post, self._prior(h0, True), c.free_bits, c.kl_dyn_scale, c.kl_rep_scale)
        # a sequential sum over each seed's own start slots: the padding to M (the block's largest count)
        # leaves it unchanged, so a seed's loss does not depend on its neighbours' counts
        start_sum = torch.where(valid, start_nll + start_kl, 0.0).cumsum(1).gather(1, (counts - 1).unsqueeze(1))
        start_loss = start_sum.squeeze(1) / (B * T)
        loss = (decoder_nll + reward_nll + cont_nll + kl).reshape(S, -1).mean(1) + start_loss     # (S,)
        with torch.no_grad():
            wrong = ((decoder_logits > 0).float() != tape).float().reshape(S, -1).mean(1)
            values = torch.stack([loss.detach(), decoder_nll.reshape(S, -1).mean(1), reward_nll.reshape(S, -1).mean(1),
                                  kl_value.reshape(S, -1).mean(1), wrong], 1).tolist()
        names = ("model_loss", "decoder_nll", "reward_nll", "kl", "cell_error")
        metrics = [dict(zip(names, row)) for row in values]
        weight = 1.0 - chunk["terminated"].float()
        states = (h.detach().reshape(S, B * T, -1), z.detach().reshape(S, B * T, -1), weight.reshape(S, B * T))
        return loss, metrics, states, deferred

    # --- one seed's state in and out --------------------------------------------------------------
    def export_seed(self, k: int, agent) -> None:
        """Seed k's complete training state into the one-seed agent `agent`."""
        with torch.no_grad():
            for name in self.NETS:
                net = getattr(agent, name)
                for pname, p in net.named_parameters():
                    p.copy_(self.nets[name][pname][k])
        for name, path in self.OPTIMISERS.items():
            opt = _attr(agent, path)
            export_adam_state(self.optimizers[name], self.nets[name].tensors(), k, opt, opt.param_groups[0]["params"])
        replay = agent.learner.replay
        for name in replay.FIELDS:
            field = getattr(replay, name)
            if field.data_ptr() != self.replay[name][k].data_ptr():
                field.copy_(self.replay[name][k])
        replay.row_first = self.row_first[k].clone()
        replay.position, replay.size = self.position, self.size
        learner = agent.learner
        learner.env_steps, learner.next_update, learner.updates = self.env_steps, self.next_update, self.updates

    def import_seed(self, k: int, agent) -> None:
        """The reverse of `export_seed` (resume): the block's counters are the seeds' common ones."""
        with torch.no_grad():
            for name in self.NETS:
                for pname, p in getattr(agent, name).named_parameters():
                    self.nets[name][pname][k].copy_(p)
        for name, path in self.OPTIMISERS.items():
            opt = _attr(agent, path)
            import_adam_state(self.optimizers[name], self.nets[name].tensors(), k, opt, opt.param_groups[0]["params"])
        replay = agent.learner.replay
        for name in replay.FIELDS:
            field, mine = getattr(replay, name), self.replay[name][k]
            if field.data_ptr() != mine.data_ptr():
                if replay.size:
                    mine.copy_(field)
                elif not self._fresh:     # an empty ring is all zeros, as the stacked one starts
                    mine.zero_()
                setattr(replay, name, mine)
        self.row_first[k] = replay.row_first
        self.position, self.size = replay.position, replay.size
        learner = agent.learner
        self.env_steps, self.next_update, self.updates = learner.env_steps, learner.next_update, learner.updates
