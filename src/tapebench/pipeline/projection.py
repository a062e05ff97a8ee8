"""`tapebench bench pipeline`: the projected cost of a configured DAG (docs/protocol.md#compute).

One run measures what the config's jobs cost on this machine and combines it with the DAG:

1. the DAG: `snakemake --dry-run --forceall` for the config (and targets), parsed into jobs (rule, wildcards,
   inputs, outputs) and their dependencies (an input another job writes);
2. per method the config uses, short timed runs at the config's hyperparameters and tape length: training
   env steps/s (`--steps` steps, one torch thread), and the evaluation cost per episode step on 16 rules of the
   split drawn at random (`sample_rules`; a trained method: its short run's last checkpoint);
3. the start-up of a light job (pandas and pyarrow), of a figure job (matplotlib) and of a torch job, as the
   pipeline will start them: forks of a job server when the config's `execution.job_server` is on (its imports
   counted once), else a process each;
4. each job's CPU-seconds from its rule and wildcards (`job_seconds`: a training job's steps over the method's
   steps/s, an evaluation's checkpoints x episodes x H x cost per episode step, plus its start-up; every other
   job a start-up), then the wall time on N cores by list scheduling of the dependency graph (longest job first
   among the ready ones);
5. with `--floor`, the arithmetic floor of the training and evaluation jobs: each distinct training run's
   matrix-product FLOPs per env step (counted, `measure_floor`) and each method's FLOPs per evaluated episode
   (counted in `measure`), at this core's best GEMM rate (`floor_seconds`).

Every timing is CPU time (the process's, or its children's for start-ups), so a loaded machine slows the
measurement but hardly moves the figures; the wall time assumes idle cores. What is estimated rather than
measured is named in the output. Compare the projection with a measured run of the same config (`tapebench status` and the compute
table show what the runs cost).
"""
from __future__ import annotations

import contextlib
import dataclasses
import heapq
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from tapebench import jobserver
from tapebench.pipeline.config import (budget_train_slice, dumps, fixed_z_train_slice, load_config, split_rule_space,
                                       sweep_train_slice, train_slice, training_stacking, validate_config)
from tapebench.layout import BLOCK_RULE
from tapebench.registry import get_method
from tapebench.rule_family import config_family
from tapebench.schemas import WORLDTEST_AGGREGATE_COLUMNS
from tapebench.settings import budget_schedule, checkpoints_per_run, worldtest_study
from tapebench.splits.io import save_split
from tapebench.utils.io import write_parquet

JOB_HEADER = re.compile(r"^(?:local)?rule (\w+):$")
SAMPLE_RULES = 16            # evaluation cost is timed on at most this many rules of the split, then scaled
# the world test on at most this many (half on each side): a learned model's planner rolls rows out in chunks, so
# fewer rows than a chunk per side would time a chunk's fixed cost as if it were per rule
WORLDTEST_SAMPLE_RULES = 64
TRAIN_RULES = ("train", "train_block", "train_fixed_z", "train_multi_rule", "train_sweep", "train_budget")
EVAL_RULES = ("evaluate", "evaluate_fixed_z", "evaluate_multi_rule", "evaluate_sweep", "evaluate_noise",
              "evaluate_budget")
METHOD_EVAL_RULES = ("evaluate_method", "evaluate_noise_method")
WORLDTEST_RULES = ("worldtest_method", "worldtest_trained")
ORACLE_RULES = ("mpc_split", "mpc_by_type", "fixed_z_oracle", "oracle_multi_rule")
TORCH_RULES = ("model_error", "model_error_sweep")
LATEX_RULES = ("report_pdf", "latex_check")
MAIN_ROW_RULES = ("train", "train_block", "evaluate", "evaluate_method")   # a method's row of the main study (Table 3)
LATEX_ESTIMATE_S = 20.0      # a LaTeX compile: estimated, not measured (LaTeX may be absent)


def run_fields(config: dict) -> dict:
    """The TrainSpec fields the config's rule family and goal protocol give every run it trains (the projection
    trains and evaluates as the DAG's jobs do: on the config's family, towards its goals)."""
    family = config_family(config)
    env = config["env"]
    return {"family": None if family.elementary else family.as_dict(), "goal": env["goal"],
            "goal_steps": int(env["goal_steps"])}


def goal_fields(config: dict) -> dict:
    """The evaluation's goal arguments (`evaluate_run`, `side_protocols`) of the config's goal protocol."""
    env = config["env"]
    return {"goal_mode": env["goal"], "goal_steps": int(env["goal_steps"])}


def protocol_fields(config: dict) -> dict:
    """The evaluation protocol's family and goal arguments (`side_protocols`) for a rule list of the config."""
    return {"family": config_family(config), **goal_fields(config)}


def sample_rules(rules: list, k: int, seed: int = 0) -> list:
    """At most `k` of `rules`, drawn without replacement by a seeded generator, in the order drawn (so the first half
    is a random half). The evaluation cost is timed on them and scaled to every rule, so they must play episodes of
    the usual length: every 16th rule of 0..255 (rules 0, 16, ..., 240, whose four lowest neighbourhoods all map to
    0) ends a planner's episodes in about 7 steps where all rules take about 26 at H = 32."""
    if len(rules) <= k:
        return list(rules)
    return [rules[i] for i in np.random.default_rng(seed).choice(len(rules), k, replace=False)]


@dataclass
class DagJob:
    jobid: int
    rule: str
    wildcards: dict = field(default_factory=dict)
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)


def parse_dry_run(text: str) -> list[DagJob]:
    """Jobs of `snakemake --dry-run` output: rule, wildcards, inputs, outputs, job id."""
    jobs, job = [], None
    for line in text.splitlines():
        header = JOB_HEADER.match(line.strip()) if not line.startswith("    ") else None
        if header:
            job = DagJob(-1, header.group(1))
            jobs.append(job)
            continue
        if job is None or not line.startswith("    "):
            continue
        key, _, value = line.strip().partition(": ")
        if key == "input":
            job.inputs = [p.strip() for p in value.split(",") if p.strip()]
        elif key == "output":
            job.outputs = [p.strip() for p in value.split(",") if p.strip()]
        elif key == "jobid":
            job.jobid = int(value)
        elif key == "wildcards":
            job.wildcards = dict(kv.split("=", 1) for kv in value.split(", "))
    for job in jobs:   # an evaluation rule of one seed block (layout.block_rule): its rule, the block as first, last
        block = BLOCK_RULE.fullmatch(job.rule)
        if block:
            job.rule = block.group(1)
            job.wildcards = {**job.wildcards, "first": block.group(2), "last": block.group(3)}
    return jobs


