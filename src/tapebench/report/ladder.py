"""Severity ladder (docs/protocol.md#severity-ladders): strict success vs the exact rule-table distance d of the test
rules from the training set, per method — ID (the training rules) at d = 0, the ladder's levels at d = 1, 2, ...
Means over seeds with percentile-bootstrap CIs, from the ladder split's aggregate table (`tapebench aggregate`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from tapebench.report.render import render_table
from tapebench.report.style import COLUMN_WIDTH, method_style, pyplot, save_figure
from tapebench.report.tables import display_name
from tapebench.splits.io import load_split
from tapebench.utils.artifacts import read_table
from tapebench.utils.io import write_parquet
from tapebench.vocabulary import ID_SIDE, ladder_level

LADDER_COLUMNS = ["agent", "side", "d", "n_rules", "n_seeds", "mean", "ci_low", "ci_high"]


def success_by_level(aggregate: pd.DataFrame, split, *, H: int, agents: list[str] | None = None,
                     metric: str = "success") -> pd.DataFrame:
    """One row per (agent, level): d = 0 for ID, the level's rule count, mean over seeds and its CI."""
    sides = {ID_SIDE: 0, **{s: ladder_level(s) for s in split.sides if ladder_level(s) is not None}}
    sel = aggregate[(aggregate["split"] == split.name) & (aggregate["H"] == int(H)) & (aggregate["metric"] == metric)
                    & aggregate["side"].isin(list(sides))]
    present = list(dict.fromkeys(sel["agent"].astype(str)))
    wanted = list(agents) if agents else present
    missing = [a for a in wanted if a not in present]
    if missing:
        raise ValueError(f"the aggregate of ladder split {split.name!r} has no {metric} at H = {H} for methods "
                         f"{missing}; it has {present}")
    rows = []
    for agent in wanted:
        by_side = sel[sel["agent"] == agent].set_index("side")
        for side, d in sides.items():
            if side not in by_side.index:
                raise ValueError(f"the aggregate of ladder split {split.name!r} lacks side {side!r} for {agent!r}")
            r = by_side.loc[side]
            rows.append({"agent": agent, "side": side, "d": d, "n_rules": len(split.side_rules(side)),
                         "n_seeds": int(r["n"]), "mean": float(r["mean"]), "ci_low": float(r["ci_low"]),
                         "ci_high": float(r["ci_high"])})
    return pd.DataFrame(rows, columns=LADDER_COLUMNS)


def ladder_figure(table: pd.DataFrame, stem, *, split_name: str, H: int) -> list[str]:
    """Success vs d, one line per method (ID at d = 0), CIs as error bars."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH, 2.4))
    agents = list(dict.fromkeys(table["agent"]))
    offsets = np.linspace(-0.12, 0.12, len(agents)) if len(agents) > 1 else np.zeros(1)
    for i, agent in enumerate(agents):
        rows = table[table["agent"] == agent].sort_values("d")
        style = method_style(i)
        x = rows["d"].to_numpy(np.float64) + offsets[i]
        y = rows["mean"].to_numpy(np.float64)
        err = np.vstack([y - rows["ci_low"].to_numpy(np.float64), rows["ci_high"].to_numpy(np.float64) - y])
        ood = rows["d"].to_numpy() > 0      # ID is another rule set: a point of its own, the levels joined
        for part, line in ((~ood, "none"), (ood, style["linestyle"])):
            ax.errorbar(x[part], y[part], yerr=np.clip(err[:, part], 0, None), color=style["color"], linestyle=line,
                        marker=style["marker"], markersize=3.5, linewidth=1.0, capsize=2, elinewidth=0.7,
                        label=display_name(agent) if line != "none" else None)
    levels = sorted(set(table["d"].astype(int)))
    sizes = table.drop_duplicates("d").set_index("d")["n_rules"]
    ax.set_xticks(levels)
    ax.set_xticklabels([f"ID\n({sizes[d]})" if d == 0 else f"{d}\n({sizes[d]})" for d in levels])
    ax.axvline(0.5, color="#999999", linewidth=0.6, linestyle=":")
    ax.set_xlabel("rule-table distance $d$ to the training rules\n(rules per level)")
    ax.set_ylabel("strict success")
    ax.set_ylim(-0.03, 1.03)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(f"Severity ladder (split {split_name}): success vs $d$ ($H={H}$)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return save_figure(fig, stem)


def render_ladder(out, *, aggregate, split_file, H, split=None, agents=None, table=None, parquet=None) -> list[str]:
    """The figure at `out`.pdf / .png, and optionally the table (LaTeX) and the per-level Parquet."""
    split = load_split(split_file)     # `split` (the name) is for the caption only; the file names it too
    if not split.levels:
        raise ValueError(f"{split_file} is not a severity ladder split (it has no levels); build it with "
                         f"`tapebench ladder-split`")
    frame = read_table(aggregate, "aggregate")[0]
    data = success_by_level(frame, split, H=int(H), agents=list(agents) if agents else None)
    if parquet:
        write_parquet(parquet, data, meta={"table": "ladder", "split": split.name, "split_hash": split.content_hash,
                                           "H": int(H), "train": list(split.train)})
    paths = ladder_figure(data, out, split_name=split.name, H=int(H))
    if table:
        levels = sorted(set(data["d"].astype(int)))
        sizes = data.drop_duplicates("d").set_index("d")["n_rules"].to_dict()
        rows = [{"name": display_name(agent), "cells": [grp.set_index("d").loc[d].to_dict() for d in levels]}
                for agent, grp in data.groupby("agent", sort=False)]
        ci = sorted(set(frame["ci"].astype(float)))
        render_table("ladder.tex.j2", table, rows=rows, levels=levels, sizes=sizes, split=split.name, H=int(H),
                     train=list(split.train), seeds=int(data["n_seeds"].max()),
                     ci=f"{100 * ci[0]:g}\\%" if len(ci) == 1 else "a")
    return paths
