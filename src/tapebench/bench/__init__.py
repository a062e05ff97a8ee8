"""`tapebench bench WHAT`: benchmark commands that print figures (never timed tests).

Every figure is the median of `--repeats` timed runs of `--seconds` each, and every figure has a
baseline measured in the same run beside it, because the machines these run on are shared and noisy.

Adding a benchmark: write `def bench_NAME(args) -> dict` anywhere (it prints its figures and returns
them as a JSON-able dict) and add `"NAME": "dotted.module:function"` to `BENCHMARKS`. The target is
imported only when run, so heavy imports stay out of CLI start-up. Options shared by all benchmarks
are defined in `register`; read the ones you need from `args`.
"""
from __future__ import annotations

import argparse
import importlib
import os
import platform
import statistics
import time
from typing import Callable

import numpy as np

from tapebench import defaults
from tapebench.validation import check_horizon, check_length, check_output_file, parse_rule_list, seed_argument

BENCH_DESCRIPTION = """\
Print throughput figures, each beside a baseline measured in the same run: on a shared machine
figures are noisy, so compare a figure with its baseline rather than with an earlier run.
Each figure is the median of --repeats timed runs of --seconds each.

  ca     CA kernel tape-steps/s per core and batched environment steps/s, vs plain NumPy
  mpc    the planning reference on the paper protocol (30 test rules x 20 episodes, L = H = 32)
  dp     exact dynamic programming for all 256 rules at L = H = 16
  train  training steps/s per agent including evaluation, and the projected CPU-hours of the
         full protocol
  methods  evaluation time of the methods that do not train (Bayes filter, identify-then-plan, ...)
         on --rules x 20 episodes, beside the random policy, and their projected pipeline CPU-hours
  families  rule families (k colours, radius r): batched-environment steps/s on one thread for
         k=3 r=1, k=2 r=2, k=4 r=1 beside the elementary family (goal: k=3 r=1 within 2x), and the
         numba table kernel's cell updates/s beside the packed elementary kernel; --figure PATH
         writes a bar chart (PNG or PDF)
  pipeline  the projected CPU-hours and wall time on --cores of a config's whole DAG (--configfile,
         --target): each method the config uses timed in short runs (--steps), combined with the DAG's
         jobs; the top cost centres; --json PATH keeps cpu_hours, wall_hours and the measurements;
         --device cuda: on one machine of --cores cores and --gpus GPUs, the stacked seed blocks trained on the
         GPU (measured here, or read from --gpu-figures files of `bench seeds --device cuda --json`), with
         --blocks-per-gpu K that many at a time per GPU, each slowed as `bench seeds --share K` measured;
         --floor [STEPS] adds the arithmetic floor of the training and evaluation jobs: each distinct
         training run's FLOPs per env step counted (runs of STEPS / 2 and STEPS, default 4096) and each
         method's FLOPs per evaluated episode, at this core's best GEMM rate; per method and per main-study row
  flops  each --agents' (default dqn ppo dreamer) training loop beside its arithmetic ceiling: the same short run
         (--steps) timed and with its matrix-product FLOPs counted; ceiling = those FLOPs alone at this core's
         best GEMM rate, the most env steps/s any implementation at the same hyperparameters could reach
  seeds  seed blocks (docs/protocol.md#seed-blocks): for each --agents (default dqn ppo dreamer) and each N of
         --seeds (default 1 4 20), N seeds trained for --steps env steps each in ONE process (`tapebench train
         --seeds`, on --device) beside N one-seed processes one after another on the same core (on the CPU);
         whole processes, start-up included; env steps/s per core and their ratio (speedup); --floor adds the
         most a block could give (at most): its loop nothing but each seed's counted FLOPs at this core's best
         GEMM rate, its start-up as measured; --share K ... adds K blocks of the largest N at once on --device
         (blocks sharing one GPU): their aggregate env steps/s beside one block alone
  grid   the 2D grid kernels (docs/protocol.md#grid): grid-steps/s on 8 x 8 torus grids of the NumPy reference,
         the bit-packed numba kernel (goal: >= 20x the reference) and the torch kernel, for Moore and von Neumann
         rules
  world-model  DreamerV3's world model alone, trained on random-policy data of the main split: its one-step
         error (ID / OOD) for the defaults and each --variants override set, at --points points of --steps;
         --agents ID ... studies whole world-model methods instead (e.g. ensemble_mpc ensemble_mpc_equivariant)
"""

