"""Grid rollouts (`grid_rollouts`, docs/protocol.md#grid-pipeline): one rule of each operational type of a 2D grid
rule set (stable / periodic / chaotic, as `rules/grid_features.py` types them), each a row of small panels: the free
evolution (no actions) of the true dynamics from one random n × n grid, the same grid for every rule.

The rule of a type is, by default, its typical rule in the features table: the one at the (lower) median of the
type's activity (ties: the lower id). `rules` picks them instead (Golly notation or ids; each must be in the table,
whose type it shows). The start grid is i.i.d. Bernoulli(0.5) from `numpy.random.default_rng(seed)`, redrawn while
it is the all-zero goal. No pipeline input but the features table.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from tapebench.ca.grid_reference import rollout
from tapebench.grid_rules import GridFamily
from tapebench.report import style
from tapebench.rule_family import family_from_config
from tapebench.utils.artifacts import read_table
from tapebench.validation import check_grid_size, check_integer

MAX_ROLLOUT_STEPS = 16     # panels per row beyond this are too small to read


def start_grid(n: int, seed: int) -> np.ndarray:
    """The (n, n) uint8 start grid every row shares: Bernoulli(0.5) cells, redrawn while all zero."""
    n = check_grid_size(n)
    rng = np.random.default_rng(check_integer(seed, "grid rollout seed", minimum=0))
    grid = rng.integers(0, 2, size=(n, n), dtype=np.uint8)
    while not grid.any():
        grid = rng.integers(0, 2, size=(n, n), dtype=np.uint8)
    return grid


def representatives(features: pd.DataFrame) -> pd.DataFrame:
    """One row of `features` per type present (types in `style.TYPE_ORDER`, unknown ones after): the rule at the
    lower median of the type's activity, ties to the lower id."""
    rows = []
    for rule_type in style.types_present(features["type"]):
        of_type = features[features["type"] == rule_type].sort_values(["activity", "rule"], kind="stable")
        rows.append(of_type.iloc[(len(of_type) - 1) // 2])
    return pd.DataFrame(rows).reset_index(drop=True)


def chosen_rules(features: pd.DataFrame, family: GridFamily, rules=None) -> pd.DataFrame:
    """The rows of the rules to draw: `representatives`, or the given rules (notation or ids) in their order."""
    if rules is None:
        return representatives(features)
    ids = family.check_rules(rules)
    known = set(features["rule"].astype(int))
    missing = [str(family.rule(r)) for r in ids if r not in known]
    if missing:
        raise ValueError(f"grid rollouts: rules {missing} are not in the features table (its {len(known)} rules "
                         f"are the config's rule set); pick rules of that table or leave --rules out")
    by_id = features.set_index(features["rule"].astype(int), drop=False)
    return pd.DataFrame([by_id.loc[r] for r in ids]).reset_index(drop=True)


def grid_rollouts(features: pd.DataFrame, family: GridFamily, *, n: int, steps: int, seed: int,
                  rules=None) -> list[dict]:
    """One item per drawn rule: rule (id), notation (Golly), type, grids ((steps + 1, n, n) uint8, t = 0..steps)."""
    if not isinstance(family, GridFamily):
        raise ValueError(f"grid rollouts need a features table of the 2D grid family; this one is of the "
                         f"{family.describe()}")
    steps = check_integer(steps, "grid rollout steps", 1, MAX_ROLLOUT_STEPS)
    grid = start_grid(n, seed)
    out = []
    for _, row in chosen_rules(features, family, rules).iterrows():
        rule = family.rule(int(row["rule"]))
        out.append({"rule": rule.id, "notation": str(rule), "type": str(row["type"]),
                    "grids": rollout(grid, rule, steps)})
    return out


def render_grid_rollouts(out, *, features, n: int, steps: int, seed: int, rules=None) -> list[str]:
    plt = style.pyplot()
    table, meta = read_table(features, "features")
    family = family_from_config(meta.get("config", {}).get("family"))
    items = grid_rollouts(table, family, n=n, steps=steps, seed=seed, rules=rules)
    columns = steps + 1
    panel = min(0.62, (style.FULL_WIDTH - 1.0) / columns)
    fig, axes = plt.subplots(len(items), columns, figsize=(1.0 + panel * columns, 0.4 + 1.1 * panel * len(items)),
                             squeeze=False)
    for r, item in enumerate(items):
        for t in range(columns):
            ax = axes[r, t]
            ax.imshow(item["grids"][t], cmap=style.CELL_CMAP, vmin=0, vmax=1, interpolation="nearest",
                      aspect="equal")
            ax.set_xticks([])
            ax.set_yticks([])
            for spine in ax.spines.values():
                spine.set_edgecolor("#888888")
                spine.set_linewidth(0.5)
            if r == 0:
                ax.set_title(f"$t={t}$", fontsize=7, pad=2)
        axes[r, 0].set_ylabel(f"{item['notation']}\n{item['type']}", rotation=0, ha="right", va="center",
                              fontsize=7, labelpad=4, color=style.type_colour(item["type"]))
    fig.suptitle(f"free evolution (no actions) from one random ${n} \\times {n}$ torus grid (seed {seed}), "
                 f"{family.name_in_text} neighbourhood; black = 1, white = 0", fontsize=7, y=0.02, va="bottom")
    fig.subplots_adjust(left=0.16, right=0.99, top=0.9, bottom=0.12, wspace=0.08, hspace=0.12)
    return style.save_figure(fig, out)
