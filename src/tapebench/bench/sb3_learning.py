"""`tapebench bench sb3 --learning`: does our DQN / PPO learn as well as Stable-Baselines3's at the same settings?

Both sides train with the hyperparameters of our `Config` defaults (SB3's arguments from `sb3_dqn_settings` /
`sb3_ppo_settings`, the same translation the throughput comparison uses) for the same env steps, on:

- each of the six representative rules alone (the paper's fixed-z tasks, Table 6) at L = H = 16, and
- the main split at --L / --H (default 32): z ~ Unif(training rules) at every reset, evaluated ID and OOD.

Every trained policy, ours and SB3's, plays the same common-random-number evaluation episodes through our
runner (`evaluation.runner.run_episodes`, greedy actions; SB3's through `policy.predict(deterministic=True)`),
so the two sides differ only in how they were trained. A seed's value is its final policy's strict success;
the figures are means over seeds with percentile-bootstrap CIs, and the CI of the difference ours - SB3
(independent groups: the seeds draw from different generators on the two sides).
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
import time

import numpy as np
import torch

from tapebench.bench import load_average, run_parallel
from tapebench.bench.sb3 import COUNTERPARTS, SETTINGS, remaining_differences, require_sb3, train_sb3
from tapebench.bench.training import select_agents
from tapebench.bench.world_model import SIDE_LABELS
from tapebench.episodes.sets import EpisodeSet
from tapebench.evaluation.evaluate import side_protocols
from tapebench.evaluation.runner import run_episodes
from tapebench.methods.contract import StatelessPolicy, greedy_policy
from tapebench.registry import build_config
from tapebench.stats.bootstrap import difference_ci, percentile_ci
from tapebench.training import checkpoint as ckpt
from tapebench.training.loop import TrainSpec, train
from tapebench.validation import check_horizon, check_length, parse_rule_list
from tapebench.vocabulary import RULES_SIDE

# The paper's six representative rules of its fixed-z tasks (Table 6 at L = H = 16); the pipeline's copy is
# config/config.yaml studies.fixed_z.rules (a test keeps the two equal).
REPRESENTATIVE_RULES = (0, 4, 108, 204, 30, 110)
FIXED_RULE_L = FIXED_RULE_H = 16
TASKS = ("fixed", "main")
SIDES = ("ours", "sb3")


@dataclasses.dataclass(frozen=True)
class Task:
    """One training problem: a rule set at L, H, and the evaluation rules (one side each)."""

    name: str                      # "rule 30" or "main"
    rules: tuple[int, ...]         # training rules, z ~ Unif(rules) at every reset
    L: int
    H: int
    split: object = None           # the Split evaluated ID / OOD, or None: evaluate on `rules` (side "rules")


@dataclasses.dataclass(frozen=True)
class RunPlan:
    side: str                      # "ours" or "sb3"
    agent: str                     # "dqn" or "ppo"
    task: Task
    seed: int
    steps: int
    episodes_per_rule: int


def parity_tasks(tasks, rules, split, L: int, H: int) -> list[Task]:
    """The fixed-rule tasks (one per rule, L = H = 16) and/or the split task at L, H."""
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown or not tasks:
        raise ValueError(f"--tasks must name some of {list(TASKS)}, got {list(tasks)}")
    out = []
    if "fixed" in tasks:
        out += [Task(f"rule {z}", (int(z),), FIXED_RULE_L, FIXED_RULE_H) for z in rules]
    if "main" in tasks:
        out.append(Task(split.name, tuple(split.train), L, H, split))
    return out


def evaluation_sets(task: Task, episodes_per_rule: int) -> list[tuple[str, EpisodeSet]]:
    """(side label, episodes) of a task: ID and OOD of the split, or the rule itself."""
    sides = side_protocols(L=task.L, H=task.H, episodes_per_rule=episodes_per_rule, eval_seed=0,
                           split=task.split, rules=None if task.split is not None else list(task.rules))
    label = {**SIDE_LABELS, RULES_SIDE: "rule"}
    return [(label.get(protocol.side, protocol.side), episodes) for episodes, protocol, _ in sides]


def sb3_greedy_policy(model) -> StatelessPolicy:
    """SB3's deterministic action (DQN: argmax Q; PPO: the most likely action) as our evaluation policy."""
    def act(obs: torch.Tensor) -> torch.Tensor:
        actions, _ = model.policy.predict(obs.cpu().numpy(), deterministic=True)
        return torch.as_tensor(np.asarray(actions), dtype=torch.long, device=obs.device)

    return StatelessPolicy(act)