BENCHMARKS: dict[str, str] = {
    "ca": "tapebench.bench:bench_ca",
    "train": "tapebench.bench.training:bench_train",
    "mpc": "tapebench.bench.oracle:bench_mpc",
    "dp": "tapebench.bench.oracle:bench_dp",
    "sb3": "tapebench.bench.sb3:bench_sb3",
    "methods": "tapebench.bench.methods:bench_methods",
    "families": "tapebench.bench:bench_families",
    "flops": "tapebench.bench.flops:bench_flops",
    "pipeline": "tapebench.pipeline.projection:bench_pipeline",
    "world-model": "tapebench.bench.world_model:bench_world_model",
    "seeds": "tapebench.bench.seeds:bench_seeds",
    "grid": "tapebench.bench.grid:bench_grid",
}
# `bench WHAT --learning`: the benchmarks that compare learning instead of throughput
LEARNING_BENCHMARKS: dict[str, str] = {
    "sb3": "tapebench.bench.sb3_learning:bench_sb3_learning",
}

KERNEL_GOAL = 2e8        # packed numba kernel, tape-steps/s on one core
ENV_GOAL = 5e6           # BatchedTapeEnv on CPU, env steps/s with 4096 tapes
KERNEL_BATCH = 1 << 16   # tapes per kernel call: large enough that call overhead is negligible
EVOLVE_STEPS = 64
ACTION_POOL = 64         # pre-drawn action batches cycled through, so the RNG is not timed
CA_ENVS = 4096           # default tapes of the `ca` environment figures
FAMILY_ENVS = 256        # default tapes of the `families` environment figures
DEFAULT_SEEDS = 5        # sb3 --learning and world-model: seeds per side / variant
SEED_BLOCK_SIZES = (1, 4, 20)   # bench seeds: seeds per process measured
FLOOR_STEPS = 4096       # pipeline --floor: env steps of the longer counted run per training shape; with a power
                         # of two both runs end on an update of every built-in method (PPO's every 2,048 steps)


