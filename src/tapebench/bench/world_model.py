"""`tapebench bench world-model`: the world model's one-step error as one setting at a time changes.

DreamerV3's one-step prediction error in the pipeline is about twice the paper's. This study isolates the world
model from the agent: the RSSM of `methods/world_model.py` (`WorldModelLearner`, the same model, replay, losses
and update schedule that DreamerV3 and PlaNet train) learns from the uniformly random policy on the main split's
training rules, with no actor-critic. Uniformly random actions are also what the pipeline's error probe plays
(`evaluation.model_error`), so the training data matches the probe's action distribution; whatever error remains
comes from the model, its training budget or its losses, not from the agent's exploration.

`--agents ID ...` studies whole world-model methods instead (e.g. `ensemble_mpc ensemble_mpc_equivariant`: the
ensemble MPC's next-tape model with MLP or shift-equivariant members): each agent, at its `Config` defaults, is fed
the same uniformly random transitions through its `observe` / `update` and probed through its `world_model_rollout`.

Each variant is DreamerV3's `Config` defaults with some fields overridden (`--variants "deter_size=256;
hidden_size=256" "train_ratio=32" ...`; the baseline, no override, always runs first). Each variant trains for
`--steps` environment steps per seed and is measured at `--points` evenly spaced points: the one-step error
(depth 1 of the protocol's probe, context 4, greedy bit per cell) on the ID and the OOD evaluation episodes.
Two references on the same probe frame the numbers: the Bayes-optimal predictor over all 256 rules (what the
context leaves unidentified: the floor) and persistence (nothing changes but the flipped cell: no dynamics).
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from tapebench.defaults import MODEL_ERROR_CONTEXT
from tapebench.bench import load_average, run_parallel
from tapebench.envs.batched import BatchedTapeEnv
from tapebench.evaluation.evaluate import side_protocols
from tapebench.evaluation.model_error import probe_trajectories, rollout_errors
from tapebench.methods.contract import EnvSpec
from tapebench.methods.world_model import WorldModelConfig, WorldModelLearner, world_model_rollout
from tapebench.registry import build_config, make_agent, registry
from tapebench.stats.bootstrap import percentile_ci
from tapebench.training.loop import seed_everything
from tapebench.validation import check_horizon, check_length
from tapebench.vocabulary import ID_PROTOCOL, ID_SIDE, OOD_PROTOCOL, OOD_SIDE

STUDIED_METHOD = "dreamer"   # whose Config defaults the variants start from
SIDE_LABELS = {ID_SIDE: ID_PROTOCOL, OOD_SIDE: OOD_PROTOCOL}   # how the benchmarks print a split's sides
DEFAULT_VARIANTS = (
    "deter_size=64;hidden_size=64", "deter_size=256;hidden_size=256",            # capacity
    "stoch_groups=64",                                                            # more latent bits
    "train_ratio=4", "train_ratio=64",                                            # replayed steps per env step
    "kl_dyn_scale=0.5;kl_rep_scale=0.5", "free_bits=0.1",                         # KL balance, free bits
    "sequence_length=16;batch_size=32",                                           # chunking
)


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str                      # "defaults" or the overrides as given
    overrides: tuple               # ((field, value), ...)


def parse_variant(text: str) -> Variant:
    """'deter_size=256;hidden_size=256' -> Variant; fields must be world-model fields, values numbers."""
    fields = {f.name: f.type for f in dataclasses.fields(WorldModelConfig)}
    overrides = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in fields:
            raise ValueError(f"--variants entry {text!r}: each part must be FIELD=VALUE with FIELD one of the world "
                             f"model's settings {sorted(fields)}, got {part!r}")
        try:
            number = float(value) if "float" in str(fields[key]) else int(value)
        except ValueError:
            raise ValueError(f"--variants entry {text!r}: {key} needs a {fields[key]} value, got {value!r}") from None
        overrides.append((key, number))
    if not overrides:
        raise ValueError(f"--variants entry {text!r} overrides nothing; write FIELD=VALUE[;FIELD=VALUE]")
    build_config(STUDIED_METHOD, dict(overrides))   # checks the values (e.g. train_ratio <= batch x sequence)
    return Variant(text, tuple(overrides))


@dataclasses.dataclass(frozen=True)
class StudyRun:
    variant: Variant               # a DreamerV3 world-model variant, or Variant(agent id, ()) with `agent`
    seed: int
    steps: int
    points: int
    split: object
    L: int
    H: int
    episodes_per_rule: int
    agent: str | None = None       # a world-model method trained whole (its defaults + the variant's overrides)


def check_world_model_agents(requested) -> list[str]:
    """`--agents` of the study: registered methods that learn a world model (order kept, duplicates dropped)."""
    methods = registry()
    allowed = [m for m, method in methods.items() if method.world_model]
    requested = list(dict.fromkeys(requested))
    bad = [a for a in requested if a not in allowed]
    if bad or not requested:
        raise ValueError(f"--agents: {bad or 'none given'}: `tapebench bench world-model` studies methods with a "
                         f"world model; allowed: {allowed}")
    return requested


def one_step_error(model, episodes, H: int) -> tuple[float, int]:
    """Episode-weighted one-step error on the probe of `episodes` and how many episodes count; `model` has the
    agent contract's `world_model_rollout`."""
    errors, valid = rollout_errors(model, episodes, H, context=MODEL_ERROR_CONTEXT, depth=1)
    return float(errors[valid].mean()), int(valid.sum())