def run_one(plan: RunPlan) -> dict:
    """Train one side for `plan.steps` env steps and evaluate its final policy; returns success per side."""
    torch.set_num_threads(1)
    task, config = plan.task, build_config(plan.agent, {})
    settings = SETTINGS[plan.agent](config, plan.steps)   # the budget rounded up as SB3 runs it, for both sides
    start, cpu_start = time.perf_counter(), time.process_time()
    if plan.side == "ours":
        total = settings["total_steps"]
        spec = TrainSpec(agent=plan.agent, rules=task.rules, seed=plan.seed, L=task.L, H=task.H,
                         total_steps=total, eval_every=total)
        with tempfile.TemporaryDirectory(prefix=f"tapebench-parity-{plan.agent}-") as run_dir:
            manifest = train(spec, run_dir, device="cpu", threads=1, quiet=True)
            agent, _ = ckpt.load_policy(os.path.join(run_dir, manifest["checkpoints"][-1]["file"]))
        env_steps, policy = manifest["training"]["env_steps"], greedy_policy(agent)
    else:
        model = train_sb3(plan.agent, settings, task.rules, task.L, task.H, plan.seed, threads=1)["model"]
        env_steps, policy = model.num_timesteps, sb3_greedy_policy(model)
    train_seconds = time.perf_counter() - start
    success = {}
    with torch.no_grad():
        for label, episodes in evaluation_sets(task, plan.episodes_per_rule):
            success[label] = float(run_episodes(policy, episodes, task.H)["success"].mean())
    return {"side": plan.side, "agent": plan.agent, "task": task.name, "seed": plan.seed, "env_steps": int(env_steps),
            "train_seconds": round(train_seconds, 2), "seconds": round(time.perf_counter() - start, 2),
            "cpu_seconds": round(time.process_time() - cpu_start, 2), "success": success}


def parity_rows(results: list[dict], seeds: int) -> list[dict]:
    """Per (agent, task, evaluation side): each side's seed mean with its CI and the CI of ours - SB3; plus, per
    agent, the fixed-rule tasks' mean over rules (seed s's value: its mean over the rules)."""
    values: dict = {}
    for r in results:
        for label, success in r["success"].items():
            values.setdefault((r["agent"], r["task"], label), {}).setdefault(r["side"], {})[r["seed"]] = success
    fixed = [k for k in values if k[2] == "rule"]
    for agent in dict.fromkeys(k[0] for k in fixed):
        tasks = [k for k in fixed if k[0] == agent]
        values[(agent, "six rules (mean)" if len(tasks) == 6 else f"{len(tasks)} rules (mean)", "rule")] = {
            side: {s: float(np.mean([values[k][side][s] for k in tasks])) for s in range(seeds)} for side in SIDES}
    rows = []
    for (agent, task, label), by_side in values.items():
        ours = [by_side["ours"][s] for s in sorted(by_side["ours"])]
        theirs = [by_side["sb3"][s] for s in sorted(by_side["sb3"])]
        ci_ours, ci_sb3, diff = percentile_ci(ours), percentile_ci(theirs), difference_ci(ours, theirs)
        verdict = "ours lower" if diff.high < 0 else "ours higher" if diff.low > 0 else "within CI"
        rows.append({"agent": agent, "task": task, "evaluation": label, "seeds": len(ours),
                     "ours": dataclasses.asdict(ci_ours), "sb3": dataclasses.asdict(ci_sb3),
                     "difference": dataclasses.asdict(diff), "verdict": verdict,
                     "ours_per_seed": ours, "sb3_per_seed": theirs})
    return rows


def _ci(interval: dict) -> str:
    return f"{interval['mean']:.3f} [{interval['low']:.3f}, {interval['high']:.3f}]"