def register(sub) -> None:
    p = sub.add_parser("bench", description=BENCH_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=sorted(BENCHMARKS), help="which benchmark (see above)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="devices for torch figures: auto = cpu, plus cuda when available (default auto)")
    p.add_argument("--num-envs", type=int, default=None,
                   help=f"parallel tapes for environment figures (default {CA_ENVS} for ca, "
                        f"{FAMILY_ENVS} for families)")
    p.add_argument("--seconds", type=float, default=1.0, help="length of one timed run (default 1.0)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per figure; the median is shown")
    p.add_argument("--L", type=int, default=defaults.L, help=f"tape length (default {defaults.L})")
    p.add_argument("--H", type=int, default=defaults.H, help=f"horizon for environment figures (default {defaults.H})")
    p.add_argument("--rules", default="0-255", help="rule set for environment figures (default 0-255)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads for environment figures (default: torch's own setting; grid: 1)")
    p.add_argument("--seed", type=seed_argument, default=0, help="seed of the random tapes and actions (default 0)")
    p.add_argument("--agents", nargs="+", default=None, metavar="ID",
                   help="methods to bench (train: any that train, default all of them; flops: any that train, "
                        "default dqn ppo dreamer; sb3: dqn and/or ppo, default both; world-model: methods with a "
                        "world model, instead of --variants); put the benchmark name first: `bench train --agents dqn`")
    p.add_argument("--steps", type=int, default=20_000,
                   help="training env steps per agent for train, flops and sb3 (default 20000)")
    p.add_argument("--split", default=None, metavar="PATH",
                   help="sb3: train on this split file's train rules instead of --rules; sb3 --learning: the "
                        "split of the main task (a path or a name in results/splits, default main)")
    p.add_argument("--learning", action="store_true",
                   help="sb3: compare learning instead of throughput: both sides train --seeds seeds on each "
                        "--fixed-rules rule (L = H = 16) and on the main split (--L, --H), evaluated on the same "
                        "episodes; success with bootstrap CIs side by side")
    p.add_argument("--seeds", type=int, nargs="+", default=None, metavar="N",
                   help="sb3 --learning: seeds per side and task; world-model: seeds per variant (one value, "
                        f"default {DEFAULT_SEEDS}); seeds: the block sizes to measure (default "
                        f"{' '.join(map(str, SEED_BLOCK_SIZES))})")
    p.add_argument("--tasks", nargs="+", default=["fixed", "main"], choices=["fixed", "main"],
                   help="sb3 --learning: the fixed-rule tasks and/or the main split (default both)")
    p.add_argument("--fixed-rules", default=None,
                   help="sb3 --learning: the single-rule tasks (default the six representative rules)")
    p.add_argument("--episodes-per-rule", type=int, default=defaults.EPISODES_PER_RULE,
                   help=f"sb3 --learning, world-model: evaluation episodes per rule (default "
                        f"{defaults.EPISODES_PER_RULE}, the protocol's)")
    p.add_argument("--jobs", type=int, default=1,
                   help="sb3 --learning, world-model: runs in parallel processes, 1 torch thread each; seeds: the "
                        "one-seed baseline processes run this many at a time, their wall times summed (default 1)")
    p.add_argument("--variants", nargs="+", default=None, metavar="FIELD=V[;FIELD=V]",
                   help="world-model: override sets of the world model's settings, one variant each (default: "
                        "capacity, latent size, train ratio, KL balance, free bits, chunking)")
    p.add_argument("--points", type=int, default=4,
                   help="world-model: measuring points, evenly spaced over --steps (default 4)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the figures to this JSON file")
    p.add_argument("--figure", default=None, metavar="PATH",
                   help="families: write a bar chart of env steps/s per family here (.png or .pdf)")
    p.add_argument("--configfile", nargs="+", default=None, metavar="FILE",
                   help="pipeline: config overlays, as for snakemake (default: config/config.yaml alone)")
    p.add_argument("--cores", type=int, default=8, help="pipeline: cores the wall time is projected on (default 8)")
    p.add_argument("--target", nargs="+", default=None, metavar="PATH",
                   help="pipeline: project only what these targets need (default: the whole DAG)")
    p.add_argument("--share", type=int, nargs="+", default=None, metavar="K",
                   help="seeds: also K blocks of the largest --seeds at once on --device, each K (blocks sharing one "
                        "GPU): their aggregate env steps/s beside one block alone")
    p.add_argument("--gpus", type=int, default=1, help="pipeline --device cuda: GPUs of the machine (default 1)")
    p.add_argument("--blocks-per-gpu", type=int, default=1, metavar="K",
                   help="pipeline --device cuda: stacked blocks sharing each GPU at a time (`snakemake --resources "
                        "gpu=K` on a one-GPU machine), each slowed as `bench seeds --share K` measured it in the "
                        "--gpu-figures files (default 1)")
    p.add_argument("--gpu-figures", nargs="+", default=None, metavar="PATH",
                   help="pipeline --device cuda: the stacked blocks' GPU rates from `bench seeds --device cuda --json` "
                        "files instead of measuring them here (a machine without a GPU can project for one)")
    p.add_argument("--floor", type=int, nargs="?", const=FLOOR_STEPS, default=None, metavar="STEPS",
                   help="pipeline: also the arithmetic floor of the training and evaluation jobs, from counted runs "
                        f"of STEPS / 2 and STEPS env steps per distinct training run (default {FLOOR_STEPS}) and "
                        "each method's evaluation played again under the FLOP counter; seeds (no STEPS): the most a "
                        "block could give, from one seed's --steps run under the FLOP counter")
    p.set_defaults(func=run)


def run(args) -> int:
    check_options(args)
    module_name, func_name = (LEARNING_BENCHMARKS if args.learning else BENCHMARKS)[args.what].split(":")
    bench: Callable = getattr(importlib.import_module(module_name), func_name)
    figures = bench(args)
    if args.json:
        # lazy: a command loads only the modules it runs
        from tapebench.utils.io import provenance, write_json

        options = {k: v for k, v in vars(args).items() if k not in ("func", "json", "command")}
        write_json(args.json, {"benchmark": args.what, "figures": figures,
                               **provenance(options, args.seed, host=host_description())})
        print(f"figures written to {args.json}")
    return 0


def check_options(args) -> None:
    if args.what == "seeds":
        args.seeds = args.seeds or list(SEED_BLOCK_SIZES)
        if min(args.seeds) < 1:
            raise ValueError(f"--seeds (seeds per process) must be >= 1, got {args.seeds}")
    elif args.seeds is not None and len(args.seeds) != 1:
        raise ValueError(f"bench {args.what} takes one --seeds value, got {args.seeds}")
    else:
        args.seeds = args.seeds[0] if args.seeds else DEFAULT_SEEDS
    check_output_file(args.json, "--json")
    check_output_file(args.figure, "--figure")
    if args.learning and args.what not in LEARNING_BENCHMARKS:
        raise ValueError(f"--learning is an option of {sorted(LEARNING_BENCHMARKS)}, not of bench {args.what}")
    if args.num_envs is not None and args.num_envs < 1:
        raise ValueError(f"--num-envs must be >= 1, got {args.num_envs}")
    if not args.seconds > 0:
        raise ValueError(f"--seconds must be > 0, got {args.seconds}")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if args.steps < 1:
        raise ValueError(f"--steps must be >= 1 (environment steps), got {args.steps}")
    if args.share is not None and (args.what != "seeds" or min(args.share) < 1):
        raise ValueError(f"--share K (blocks at once, K >= 1) is an option of bench seeds, got {args.share} for "
                         f"bench {args.what}")
    if args.floor is not None and args.what not in ("pipeline", "seeds"):
        raise ValueError(f"--floor is an option of bench pipeline and bench seeds, not of bench {args.what}")
    if args.what == "seeds" and args.floor not in (None, FLOOR_STEPS):
        raise ValueError(f"bench seeds --floor counts the FLOPs of the --steps run itself and takes no STEPS, "
                         f"got {args.floor}")
    if args.floor is not None and args.device == "cuda":
        raise ValueError("--floor is the CPU's arithmetic floor: leave out --device cuda")
    if args.floor is not None and (args.floor < FLOOR_STEPS or args.floor & (args.floor - 1)):
        raise ValueError(f"--floor STEPS must be a power of two >= {FLOOR_STEPS} (so that both counted runs end on an "
                         f"update of every built-in method: PPO updates every 2,048 steps), got {args.floor}")
    if args.figure is not None and os.path.splitext(args.figure)[1].lower() not in (".png", ".pdf"):
        raise ValueError(f"--figure must end in .png or .pdf, got {args.figure!r}")
    check_length(args.L)
    check_horizon(args.H)
    parse_rule_list(args.rules)
    if args.blocks_per_gpu != 1 and args.what != "pipeline":
        raise ValueError(f"--blocks-per-gpu is an option of bench pipeline, not of bench {args.what}")
    if args.blocks_per_gpu < 1:
        raise ValueError(f"--blocks-per-gpu must be >= 1, got {args.blocks_per_gpu}")
    if args.blocks_per_gpu > 1 and (args.device != "cuda" or not args.gpu_figures):
        raise ValueError(f"--blocks-per-gpu {args.blocks_per_gpu} reads each block's slowdown on a shared GPU from "
                         f"`tapebench bench seeds --device cuda --share {args.blocks_per_gpu} --json` files: give "
                         f"them with --device cuda --gpu-figures")
    if args.gpu_figures is not None and (args.what != "pipeline" or args.device != "cuda"):
        raise ValueError("--gpu-figures is an option of bench pipeline --device cuda")
    if args.device == "cuda" and args.gpu_figures is None:
        # torch is heavy: loaded only when this runs
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda was asked for, but torch.cuda.is_available() is False; "
                             "use --device cpu or auto")


