"""`tapebench bench train`: training throughput per agent on CPU, evaluation cost, and the projected
CPU cost of the paper protocol.

For each registered method that trains (or the subset named by `--agents`): a short real training
run of `--steps` env steps (the shared loop, default hyperparameters, z ~ Unif(--rules), --L/--H,
checkpoints as in the protocol), then evaluation of its checkpoints on
the full common-random-number episode set (every rule of --rules x 20 episodes) at H and 2H — the
same work `tapebench evaluate` does per checkpoint. Baseline measured in the same run: the bare
`BatchedTapeEnv` with random actions at the agent's num_envs (the ceiling for the loop).

Projection (per agent): SEEDS x [ train 200k steps + EVAL_JOBS x (setup + 20 checkpoints x episodes) ];
the whole suite benched is the sum over its agents.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time

import torch

from tapebench import defaults
from tapebench.envs.batched import BatchedTapeEnv
from tapebench.evaluation.trained_runs import evaluate_run
from tapebench.registry import build_config, registry
from tapebench.training.loop import TrainSpec, resolve_device, train
from tapebench.validation import check_horizon, check_length, parse_rule_list

PROTOCOL_STEPS = defaults.TOTAL_STEPS
PROTOCOL_EVAL_EVERY = defaults.EVAL_EVERY
PROTOCOL_SEEDS = defaults.SEEDS
EPISODES_PER_RULE = defaults.EPISODES_PER_RULE
BENCH_STEPS = 20_000          # training steps timed per agent (default of --steps)
BENCH_EVAL_EVERY = 5_000      # -> 4 checkpoints to evaluate
PROTOCOL_LAST_K = defaults.LAST_K  # planners are evaluated at their last K checkpoints only
PLANNER_EPISODES_PER_RULE = 2 # a planner's evaluation is timed on this many episodes per rule, then scaled
PLANNER_TIMED_RULES = 16      # ... and on at most this many of the rules (evenly spaced), then scaled
HEARTBEAT_S = 30.0            # a progress line at least this often while one measurement runs


@contextlib.contextmanager
def heartbeat(what: str, every: float = HEARTBEAT_S, out=print):
    """Print `what` with the elapsed time every `every` seconds until the block ends (long measurements talk)."""
    done, start = threading.Event(), time.perf_counter()

    def beat():
        while not done.wait(every):
            out(f"  ... {what}: {time.perf_counter() - start:.0f} s so far", flush=True)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def env_baseline(num_envs: int, L: int, H: int, rules, seconds: float, device) -> float:
    """Env steps/s of the bare batched env with random actions (no agent)."""
    env = BatchedTapeEnv(num_envs, L=L, H=H, rules=rules, device=device, seed=0)
    env.reset()
    gen = torch.Generator().manual_seed(0)
    actions = [torch.randint(0, L, (num_envs,), generator=gen).to(device) for _ in range(64)]
    calls, start = 0, time.perf_counter()
    with torch.no_grad():
        while calls < 64 or time.perf_counter() - start < seconds:
            env.step(actions[calls % 64])
            calls += 1
    return calls * num_envs / (time.perf_counter() - start)


def trained_methods() -> list[str]:
    """Ids of every registered method that trains (built-in and plug-ins), sorted."""
    return sorted(m for m, method in registry().items() if method.trains)


def select_agents(requested, allowed: list[str] | None = None, command: str = "bench train") -> list[str]:
    """The agents to bench: `requested` (an `--agents` list, order kept, duplicates dropped) checked
    against the method registry, or all of `allowed` (default: every method that trains) when None."""
    training = trained_methods()
    allowed = training if allowed is None else list(allowed)
    if requested is None:
        return allowed
    requested = list(dict.fromkeys(requested))
    if not requested:
        raise ValueError(f"--agents needs at least one method id; allowed for `tapebench {command}`: {allowed}")
    methods = registry()
    unknown = [a for a in requested if a not in methods]
    if unknown:
        raise ValueError(f"--agents: unknown method id(s) {unknown}; allowed for `tapebench {command}`: {allowed}")
    untrained = [a for a in requested if not methods[a].trains]
    if untrained:
        raise ValueError(f"--agents: {untrained} do not train, so `tapebench {command}` has nothing to time; "
                         f"allowed: {allowed}")
    other = [a for a in requested if a not in allowed]
    if other:
        raise ValueError(f"--agents: `tapebench {command}` does not cover {other}; allowed: {allowed}")
    return requested


def measure_agent(agent: str, *, L: int, H: int, rules, eval_horizons, threads: int, device, seed: int = 0,
                  steps: int = BENCH_STEPS, eval_every: int = BENCH_EVAL_EVERY) -> dict:
    """Train for `steps` and time the evaluation of its checkpoints. A planner (registry
    `every_checkpoint=False`, evaluated only at its last K checkpoints) is timed on its last checkpoint
    with PLANNER_EPISODES_PER_RULE episodes per rule and scaled to the protocol's episode count."""
    spec = TrainSpec(agent=agent, rules=tuple(rules), seed=seed, L=L, H=H, total_steps=steps, eval_every=eval_every)
    planner = not registry()[agent].every_checkpoint
    episodes = PLANNER_EPISODES_PER_RULE if planner else EPISODES_PER_RULE
    rules = tuple(rules)
    timed_rules = rules[::max(1, -(-len(rules) // PLANNER_TIMED_RULES))] if planner else rules
    with tempfile.TemporaryDirectory(prefix=f"tapebench-bench-{agent}-") as run_dir:
        with heartbeat(f"{agent}: training {steps} steps"):
            manifest = train(spec, run_dir, device=device, threads=threads, quiet=True)
        figures = {"train_steps": manifest["training"]["env_steps"], "train_seconds": manifest["wall_time_s"],
                   "train_steps_per_s": manifest["steps_per_second"], "eval": {},
                   "evaluated_checkpoints": PROTOCOL_LAST_K if planner else PROTOCOL_STEPS // PROTOCOL_EVAL_EVERY,
                   "eval_episodes_per_rule_timed": episodes}
        for eval_H in eval_horizons:
            start = time.perf_counter()
            with heartbeat(f"{agent}: evaluating at H={eval_H} ({len(timed_rules)} rules x {episodes} episodes)"):
                _, summary = evaluate_run(run_dir, eval_H, rules=timed_rules, episodes_per_rule=episodes,
                                          checkpoints=1 if planner else "all", device=device, threads=threads)
            total = time.perf_counter() - start
            checkpoints = len(summary["checkpoints"])
            scale = EPISODES_PER_RULE * len(rules) / (episodes * len(timed_rules))
            figures["eval"][str(eval_H)] = {"per_checkpoint_s": scale * summary["seconds"] / checkpoints,
                                            "setup_s": total - summary["seconds"], "checkpoints": checkpoints}
    return figures


def project(figures: dict, seeds: int = PROTOCOL_SEEDS, steps: int = PROTOCOL_STEPS,
            eval_every: int = PROTOCOL_EVAL_EVERY) -> dict:
    """CPU-seconds of the protocol for one agent (single-threaded jobs: wall seconds = CPU seconds)."""
    checkpoints = figures.get("evaluated_checkpoints", steps // eval_every)
    train_s = steps / figures["train_steps_per_s"]
    eval_s = sum(e["setup_s"] + checkpoints * e["per_checkpoint_s"] for e in figures["eval"].values())
    return {"train_s_per_seed": train_s, "eval_s_per_seed": eval_s,
            "steps_per_s_incl_eval": steps / (train_s + eval_s),
            "cpu_hours": seeds * (train_s + eval_s) / 3600.0}


def bench_train(args) -> dict:
    """Entry point for `tapebench bench train` (options: --L --H --rules --threads --device --seed)."""
    L, H = check_length(args.L), check_horizon(args.H)
    rules = parse_rule_list(args.rules)
    threads = args.threads or 1
    device = resolve_device("cpu" if args.device == "auto" else args.device)
    horizons = (H, 2 * H)
    agents = select_agents(args.agents)
    steps = args.steps
    not_benched = [m for m in trained_methods() if m not in agents]
    print(f"tapebench bench train: L={L}, H={H}, {len(rules)} training rules, device {device}, "
          f"{threads} torch thread(s), {os.cpu_count()} CPU cores, load average {_load()}")
    print(f"agents: {', '.join(agents)}" + (f" (--agents; not benched: {', '.join(not_benched)})" if not_benched else
                                             " (every registered method that trains)"))
    print(f"each agent: {steps} training steps with default hyperparameters, checkpoints every "
          f"{min(BENCH_EVAL_EVERY, steps)}; evaluation of each checkpoint on {len(rules)} rules x {EPISODES_PER_RULE} "
          f"episodes at H={horizons[0]} and H={horizons[1]}; baseline: bare BatchedTapeEnv, random actions")
    figures: dict = {}
    width = max(6, *(len(a) for a in agents))
    header = (f"  {'agent':<{width}} {'envs':>4} {'env only':>10} {'train':>8} {'incl. eval':>10} "
              f"{'eval/ckpt H' + str(horizons[0]):>14} {'eval/ckpt H' + str(horizons[1]):>14}")
    print("\nenv steps/s (env only = baseline; train = shared loop incl. checkpoint writes; incl. eval = "
          f"protocol ratio of {PROTOCOL_STEPS // PROTOCOL_EVAL_EVERY} evaluated checkpoints per "
          f"{PROTOCOL_STEPS} steps, {PROTOCOL_LAST_K} for planners, whose eval/ckpt is timed on "
          f"{PLANNER_EPISODES_PER_RULE} episodes per rule of at most {PLANNER_TIMED_RULES} rules and scaled to "
          f"{EPISODES_PER_RULE} episodes of every rule); each line as soon as it is measured:")
    print(header, flush=True)
    for agent in agents:
        num_envs = build_config(agent, {}).num_envs
        torch.set_num_threads(threads)
        baseline = env_baseline(num_envs, L, H, rules, 1.0, device)
        measured = measure_agent(agent, L=L, H=H, rules=rules, eval_horizons=horizons, threads=threads,
                                 device=device, seed=args.seed, steps=steps)
        projection = project(measured)
        figures[agent] = {**measured, "num_envs": num_envs, "env_baseline_steps_per_s": baseline,
                          "protocol": projection}
        print(f"  {agent:<{width}} {num_envs:>4} {baseline:>10.0f} {measured['train_steps_per_s']:>8.0f} "
              f"{projection['steps_per_s_incl_eval']:>10.0f} "
              + " ".join(f"{measured['eval'][str(h)]['per_checkpoint_s']:>13.2f}s" for h in horizons), flush=True)
    total = sum(f["protocol"]["cpu_hours"] for f in figures.values())
    print(f"\nprojected paper protocol ({PROTOCOL_STEPS} steps x {PROTOCOL_SEEDS} seeds, "
          f"{PROTOCOL_STEPS // PROTOCOL_EVAL_EVERY} checkpoints x {len(rules)} rules x {EPISODES_PER_RULE} "
          f"episodes at H={horizons[0]} and {horizons[1]}), single-threaded jobs:")
    for agent, f in figures.items():
        p = f["protocol"]
        print(f"  {agent:<{width}} train {p['train_s_per_seed']:7.0f} s + eval {p['eval_s_per_seed']:5.0f} s per seed "
              f"-> {p['cpu_hours']:.2f} CPU-hours")
    mean = total / len(figures)
    print(f"  whole suite ({len(figures)} agent{'s' if len(figures) > 1 else ''}: {', '.join(figures)}; "
          f"{PROTOCOL_SEEDS} seeds each): {total:.2f} CPU-hours; N agents of similar cost: ~{mean:.2f} x N CPU-hours")
    if not_benched:
        print(f"  (the suite benched here is the --agents subset; not included: {', '.join(not_benched)})")
    figures["total_cpu_hours"] = total
    figures["whole_suite"] = {"agents": list(agents), "not_benched": not_benched, "cpu_hours": total,
                              "seeds": PROTOCOL_SEEDS, "steps": PROTOCOL_STEPS}
    return figures
