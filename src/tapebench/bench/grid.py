"""`tapebench bench grid`: the grid kernels' grid-steps/s on 8 × 8 torus grids (docs/protocol.md#grid).

The NumPy reference (`ca.grid_reference.update`, batched `np.roll` sums and a table lookup) is the baseline;
the bit-packed numba kernel (`ca.grid_packed.step_words`, one uint64 word per grid) and the torch kernel
(`ca.grid_torch.ca_step`, on the CPU, --threads or 1 thread) are measured beside it in the same run, after a
check that all three give the same grids.
"""
from __future__ import annotations

import numpy as np

from tapebench.bench import fmt, load_average, measure

GRID_SIDE = 8
GRID_BATCH = 4096            # grids per call
PACKED_GOAL_RATIO = 20.0     # packed kernel >= 20x the NumPy reference
GRID_RULES = ("B3/S23", "B36/S23", "B1/S12V")


def bench_grid(args) -> dict:
    # numba and torch are heavy: loaded only when this runs
    import numba
    import torch

    # lazy: a command loads only the modules it runs
    from tapebench.ca import grid_packed, grid_reference, grid_torch
    from tapebench.grid_rules import parse_rule

    n, seconds, repeats = GRID_SIDE, args.seconds, args.repeats
    threads = args.threads or 1
    rng = np.random.default_rng(args.seed)
    grids = rng.integers(0, 2, (GRID_BATCH, n, n), dtype=np.uint8)
    words = grid_packed.pack(grids)
    print(f"tapebench bench grid: {GRID_BATCH} grids of {n} x {n} per call, one core (torch: {threads} thread(s)), "
          f"numpy {np.__version__}, numba {numba.__version__}, torch {torch.__version__}")
    print(f"each figure: median of {repeats} runs x {seconds:g} s (load average now: {load_average()}); "
          f"goal: packed kernel >= {PACKED_GOAL_RATIO:g}x the NumPy reference")
    print(f"  {'rule':<9}  {'numpy reference':>15}  {'numba packed':>12}  {'torch':>10}  {'packed / numpy':>14}  goal")
    figures: dict = {"n": n, "batch": GRID_BATCH, "threads": threads, "rules": {}}
    default_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for text in GRID_RULES:
            rule = parse_rule(text)
            moore = rule.family.neighbours == 8
            tables = torch.as_tensor(np.broadcast_to(rule.table.reshape(1, -1), (GRID_BATCH, 2 * rule.family.counts))
                                     .copy())
            tensor = torch.from_numpy(grids)
            expected = grid_reference.update(grids, rule)
            if not (np.array_equal(grid_packed.unpack(grid_packed.step_words(words, rule.id, n, moore), n), expected)
                    and np.array_equal(grid_torch.ca_step(tensor, tables, rule.family).numpy(), expected)):
                raise RuntimeError(f"the grid kernels disagree with the NumPy reference for rule {text}")
            base = measure(lambda: grid_reference.update(grids, rule), GRID_BATCH, seconds, repeats)
            packed = measure(lambda: grid_packed.step_words(words, rule.id, n, moore), GRID_BATCH, seconds, repeats)
            with torch.no_grad():
                torch_rate = measure(lambda: grid_torch.ca_step(tensor, tables, rule.family), GRID_BATCH, seconds,
                                     repeats)
            ratio = packed / base
            met = "met" if ratio >= PACKED_GOAL_RATIO else "MISSED"
            print(f"  {text:<9}  {fmt(base):>15}  {fmt(packed):>12}  {fmt(torch_rate):>10}  {ratio:>13.0f}x  {met}")
            figures["rules"][text] = {"numpy_reference": base, "packed": packed, "torch": torch_rate,
                                      "packed_over_numpy": ratio}
    finally:
        torch.set_num_threads(default_threads)
    print("  (grid-steps/s: grids advanced by one synchronous update per second)")
    return figures
