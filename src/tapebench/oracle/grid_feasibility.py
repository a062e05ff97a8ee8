"""Exact feasibility per grid rule (docs/protocol.md#grid-oracles): which non-goal n × n grids (n ≤ 4) can reach
the all-zero goal within H steps, from the exact search of `methods.grid_exact`; the columns of
`oracle.feasibility` for tapes."""
from __future__ import annotations

import numpy as np
import pandas as pd

from tapebench.grid_rules import GridFamily
from tapebench.methods.grid_exact import UNREACHABLE, check_exact_grid, check_exact_grid_horizon, value_layers


def grid_feasibility_table(rules, family: GridFamily, n: int, H: int) -> pd.DataFrame:
    """Per rule, over the 2^(n²) − 1 non-goal grids (as `oracle.feasibility` on tapes): solvable_fraction (success
    reachable within H steps = the exact controller's success from a uniform start), solvable_grids,
    any_solvable, min_steps_mean / min_steps_max over solvable grids, optimal_final_dist_mean (the least
    reachable final fraction of live cells, 0 where solvable) and steps_k, the fraction whose fewest steps is k."""
    if not isinstance(family, GridFamily):
        raise ValueError(f"family must be a GridFamily (MOORE or VON_NEUMANN), got {family!r}")
    n, H = check_exact_grid(n), check_exact_grid_horizon(H)
    ids = family.check_rules(rules)
    nongoal = (1 << (n * n)) - 1
    rows = []
    for rule_id in ids:
        W, d = value_layers(rule_id, family, n, H)
        d, final = d[1:], W[H][1:]
        solvable = d != UNREACHABLE
        row = {"rule": rule_id, "name": str(family.rule(rule_id)), "n": n, "H": H,
               "solvable_fraction": solvable.sum() / nongoal, "solvable_grids": int(solvable.sum()),
               "any_solvable": bool(solvable.any()),
               "min_steps_mean": float(d[solvable].mean()) if solvable.any() else float("nan"),
               "min_steps_max": int(d[solvable].max()) if solvable.any() else 0,
               "optimal_final_dist_mean": float(final.sum()) / (nongoal * n * n)}
        counts = np.bincount(d[solvable], minlength=H + 1)
        row.update({f"steps_{k}": counts[k] / nongoal for k in range(1, H + 1)})
        rows.append(row)
    return pd.DataFrame(rows)
