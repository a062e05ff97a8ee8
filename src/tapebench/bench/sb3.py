"""`tapebench bench sb3`: training env steps/s of our DQN and PPO against Stable-Baselines3's, same run.

Ours: the shared training loop (`training.loop.train`) on `BatchedTapeEnv`, one torch call stepping
every environment row. Stable-Baselines3: `DQN` / `PPO` with `make_vec_env` (a `DummyVecEnv` of
`Monitor`-wrapped envs) over the registered Gymnasium env `tapebench/Tape-v0` — our `TapeEnv`, one
Python env object per tape, stepped one after another. That is the point of the comparison: it shows
what the batched env and the loop buy over the standard Gymnasium route with the same algorithm.

Both sides train for the same number of env steps (`--steps`, rounded up to whole vectorised steps, and
for PPO to whole rollouts, so both do the same number of updates) on the same rule set (z ~ Unif(rules)
at every reset; `--rules`, default all 256, or `--split PATH`'s train rules), L = --L, H = --H, on
the CPU with the same torch thread count (`--threads`, default 1) and deterministic algorithms on, and
with the hyperparameters of our `Config` defaults translated by `sb3_dqn_settings` / `sb3_ppo_settings`.
What cannot be matched is listed by `remaining_differences` and printed. The two sides alternate
(`--repeats` runs each, median shown) so that load drift hits both.

Needs the optional extra: `pip install -e ".[bench]"` (stable-baselines3 >= 2.3).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import statistics
import tempfile
import time

import torch
from torch import nn

from tapebench.bench import load_average as _load
from tapebench.bench.training import select_agents
from tapebench.gymnasium_ids import ENV_ID
from tapebench.registry import build_config
from tapebench.training.loop import TrainSpec, torch_settings, train
from tapebench.validation import check_horizon, check_length, parse_rule_list

SB3_MIN_VERSION = (2, 3)
INSTALL_HINT = 'pip install -e ".[bench]"'
COUNTERPARTS = {"dqn": "DQN", "ppo": "PPO"}   # our method id -> stable_baselines3 class


class MissingOptionalDependency(ValueError):
    """An optional extra is not installed (a ValueError, so the CLI prints it as a clean error)."""


def require_sb3():
    """Import stable_baselines3 or explain how to install it."""
    try:
        # optional extra: loaded only by the SB3 benchmark
        import stable_baselines3
    except ImportError as exc:
        raise MissingOptionalDependency(
            f"`tapebench bench sb3` needs Stable-Baselines3, which is not installed ({exc}). Install the "
            f"optional extra from the repository root: {INSTALL_HINT}  (it is not part of the test "
            f"extra)") from None
    version = tuple(int(p) for p in stable_baselines3.__version__.split(".")[:2] if p.isdigit())
    if version < SB3_MIN_VERSION:
        raise MissingOptionalDependency(
            f"`tapebench bench sb3` needs stable-baselines3 >= {'.'.join(map(str, SB3_MIN_VERSION))}, found "
            f"{stable_baselines3.__version__}; upgrade with {INSTALL_HINT}")
    return stable_baselines3


# --- our Config defaults -> Stable-Baselines3 arguments -------------------------------------

@functools.lru_cache(maxsize=None)
def fused_adam_available() -> bool:
    """Whether this torch build has fused Adam on CPU (our agents use it there; see agents.common.adam)."""
    try:
        torch.optim.Adam([nn.Parameter(torch.zeros(1))], lr=1e-3, fused=True)
        return True
    except (RuntimeError, TypeError):
        return False


def _optimizer_kwargs(eps: float) -> dict:
    return {"eps": eps, **({"fused": True} if fused_adam_available() else {})}


def whole_steps(steps: int, unit: int) -> int:
    """`steps` rounded up to a multiple of `unit` (whole vectorised steps or whole rollouts)."""
    return math.ceil(int(steps) / unit) * unit


def sb3_dqn_settings(config, steps: int) -> dict:
    """Our DQN `Config` as Stable-Baselines3 `DQN` arguments.

    Returns {"n_envs", "total_steps", "kwargs"}: `make_vec_env(..., n_envs=n_envs)`,
    `DQN("MlpPolicy", venv, **kwargs)`, `learn(total_timesteps=total_steps)`. Our loop counts
    `train_frequency` and `target_update_frequency` in env steps; SB3 counts `train_freq` in
    vectorised steps (`n_envs` env steps each, `gradient_steps` per trigger) and
    `target_update_interval` in env steps (applied every `target_update_interval // n_envs` vectorised
    steps). A Config that SB3 cannot express raises ValueError naming the value.
    """
    c = config
    n = c.num_envs
    if c.double_dqn:
        raise ValueError("Stable-Baselines3's DQN has no Double-DQN target; the comparison needs double_dqn=False, "
                         "got double_dqn=True")
    _check_mlp(c, "DQN")
    if c.her_strategy != "none":   # her_k is unused without it
        raise ValueError("the Stable-Baselines3 comparison runs the paper's fixed goal, where hindsight relabelling "
                         f"does not apply; it needs her_strategy='none', got her_strategy={c.her_strategy!r}")
    if n % c.train_frequency == 0:
        train_freq, gradient_steps = 1, n // c.train_frequency
    elif c.train_frequency % n == 0:
        train_freq, gradient_steps = c.train_frequency // n, 1
    else:
        raise ValueError(f"DQN train_frequency={c.train_frequency} env steps cannot be expressed in SB3 with "
                         f"num_envs={n}: one must divide the other")
    if c.target_update_frequency % n:
        raise ValueError(f"DQN target_update_frequency={c.target_update_frequency} must be a multiple of "
                         f"num_envs={n} for SB3 to update at the same env steps")
    total = whole_steps(steps, n)
    return {"n_envs": n, "total_steps": total, "kwargs": {
        "learning_rate": c.learning_rate,
        "buffer_size": c.buffer_size,
        "learning_starts": c.learning_starts,
        "batch_size": c.batch_size,
        "tau": c.tau,
        "gamma": c.gamma,
        "train_freq": train_freq,
        "gradient_steps": gradient_steps,
        "target_update_interval": c.target_update_frequency,
        "exploration_fraction": c.exploration_fraction,
        "exploration_initial_eps": c.epsilon_start,
        "exploration_final_eps": c.epsilon_end,
        "max_grad_norm": c.max_grad_norm,
        "policy_kwargs": {"net_arch": [c.hidden_size] * c.hidden_layers, "activation_fn": nn.ReLU,
                          "optimizer_kwargs": _optimizer_kwargs(1e-8)},
    }}


def _check_mlp(config, name: str) -> None:
    """SB3's policies are MLPs: the comparison runs only with our MLP (network = "mlp"; the conv_* fields unused)."""
    if config.network != "mlp":
        raise ValueError(f"Stable-Baselines3's {name} policy is an MLP; the comparison needs network='mlp', "
                         f"got network={config.network!r}")


