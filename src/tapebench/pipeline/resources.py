"""What a training, evaluation or world-test job needs, estimated from its config slice before any job runs.

The estimates are arithmetic on the method's built `Config` (the fields a method declares: network widths and
depths, replay capacity, batch, rollout and planner sizes), the tape length L and horizon H, and the number of
seeds one job trains. They are meant as a ceiling a job stays under, not a measurement:

- memory: a torch process (`BASE_MB`), every network parameter held `PARAMETER_COPIES` times (weights, target or
  slow copies, gradients, two Adam moments) and multiplied by `ensemble_size`, the activations of the largest
  batch that passes through a network at once (`ACTIVATION_COPIES` times: forward values, their gradients, a
  temporary), the replay buffer twice (a resume checkpoint is serialised in memory), a PPO-style rollout and the
  planner's candidate rows. Every term names the config keys it comes from, so a refusal names the key to change.
- run time: the forward and backward multiply-adds per environment step over `FLOP_RATE` (a core on the small
  matrices these networks use, well under its peak GEMM rate), times `RUNTIME_SAFETY`, plus `START_MIN`.

`validate_config` (pipeline.config) refuses a config whose job would need more than `resources.max_mem_mb`;
`tapebench train` checks its own run through the same estimate; the workflow declares `mem_mb` and `runtime` of
each job from it (workflow/rules/common.smk; the world test's in workflow/rules/helpers/worldtest.smk).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from tapebench.registry import build_config, get_method

BASE_MB = 800                # a job's process besides the terms below: a short default DQN / DreamerV3 training at
                             # L = 32 peaks at 410-460 MB RSS; the rest is margin (a job over mem_mb is killed)
PARAMETER_COPIES = 8         # weights, target / slow copies, gradients, two Adam moments, actor and critic heads
ACTIVATION_COPIES = 3        # forward activations, their gradients, one temporary
FLOAT = 4                    # bytes of a float32
FLOP_RATE = 2e10             # FLOP/s one core sustains on these small matrices (DQN's measured ~1,600 env steps/s
                             # at its ~16 MFLOP per env step gives ~25e9)
RUNTIME_SAFETY = 3           # the run-time estimate declared to Slurm: this many times the arithmetic
START_MIN = 10               # minutes a job spends starting, loading and writing besides its arithmetic
STEP_OVERHEAD_S = 2e-4       # seconds of Python per environment step (the batched env, the loop)
MB = 2 ** 20
MAX_PLANNER_ROLLOUTS = 2 ** 16   # world-test planner horizon x candidates: 64 x the default (8 x 128); beyond it
                                 # a world-test job of the default problem count plans for hours


@dataclass(frozen=True)
class Term:
    """One part of an estimate: its bytes and the config keys (a method's fields) it grows with."""

    what: str
    bytes: int
    keys: tuple[str, ...]


@dataclass(frozen=True)
class Estimate:
    terms: tuple[Term, ...]

    @property
    def mb(self) -> int:
        return BASE_MB + math.ceil(sum(t.bytes for t in self.terms) / MB)

    @property
    def largest(self) -> Term:
        return max(self.terms, key=lambda t: t.bytes)

    def describe(self) -> str:
        parts = [f"{t.what} {math.ceil(t.bytes / MB):,} MB ({', '.join(t.keys)})"
                 for t in sorted(self.terms, key=lambda t: -t.bytes) if t.bytes >= MB]
        return f"about {self.mb:,} MB" + (f": {'; '.join(parts)}" if parts else "")


def culprit(keys: tuple, given: dict, defaults, estimate_with) -> str:
    """Of the `keys` of an estimate's largest term, the one `given` sets whose return to its value in `defaults`
    (the method's default Config) shrinks `estimate_with({key: default})` most; the first key when none is set."""
    best, best_mb = keys[0], None
    for key in keys:
        if key not in given or not hasattr(defaults, key):
            continue
        try:
            mb = estimate_with({key: getattr(defaults, key)}).mb
        except ValueError:      # the default does not combine with the other values given
            continue
        if best_mb is None or mb < best_mb:
            best, best_mb = key, mb
    return best


def check_training(method: str, hyperparameters: dict, L: int, H: int, seeds: int = 1,
                   limit_mb: int | None = None) -> Estimate:
    """A hand-run training job's estimate, refused (ValueError naming the hyperparameter) above `limit_mb`
    (default: this machine's memory), before anything is allocated."""
    def estimate_with(change: dict) -> Estimate:
        return training_memory(build_config(method, {**hyperparameters, **change}), L, H, seeds)

    estimate = estimate_with({})
    limit = machine_mem_mb() if limit_mb is None else int(limit_mb)
    if estimate.mb > limit:
        key = culprit(estimate.largest.keys, hyperparameters, get_method(method).Config(), estimate_with)
        raise ValueError(f"--params agent.{key}: a training run of {method!r} at L = {L}, H = {H} ({seeds} seed(s)) "
                         f"needs {estimate.describe()}; this machine has {limit:,} MB. Lower {key} (or the other "
                         f"keys named)")
    return estimate


def check_evaluation(method: str, hyperparameters: dict, L: int, H: int, episodes: int,
                     limit_mb: int | None = None) -> Estimate:
    """A hand-run evaluation job's estimate (`episodes` episodes of H steps at once), refused above `limit_mb`
    (default: this machine's memory) with a ValueError naming the option or --params key to lower, before anything
    is allocated."""
    def estimate_with(change: dict) -> Estimate:
        return evaluation_memory(build_config(method, {**hyperparameters, **change}), L, H, episodes)

    estimate = estimate_with({})
    limit = machine_mem_mb() if limit_mb is None else int(limit_mb)
    if estimate.mb > limit:
        keys = estimate.largest.keys
        key = {"episodes_per_rule": "--params evaluation.episodes_per_rule", "H": "--H"}.get(keys[0]) or \
            "--params agent." + culprit(keys, hyperparameters, get_method(method).Config(), estimate_with)
        raise ValueError(f"{key}: an evaluation of {method!r} at L = {L}, H = {H} ({episodes:,} episodes at once) "
                         f"needs {estimate.describe()}; this machine has {limit:,} MB. Lower {key.split()[-1]}")
    return estimate


def machine_mem_mb() -> int:
    """This machine's physical memory in MB (the default of `resources.max_mem_mb`)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // MB)
    except (AttributeError, ValueError, OSError):
        return 16_000


def _field(config, name: str, default: int = 0) -> int:
    value = getattr(config, name, default)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


@dataclass(frozen=True)
class _Shape:
    params: int              # parameters of every network of the method (times the ensemble)
    param_keys: tuple
    row_width: int           # activations per example through the networks (one layer's values summed over layers)
    width_keys: tuple
    ensemble: int


def _shape(config, L: int) -> _Shape:
    obs = L + 1
    atoms = max(1, _field(config, "atoms", 1))
    ensemble = max(1, _field(config, "ensemble_size", 1))
    latent = _field(config, "latent_dim")
    deter = _field(config, "deter_size")
    stoch = _field(config, "stoch_groups") * _field(config, "stoch_classes")
    width, depth = _field(config, "hidden_size"), max(1, _field(config, "hidden_layers", 2))
    params, row, keys, wkeys = 0, obs + L * atoms, [], []
    if getattr(config, "network", "mlp") == "equivariant":
        channels, layers = _field(config, "conv_channels"), max(1, _field(config, "conv_layers", 1))
        kernel = max(1, _field(config, "conv_kernel", 1))
        params += layers * channels * channels * (kernel + 1) + channels * (4 + latent + atoms)
        row += 2 * layers * channels * L
        keys += ["conv_channels", "conv_layers", "conv_kernel"]
        wkeys += ["conv_channels", "conv_layers"]
    elif width:
        params += (obs + latent + deter + stoch) * width + (depth - 1) * width * width + width * (L * atoms + 1)
        row += depth * width
        keys += ["hidden_size", "hidden_layers"] if hasattr(config, "hidden_layers") else ["hidden_size"]
        wkeys += ["hidden_size", "hidden_layers"] if hasattr(config, "hidden_layers") else ["hidden_size"]
    if deter:   # a recurrent state: GRU gates on [state, input], heads reading [state, latent]
        params += 3 * (deter + width + stoch) * deter + 4 * (deter + stoch) * max(width, 1) + stoch * deter
        row += 4 * deter + 2 * stoch
        keys += ["deter_size"]
        wkeys += ["deter_size"]
    enc_width = _field(config, "encoder_hidden_size")
    if enc_width:
        enc_depth = max(1, _field(config, "encoder_hidden_layers", 2))
        params += (2 * obs + 2) * enc_width + (enc_depth - 1) * enc_width ** 2 + enc_width * 2 * latent
        row += enc_depth * enc_width
        keys += ["encoder_hidden_size", "encoder_hidden_layers"]
        wkeys += ["encoder_hidden_size", "encoder_hidden_layers"]
    if ensemble > 1:
        keys.append("ensemble_size")
    return _Shape(params * ensemble, tuple(keys), row, tuple(wkeys), ensemble)


def _update_rows(config) -> tuple[int, tuple[str, ...]]:
    """The most examples one gradient step (or one imagination) pushes through the networks at once."""
    rows, keys = 1, ()
    batch = _field(config, "batch_size") * max(1, _field(config, "sequence_length", 1))
    if batch > rows:
        rows, keys = batch, ("batch_size", "sequence_length") if hasattr(config, "sequence_length") else ("batch_size",)
    steps = _field(config, "num_steps")
    if steps:
        minibatch = steps * _field(config, "num_envs", 1) // max(1, _field(config, "num_minibatches", 1))
        if minibatch > rows:
            rows, keys = minibatch, ("num_steps", "num_envs", "num_minibatches")
    imagined = _field(config, "imagination_starts") * _field(config, "imagination_horizon")
    if imagined > rows:
        rows, keys = imagined, ("imagination_starts", "imagination_horizon")
    return rows, keys


def _planner_rows(config, envs: int) -> int:
    """Rows one planning step evaluates at once (candidates x environments, bounded by plan_rows if the method
    chunks them)."""
    candidates = _field(config, "candidates")
    if not candidates:
        return 0
    rows = candidates * max(1, envs)
    cap = _field(config, "plan_rows")
    return min(rows, cap) if cap else rows


def training_memory(config, L: int, H: int, seeds: int = 1) -> Estimate:
    """Memory of a training job that trains `seeds` runs of a method with hyperparameters `config` at L, H."""
    seeds = max(1, int(seeds))
    shape = _shape(config, L)
    envs = _field(config, "num_envs", 1)
    rows, row_keys = _update_rows(config)
    terms = [
        Term("networks", shape.params * FLOAT * PARAMETER_COPIES * seeds, shape.param_keys),
        Term("batch activations", rows * shape.row_width * shape.ensemble * FLOAT * ACTIVATION_COPIES * seeds,
             row_keys + shape.width_keys),
    ]
    buffer = _field(config, "buffer_size")
    if buffer:
        terms.append(Term("replay buffer", 2 * buffer * (2 * (L + 1) * FLOAT + 24) * seeds, ("buffer_size",)))
    steps = _field(config, "num_steps")
    if steps:
        terms.append(Term("rollout", steps * envs * (L + 1 + L + 8) * FLOAT * seeds, ("num_steps", "num_envs")))
    plan = _planner_rows(config, envs)
    if plan:
        horizon = max(1, _field(config, "plan_horizon", 1))
        terms.append(Term("planner", plan * (horizon * 8 + (shape.row_width + L) * FLOAT * shape.ensemble) * seeds,
                          ("candidates", "plan_horizon", "num_envs")))
    terms.append(Term("environments", envs * (L + 1) * FLOAT * 16 * seeds, ("num_envs",)))
    return Estimate(tuple(terms))


def _flops_per_step(config, L: int) -> float:
    shape = _shape(config, L)
    act = 2.0 * shape.params
    if _field(config, "num_steps"):            # on-policy: every sample back-propagated update_epochs times
        replay = max(1, _field(config, "update_epochs", 1))
    elif _field(config, "train_ratio"):        # world models: replayed steps per env step, and the imagined ones
        chunk = max(1, _field(config, "batch_size") * max(1, _field(config, "sequence_length", 1)))
        imagined = _field(config, "imagination_starts") * _field(config, "imagination_horizon")
        replay = _field(config, "train_ratio") * (1 + imagined / chunk)
    else:
        replay = _update_rows(config)[0] / max(1, _field(config, "train_frequency", 1))
    plan = _planner_rows(config, 1) * max(1, _field(config, "plan_horizon", 1)) * max(1, _field(config, "iterations", 1))
    return act * (1 + plan) + 6.0 * shape.params * replay


def training_minutes(config, L: int, H: int, total_steps: int, seeds: int = 1) -> int:
    """Run-time estimate in minutes of a training job of `seeds` runs of `total_steps` environment steps each."""
    seconds = max(1, int(seeds)) * int(total_steps) * (_flops_per_step(config, L) / FLOP_RATE + STEP_OVERHEAD_S)
    return START_MIN + math.ceil(RUNTIME_SAFETY * seconds / 60)


def evaluation_memory(config, L: int, H: int, episodes: int) -> Estimate:
    """Memory of an evaluation job playing `episodes` episodes of H steps at once (one checkpoint at a time)."""
    shape = _shape(config, L)
    terms = [Term("networks", shape.params * FLOAT * 2, shape.param_keys),
             Term("episode batch", episodes * (shape.row_width * shape.ensemble * FLOAT + (L + 1) * FLOAT * 8),
                  ("episodes_per_rule",) + shape.width_keys),
             Term("records", episodes * H * 64, ("episodes_per_rule", "H"))]
    plan = _planner_rows(config, episodes)
    if plan:
        horizon = max(1, _field(config, "plan_horizon", _field(config, "horizon", 1)))
        terms.append(Term("planner", plan * (horizon * 8 + (shape.row_width + L) * FLOAT * shape.ensemble),
                          ("candidates", "episodes_per_rule")))
    return Estimate(tuple(terms))


def evaluation_minutes(config, L: int, H: int, episodes: int, checkpoints: int = 1) -> int:
    """Run-time estimate in minutes of an evaluation job: `checkpoints` x `episodes` episodes of H steps."""
    shape = _shape(config, L)
    plan = max(1, _planner_rows(config, 1)) * max(1, _field(config, "plan_horizon", _field(config, "horizon", 1)))
    flops = 2.0 * max(shape.params, L * L) * plan
    seconds = checkpoints * episodes * H * flops / FLOP_RATE + checkpoints * H * STEP_OVERHEAD_S * 10
    return START_MIN + math.ceil(RUNTIME_SAFETY * seconds / 60)


PREDICTION_CANDIDATES = 6   # episodes.worldtest: the candidates of each masked prediction


def worldtest_memory(problems: int, L: int, lengths, masked_cells: int, planner_candidates: int,
                     planner_horizon: int) -> Estimate:
    """Memory of a world-test job over `problems` problems of one side (rules x problems_per_rule): the
    prediction task's tapes, their copy shown to the method and the method's rollouts of them, the candidates; the
    planner's candidate rows."""
    T = max(lengths)
    keys = ("problems_per_rule", "prediction.lengths")
    return Estimate((
        Term("prediction tapes", problems * (3 * (T + 1) * L + 2 * T * 8), keys),
        Term("prediction candidates", problems * (PREDICTION_CANDIDATES * masked_cells + L + 16),
             ("problems_per_rule", "prediction.masked_cells")),
        Term("planner", planner_candidates * (planner_horizon * 8 + L * 2), ("planner.candidates", "planner.horizon")),
    ))