def dag_jobs(configfiles, targets=(), workdir=".") -> list[DagJob]:
    """The whole DAG of a config (every job, as if nothing were built)."""
    cmd = [sys.executable, "-m", "snakemake", *targets, "--dry-run", "--forceall", "--cores", "1"]
    if configfiles:
        cmd += ["--configfile", *configfiles]
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ValueError(f"snakemake could not build the DAG (run from the repository root, where the Snakefile "
                         f"is):\n{(proc.stdout + proc.stderr)[-2000:]}")
    return parse_dry_run(proc.stdout)


def dependencies(jobs: list[DagJob]) -> dict[int, set[int]]:
    """job id -> the ids of the jobs that write its inputs."""
    writer = {path: job.jobid for job in jobs for path in job.outputs}
    return {job.jobid: {writer[p] for p in job.inputs if p in writer and writer[p] != job.jobid} for job in jobs}


def schedule_wall(jobs: list[DagJob], seconds: dict[int, float], deps: dict[int, set[int]], cores: int,
                  gpu_jobs: frozenset = frozenset(), gpus: int = 0) -> float:
    """Wall time of the DAG on `cores` single-threaded slots: list scheduling, longest ready job first. The jobs
    of `gpu_jobs` run one at a time on each of `gpus` GPUs, each holding one of the cores meanwhile."""
    if gpu_jobs and gpus < 1:
        raise ValueError(f"{len(gpu_jobs)} jobs need a GPU but none is given")
    waiting = {j.jobid: set(deps[j.jobid]) for j in jobs}
    children = defaultdict(list)
    for jid, parents in waiting.items():
        for p in parents:
            children[p].append(jid)
    ready = {"cpu": [], "gpu": []}
    pool_of = {j.jobid: "gpu" if j.jobid in gpu_jobs else "cpu" for j in jobs}
    for jid, parents in waiting.items():
        if not parents:
            ready[pool_of[jid]].append((-seconds[jid], jid))
    for queue in ready.values():
        heapq.heapify(queue)
    running, now, free_cores, free_gpus = [], 0.0, cores, gpus
    while ready["cpu"] or ready["gpu"] or running:
        while ready["gpu"] and free_gpus > 0 and free_cores > 0:
            cost, jid = heapq.heappop(ready["gpu"])
            heapq.heappush(running, (now - cost, jid))
            free_gpus, free_cores = free_gpus - 1, free_cores - 1
        while ready["cpu"] and free_cores > 0:
            cost, jid = heapq.heappop(ready["cpu"])
            heapq.heappush(running, (now - cost, jid))
            free_cores -= 1
        now, done = heapq.heappop(running)
        free_cores += 1
        free_gpus += pool_of[done] == "gpu"
        for child in children[done]:
            waiting[child].discard(done)
            if not waiting[child]:
                heapq.heappush(ready[pool_of[child]], (-seconds[child], child))
    return now


# --- what the jobs cost -----------------------------------------------------------------------------------------
def _server_cpu(server) -> tuple[float, float]:
    """(its own, its reaped forks') CPU-seconds of a job server, once it has reaped every fork."""
    pid = server.process.pid
    while Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        time.sleep(0.05)
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks, (int(fields[13]) + int(fields[14])) / ticks