def bench_sb3_learning(args) -> dict:
    """Entry point of `tapebench bench sb3 --learning` (options: --agents --steps --seeds --tasks --fixed-rules
    --split --L --H --episodes-per-rule --jobs)."""
    agents = select_agents(args.agents, allowed=list(COUNTERPARTS), command="bench sb3")
    if args.device == "cuda":
        raise ValueError("`tapebench bench sb3 --learning` trains on the CPU only; use --device cpu or auto")
    L, H = check_length(args.L), check_horizon(args.H)
    if args.seeds < 2:
        raise ValueError(f"--seeds must be >= 2 for a bootstrap CI over seeds, got {args.seeds}")
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1 worker process, got {args.jobs}")
    if args.episodes_per_rule < 1:
        raise ValueError(f"--episodes-per-rule must be >= 1, got {args.episodes_per_rule}")
    rules = REPRESENTATIVE_RULES if args.fixed_rules is None else tuple(parse_rule_list(args.fixed_rules))
    split = None
    if "main" in args.tasks:
        # lazy: a command loads only the modules it runs
        from tapebench.splits.io import resolve_split

        try:
            split = resolve_split(args.split or "main")
        except ValueError as exc:
            raise ValueError(f"{exc}; build the main split first (`snakemake --cores 1 results/splits/main.json`) "
                             f"or pass --split PATH, or run only the fixed-rule tasks with --tasks fixed") from None
    tasks = parity_tasks(args.tasks, rules, split, L, H)
    sb3 = require_sb3()
    for agent in agents:   # refuse settings SB3 cannot express before anything runs
        SETTINGS[agent](build_config(agent, {}), args.steps)
    plans = [RunPlan(side, agent, task, seed, args.steps, args.episodes_per_rule)
             for agent in agents for task in tasks for seed in range(args.seeds) for side in SIDES]

    print(f"tapebench bench sb3 --learning: our {', '.join(a.upper() for a in agents)} vs Stable-Baselines3 "
          f"{sb3.__version__} at matched hyperparameters (our Config defaults), {args.steps} env steps per run "
          f"(rounded up to whole vectorised steps / rollouts), {args.seeds} seeds per side; final policies "
          f"evaluated greedily on the same episodes ({args.episodes_per_rule} per rule) through our runner")
    print(f"tasks: {', '.join(f'{t.name} (L=H={t.L})' if t.L == t.H else f'{t.name} (L={t.L}, H={t.H})' for t in tasks)}; "
          f"{len(plans)} runs in {args.jobs} process(es), 1 torch thread each; load average {load_average()}")
    started = time.perf_counter()

    def report(result, done, total):
        shown = ", ".join(f"{k} {v:.3f}" for k, v in result["success"].items())
        print(f"  [{done}/{total}, {time.perf_counter() - started:.0f} s] {result['agent']} {result['side']:<4} "
              f"{result['task']:<9} seed {result['seed']}: success {shown} (trained {result['env_steps']} steps in "
              f"{result['train_seconds']:.0f} s)", flush=True)

    results = run_parallel(run_one, plans, args.jobs, report)
    rows = parity_rows(results, args.seeds)
    print(f"\nstrict success, mean over {args.seeds} seeds [95% percentile-bootstrap CI]; difference = ours - SB3 "
          f"(independent groups); verdict: 'within CI' when the difference's CI contains 0")
    print(f"  {'agent':<5} {'task':<17} {'eval':<4} {'ours':>23} {'SB3':>23} {'ours - SB3':>24}  verdict")
    for row in sorted(rows, key=lambda r: (r["agent"], r["task"] != "main", r["task"], r["evaluation"])):
        print(f"  {row['agent']:<5} {row['task']:<17} {row['evaluation']:<4} {_ci(row['ours']):>23} "
              f"{_ci(row['sb3']):>23} {_ci(row['difference']):>24}  {row['verdict']}")
    seconds = {side: sum(r["cpu_seconds"] for r in results if r["side"] == side) for side in SIDES}
    print(f"CPU time of the runs (training + evaluation, 1 thread each): ours {seconds['ours'] / 3600:.2f} h, "
          f"SB3 {seconds['sb3'] / 3600:.2f} h; wall {time.perf_counter() - started:.0f} s; load average "
          f"{load_average()}")
    for agent in agents:
        print(f"remaining differences ({agent}):")
        for line in remaining_differences(agent, build_config(agent, {})):
            print(f"  - {line}")
    return {"stable_baselines3": sb3.__version__, "steps": args.steps, "seeds": args.seeds,
            "episodes_per_rule": args.episodes_per_rule, "tasks": [t.name for t in tasks], "rows": rows,
            "runs": results, "cpu_seconds": seconds}
