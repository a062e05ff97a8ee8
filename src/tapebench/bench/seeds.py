"""`tapebench bench seeds`: N seeds in one process beside N one-seed processes (docs/protocol.md#seed-blocks).

For each agent and each N of `--seeds`, in the same run:

* one process: `tapebench train --seeds 0-(N-1) --stacking always` on `--device` (a stacked block where the method
  has `make_block`, else its seeds one after another in that process);
* separate: N processes `tapebench train --seed k` on the CPU, one after another on the same core (the baseline:
  one CPU core running the seeds one by one); with `--jobs J`, J at a time on their own cores and their wall
  times summed, which is the same figure where J idle cores are free (a GPU machine's), in 1/J of the time.

Both are whole processes, start-up included, each `--steps` env steps per seed with one checkpoint at the end,
at the agent's default hyperparameters, on `--rules` at `--L`/`--H`. Env steps/s per core = N x steps / wall
seconds of the one core. `startup_s` is a process's wall time outside the training loop (imports, building,
writing), read from the runs' train.json.

With `--floor`, each agent's one-seed run is trained once more under torch's FLOP counter (`bench flops`): its
matrix-product FLOPs at this core's best GEMM rate are the least time any implementation of the same
hyperparameters spends per seed. `at_most` is then the speedup a block of N would have if its training loop were
nothing but those FLOPs, its measured start-up kept: the most stacking could give over the measured `separate`.

With `--share K ...`, K processes, each a block of the largest N, start together on `--device` (K blocks sharing one
GPU, as `--resources gpu=K` lets the pipeline run them): their aggregate env steps/s, `gain` = that over one block
alone (the same run's `one_process`), and `slowdown` = a block's wall time sharing over alone (what `bench pipeline
--blocks-per-gpu K` scales the GPU jobs by).
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tapebench.bench.flops import counted_run_flops, gemm_rate
from tapebench.bench.training import select_agents
from tapebench.training.loop import TrainSpec
from tapebench.utils.artifacts import read_json
from tapebench.validation import parse_rule_list

DEFAULT_AGENTS = ["dqn", "ppo", "dreamer"]


def train_command(agent: str, seeds: list[int] | int, out: str, params: dict, source: list[str], device: str
                  ) -> list[str]:
    """One `tapebench train` process: a seed block (`seeds` a list, `out` with {seed}) or one seed (an int), on the
    rules of `source` (`["--rules", LIST]` or `["--split", PATH]`)."""
    chosen = ["--seed", str(seeds)] if isinstance(seeds, int) else \
        ["--seeds", f"{seeds[0]}-{seeds[-1]}", "--stacking", "always"]
    return [sys.executable, "-m", "tapebench", "train", "--agent", agent, *source, *chosen,
            "--params", json.dumps(params), "--device", device, "--threads", "1", "--quiet", "--out", out]


def timed_process(command: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command[2:6])} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return elapsed


def loop_seconds(run_dirs) -> float:
    """Wall seconds the training loops took (a block's seeds each record their share)."""
    return sum(read_json(Path(run) / "train.json", "training manifest")["wall_time_s"] for run in run_dirs)


def one_process(agent: str, n: int, params: dict, source: list[str], device: str, root: Path) -> tuple[float, float]:
    """(wall s, training-loop wall s) of one `tapebench train` process training seeds 0..n-1 as a block."""
    block_dir = root / f"{agent}_block{n}"
    wall = timed_process(train_command(agent, list(range(n)), str(block_dir / "seed{seed}"), params, source, device))
    return wall, loop_seconds(block_dir / f"seed{seed}" for seed in range(n))


def measure_block(agent: str, n: int, params: dict, rules: str, device: str, root: Path, jobs: int = 1) -> dict:
    """One agent's block of n seeds in one process, then its n one-seed processes, `jobs` at a time (each on its
    own core, one torch thread; their wall times are summed: what one core running them one by one takes)."""
    steps = params["training"]["total_steps"]
    seeds = list(range(n))
    source = ["--rules", rules]
    one_wall, one_loop = one_process(agent, n, params, source, device, root)
    separate_dirs = [root / f"{agent}_separate{n}" / f"seed{seed}" for seed in seeds]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        separate_wall = sum(pool.map(lambda seed: timed_process(
            train_command(agent, seed, str(separate_dirs[seed]), params, source, "cpu")), seeds))
    separate_loop = loop_seconds(separate_dirs)
    one, separate = n * steps / one_wall, n * steps / separate_wall
    return {"seeds": n, "env_steps": n * steps,
            "one_process": round(one, 1), "separate": round(separate, 1), "speedup": round(one / separate, 3),
            "one_process_wall_s": round(one_wall, 2), "separate_wall_s": round(separate_wall, 2),
            "one_process_loop_s": round(one_loop, 2), "separate_loop_s": round(separate_loop, 2),
            "one_process_startup_s": round(one_wall - one_loop, 2),
            "separate_startup_s": round(separate_wall - separate_loop, 2)}


def shared_device(agent: str, n: int, k: int, params: dict, rules: str, device: str, root: Path, alone: dict) -> dict:
    """k processes, each a block of n seeds, started together on `device` (k blocks sharing it), beside `alone`
    (measure_block's row of the same n: one such block by itself in the same run)."""
    steps = params["training"]["total_steps"]
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=k) as pool:
        processes = list(pool.map(lambda j: one_process(agent, n, params, ["--rules", rules], device,
                                                        root / f"share{k}_{j}"), range(k)))
    wall = time.perf_counter() - start
    slowest_loop = max(loop for _, loop in processes)
    aggregate = k * n * steps / wall
    return {"blocks": k, "seeds": n, "env_steps": k * n * steps, "wall_s": round(wall, 2),
            "aggregate": round(aggregate, 1), "gain": round(aggregate / alone["one_process"], 3),
            "slowdown": round(wall / alone["one_process_wall_s"], 3),
            "loop_slowdown": round(slowest_loop / alone["one_process_loop_s"], 3)}


