"""`tapebench bench flops`: how far each agent's training loop is from its arithmetic ceiling on this core.

For each agent, the same short training run (--steps env steps through the shared loop, default
hyperparameters) twice: once timed (env steps/s), once under torch's `FlopCounterMode`, which counts the
floating-point operations of every matrix product and convolution — the arithmetic the agent's
hyperparameters demand, whatever the implementation. At the best GEMM rate this core reaches (measured in
the same run on a few shapes from the agents' own layers), those FLOPs alone take a time that no
implementation at the same hyperparameters can beat: the *ceiling* in env steps/s. The measured rate over
the ceiling is the loop's efficiency; what is left is overhead (element-wise ops, small-batch latency,
Python) that code can still remove. Short runs include the warm-up before learning starts (few FLOPs), so
the ceiling of a short run is above a long run's: a conservative bound.
"""
from __future__ import annotations

import dataclasses
import tempfile

import torch
from torch.utils.flop_counter import FlopCounterMode

from tapebench.bench import measure
from tapebench.bench.training import heartbeat, select_agents
from tapebench.training.loop import TrainSpec, train
from tapebench.validation import check_horizon, check_length, parse_rule_list

DEFAULT_AGENTS = ("dqn", "ppo", "dreamer")
# (rows, inner, outer) of products the agents compute: DQN's batch-128 layers, DreamerV3's imagination heads
GEMM_SHAPES = ((128, 33, 256), (128, 256, 256), (256, 256, 128), (3840, 256, 128))


def count_flops(fn) -> int:
    """FLOPs of the matrix products and convolutions `fn()` runs (torch's FlopCounterMode)."""
    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return int(counter.get_total_flops())


def gemm_rate(shapes=GEMM_SHAPES, seconds: float = 0.3, repeats: int = 3, threads: int = 1) -> dict:
    """FLOP/s of `x @ w.T` on `threads` torch threads per shape (median of `repeats` timed runs) and the best of
    them."""
    rates, before = {}, torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows, inner, outer in shapes:
            x, w = torch.randn(rows, inner), torch.randn(outer, inner)
            rates[f"{rows}x{inner}x{outer}"] = measure(lambda: x @ w.t(), 2 * rows * inner * outer, seconds, repeats)
    finally:
        torch.set_num_threads(before)
    return {"per_shape": rates, "best": max(rates.values())}


def ceiling_steps_per_s(steps: int, flops: int, flops_per_s: float) -> float:
    """Env steps/s if the run did nothing but its FLOPs at `flops_per_s`."""
    return float("inf") if flops == 0 else steps * flops_per_s / flops


def counted_run_flops(spec: TrainSpec, threads: int = 1) -> tuple[int, int]:
    """(env steps, FLOPs) of training `spec` once from scratch under the counter."""
    with tempfile.TemporaryDirectory(prefix=f"tapebench-flops-{spec.agent}-") as run_dir:
        result = {}
        flops = count_flops(lambda: result.update(train(spec, run_dir, device="cpu", threads=threads, quiet=True)))
    return int(result["training"]["env_steps"]), flops


def steady_flops_per_step(spec: TrainSpec, threads: int = 1) -> float:
    """FLOPs per env step once learning runs: two counted runs of `spec`, of total_steps / 2 and total_steps
    env steps, and the difference of their FLOPs over the difference of their steps. The warm-up before
    learning starts (few FLOPs) cancels, so a run of any length is charged the rate of its learning phase."""
    half = dataclasses.replace(spec, total_steps=max(1, spec.total_steps // 2), eval_every=max(1, spec.total_steps // 2))
    whole = dataclasses.replace(spec, eval_every=spec.total_steps)
    (steps_a, flops_a), (steps_b, flops_b) = counted_run_flops(half, threads), counted_run_flops(whole, threads)
    if steps_b <= steps_a:
        raise ValueError(f"steady_flops_per_step needs total_steps >= 2 batched steps, got {spec.total_steps}")
    return (flops_b - flops_a) / (steps_b - steps_a)


def measure_agent(agent: str, *, rules, L: int, H: int, steps: int, seed: int, threads: int) -> dict:
    spec = TrainSpec(agent=agent, rules=tuple(rules), seed=seed, L=L, H=H, total_steps=steps, eval_every=steps)

    def run():
        with tempfile.TemporaryDirectory(prefix=f"tapebench-flops-{agent}-") as run_dir:
            return train(spec, run_dir, device="cpu", threads=threads, quiet=True)

    with heartbeat(f"{agent}: timing {steps} steps"):
        manifest = run()
    with heartbeat(f"{agent}: counting the FLOPs of the same run"):
        flops = count_flops(run)
    return {"env_steps": manifest["training"]["env_steps"], "steps_per_s": manifest["steps_per_second"],
            "flops": flops}


def bench_flops(args) -> dict:
    """Entry point for `tapebench bench flops` (options: --agents --steps --L --H --rules --threads --seed)."""
    L, H = check_length(args.L), check_horizon(args.H)
    steps = args.steps
    rules = parse_rule_list(args.rules)
    threads = args.threads or 1
    agents = select_agents(args.agents or list(DEFAULT_AGENTS), command="bench flops")
    torch.set_num_threads(threads)
    rate = gemm_rate(seconds=args.seconds / 3, repeats=args.repeats, threads=threads)
    print(f"tapebench bench flops: L={L}, H={H}, {len(rules)} training rules, {steps} env steps per run, "
          f"{threads} torch thread(s)")
    print("GEMM rate of this core (x @ w.T, GFLOP/s): "
          + ", ".join(f"{shape} {r / 1e9:.1f}" for shape, r in rate["per_shape"].items())
          + f"; the ceiling uses the best, {rate['best'] / 1e9:.1f}")
    width = max(7, *(len(a) for a in agents))
    print(f"\n  {'agent':<{width}} {'measured':>9} {'GFLOP/1k steps':>15} {'ceiling':>9} {'efficiency':>10}"
          "   (env steps/s; ceiling = the counted FLOPs alone at the best GEMM rate)", flush=True)
    figures: dict = {"gemm_flops_per_s": rate, "agents": {}}
    for agent in agents:
        m = measure_agent(agent, rules=rules, L=L, H=H, steps=steps, seed=args.seed, threads=threads)
        ceiling = ceiling_steps_per_s(m["env_steps"], m["flops"], rate["best"])
        m.update(ceiling_steps_per_s=ceiling, efficiency=m["steps_per_s"] / ceiling)
        figures["agents"][agent] = m
        print(f"  {agent:<{width}} {m['steps_per_s']:>9.0f} {m['flops'] / m['env_steps'] / 1e6:>15.3f} "
              f"{ceiling:>9.0f} {m['efficiency']:>9.0%}", flush=True)
    if len(agents) > 1:
        base = agents[0]
        print(f"\nrelative to {base}'s measured env steps/s (what `bench train` compares): measured ratio, and the "
              "most any implementation at the same hyperparameters could reach on this core (ceiling / "
              f"{base} measured):")
        for agent in agents[1:]:
            m, b = figures["agents"][agent], figures["agents"][base]
            print(f"  {agent:<{width}} {m['steps_per_s'] / b['steps_per_s']:.2f} now, at most "
                  f"{m['ceiling_steps_per_s'] / b['steps_per_s']:.2f}")
    return figures