def bayes_one_step_error(episodes, context: int = MODEL_ERROR_CONTEXT, prior_rules=range(256),
                         seen: int | None = None) -> tuple[float, int]:
    """The one-step error of the Bayes-optimal predictor on the same probe, a floor for any learned model.

    The predictor knows the CA family and a uniform prior over `prior_rules` (default all 256 elementary rules,
    so it assumes nothing about the split): after the `context` probe transitions (or only the last `seen` of
    them: the floor of a model that reads no more, as the ensemble MPC's reads one) its posterior is uniform over
    the rules that reproduce them, and it predicts each cell of the next tape by the posterior majority (> 0.5,
    the probe's threshold). Its error is what the context leaves unidentified. Elementary, noise-free episodes."""
    tapes, actions, valid = _one_step_probe(episodes, context)
    rules = np.asarray(list(prior_rules), dtype=np.int64)
    tables = ((rules[:, None] >> np.arange(8)) & 1).astype(np.uint8)      # (R, 8): bit k = next cell of k
    rows = np.arange(len(tapes))

    def successors(tape, action):                                         # (N, L), (N,) -> (N, R, L)
        flipped = tape.copy()
        flipped[rows, action] ^= 1
        index = (np.roll(flipped, 1, axis=1) << 2) | (flipped << 1) | np.roll(flipped, -1, axis=1)
        return tables[:, index].transpose(1, 0, 2)

    consistent = np.ones((len(tapes), len(rules)), dtype=bool)
    for t in range(context - (context if seen is None else min(seen, context)), context):
        consistent &= (successors(tapes[:, t], actions[:, t]) == tapes[:, t + 1, None, :]).all(axis=2)
    if not consistent.any(axis=1).all():
        raise ValueError("a probe episode's rule is not among prior_rules: no rule reproduces its context")
    votes = (successors(tapes[:, context], actions[:, context]) * consistent[:, :, None]).sum(axis=1)
    predicted = votes / consistent.sum(axis=1, keepdims=True) > 0.5
    errors = (predicted != tapes[:, context + 1].astype(bool)).mean(axis=1)
    return float(errors[valid].mean()), int(valid.sum())


def persistence_one_step_error(episodes, context: int = MODEL_ERROR_CONTEXT) -> tuple[float, int]:
    """The one-step error of predicting that nothing but the flipped cell changes (a model that learned no
    dynamics; exact for the identity rule 204), on the same probe."""
    tapes, actions, valid = _one_step_probe(episodes, context)
    predicted = tapes[:, context].copy()
    predicted[np.arange(len(tapes)), actions[:, context]] ^= 1
    errors = (predicted != tapes[:, context + 1]).mean(axis=1)
    return float(errors[valid].mean()), int(valid.sum())


def _one_step_probe(episodes, context: int):
    """The probe's tapes (N, C+2, L) and actions (N, C+1) for a one-step prediction after `context` transitions,
    and which episodes count (not at the all-zero goal by the predicted step, as in `rollout_errors`)."""
    tapes, actions = probe_trajectories(episodes, context + 1)
    valid = ~(tapes[:, :context + 1] == 0).all(axis=2).any(axis=1)
    return tapes, actions, valid


@dataclasses.dataclass
class _Rollout:
    """The agent contract's `world_model_rollout` of a bare RSSM."""
    model: object

    def world_model_rollout(self, obs_prefix, action_prefix, actions):
        return world_model_rollout(self.model, obs_prefix, action_prefix, actions)