@dataclasses.dataclass(frozen=True)
class AnnealedLearningRate:
    """SB3 learning-rate schedule equal to our PPO annealing, lr * (1 - k / N) at update k = 0..N-1.

    SB3 evaluates the schedule after collecting rollout k, at progress_remaining = 1 - (k + 1) / N
    (when the budget is exactly N rollouts), so the schedule adds back one rollout's share.
    """

    learning_rate: float
    rollout_share: float   # 1 / N

    def __call__(self, progress_remaining: float) -> float:
        return self.learning_rate * min(1.0, progress_remaining + self.rollout_share)


def sb3_ppo_settings(config, steps: int) -> dict:
    """Our PPO `Config` as Stable-Baselines3 `PPO` arguments (see `sb3_dqn_settings` for the shape).

    The budget is rounded up to whole rollouts (num_envs x num_steps) so both sides make the same
    number of updates. Our value loss is 0.5 * (squared error) with vf_coef; SB3's is the plain mean
    squared error, so vf_coef is halved to give the same gradient (see `remaining_differences` for
    the clipped form).
    """
    c = config
    _check_mlp(c, "PPO")
    rollout = c.num_envs * c.num_steps
    total = whole_steps(steps, rollout)
    learning_rate = AnnealedLearningRate(c.learning_rate, rollout / total) if c.anneal_lr else c.learning_rate
    return {"n_envs": c.num_envs, "total_steps": total, "kwargs": {
        "learning_rate": learning_rate,
        "n_steps": c.num_steps,
        "batch_size": rollout // c.num_minibatches,
        "n_epochs": c.update_epochs,
        "gamma": c.gamma,
        "gae_lambda": c.gae_lambda,
        "clip_range": c.clip_coef,
        "clip_range_vf": c.clip_coef if c.clip_vloss else None,
        "normalize_advantage": c.norm_adv,
        "ent_coef": c.ent_coef,
        "vf_coef": c.vf_coef / 2,
        "max_grad_norm": c.max_grad_norm,
        "policy_kwargs": {"net_arch": {"pi": [c.hidden_size] * c.hidden_layers,
                                       "vf": [c.hidden_size] * c.hidden_layers},
                          "activation_fn": nn.Tanh, "ortho_init": True,
                          "optimizer_kwargs": _optimizer_kwargs(1e-5)},
    }}