# --- measurement ---------------------------------------------------------------------------

def measure(step: Callable[[], object], units_per_call: float, seconds: float, repeats: int,
            sync: Callable[[], None] = lambda: None) -> float:
    """Median over `repeats` runs of units processed per second; each run lasts >= `seconds`."""
    step()
    sync()
    rates = []
    for _ in range(repeats):
        calls = 0
        start = time.perf_counter()
        while True:
            step()
            calls += 1
            if calls % 4 == 0 and time.perf_counter() - start >= seconds:
                break
        sync()
        rates.append(calls * units_per_call / (time.perf_counter() - start))
    return statistics.median(rates)


def run_parallel(function: Callable, items: list, jobs: int, report: Callable[[object, int, int], None]) -> list:
    """`function` on every item, in `jobs` spawned worker processes (1: in this one), calling
    `report(result, done, total)` as each finishes; results in finishing order."""
    results = []
    if jobs == 1:
        for item in items:
            results.append(function(item))
            report(results[-1], len(results), len(items))
        return results
    # the standard library's process pool: loaded only when a benchmark runs in parallel
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for future in concurrent.futures.as_completed([pool.submit(function, item) for item in items]):
            results.append(future.result())
            report(results[-1], len(results), len(items))
    return results


def host_description() -> dict:
    # numba is heavy: loaded only when this runs
    import numba
    import torch

    return {"machine": platform.machine(), "processor": platform.processor() or "", "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "numpy": np.__version__, "numba": numba.__version__,
            "torch": torch.__version__}


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def fmt(x: float) -> str:
    return f"{x:.3g}"