def run_study(run: StudyRun) -> dict:
    """Train one variant's world model (or one agent) on random-policy data; its one-step error at each point."""
    torch.set_num_threads(1)
    env_seed = seed_everything(run.seed)
    spec = EnvSpec.for_tape(run.L, run.H)
    if run.agent is None:
        config = build_config(STUDIED_METHOD, dict(run.variant.overrides))
        learner = WorldModelLearner(config, spec, "cpu")
        model, updates = _Rollout(learner.model), lambda: learner.updates

        def learn(*transition):
            learner.add(*transition)
            for _ in range(learner.due()):
                learner.update()
    else:
        config = build_config(run.agent, dict(run.variant.overrides))
        model = make_agent(run.agent, config, spec, run.steps, "cpu")
        if hasattr(model, "gradient_steps"):
            updates = lambda: model.gradient_steps            # noqa: E731
        else:                                                 # DreamerV3, PlaNet: their RSSM learner's count
            updates = lambda: model.learner.updates           # noqa: E731

        def learn(*transition):
            model.observe(*transition)
            model.update()
    env = BatchedTapeEnv(config.num_envs, L=run.L, H=run.H, rules=run.split.train, seed=env_seed)
    actions_gen = torch.Generator().manual_seed(env_seed)
    sides = [(SIDE_LABELS[protocol.side], episodes) for episodes, protocol, _ in side_protocols(
        L=run.L, H=run.H, episodes_per_rule=run.episodes_per_rule, eval_seed=0, split=run.split)]
    iterations = -(-run.steps // config.num_envs)
    measure_at = {round(iterations * (k + 1) / run.points) for k in range(run.points)}
    curve, start, train_seconds = [], time.perf_counter(), 0.0
    obs = env.reset()
    for iteration in range(1, iterations + 1):
        tick = time.perf_counter()
        actions = torch.randint(0, run.L, (config.num_envs,), generator=actions_gen)
        next_obs, rewards, terminated, truncated, info = env.step(actions)
        learn(obs, actions, rewards, info["final_obs"], terminated, truncated)
        obs = next_obs
        train_seconds += time.perf_counter() - tick
        if iteration in measure_at:
            point = {"env_steps": iteration * config.num_envs, "updates": updates()}
            with torch.no_grad():
                for label, episodes in sides:
                    point[label], point[f"{label}_n"] = one_step_error(model, episodes, run.H)
            curve.append(point)
    return {"variant": run.variant.name, "seed": run.seed, "curve": curve, "train_seconds": round(train_seconds, 2),
            "seconds": round(time.perf_counter() - start, 2)}


def study_rows(results: list[dict]) -> list[dict]:
    """Per variant: the final point's ID / OOD one-step error, mean over seeds with a bootstrap CI."""
    rows = []
    for name in dict.fromkeys(r["variant"] for r in results):
        runs = [r for r in results if r["variant"] == name]
        row = {"variant": name, "seeds": len(runs), "env_steps": runs[0]["curve"][-1]["env_steps"],
               "updates": runs[0]["curve"][-1]["updates"],
               "train_seconds": float(np.mean([r["train_seconds"] for r in runs]))}
        for label in SIDE_LABELS.values():
            values = [r["curve"][-1][label] for r in runs]
            row[label] = dataclasses.asdict(percentile_ci(values)) if len(values) > 1 else \
                {"mean": values[0], "low": values[0], "high": values[0], "n": 1}
            row[f"{label}_curve"] = [float(np.mean([r["curve"][k][label] for r in runs]))
                                     for k in range(len(runs[0]["curve"]))]
        rows.append(row)
    return rows


def bench_world_model(args) -> dict:
    """Entry point of `tapebench bench world-model` (options: --variants --steps --points --seeds --split --L --H
    --episodes-per-rule --jobs)."""
    # lazy: a command loads only the modules it runs
    from tapebench.splits.io import resolve_split

    L, H = check_length(args.L), check_horizon(args.H)
    if args.seeds < 1 or args.jobs < 1 or args.points < 1 or args.episodes_per_rule < 1:
        raise ValueError(f"--seeds, --jobs, --points and --episodes-per-rule must be >= 1, got {args.seeds}, "
                         f"{args.jobs}, {args.points}, {args.episodes_per_rule}")
    if args.agents and args.variants:
        raise ValueError("--agents and --variants exclude each other: --variants overrides DreamerV3's world model, "
                         "--agents studies whole methods at their defaults")
    agents = check_world_model_agents(args.agents) if args.agents else []
    variants = [Variant(a, ()) for a in agents] or \
        [Variant("defaults", ())] + [parse_variant(v) for v in (args.variants or DEFAULT_VARIANTS)]
    try:
        split = resolve_split(args.split or "main")
    except ValueError as exc:
        raise ValueError(f"{exc}; build the main split first (`snakemake --cores 1 results/splits/main.json`) or "
                         f"pass --split PATH") from None
    runs = [StudyRun(v, seed, args.steps, args.points, split, L, H, args.episodes_per_rule,
                     agent=v.name if agents else None)
            for v in variants for seed in range(args.seeds)]
    studied = (f"the methods {agents} (their Config defaults, world model and its updates as in training)" if agents
               else f"the RSSM of {STUDIED_METHOD} (its Config defaults, one override set per variant)")
    print(f"tapebench bench world-model: {studied} trained on the uniformly random policy's data, split "
          f"{split.name!r} training rules, L={L}, "
          f"H={H}, {args.steps} env steps per run, {args.seeds} seed(s); one-step error (probe depth 1, context "
          f"{MODEL_ERROR_CONTEXT}) on {args.episodes_per_rule} episodes per ID / OOD rule at {args.points} point(s)")
    references = side_protocols(L=L, H=H, episodes_per_rule=args.episodes_per_rule, eval_seed=0, split=split)
    floor = {SIDE_LABELS[protocol.side]: bayes_one_step_error(episodes)[0] for episodes, protocol, _ in references}
    floor_last = {SIDE_LABELS[protocol.side]: bayes_one_step_error(episodes, seen=1)[0]
                  for episodes, protocol, _ in references}
    persistence = {SIDE_LABELS[protocol.side]: persistence_one_step_error(episodes)[0]
                   for episodes, protocol, _ in references}
    print(f"references on the same probe: the Bayes-optimal predictor over all 256 rules given the same "
          f"{MODEL_ERROR_CONTEXT} context transitions (the floor) ID {floor['ID']:.4f}, OOD {floor['OOD']:.4f}; "
          f"given the last of them only (the ensemble MPC's models read one) ID {floor_last['ID']:.4f}, OOD "
          f"{floor_last['OOD']:.4f}; 'nothing changes but the flipped cell' ID {persistence['ID']:.4f}, OOD "
          f"{persistence['OOD']:.4f}")
    print(f"{len(runs)} runs in {args.jobs} process(es), 1 torch thread each; load average {load_average()}")
    started = time.perf_counter()

    def report(result, done, total):
        last = result["curve"][-1]
        print(f"  [{done}/{total}, {time.perf_counter() - started:.0f} s] {result['variant']:<34} seed "
              f"{result['seed']}: one-step error ID {last['ID']:.4f}, OOD {last['OOD']:.4f} after {last['updates']} "
              f"updates ({result['train_seconds']:.0f} s training)", flush=True)

    results = run_parallel(run_study, runs, args.jobs, report)
    rows = study_rows(results)
    steps = [p["env_steps"] for p in results[0]["curve"]]
    print(f"\none-step error at {steps[-1]} env steps, mean over seeds [95% bootstrap CI when >= 2 seeds]; curve: "
          f"ID error at {', '.join(str(s) for s in steps)} env steps")
    print(f"  {'variant':<34} {'updates':>7} {'ID':>22} {'OOD':>22} {'train s':>8}  ID curve")
    for row in rows:
        ci = {k: f"{row[k]['mean']:.4f} [{row[k]['low']:.4f}, {row[k]['high']:.4f}]" for k in SIDE_LABELS.values()}
        print(f"  {row['variant']:<34} {row['updates']:>7} {ci['ID']:>22} {ci['OOD']:>22} "
              f"{row['train_seconds']:>8.0f}  {' '.join(f'{e:.3f}' for e in row['ID_curve'])}")
    print(f"  {'Bayes over 256 rules (floor)':<34} {'':>7} {floor['ID']:>22.4f} {floor['OOD']:>22.4f}")
    print(f"  {'Bayes, last transition only':<34} {'':>7} {floor_last['ID']:>22.4f} {floor_last['OOD']:>22.4f}")
    print(f"  {'persistence (no dynamics)':<34} {'':>7} {persistence['ID']:>22.4f} {persistence['OOD']:>22.4f}")
    print(f"wall {time.perf_counter() - started:.0f} s; load average {load_average()}")
    return {"method": agents or STUDIED_METHOD, "split": split.name, "L": L, "H": H, "steps": args.steps,
            "seeds": args.seeds, "bayes_floor": floor, "bayes_floor_last_transition": floor_last,
            "persistence": persistence, "rows": rows, "runs": results}