SETTINGS = {"dqn": sb3_dqn_settings, "ppo": sb3_ppo_settings}


def remaining_differences(agent: str, config) -> list[str]:
    """What differs between the two sides beyond the matched arguments (printed with the figures)."""
    both = [
        "environment: SB3 steps one Python TapeEnv (+ Monitor wrapper) per tape in turn through DummyVecEnv and "
        "converts numpy observations to torch tensors every step; ours steps all rows in one BatchedTapeEnv "
        "call on torch tensors (by design: this is what is measured)",
        "random streams: both sides are seeded with --seed but draw tapes, rules and actions from different "
        "generators, so the trajectories differ (same distributions)",
        "timed span: ours is the loop's wall time including the final policy checkpoint and resume.pt writes "
        "(as in the protocol); SB3's is learn(), which writes nothing; model/env construction is excluded "
        "on both sides",
    ]
    if agent == "dqn":
        return [
            "epsilon-greedy: SB3 draws one exploration coin per vectorised step (all envs explore or none); "
            "ours draws one per env",
            f"warm-up: SB3 acts uniformly at random for the first learning_starts={config.learning_starts} env "
            f"steps (ours is already epsilon-greedy with the decaying epsilon) and starts learning at "
            f"num_timesteps > learning_starts (ours at >=): SB3 makes one gradient step fewer",
            "replay buffer: SB3 stores numpy arrays of shape (buffer_size / n_envs, n_envs, ...) and converts "
            "each sampled batch to torch; ours is a torch ring buffer",
            "initialisation: both use PyTorch's default Linear init (no orthogonal init) for the Q-network",
        ] + both
    if agent == "ppo":
        return [
            "value loss: ours is 0.5 * max(unclipped, clipped squared error) (CleanRL); SB3 uses the clipped "
            "squared error only (mean, no 0.5, hence vf_coef / 2)" if config.clip_vloss else
            "value loss: SB3's has no 0.5 factor, hence vf_coef / 2",
            "networks: both have separate actor and critic MLPs (SB3: net_arch pi/vf behind a parameter-free "
            "Flatten extractor) with orthogonal init, gains sqrt(2) hidden / 0.01 policy head / 1 value head, "
            "zero biases; the initial weights differ (different generators)",
            "truncation bootstrap: both add gamma * V(last observation) to the reward; SB3 evaluates V one "
            "truncated env at a time, ours in one batch",
            "rollout storage: SB3 keeps the rollout in numpy and converts each minibatch to torch; ours keeps "
            "torch tensors",
            "bookkeeping: SB3 also computes explained variance and logger records each update",
        ] + both
    raise ValueError(f"no Stable-Baselines3 counterpart for method {agent!r}; allowed: {sorted(COUNTERPARTS)}")


# --- the two sides ---------------------------------------------------------------------------

def time_ours(agent: str, total_steps: int, rules, L: int, H: int, seed: int, threads: int) -> dict:
    spec = TrainSpec(agent=agent, rules=tuple(rules), seed=seed, L=L, H=H, total_steps=total_steps,
                     eval_every=total_steps)
    with tempfile.TemporaryDirectory(prefix=f"tapebench-bench-sb3-{agent}-") as run_dir:
        manifest = train(spec, run_dir, device="cpu", threads=threads, quiet=True)
    steps, seconds = manifest["training"]["env_steps"], manifest["wall_time_s"]
    return {"env_steps": steps, "seconds": seconds, "steps_per_s": steps / seconds, "threads": manifest["threads"]}