# --- naive NumPy baselines (deliberately plain; only the benchmark uses them) ----------------

RULE_TABLES = ((np.arange(256)[:, None] >> np.arange(8)) & 1).astype(np.uint8)   # (256, 8)


def numpy_ca_step(tapes: np.ndarray, rule: int) -> np.ndarray:
    """np.roll-based CA step of a (N, L) uint8 batch under one rule."""
    idx = (np.roll(tapes, 1, axis=1) << 2) | (tapes << 1) | np.roll(tapes, -1, axis=1)
    return RULE_TABLES[rule][idx]


class NumpyBatchedEnv:
    """Naive NumPy re-statement of `BatchedTapeEnv.step` (all-zero goal, auto-reset on)."""

    def __init__(self, num_envs: int, L: int, H: int, rules, seed: int):
        self.rng = np.random.default_rng(seed)
        self.L, self.H, self.rule_set = L, H, np.asarray(rules)
        self.rows = np.arange(num_envs)
        self.tapes = self._draw(num_envs)
        self.rules = self.rng.choice(self.rule_set, num_envs)
        self.t = np.zeros(num_envs, dtype=np.int64)

    def _draw(self, n):
        tapes = self.rng.integers(0, 2, (n, self.L), dtype=np.uint8)
        empty = ~tapes.any(axis=1)
        while empty.any():
            tapes[empty] = self.rng.integers(0, 2, (int(empty.sum()), self.L), dtype=np.uint8)
            empty = ~tapes.any(axis=1)
        return tapes

    def observation(self):
        return np.concatenate([self.tapes.astype(np.float32), (self.t / self.H).astype(np.float32)[:, None]], 1)

    def step(self, actions):
        self.tapes[self.rows, actions] ^= 1
        tapes = self.tapes
        idx = (np.roll(tapes, 1, axis=1) << 2) | (tapes << 1) | np.roll(tapes, -1, axis=1)
        self.tapes = np.take_along_axis(RULE_TABLES[self.rules], idx, axis=1)
        self.t += 1
        dist = self.tapes.mean(axis=1, dtype=np.float32)
        terminated = dist == 0
        truncated = ~terminated & (self.t >= self.H)
        reward = -dist + terminated.astype(np.float32)
        info = {"dist": dist, "rule": self.rules.copy(), "t": self.t.copy(), "final_obs": self.observation()}
        done = np.flatnonzero(terminated | truncated)
        if len(done):
            self.tapes[done] = self._draw(len(done))
            self.rules[done] = self.rng.choice(self.rule_set, len(done))
            self.t[done] = 0
        return self.observation(), reward, terminated, truncated, info