def floor_loop_s(agent: str, params: dict, rules: str, flops_per_s: float) -> dict:
    """Seconds one seed's training run of `params` takes doing only its counted FLOPs at `flops_per_s`."""
    env, training = params["env"], params["training"]
    spec = TrainSpec(agent=agent, rules=tuple(parse_rule_list(rules)), seed=0, L=env["L"], H=env["H"],
                     total_steps=training["total_steps"], eval_every=training["eval_every"])
    _, flops = counted_run_flops(spec)
    return {"flops_per_seed": flops, "loop_s_per_seed": flops / flops_per_s}


def at_most(row: dict, floor: dict) -> dict:
    """The block of `row` with its loop at the arithmetic floor and its measured start-up: env steps/s per core and
    that over the measured separate processes' rate."""
    best = row["env_steps"] / (row["one_process_startup_s"] + row["seeds"] * floor["loop_s_per_seed"])
    return {"floor_one_process": round(best, 1), "at_most": round(best / row["separate"], 3)}


def bench_seeds(args) -> dict:
    agents = select_agents(args.agents or DEFAULT_AGENTS, command="bench seeds")
    parse_rule_list(args.rules)
    device = "cpu" if args.device == "auto" else args.device
    params = {"env": {"L": args.L, "H": args.H}, "training": {"total_steps": args.steps, "eval_every": args.steps}}
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    side = "one after another on one CPU core" if args.jobs == 1 else \
        f"{args.jobs} at a time on their own CPU cores, their wall times summed"
    print(f"seed blocks: {args.steps} env steps per seed, L = {args.L}, H = {args.H}, rules {args.rules}; one "
          f"process on {device} beside one-seed processes {side} (whole processes, one torch thread each)")
    floor = args.floor is not None
    print(f"{'agent':<14}{'N':>4}{'one process':>14}{'separate':>12}{'speedup':>9}"
          f"{'start-up one / separate (s)':>30}" + (f"{'at most':>9}" if floor else "") + "   env steps/s per core"
          + ("; at most: the block's loop at the arithmetic floor (this core's best GEMM rate), its start-up as "
             "measured" if floor else ""))
    figures: dict = {"device": device, "separate_jobs": args.jobs, "steps": args.steps, "L": args.L, "H": args.H,
                     "rules": args.rules, "agents": {}}
    if floor:
        figures["gemm_flops_per_s"] = gemm_rate(seconds=args.seconds / 3, repeats=args.repeats)
        figures["floor"] = {}
    with tempfile.TemporaryDirectory(prefix="tapebench-seeds-") as tmp:
        for agent in agents:
            rows = figures["agents"][agent] = {}
            if floor:
                figures["floor"][agent] = floor_loop_s(agent, params, args.rules, figures["gemm_flops_per_s"]["best"])
            for n in args.seeds:
                row = rows[str(n)] = measure_block(agent, n, params, args.rules, device, Path(tmp), args.jobs)
                if floor:
                    row.update(at_most(row, figures["floor"][agent]))
                print(f"{agent:<14}{n:>4}{row['one_process']:>14,.0f}{row['separate']:>12,.0f}"
                      f"{row['speedup']:>8.2f}x{row['one_process_startup_s']:>16.1f} / "
                      f"{row['separate_startup_s']:.1f}" + (f"{row['at_most']:>10.2f}x" if floor else ""),
                      flush=True)
            largest = max(args.seeds)
            for k in args.share or ():
                share = figures.setdefault("share", {}).setdefault(agent, {})[str(k)] = shared_device(
                    agent, largest, k, params, args.rules, device, Path(tmp), rows[str(largest)])
                print(f"{agent:<14}{largest:>4}  {k} blocks at once on {device}: {share['aggregate']:,.0f} env "
                      f"steps/s together, {share['gain']:.2f}x one block alone; each block's wall "
                      f"{share['slowdown']:.2f}x (its training loop {share['loop_slowdown']:.2f}x)", flush=True)
    return figures