def train_sb3(agent: str, settings: dict, rules, L: int, H: int, seed: int, threads: int) -> dict:
    """Train SB3's counterpart of `agent` on the registered Gymnasium env; returns the model and its timing."""
    # optional extra: loaded only by the SB3 benchmarks
    import stable_baselines3
    from stable_baselines3.common.env_util import make_vec_env

    # lazy: a command loads only the modules it runs
    from tapebench.envs.tape_env import TapeEnv

    algorithm = getattr(stable_baselines3, COUNTERPARTS[agent])
    with torch_settings(torch.device("cpu"), threads):
        # make_vec_env defaults render_mode to "rgb_array", which TapeEnv rejects (it renders "ansi" only)
        venv = make_vec_env(ENV_ID, n_envs=settings["n_envs"], seed=seed,
                            env_kwargs={"rules": list(rules), "L": L, "H": H, "render_mode": None})
        try:
            env_class = type(venv.envs[0].unwrapped)
            if not issubclass(env_class, TapeEnv):
                raise RuntimeError(f"{ENV_ID} made {env_class.__name__}, not tapebench's TapeEnv")
            model = algorithm("MlpPolicy", venv, device="cpu", seed=seed, verbose=0, **settings["kwargs"])
            start = time.perf_counter()
            model.learn(total_timesteps=settings["total_steps"])
            seconds = time.perf_counter() - start
            used_threads = torch.get_num_threads()
        finally:
            venv.close()
    if model.num_timesteps != settings["total_steps"]:
        raise RuntimeError(f"SB3 {COUNTERPARTS[agent]} ran {model.num_timesteps} env steps, expected "
                           f"{settings['total_steps']}")
    return {"model": model, "seconds": seconds, "threads": used_threads, "vec_env": type(venv).__name__,
            "env": f"{env_class.__module__}.{env_class.__name__}"}


def time_sb3(agent: str, settings: dict, rules, L: int, H: int, seed: int, threads: int) -> dict:
    run = train_sb3(agent, settings, rules, L, H, seed, threads)
    steps = run.pop("model").num_timesteps
    return {"env_steps": steps, "steps_per_s": steps / run["seconds"], **run}


def _describe(kwargs: dict) -> str:
    def show(v):
        if isinstance(v, type):
            return f"nn.{v.__name__}"
        if isinstance(v, float):
            return f"{v:g}"
        if isinstance(v, AnnealedLearningRate):
            return f"linear anneal from {v.learning_rate:g} (matched to ours)"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k}: {show(x)}" for k, x in v.items()) + "}"
        return repr(v)

    return ", ".join(f"{k}={show(v)}" for k, v in kwargs.items())


def _rule_set(args) -> tuple[list[int], str]:
    if args.split is not None:
        # lazy: a command loads only the modules it runs
        from tapebench.splits.io import load_split

        split = load_split(args.split)
        return list(split.train), f"train rules of split {split.name!r} ({args.split})"
    rules = parse_rule_list(args.rules)
    return rules, f"--rules {args.rules}"