# --- `bench ca` ----------------------------------------------------------------------------

def env_steps_per_second(env_cls, torch, device, n, L, H, rules, seed, seconds, repeats, **env_kwargs) -> float:
    env = env_cls(n, L=L, H=H, rules=rules, device=device, seed=seed, **env_kwargs)
    env.reset()
    gen = torch.Generator().manual_seed(seed)
    actions = [torch.randint(0, L, (n,), generator=gen).to(device) for _ in range(ACTION_POOL)]
    calls = iter(range(1 << 62))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with torch.no_grad():
        return measure(lambda: env.step(actions[next(calls) % ACTION_POOL]), n, seconds, repeats, sync)


def bench_ca(args) -> dict:
    # numba is heavy: loaded only when this runs
    import numba
    import torch

    # lazy: a command loads only the modules it runs
    from tapebench.ca import packed
    from tapebench.envs.batched import BatchedTapeEnv

    L, seconds, repeats = check_length(args.L), args.seconds, args.repeats
    rules = parse_rule_list(args.rules)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    devices = ["cpu"] if args.device == "cpu" else ["cuda"] if args.device == "cuda" else \
        ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"tapebench bench ca: L={L}, {os.cpu_count()} CPU cores, numpy {np.__version__}, "
          f"numba {numba.__version__}, torch {torch.__version__}")
    print(f"each figure: median of {repeats} runs x {seconds:g} s; on a shared machine figures are noisy, "
          f"compare a figure with the baseline printed beside it (load average now: {load_average()})")
    figures: dict = {"kernel": {}, "env": {}}

    # (a) packed numba kernel, one thread (the kernels have no parallel loops)
    print(f"\n(a) CA kernel: tape-steps/s on one core, batch of {KERNEL_BATCH} tapes "
          f"(goal >= {KERNEL_GOAL:.0e} for the numba kernel)")
    print(f"  {'rule':>4}  {'numba step_words':>16}  {'numba evolve_words':>18}  {'numpy np.roll':>13}  "
          f"{'speed-up':>8}  goal")
    rng = np.random.default_rng(args.seed)
    tapes = rng.integers(0, 2, (KERNEL_BATCH, L), dtype=np.uint8)
    words = packed.pack(tapes)
    for rule in (30, 110):
        if not np.array_equal(packed.unpack(packed.step_words(words, rule, L), L), numpy_ca_step(tapes, rule)):
            raise RuntimeError(f"NumPy baseline and numba kernel disagree for rule {rule}")
        step = measure(lambda: packed.step_words(words, rule, L), KERNEL_BATCH, seconds, repeats)
        evolve = measure(lambda: packed.evolve_words(words, rule, L, EVOLVE_STEPS),
                         KERNEL_BATCH * EVOLVE_STEPS, seconds, repeats)
        base = measure(lambda: numpy_ca_step(tapes, rule), KERNEL_BATCH, seconds, repeats)
        met = "met" if min(step, evolve) >= KERNEL_GOAL else "MISSED"
        print(f"  {rule:>4}  {fmt(step):>16}  {fmt(evolve):>18}  {fmt(base):>13}  {step / base:>7.0f}x  {met}")
        figures["kernel"][str(rule)] = {"step_words": step, "evolve_words": evolve, "numpy_baseline": base}

    # (b, c) batched environment
    n, H = args.num_envs or CA_ENVS, args.H
    print(f"\n(b) BatchedTapeEnv.step: env steps/s, {n} tapes, rules {args.rules}, H={H}, auto-reset on, "
          f"random actions (goal >= {ENV_GOAL:.0e} on CPU)")
    numpy_env = NumpyBatchedEnv(n, L, H, rules, args.seed)
    np_actions = [rng.integers(0, L, n) for _ in range(ACTION_POOL)]
    np_calls = iter(range(1 << 62))
    base = measure(lambda: numpy_env.step(np_actions[next(np_calls) % ACTION_POOL]), n, seconds, repeats)
    figures["env"]["numpy_baseline"] = base
    print(f"  {'device':<18}  {'torch env':>10}  {'numpy env':>10}  {'speed-up':>8}  goal")
    runs = [(d, None) for d in devices]
    if "cpu" in devices and args.threads is None and torch.get_num_threads() > 1:
        runs.insert(1, ("cpu", 1))   # the per-core figure beside torch's default thread count
    for device, threads in runs:
        default_threads = torch.get_num_threads()
        if threads is not None:
            torch.set_num_threads(threads)
        try:
            rate = env_steps_per_second(BatchedTapeEnv, torch, device, n, L, H, rules, args.seed, seconds, repeats)
            used = torch.get_num_threads()
        finally:
            torch.set_num_threads(default_threads)
        label = f"cpu ({used} thread{'s' if used > 1 else ''})" if device == "cpu" else torch.cuda.get_device_name()
        met = ("met" if rate >= ENV_GOAL else "MISSED") if device == "cpu" else ""
        print(f"  {label:<18}  {fmt(rate):>10}  {fmt(base):>10}  {rate / base:>7.1f}x  {met}")
        key = device if threads is None else f"{device}_{threads}thread"
        figures["env"][key] = {"steps_per_s": rate, "threads": used if device == "cpu" else None}
    if "cuda" not in devices:
        print("  (c) cuda: not available here")
    return figures