def _children_cpu(cmd: list[str], cwd=None, server=None) -> float:
    """CPU-seconds (user + system) of a command run to completion; through a job server, the command's own and its
    fork's."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    forks_before = _server_cpu(server)[1] if server else 0.0
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"calibration command failed: {' '.join(cmd)}\n{(proc.stdout + proc.stderr)[-1500:]}")
    forks = _server_cpu(server)[1] - forks_before if server else 0.0
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime + forks


def _median_cpu(cmd: list[str], cwd=None, repeats: int = 3, server=None) -> float:
    return sorted(_children_cpu(cmd, cwd, server) for _ in range(repeats))[repeats // 2]


def calibrate_jobs(job_server: bool = False) -> dict:
    """CPU-seconds of the smallest real jobs, what every job of the kind pays whatever its size: an evaluation
    (`tapebench evaluate --method random`, 1 episode), a training run (`tapebench train`, 64 steps), a light job
    (`tapebench aggregate-seed`) and a figure job (`tapebench render figure_worldtest`). With `job_server` (a local
    run's `execution.job_server`) they run as a pipeline runs them, forks of a job server (docs/compute.md#job-server),
    and `server` is the server's own CPU-seconds (its imports, once per pipeline run); else `server` is 0."""
    tapebench = [sys.executable, "-m", "tapebench.cli"]
    server = jobserver.start(log=lambda message: None) if job_server else None
    try:
        return _calibrate(tapebench, server) | {"server": _server_cpu(server)[0] if server else 0.0}
    finally:
        jobserver.stop(server)


def _calibrate(tapebench: list[str], server) -> dict:
    with tempfile.TemporaryDirectory(prefix="tapebench-calibrate-") as tmp:
        save_split(f"{tmp}/s.json", {"name": "calibration", "train": [4, 12], "test": [0], "unit": "rule",
                                      "types": {"4": "periodic", "12": "periodic", "0": "stable"},
                                      "params": {"method": "hand"}})
        params = '{"env": {"L": 8, "H": 4}, "evaluation": {"episodes_per_rule": 1}}'
        evaluate = _median_cpu([*tapebench, "evaluate", "--method", "random", "--split", f"{tmp}/s.json", "--H", "4",
                                "--params", params, "--out", f"{tmp}/e.parquet"], server=server)
        train = _median_cpu([*tapebench, "train", "--agent", "dqn", "--split", f"{tmp}/s.json", "--seed", "0",
                             "--params", '{"env": {"L": 8, "H": 4}, "training": {"total_steps": 64, "eval_every": 64}}',
                             "--out", f"{tmp}/run", "--quiet"], repeats=1, server=server)
        light = _median_cpu([*tapebench, "aggregate-seed", "--episodes", f"{tmp}/e.parquet", "--last-k", "1",
                             "--out", f"{tmp}/p.parquet"], server=server)
        rows = [{"agent": "random", "family": "eca", "task": "prediction", "side": s, "budget": b, "n_seeds": 1, "problems": 1,
                 "mean": 0.2, "ci_low": 0.1, "ci_high": 0.3, "ci": 0.95, "n_resamples": 10, "chance": 1 / 6}
                for s in ("train", "test") for b in (0, 8)]
        write_parquet(f"{tmp}/a.parquet", pd.DataFrame(rows, columns=WORLDTEST_AGGREGATE_COLUMNS).astype(
            {"chance": np.float64}), meta={"table": "worldtest_aggregate"})
        figure = _median_cpu([*tapebench, "render", "figure_worldtest", "--aggregate", f"{tmp}/a.parquet", "--split",
                              "calibration", "--out", f"{tmp}/f"], repeats=1, server=server)
    return {"evaluate": evaluate, "train": train, "light": light, "figure": figure}


@dataclass
class CostModel:
    light_s: float                       # a light job's process (pandas, pyarrow, the CLI)
    figure_s: float                      # a figure or table job (matplotlib, jinja2)
    torch_s: float                       # the smallest evaluation job (torch, the registry, numba caches)
    train_s: float = 0.0                 # the smallest training job
    server_s: float = 0.0                # a job server's imports, once per pipeline run (0: a process per job)
    H: int = 32                          # the horizon evaluation costs were measured at
    train_steps_per_s: dict = field(default_factory=dict)     # method -> env steps/s in training
    block_steps_per_s: dict = field(default_factory=dict)     # (method, seeds) -> env steps/s per seed, stacked block
    episode_s: dict = field(default_factory=dict)             # method -> evaluation seconds per episode (at H)
    batch_s: dict = field(default_factory=dict)               # method -> fixed seconds per evaluated batch (at H)
    problem_s: dict = field(default_factory=dict)             # method -> world-test seconds per problem
    side_s: dict = field(default_factory=dict)                # method -> fixed world-test seconds per side
    eval_flops_per_episode: dict = field(default_factory=dict)  # method -> matrix-product FLOPs per episode (at H)
    gpu_blocks: dict = field(default_factory=dict)            # method -> {seeds: (start-up s, env steps/s of the
                                                              # block's loop, all seeds)} of stacked blocks on a GPU
    estimated: list = field(default_factory=list)             # what is not measured

    def evaluation(self, method: str, batches: int, episodes: int, H: int) -> float:
        """Seconds of `batches` evaluated batches holding `episodes` episodes in all, at horizon H."""
        return (batches * self.batch_s[method] + episodes * self.episode_s[method]) * H / self.H


def linear_fit(n_small: int, t_small: float, n_big: int, t_big: float) -> tuple[float, float]:
    """(fixed, per unit) through two timings; a non-positive slope (noise) falls back to the big one's mean."""
    per = (t_big - t_small) / (n_big - n_small)
    if per <= 0:
        return 0.0, t_big / n_big
    return max(t_small - per * n_small, 0.0), per


@contextlib.contextmanager
def as_a_job_runs():
    """torch as a CPU job sets it (`torch_settings` with `--threads 1`) and numba on one thread (`NUMBA_NUM_THREADS=1`):
    a process's CPU time is then one core's work (more threads would add their spin-waits to it)."""
    # numba, torch and the training loop: heavy, loaded only when a projection measures
    import numba
    import torch

    # the training loop imports torch: likewise
    from tapebench.training.loop import torch_settings

    numba_threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        with torch_settings(torch.device("cpu"), 1):
            yield
    finally:
        numba.set_num_threads(numba_threads)


def measure(config: dict, methods, *, steps: int, count_evaluation_flops: bool = False, blocks=None,
            log=print) -> CostModel:
    """Time the config's methods on this machine (short runs at the config's hyperparameters, one torch and one
    numba thread, as the jobs run); with `count_evaluation_flops`, also count the matrix-product FLOPs per evaluated
    episode (the smaller timed rule set played again under the counter); `blocks` (method -> seed-block sizes): each
    such block trained once, stacked where the method can (a block that is not stacked trains at the one-seed
    rate)."""
    with as_a_job_runs():
        return _measure(config, methods, steps=steps, count_evaluation_flops=count_evaluation_flops, blocks=blocks,
                        log=log)


def _measure(config: dict, methods, *, steps: int, count_evaluation_flops: bool, blocks, log) -> CostModel:
    # torch and the methods: loaded only when a projection measures them
    from tapebench.bench.flops import count_flops
    from tapebench.bench.training import heartbeat
    from tapebench.evaluation.evaluate import evaluate_untrained, side_protocols
    from tapebench.evaluation.trained_runs import evaluate_run
    from tapebench.evaluation.worldtest import WorldTestSettings, run_worldtest
    from tapebench.registry import build_config
    from tapebench.training.loop import TrainSpec, train

    fixed = calibrate_jobs(job_server=bool(config["execution"]["job_server"]))
    model = CostModel(light_s=fixed["light"], figure_s=fixed["figure"], torch_s=fixed["evaluate"],
                      train_s=fixed["train"], server_s=fixed["server"])
    log(f"smallest real jobs (CPU-s): light {model.light_s:.2f}, figure {model.figure_s:.2f}, evaluation "
        f"{model.torch_s:.2f}, training {model.train_s:.2f}"
        + (f" (forks of a job server, whose imports cost {model.server_s:.2f} once)" if model.server_s else
           " (a process per job)"), flush=True)
    env, evaluation = config["env"], config["evaluation"]
    L, H = int(env["L"]), int(env["H"])
    rules = split_rule_space(config, config["main_split"])
    sample = sample_rules(rules, SAMPLE_RULES)
    half = sample[: max(1, len(sample) // 2)]
    worldtest_sample = rules[::max(1, math.ceil(len(rules) / WORLDTEST_SAMPLE_RULES))]
    worldtest_half = worldtest_sample[: max(1, len(worldtest_sample) // 2)]
    E = int(evaluation["episodes_per_rule"])
    eval_kwargs = dict(episodes_per_rule=E, eval_seed=int(evaluation["eval_seed"]))
    goals = goal_fields(config)
    model.H = H

    def protocols(rules_):
        return side_protocols(L=L, H=H, rules=rules_, **eval_kwargs, **protocol_fields(config))

    study = worldtest_study(config)
    settings = WorldTestSettings.from_config(study["worldtest"]) if study["methods"] else None

    def halves(rules_):
        return {"train": rules_[: len(rules_) // 2], "test": rules_[len(rules_) // 2:]}
    for method_id in methods:
        method = get_method(method_id)
        overrides = config["agents"].get(method_id, {}) or {}
        agent = None
        with tempfile.TemporaryDirectory(prefix=f"tapebench-projection-{method_id}-") as run_dir:
            if method.trains:
                spec = TrainSpec(agent=method_id, rules=tuple(rules), seed=0, L=L, H=H, total_steps=steps,
                                 eval_every=steps, hyperparameters=overrides, **run_fields(config))
                with heartbeat(f"{method_id}: training {steps} steps"):
                    manifest = train(spec, run_dir, quiet=True)
                model.train_steps_per_s[method_id] = manifest["training"]["env_steps"] / manifest["cpu_time_s"]
                evaluate_run(run_dir, H, rules=sample[:1], episodes_per_rule=1, checkpoints=1, **goals)   # warm-up

                def evaluate(rules_):
                    return evaluate_run(run_dir, H, rules=rules_, checkpoints=1, **eval_kwargs, **goals)[1]
                with heartbeat(f"{method_id}: evaluating {len(half)} and {len(sample)} rules"):
                    timings = [evaluate(r)["cpu_seconds"] for r in (half, sample)]
                if settings is not None and method_id in study["methods"]:
                    # torch is heavy: loaded only when a trained method's world test is timed
                    from tapebench.training import checkpoint as ckpt

                    payload = ckpt.load(Path(run_dir) / manifest["checkpoints"][-1]["file"])
                    agent = ckpt.build_policy_agent(payload)
                    agent.load_policy_state_dict(payload["policy"])
            elif method.make_policy is not None:
                evaluate_untrained(method_id, overrides, 0, side_protocols(L=L, H=H, rules=sample[:1],
                                                                           episodes_per_rule=1,
                                                                           eval_seed=eval_kwargs["eval_seed"],
                                                                           **protocol_fields(config)),
                                   train_rules=rules)                                  # warm-up (numba caches)

                def evaluate(rules_):
                    return evaluate_untrained(method_id, overrides, 0, protocols(rules_), train_rules=rules)[1]
                with heartbeat(f"{method_id}: evaluating {len(half)} and {len(sample)} rules"):
                    timings = [evaluate(r)["cpu_seconds"] for r in (half, sample)]
            if method.plays_episodes:
                model.batch_s[method_id], model.episode_s[method_id] = linear_fit(
                    len(half) * E, timings[0], len(sample) * E, timings[1])
                if count_evaluation_flops:
                    with heartbeat(f"{method_id}: counting the FLOPs of {len(half)} rules' evaluation"):
                        flops = count_flops(lambda: evaluate(half))
                    model.eval_flops_per_episode[method_id] = flops / (len(half) * E)
            if settings is not None and method_id in study["methods"]:
                config_m = build_config(method_id, overrides)
                run_worldtest(method, config_m, settings, sides={"train": sample[:1]}, L=L, H=H, seed=0,
                               budget=0, agent=agent)                                          # warm-up
                points = []
                with heartbeat(f"{method_id}: world test on {len(worldtest_half)} and {len(worldtest_sample)} rules"):
                    for r in (worldtest_half, worldtest_sample):
                        start = time.process_time()
                        table = run_worldtest(method, config_m, settings, sides=halves(r), L=L, H=H, seed=0,
                                               budget=max(study["budgets"]), agent=agent)
                        points += [len(table), time.process_time() - start]
                fixed, model.problem_s[method_id] = linear_fit(*points)
                model.side_s[method_id] = fixed / 2
        shown = [f"train {model.train_steps_per_s[method_id]:.0f} steps/s" if method_id in model.train_steps_per_s
                 else "", f"eval {1e3 * model.episode_s[method_id]:.2f} ms/episode + {model.batch_s[method_id]:.2f} s/batch"
                 f" at H={H}" if method_id in model.episode_s else "",
                 f"world test {1e3 * model.problem_s[method_id]:.2f} ms/problem + {model.side_s[method_id]:.2f} s/side"
                 if method_id in model.problem_s else "",
                 f"{model.eval_flops_per_episode[method_id] / 1e6:.1f} MFLOP per evaluated episode"
                 if method_id in model.eval_flops_per_episode else ""]
        log(f"  {method_id}: " + ", ".join(s for s in shown if s), flush=True)
    for method_id, sizes in sorted((blocks or {}).items()):
        for n in sorted(sizes):
            rate = _stacked_rate(method_id, n, config, rules, steps)
            if rate is not None:
                model.block_steps_per_s[(method_id, n)] = rate
                log(f"  {method_id}: a stacked block of {n} seeds trains {rate:.0f} steps/s per seed "
                    f"({rate / model.train_steps_per_s[method_id]:.2f}x one seed alone)", flush=True)
    model.estimated.append(f"a LaTeX compile: {LATEX_ESTIMATE_S:.0f} s")
    return model


def _stacked_rate(method_id: str, seeds: int, config: dict, rules, steps: int) -> float | None:
    """Env steps/s per seed (CPU time) of a stacked block of `seeds` seeds; None when the method does not stack."""
    # torch and the methods: loaded only when a projection measures them
    from tapebench.bench.training import heartbeat
    from tapebench.training.blocks import train_block
    from tapebench.training.loop import TrainSpec

    make_block = get_method(method_id).make_block
    stacking = training_stacking(config, method_id, seeds)
    if make_block is None or ("cpu" not in getattr(make_block, "bit_exact_devices", ()) and stacking != "always"):
        return None   # the pipeline (`--stacking auto`) trains its blocks' seeds one after another on a CPU
    specs = [TrainSpec(agent=method_id, rules=tuple(rules), seed=seed, L=int(config["env"]["L"]),
                       H=int(config["env"]["H"]), total_steps=steps, eval_every=steps,
                       hyperparameters=config["agents"].get(method_id, {}) or {}, **run_fields(config))
             for seed in range(seeds)]
    with tempfile.TemporaryDirectory(prefix=f"tapebench-projection-{method_id}-block-") as tmp:
        with heartbeat(f"{method_id}: training a block of {seeds} seeds, {steps} steps each"):
            manifests = train_block(specs, [f"{tmp}/seed{seed}" for seed in range(seeds)], quiet=True,
                                    stacking=stacking)      # as the DAG's job
    if "block" not in manifests[0]:
        return None
    return manifests[0]["training"]["env_steps"] * seeds / manifests[0]["block"]["cpu_time_s"]


def measure_floor(jobs: list[DagJob], config: dict, *, steps: int, log=print) -> dict:
    """FLOPs per env step of every distinct training run of the DAG (method, hyperparameters, L, H), counted in
    its learning phase (`bench.flops.steady_flops_per_step`, runs of steps / 2 and steps), and this core's best
    GEMM rate: what `floor_seconds` needs."""
    # the methods and the FLOP counter: loaded only when the floor is measured
    from tapebench.bench.flops import gemm_rate, steady_flops_per_step
    from tapebench.bench.training import heartbeat
    from tapebench.training.loop import TrainSpec

    rules = tuple(split_rule_space(config, config["main_split"]))
    shapes = {}
    for job in jobs:
        training = training_job(job, config)
        if training is not None:
            shapes.setdefault(arithmetic_shape(*training), training)
    with as_a_job_runs():   # the rate of the one core a training job runs on
        rate = gemm_rate()["best"]
        log(f"arithmetic floor: {len(shapes)} distinct training runs, FLOPs counted over {steps // 2} and {steps} "
            f"env steps each; best GEMM rate of this core {rate / 1e9:.1f} GFLOP/s", flush=True)
        flops = {}
        for key, (method, train) in sorted(shapes.items()):
            L, H = int(train["env"]["L"]), int(train["env"]["H"])
            spec = TrainSpec(agent=method, rules=rules, seed=0, hyperparameters=train["agent"], L=L, H=H,
                             total_steps=steps, eval_every=steps, **run_fields(config))
            with heartbeat(f"{method}: counting FLOPs at L={L}, H={H}"):
                flops[key] = steady_flops_per_step(spec)
            overrides = f", {dumps(train['agent'])}" if train["agent"] else ""
            log(f"  {method} at L={L}, H={H}{overrides}: {flops[key] / 1e6:.2f} MFLOP per env step", flush=True)
    return {"gemm_flops_per_s": rate, "flops_per_env_step": flops}


def _rule_count(config: dict, split: str) -> int:
    if split in config["splits"]:
        return len(split_rule_space(config, split))
    ladder = config["studies"]["ladder"]
    return 2 * max(len(ladder["train"]) // 2, ladder["train_classes"]) + len(ladder["levels"]) * ladder["level_size"]


def _schedule(config: dict, rule: str) -> tuple[int, int]:
    """(total_steps, eval_every) of a training rule's runs."""
    if rule in ("train_fixed_z", "evaluate_fixed_z", "train_multi_rule", "evaluate_multi_rule"):
        fixed = config["studies"]["fixed_z"]
        return int(fixed["total_steps"]), int(fixed["eval_every"])
    return int(config["training"]["total_steps"]), int(config["training"]["eval_every"])


def training_job(job: DagJob, config: dict) -> tuple[str, dict] | None:
    """(method, config slice) of a training job, the slice the workflow passes to `tapebench train --params`;
    None for any other job."""
    rule, w = job.rule, job.wildcards
    if rule in ("train", "train_block"):
        return w["agent"], train_slice(config, w["agent"], block_seeds(job))
    if rule in ("train_fixed_z", "train_multi_rule"):
        return w["agent"], fixed_z_train_slice(config, w["agent"], w["L"], w["H"])
    if rule == "train_sweep":
        return config["diagnostics"]["sweep"]["method"], sweep_train_slice(config, w["value"])
    if rule == "train_budget":
        return w["method"], budget_train_slice(config, w["method"], w["steps"])
    if rule in TRAIN_RULES:
        raise ValueError(f"training rule {rule!r} has no config slice in training_job")
    return None


def block_seeds(job: DagJob) -> int:
    """Seeds a job trains or evaluates: a seed block's (`train_block`, an evaluation rule per block), else one."""
    if "first" in job.wildcards:
        return int(job.wildcards["last"]) - int(job.wildcards["first"]) + 1
    return 1


def block_sizes(jobs: list[DagJob]) -> dict[str, set[int]]:
    """method -> the sizes of its training seed blocks of more than one seed in the DAG."""
    sizes = defaultdict(set)
    for job in jobs:
        if job.rule == "train_block" and block_seeds(job) > 1:
            sizes[job.wildcards["agent"]].add(block_seeds(job))
    return dict(sizes)


def arithmetic_shape(method: str, train: dict) -> str:
    """What a training run's FLOPs per env step depend on: the method, its hyperparameters, L and H."""
    return dumps({"method": method, "agent": train["agent"], "L": int(train["env"]["L"]), "H": int(train["env"]["H"])})


def evaluation_job(job: DagJob, config: dict) -> tuple[str, int, int, int] | None:
    """(method, evaluated batches, episodes, H) of an evaluation job (every seed of its block); None for any other
    job."""
    rule, w = job.rule, job.wildcards
    if rule not in EVAL_RULES and rule not in METHOD_EVAL_RULES:
        return None
    agent = config["diagnostics"]["sweep"]["method"] if rule == "evaluate_sweep" else w.get("agent") or w.get("method")
    H = int(w.get("H", config["env"]["H"]))
    if rule in METHOD_EVAL_RULES:
        checkpoints = 1
    elif rule == "evaluate_budget":   # the last K of the budget's checkpoints (budget 0: its one)
        checkpoints = min(max(1, checkpoints_per_run(*budget_schedule(config, w["steps"]))),
                          int(config["evaluation"]["last_k"]))
    else:
        total, every = _schedule(config, rule)
        every_checkpoint = get_method(agent).every_checkpoint and rule != "evaluate_noise"
        checkpoints = checkpoints_per_run(total, every) if every_checkpoint else int(config["evaluation"]["last_k"])
    n_rules = 1 if rule == "evaluate_fixed_z" else _rule_count(config, w.get("split", config["main_split"]))
    sides = 1 if rule == "evaluate_fixed_z" else 2
    seeds = block_seeds(job)
    return agent, checkpoints * sides * seeds, checkpoints * n_rules * int(config["evaluation"]["episodes_per_rule"]) \
        * seeds, H


def floor_seconds(job: DagJob, config: dict, model: CostModel, floor: dict) -> float | None:
    """The arithmetic floor of a training or evaluation job: its matrix products alone at the best GEMM rate
    (no start-up); None for any other job. An evaluation at another L than the one measured is charged nothing
    (its FLOPs were not counted), which keeps the figure a floor."""
    training = training_job(job, config)
    if training is not None:
        steps = int(training[1]["training"]["total_steps"]) * block_seeds(job)
        return steps * floor["flops_per_env_step"][arithmetic_shape(*training)] / floor["gemm_flops_per_s"]
    evaluation = evaluation_job(job, config)
    if evaluation is None:
        return None
    if int(job.wildcards.get("L", config["env"]["L"])) != int(config["env"]["L"]):
        return 0.0
    method, _, episodes, H = evaluation
    return episodes * model.eval_flops_per_episode.get(method, 0.0) * H / model.H / floor["gemm_flops_per_s"]


def on_gpu(job: DagJob, model: CostModel) -> bool:
    """Whether a job runs on the GPU: a training block of more than one seed of a method that stacks, measured on
    the GPU (`training.device: auto` trains every other job on a CPU core, `training_device`)."""
    return job.rule == "train_block" and block_seeds(job) > 1 and job.wildcards["agent"] in model.gpu_blocks


def gpu_block(model: CostModel, method: str, seeds: int) -> tuple[float, float]:
    """(start-up s, env steps/s of all seeds) of a stacked block of `seeds` seeds on the GPU: the measured block of
    that size, else the smallest larger one at the same steps/s per seed (a GPU block's step is latency-bound, so a
    smaller block's steps take about as long: an upper bound), else the largest at its total steps/s."""
    measured = model.gpu_blocks[method]
    if seeds in measured:
        return measured[seeds]
    larger = [n for n in measured if n > seeds]
    if larger:
        n = min(larger)
        return measured[n][0], measured[n][1] * seeds / n
    return measured[max(measured)]


def read_gpu_figures(paths, config: dict) -> dict:
    """method -> {seeds: (start-up s, steps/s)} from `tapebench bench seeds --device cuda --json` files measured at
    the config's L and H; a file of another benchmark, device or shape is refused naming it."""
    from tapebench.utils.artifacts import read_json   # only when GPU figures are read

    blocks: dict = defaultdict(dict)
    L, H = int(config["env"]["L"]), int(config["env"]["H"])
    for path in paths:
        data = read_json(path, "bench seeds figures")
        figures = data.get("figures", {}) if isinstance(data, dict) else {}
        if data.get("benchmark") != "seeds" or figures.get("device") != "cuda":
            raise ValueError(f"--gpu-figures {path}: not a `tapebench bench seeds --device cuda --json` file")
        if (int(figures["L"]), int(figures["H"])) != (L, H):
            raise ValueError(f"--gpu-figures {path}: measured at L = {figures['L']}, H = {figures['H']}; the config "
                             f"has L = {L}, H = {H}")
        for method, rows in figures["agents"].items():
            for n, row in rows.items():
                if int(n) > 1:
                    blocks[method][int(n)] = (float(row["one_process_startup_s"]),
                                              float(row["env_steps"]) / float(row["one_process_loop_s"]))
    return dict(blocks)


def read_gpu_sharing(paths, blocks_per_gpu: int) -> dict[str, float]:
    """method -> how many times longer a block's process takes when `blocks_per_gpu` blocks share one GPU (`slowdown`
    of `tapebench bench seeds --device cuda --share K --json` files; the last file naming a method wins)."""
    from tapebench.utils.artifacts import read_json   # only when GPU figures are read

    slowdowns: dict[str, float] = {}
    for path in paths:
        figures = read_json(path, "bench seeds figures").get("figures", {})
        for method, rows in figures.get("share", {}).items():
            if str(blocks_per_gpu) in rows:
                slowdowns[method] = float(rows[str(blocks_per_gpu)]["slowdown"])
    return slowdowns


def slow_shared_gpu_jobs(seconds: dict[int, float], jobs: list[DagJob], gpu_jobs: frozenset,
                         slowdowns: dict[str, float]) -> list[str]:
    """Scale each GPU job's seconds in place by its method's slowdown on a shared GPU (`read_gpu_sharing`); a
    method without a figure is slowed as the slowest measured one. Returns those methods."""
    guessed = set()
    for job in jobs:
        if job.jobid in gpu_jobs:
            method = job.wildcards["agent"]
            if method not in slowdowns:
                guessed.add(method)
            seconds[job.jobid] *= slowdowns.get(method, max(slowdowns.values()))
    return sorted(guessed)


def measure_gpu_blocks(config: dict, sizes: dict[str, set[int]], steps: int, log=print) -> dict:
    """method -> {seeds: (start-up s, steps/s)}: each stacked block size of the DAG trained once on the GPU, as
    `bench seeds --device cuda` does (a whole `tapebench train --seeds` process)."""
    from tapebench.bench.seeds import one_process   # only when a GPU projection measures

    rules = split_rule_space(config, config["main_split"])
    family = config_family(config)
    blocks: dict = defaultdict(dict)
    with tempfile.TemporaryDirectory(prefix="tapebench-projection-gpu-") as tmp:
        source = ["--rules", ",".join(map(str, rules))]
        if not family.elementary:   # `--rules` lists elementary rules; another family comes with a split file
            save_split(f"{tmp}/projection.json", {"name": "projection", "train": rules[:-1], "test": rules[-1:],
                                                   "unit": "rule", "types": {str(z): "" for z in rules},
                                                   "params": {"method": "hand"}, "family": family.as_dict()})
            source = ["--split", f"{tmp}/projection.json"]
        for method, block_sizes_ in sorted(sizes.items()):
            if get_method(method).make_block is None:
                continue
            for n in sorted(block_sizes_):
                params = {"env": {"L": int(config["env"]["L"]), "H": int(config["env"]["H"]),
                                  "goal": config["env"]["goal"], "goal_steps": int(config["env"]["goal_steps"])},
                          "training": {"total_steps": steps, "eval_every": steps},
                          "agent": config["agents"].get(method, {}) or {}}
                wall, loop = one_process(method, n, params, source, "cuda", Path(tmp))
                blocks[method][n] = (wall - loop, n * steps / loop)
                log(f"  {method}: a block of {n} seeds on the GPU trains {n * steps / loop:.0f} env steps/s (all "
                    f"seeds), start-up {wall - loop:.1f} s", flush=True)
    return dict(blocks)


def job_seconds(job: DagJob, config: dict, model: CostModel) -> tuple[float, str]:
    """(CPU-seconds, cost centre) of one job."""
    rule, w = job.rule, job.wildcards
    agent = w.get("agent") or w.get("method")
    episodes_per_rule = int(config["evaluation"]["episodes_per_rule"])
    training = training_job(job, config)
    if training is not None:
        agent, train = training
        seeds = block_seeds(job)
        if on_gpu(job, model):
            startup, rate = gpu_block(model, agent, seeds)
            return startup + seeds * int(train["training"]["total_steps"]) / rate, f"train {agent} (GPU)"
        rate = model.block_steps_per_s.get((agent, seeds), model.train_steps_per_s[agent])
        return model.train_s + seeds * int(train["training"]["total_steps"]) / rate, f"train {agent}"
    evaluation = evaluation_job(job, config)
    if evaluation is not None:
        agent, batches, episodes, H = evaluation
        return model.torch_s + model.evaluation(agent, batches, episodes, H), f"evaluate {agent}"
    if rule in WORLDTEST_RULES:
        study = worldtest_study(config)
        settings = study["worldtest"]
        tasks = (len(settings["prediction"]["lengths"]) if "prediction" in settings["tasks"] else 0) + \
            sum(t in settings["tasks"] for t in ("planning", "detection"))
        problems = _rule_count(config, study["split"]) * int(settings["problems_per_rule"]) * tasks
        return model.torch_s + 2 * model.side_s[agent] + problems * model.problem_s[agent], f"world test {agent}"
    if rule in ORACLE_RULES:
        H = int(w.get("H", config["env"]["H"]))
        n_rules = _rule_count(config, w.get("split", config["main_split"]))
        cost = model.evaluation("mpc", 1, n_rules * episodes_per_rule, H) if "mpc" in model.episode_s else 0.0
        return model.light_s + cost, "oracle (MPC)"
    if rule in TORCH_RULES:
        return model.torch_s, "diagnostics"
    if rule in LATEX_RULES:
        return LATEX_ESTIMATE_S, "report (LaTeX)"
    if rule.startswith("render"):
        return model.figure_s, "tables and figures"
    return model.light_s, "other jobs"


def project_one_seed_per_job(configfiles, targets, config: dict, model: CostModel, cores: int,
                             snakemake_s: float) -> dict:
    """The same config and targets with `training.seeds_per_job: 1`, projected with the same measurements."""
    with tempfile.TemporaryDirectory(prefix="tapebench-projection-") as tmp:
        overlay = Path(tmp) / "one_seed_per_job.yaml"
        overlay.write_text("training: {seeds_per_job: 1}\n")
        jobs = dag_jobs([*configfiles, str(overlay)], targets)
    single = {**config, "training": {**config["training"], "seeds_per_job": 1}}
    seconds = {job.jobid: job_seconds(job, single, model)[0] for job in jobs}
    return {"jobs": len(jobs), "cpu_hours": (sum(seconds.values()) + snakemake_s) / 3600,
            "wall_hours": (schedule_wall(jobs, seconds, dependencies(jobs), cores) + snakemake_s) / 3600}


def methods_of(jobs: list[DagJob], config: dict) -> list[str]:
    found = {j.wildcards.get("agent") or j.wildcards.get("method") for j in jobs
             if j.rule in (*TRAIN_RULES, *EVAL_RULES, *METHOD_EVAL_RULES, *WORLDTEST_RULES)}
    if any(j.rule in ("train_sweep", "evaluate_sweep") for j in jobs):
        found.add(config["diagnostics"]["sweep"]["method"])
    if any(j.rule in ORACLE_RULES for j in jobs):
        found.add("mpc")
    return sorted(m for m in found if m)


def bench_pipeline(args) -> dict:
    """Entry point of `tapebench bench pipeline` (options: --configfile, --cores, --target, --steps, --json, --floor,
    --device cuda with --gpus, --gpu-figures and --blocks-per-gpu)."""
    configfiles = list(args.configfile or [])
    cores = int(args.cores)
    if cores < 1:
        raise ValueError(f"--cores must be >= 1, got {cores}")
    schema = Path("workflow") / "schemas" / "config.schema.yaml"
    if not schema.is_file():
        raise FileNotFoundError(f"{schema} not found: run `tapebench bench pipeline` from the repository root")
    config = validate_config(load_config(configfiles), schema)
    share, slowdowns = int(args.blocks_per_gpu), {}
    if share > 1:
        slowdowns = read_gpu_sharing(args.gpu_figures, share)
        if not slowdowns:
            raise ValueError(f"--gpu-figures {' '.join(map(str, args.gpu_figures))}: no `bench seeds --share {share}` "
                             f"figure")
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    jobs = dag_jobs(configfiles, args.target or ())
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # Snakemake's own DAG building, paid once per invocation (and, below, the job server's imports)
    snakemake_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    deps = dependencies(jobs)
    methods = methods_of(jobs, config)
    print(f"tapebench bench pipeline: {len(jobs)} jobs ({', '.join(configfiles) or 'config/config.yaml'}"
          f"{'; targets ' + ' '.join(args.target) if args.target else ''}); measuring {len(methods)} methods "
          f"({args.steps} training steps each, evaluation on <= {SAMPLE_RULES} rules, the world test on <= "
          f"{WORLDTEST_SAMPLE_RULES}), one thread", flush=True)
    blocks = block_sizes(jobs)
    model = measure(config, methods, steps=args.steps, count_evaluation_flops=bool(args.floor), blocks=blocks,
                    log=print)
    once_s = snakemake_s + model.server_s
    gpus = 0
    if args.device == "cuda":
        gpus = int(args.gpus)
        if gpus < 1:
            raise ValueError(f"--gpus must be >= 1 with --device cuda, got {gpus}")
        model.gpu_blocks = read_gpu_figures(args.gpu_figures, config) if args.gpu_figures else \
            measure_gpu_blocks(config, blocks, args.steps, log=print)
        unmeasured = sorted(m for m in blocks if get_method(m).make_block is not None and m not in model.gpu_blocks)
        if unmeasured:
            model.estimated.append(f"no GPU figures for {', '.join(unmeasured)}: their stacked blocks are projected "
                                   f"on a CPU core")
    gpu_jobs = frozenset(job.jobid for job in jobs if on_gpu(job, model))
    seconds, centre = {}, {}
    for job in jobs:
        seconds[job.jobid], centre[job.jobid] = job_seconds(job, config, model)
    if slowdowns:
        guessed = slow_shared_gpu_jobs(seconds, jobs, gpu_jobs, slowdowns)
        if guessed:
            model.estimated.append(f"no `--share {share}` figure for {', '.join(guessed)}: their blocks slowed as the "
                                   f"slowest measured method ({max(slowdowns.values()):.2f}x)")
    cpu = sum(s for jid, s in seconds.items() if jid not in gpu_jobs) + once_s
    gpu_hours = sum(seconds[jid] for jid in gpu_jobs) / share / 3600
    wall = schedule_wall(jobs, seconds, deps, cores, gpu_jobs, gpus * share) + once_s
    one_seed = None
    if config["training"]["seeds_per_job"] > 1 and not gpus:
        one_seed = project_one_seed_per_job(configfiles, args.target or (), config, model, cores, once_s)
    by_centre = Counter({"snakemake (DAG)": snakemake_s, "job server (imports, once)": model.server_s})
    for jid, c in centre.items():
        by_centre[c] += seconds[jid]
    rules = Counter(j.rule for j in jobs)
    cores_alone = None
    if gpus:
        print(f"\nprojected: {wall / 3600:.2f} h wall on one machine of {cores} cores and {gpus} GPU(s): "
              f"{len(gpu_jobs)} stacked training blocks on the GPU ({gpu_hours:.2f} GPU-hours, "
              + ("one block at a time per GPU" if share == 1 else
                 f"{share} blocks at a time per GPU, each {min(slowdowns.values()):.2f}-{max(slowdowns.values()):.2f}x "
                 f"its time alone") + f"), {cpu / 3600:.2f} CPU-hours of every other job on the cores (list "
              f"scheduling of the DAG)")
        cpu_model = dataclasses.replace(model, gpu_blocks={})
        alone = {job.jobid: job_seconds(job, config, cpu_model)[0] for job in jobs}
        cores_alone = {"cpu_hours": (sum(alone.values()) + once_s) / 3600,
                       "wall_hours": (schedule_wall(jobs, alone, deps, cores) + once_s) / 3600}
        print(f"  the same DAG on the {cores} cores alone, same measurements: {cores_alone['cpu_hours']:.2f} "
              f"CPU-hours, {cores_alone['wall_hours']:.2f} h wall")
    else:
        print(f"\nprojected: {cpu / 3600:.2f} CPU-hours; {wall / 3600:.2f} h wall on {cores} cores "
              f"(list scheduling of the DAG; lower bound CPU/cores {cpu / cores / 3600:.2f} h)")
    if one_seed is not None:
        print(f"  the same DAG with training.seeds_per_job: 1 (one job per seed), same measurements: "
              f"{one_seed['cpu_hours']:.2f} CPU-hours, {one_seed['wall_hours']:.2f} h wall; seed blocks of "
              f"{config['training']['seeds_per_job']} cost {cpu / 3600 / one_seed['cpu_hours']:.2f}x its CPU-hours")
    print(f"top cost centres ({'CPU- or GPU-' if gpus else 'CPU-'}hours, share):")
    for name, s in by_centre.most_common(12):
        print(f"  {name:<32} {s / 3600:8.3f}  {100 * s / sum(by_centre.values()):5.1f}%")
    floor = None
    if args.floor:
        floor = measure_floor(jobs, config, steps=args.floor, log=print)
        floored, projected, row = Counter(), Counter(), defaultdict(lambda: [0.0, 0.0])
        for job in jobs:
            job_floor = floor_seconds(job, config, model, floor)
            if job_floor is None:
                continue
            method = centre[job.jobid].split(" ", 1)[1]     # "train <method>" or "evaluate <method>"
            floored[method] += job_floor
            projected[method] += seconds[job.jobid]
            if job.rule in MAIN_ROW_RULES and job.wildcards.get("split") == config["main_split"]:
                row[method][0] += job_floor
                row[method][1] += seconds[job.jobid]
        floor["eval_flops_per_episode"] = dict(model.eval_flops_per_episode)
        floor["cpu_hours"] = {m: v / 3600 for m, v in floored.items()}
        floor["row_cpu_hours"] = {m: {"floor": f / 3600, "projected": p / 3600} for m, (f, p) in row.items()}
        floor["dag_cpu_hours"] = (cpu - sum(projected.values()) + sum(floored.values())) / 3600
        print(f"\narithmetic floor of the training and evaluation jobs (their matrix products alone at "
              f"{floor['gemm_flops_per_s'] / 1e9:.1f} GFLOP/s, no start-up): {sum(floored.values()) / 3600:.2f} "
              f"CPU-hours, projected {sum(projected.values()) / 3600:.2f}; the whole DAG with them at that floor and "
              f"every other job as projected: {floor['dag_cpu_hours']:.2f} CPU-hours")
        print(f"  per method (CPU-hours): the DAG's training and evaluation, floor and projected; the main-study row "
              f"({config['seeds']} seeds on {config['main_split']}: training and evaluation), floor and projected")
        for method in sorted(floored, key=lambda m: -projected[m]):
            f, p = row.get(method, (0.0, 0.0))
            print(f"  {method:<30} {floored[method] / 3600:8.3f} {projected[method] / 3600:8.3f}   "
                  f"row {f / 3600:8.3f} {p / 3600:8.3f}")
    print(f"estimated, not measured: {'; '.join(model.estimated)}; measurement took {time.perf_counter() - start:.0f} s")
    return {"cpu_hours": cpu / 3600, "wall_hours": wall / 3600, "cores": cores, "jobs": len(jobs), "floor": floor,
            "gpus": gpus, "blocks_per_gpu": share, "share_slowdowns": slowdowns, "gpu_hours": gpu_hours,
            "gpu_jobs": len(gpu_jobs), "cores_alone": cores_alone,
            "gpu_blocks": {f"{m} x{n}": {"startup_s": v[0], "env_steps_per_s": v[1]}
                           for m, sizes in model.gpu_blocks.items() for n, v in sizes.items()},
            "seeds_per_job": config["training"]["seeds_per_job"], "one_seed_per_job": one_seed,
            "jobs_per_rule": dict(rules), "cost_centres_cpu_hours": {k: v / 3600 for k, v in by_centre.items()},
            "measured": {"light_s": model.light_s, "figure_s": model.figure_s, "evaluation_s": model.torch_s,
                         "train_s": model.train_s, "job_server_s": model.server_s,
                         "H": model.H, "train_steps_per_s": model.train_steps_per_s,
                         "block_steps_per_s": {f"{m} x{n}": v for (m, n), v in model.block_steps_per_s.items()},
                         "eval_seconds_per_episode": model.episode_s, "eval_seconds_per_batch": model.batch_s,
                         "worldtest_seconds_per_problem": model.problem_s, "worldtest_seconds_per_side": model.side_s},
            "estimated": model.estimated, "configfiles": configfiles, "targets": list(args.target or [])}