def bench_sb3(args) -> dict:
    """Entry point for `tapebench bench sb3` (options: --agents --steps --rules/--split --L --H --threads
    --repeats --seed); `bench sb3 --learning` is `bench.sb3_learning`."""
    sb3 = require_sb3()
    # gymnasium: loaded only when the environment is registered
    import gymnasium

    agents = select_agents(args.agents, allowed=list(COUNTERPARTS), command="bench sb3")
    if args.device == "cuda":
        raise ValueError("`tapebench bench sb3` compares CPU training only; use --device cpu or auto")
    L, H = check_length(args.L), check_horizon(args.H)
    rules, rules_label = _rule_set(args)
    threads = args.threads or 1
    repeats = args.repeats
    plans = {}
    for agent in agents:
        config = build_config(agent, {})
        plans[agent] = (config, SETTINGS[agent](config, args.steps))

    load_before = _load()
    print(f"tapebench bench sb3: our {', '.join(a.upper() for a in agents)} (BatchedTapeEnv + shared training loop) "
          f"vs Stable-Baselines3 {sb3.__version__} on the real Gymnasium env {ENV_ID} (tapebench's TapeEnv, "
          f"one Python env per tape, via make_vec_env / DummyVecEnv) — what the batched env and loop buy")
    print(f"L={L}, H={H}, {len(rules)} training rules ({rules_label}; z ~ Unif(rules) at every reset), CPU, "
          f"{threads} torch thread(s) and deterministic algorithms on both sides, torch {torch.__version__}, "
          f"gymnasium {gymnasium.__version__}; load average {load_before}")
    print(f"each figure: median of {repeats} run(s) per side, ours and SB3 alternating; ratio = ours / SB3")
    figures: dict = {"stable_baselines3": sb3.__version__, "L": L, "H": H, "rules": len(rules),
                     "threads": threads, "load_average_before": load_before, "agents": {}}
    summary = []
    for agent in agents:
        config, settings = plans[agent]
        total = settings["total_steps"]
        print(f"\n{agent.upper()}: {total} env steps per run" +
              (f" (--steps {args.steps} rounded up to whole {'rollouts' if agent == 'ppo' else 'vectorised steps'})"
               if total != args.steps else ""))
        print(f"  ours: {agent} Config defaults: {_describe(dataclasses.asdict(config))}")
        print(f"  SB3:  {COUNTERPARTS[agent]}('MlpPolicy', make_vec_env({ENV_ID!r}, n_envs={settings['n_envs']}), "
              f"{_describe(settings['kwargs'])})")
        runs = []
        for r in range(repeats):
            order = ("ours", "sb3") if r % 2 == 0 else ("sb3", "ours")
            run = {}
            for side in order:
                if side == "ours":
                    run[side] = time_ours(agent, total, rules, L, H, args.seed, threads)
                else:
                    run[side] = time_sb3(agent, settings, rules, L, H, args.seed, threads)
            if run["ours"]["env_steps"] != run["sb3"]["env_steps"]:
                raise RuntimeError(f"{agent}: ours ran {run['ours']['env_steps']} env steps, SB3 "
                                   f"{run['sb3']['env_steps']}; the budgets must match")
            run["ratio"] = run["ours"]["steps_per_s"] / run["sb3"]["steps_per_s"]
            run["load_average"] = _load()
            runs.append(run)
            print(f"  run {r + 1}/{repeats}: ours {run['ours']['steps_per_s']:8.0f} env steps/s "
                  f"({run['ours']['seconds']:.1f} s), SB3 {run['sb3']['steps_per_s']:8.0f} env steps/s "
                  f"({run['sb3']['seconds']:.1f} s), ratio {run['ratio']:.2f}x; load average {run['load_average']}")
        ours = statistics.median(run["ours"]["steps_per_s"] for run in runs)
        theirs = statistics.median(run["sb3"]["steps_per_s"] for run in runs)
        ratio = statistics.median(run["ratio"] for run in runs)
        differences = remaining_differences(agent, config)
        figures["agents"][agent] = {"env_steps": total, "ours_steps_per_s": ours, "sb3_steps_per_s": theirs,
                                    "ratio": ratio, "runs": runs, "sb3_env": runs[0]["sb3"]["env"],
                                    "sb3_kwargs": repr(settings["kwargs"]), "remaining_differences": differences}
        summary.append((agent, total, ours, theirs, ratio))
        print("  remaining differences:")
        for line in differences:
            print(f"    - {line}")

    load_after = _load()
    figures["load_average_after"] = load_after
    print(f"\nenv steps/s, median of {repeats} run(s); ratio = median of the per-run ratios (SB3 on {ENV_ID} = tapebench.envs.tape_env.TapeEnv; "
          f"ours on BatchedTapeEnv):")
    print(f"  {'agent':<6} {'env steps':>9} {'ours':>9} {'SB3':>9} {'ours / SB3':>11}")
    for agent, total, ours, theirs, ratio in summary:
        print(f"  {agent:<6} {total:>9} {ours:>9.0f} {theirs:>9.0f} {ratio:>10.2f}x")
    print(f"load average (1, 5, 15 min): before {load_before}, after {load_after}; {threads} torch thread(s) "
          f"per side on a machine with {os.cpu_count()} cores")
    return figures