# --- `bench families` ------------------------------------------------------------------------

FAMILY_GOAL_RATIO = 2.0        # k = 3, r = 1 env steps/s within 2x of the elementary family
BENCH_FAMILIES = ((3, 1), (2, 2), (4, 1))
FAMILY_RULES = 64              # random rules per family (tables drawn uniformly, seeded)
TABLE_KERNEL_BATCH = 1 << 14   # tapes per numba kernel call


def bench_families(args) -> dict:
    """Batched-env steps/s per family on one thread (elementary baseline in the same run) and the numba
    table kernel's cell updates/s beside the packed elementary kernel."""
    # numba is heavy: loaded only when this runs
    import numba
    import torch

    # lazy: a command loads only the modules it runs
    from tapebench.ca import packed, table_kernel
    from tapebench.envs.batched import BatchedTapeEnv
    from tapebench.rule_family import ELEMENTARY, RuleFamily

    L, H, seconds, repeats = check_length(args.L), args.H, args.seconds, args.repeats
    n = args.num_envs or FAMILY_ENVS
    threads = args.threads or 1
    device = "cuda" if args.device == "cuda" else "cpu"
    rng = np.random.default_rng(args.seed)
    families = [ELEMENTARY] + [RuleFamily(k, r) for k, r in BENCH_FAMILIES]
    rule_sets = {ELEMENTARY.name: parse_rule_list(args.rules)}
    for family in families[1:]:
        tables = rng.integers(0, family.k, (FAMILY_RULES, family.neighbourhoods), dtype=np.uint8)
        rule_sets[family.name] = [family.number(t) for t in tables]
    print(f"tapebench bench families: L={L}, H={H}, {n} tapes, {threads} torch thread(s) on {device}, numba "
          f"{numba.__version__}, torch {torch.__version__}; elementary rules {args.rules}, "
          f"{FAMILY_RULES} random rules per other family")
    print(f"each figure: median of {repeats} runs x {seconds:g} s (load average now: {load_average()})")
    figures: dict = {"env": {}, "kernel": {}, "num_envs": n, "threads": threads, "device": device}

    print(f"\n(a) BatchedTapeEnv.step: env steps/s, auto-reset on, random actions "
          f"(goal: k=3 r=1 within {FAMILY_GOAL_RATIO:g}x of the elementary family)")
    print(f"  {'family':<8}  {'steps/s':>10}  {'elementary / family':>19}")
    default_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for family in families:
            rate = env_steps_per_second(BatchedTapeEnv, torch, device, n, L, H, rule_sets[family.name], args.seed,
                                        seconds, repeats, family=family)
            figures["env"][family.name] = {"k": family.k, "r": family.r, "steps_per_s": rate}
    finally:
        torch.set_num_threads(default_threads)
    base = figures["env"][ELEMENTARY.name]["steps_per_s"]
    for name, row in figures["env"].items():
        row["slowdown"] = base / row["steps_per_s"]
        note = ""
        if (row["k"], row["r"]) == (3, 1):
            note = "  met" if row["slowdown"] <= FAMILY_GOAL_RATIO else "  MISSED"
        print(f"  {name:<8}  {fmt(row['steps_per_s']):>10}  {row['slowdown']:>18.2f}x{note}")

    print(f"\n(b) numba kernels: cell updates/s on one core, {TABLE_KERNEL_BATCH} tapes of L={L}, "
          f"one random rule per tape")
    print(f"  {'family':<8}  {'kernel':<24}  {'cell updates/s':>14}  {'packed / kernel':>15}")
    tapes2 = rng.integers(0, 2, (TABLE_KERNEL_BATCH, L), dtype=np.uint8)
    words = packed.pack(tapes2)
    eca_rules = rng.integers(0, 256, TABLE_KERNEL_BATCH).astype(np.uint64)
    packed_rate = measure(lambda: packed.step_words_rules(words, eca_rules, L), TABLE_KERNEL_BATCH * L,
                          seconds, repeats)
    figures["kernel"]["packed_eca"] = {"cell_updates_per_s": packed_rate}
    print(f"  {'eca':<8}  {'packed.step_words_rules':<24}  {fmt(packed_rate):>14}  {1.0:>14.2f}x")
    for family in families:
        tables = rng.integers(0, family.k, (FAMILY_RULES, family.neighbourhoods), dtype=np.uint8)
        tapes = rng.integers(0, family.k, (TABLE_KERNEL_BATCH, L), dtype=np.uint8)
        index = rng.integers(0, FAMILY_RULES, TABLE_KERNEL_BATCH)
        k, r = family.k, family.r
        rate = measure(lambda: table_kernel.step_nb(tapes, tables, index, k, r), TABLE_KERNEL_BATCH * L,
                       seconds, repeats)
        figures["kernel"][family.name] = {"k": k, "r": r, "cell_updates_per_s": rate,
                                          "packed_over_table": packed_rate / rate}
        print(f"  {family.name:<8}  {'table_kernel.step':<24}  {fmt(rate):>14}  {packed_rate / rate:>14.2f}x")

    if args.figure:
        write_family_figure(args.figure, figures, n, L, threads, device)
        print(f"\nfigure written to {args.figure}")
    return figures


