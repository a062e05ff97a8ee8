"""`tapebench bench methods`: evaluation cost of the methods that do not train (belief trackers,
planners, reference rows) on the paper protocol's episodes, beside the random policy measured in the
same run, and the projected CPU time of their pipeline jobs (seeds x horizons)."""
from __future__ import annotations

import os
import time

import torch

from tapebench.evaluation.evaluate import evaluate_untrained, side_protocols
from tapebench.registry import build_config, get_method, registry
from tapebench.validation import check_horizon, check_length, parse_rule_list

PROTOCOL_SEEDS = 20
EPISODES_PER_RULE = 20
BASELINE = "random"


def untrained_methods() -> list[str]:
    return sorted(m for m, method in registry().items() if method.make_policy is not None and not method.sees_true_rule)


def _time(method_id: str, sides, train_rules, seed: int) -> tuple[float, float]:
    start = time.perf_counter()
    records, _ = evaluate_untrained(method_id, {}, seed, sides, train_rules=train_rules)
    return time.perf_counter() - start, float(records["success"].mean())


def bench_methods(args) -> dict:
    L, H = check_length(args.L), check_horizon(args.H)
    rules = parse_rule_list(args.rules)
    agents = list(dict.fromkeys(args.agents)) if args.agents else untrained_methods()
    for a in agents:
        if get_method(a).trains:
            raise ValueError(f"--agents: {a!r} trains; `tapebench bench train` times it")
    # numba is heavy: loaded only when this runs
    import numba

    threads = args.threads or 1
    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))   # as the pipeline's jobs run
    sides = side_protocols(L=L, H=H, episodes_per_rule=EPISODES_PER_RULE, eval_seed=0, rules=rules)
    episodes = len(sides[0][0])
    print(f"tapebench bench methods: L={L}, H={H}, {len(rules)} rules x {EPISODES_PER_RULE} episodes = {episodes} "
          f"episodes (candidate set `train` = these rules), {os.cpu_count()} CPU cores, {threads} "
          f"thread(s) (--threads; the pipeline's evaluation jobs use 1); baseline: the {BASELINE} policy in the same run")
    _time(BASELINE, sides, rules, args.seed)   # compile / warm caches outside the timings
    base_s, base_success = _time(BASELINE, sides, rules, args.seed)
    figures = {BASELINE: {"seconds": base_s, "success": base_success}}
    width = max(len(a) for a in [*agents, BASELINE])
    print(f"  {'method':<{width}} {'seconds':>9} {'ms/episode':>11} {'success':>8}  projected pipeline (H and 2H x "
          f"{PROTOCOL_SEEDS} seeds)")
    print(f"  {BASELINE:<{width}} {base_s:>9.2f} {1000 * base_s / episodes:>11.3f} {base_success:>8.3f}  (baseline)")
    for agent in agents:
        if agent == BASELINE:
            continue
        build_config(agent, {})
        _time(agent, side_protocols(L=L, H=H, episodes_per_rule=1, eval_seed=0, rules=rules[:2]), rules, args.seed)
        seconds, success = _time(agent, sides, rules, args.seed)
        seeds = 1 if get_method(agent).deterministic else PROTOCOL_SEEDS
        projected_h = seeds * seconds * 3 / 3600.0   # H and 2H: about 1 + 2 times the H cost
        figures[agent] = {"seconds": seconds, "success": success, "projected_cpu_hours": projected_h}
        print(f"  {agent:<{width}} {seconds:>9.2f} {1000 * seconds / episodes:>11.3f} {success:>8.3f}  "
              f"~{projected_h:.2f} CPU-hours")
    return figures