def write_family_figure(path: str, figures: dict, n: int, L: int, threads: int, device: str) -> None:
    """Bars of env steps/s per family, each labelled with its slowdown vs the elementary family."""
    # matplotlib is heavy: only figure builders load it
    import matplotlib

    matplotlib.use("Agg")
    # matplotlib is heavy: only figure builders load it
    import matplotlib.pyplot as plt

    # lazy: a command loads only the modules it runs
    from tapebench.utils.io import atomic_path

    rows = figures["env"]
    names = list(rows)
    rates = [rows[name]["steps_per_s"] for name in names]
    labels = ["elementary" if name == "eca" else f"k={rows[name]['k']}, r={rows[name]['r']}" for name in names]
    fig, ax = plt.subplots(figsize=(3.3, 2.4))
    bars = ax.bar(labels, rates, color=["#4d4d4d"] + ["#0072b2"] * (len(names) - 1))
    ax.axhline(rates[0] / FAMILY_GOAL_RATIO, color="#d55e00", linestyle="--", linewidth=1,
               label=f"elementary / {FAMILY_GOAL_RATIO:g}")
    for bar, name in zip(bars, names):
        ax.annotate(f"{rows[name]['slowdown']:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=7)
    ax.set_ylabel("env steps / s")
    ax.set_title(f"BatchedTapeEnv, N={n}, L={L}, {threads} thread(s), {device}", fontsize=7)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6, loc="lower left")
    ax.set_ylim(0, max(rates) * 1.15)
    fig.tight_layout()
    suffix = os.path.splitext(path)[1] or ".png"
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=suffix.lstrip("."), dpi=200)
    plt.close(fig)
