"""The paper's figures (docs/protocol.md#figures): each a data function (tested against hand-computed values)
and a builder that draws it and writes `<stem>.pdf` and `<stem>.png`.

* Figure 1 (`figure1`): a rollout of rule 30 at L = 8 — initial tape, post-action, post-update, post-action,
  post-update — from the fixed tape `FIGURE1_TAPE` and actions `FIGURE1_ACTIONS`; no pipeline input.
* Figure 4 (`figure4`): space-time diagrams of rules 0, 90, 30 from one initial tape and one action sequence
  (L = 32, H = 64), both drawn from `numpy.random.default_rng(FIGURE4_SEED)`; no pipeline input. The defaults
  (`FIGURE4_*`) are the registry entry's (report/registry.py).
* Figure 3 (`figure3`): per-rule strict success (mean over seeds) of every method, ID and OOD rules, coloured
  by rule type; from the per-rule tables of the main split at the training horizon. A black cross marks the rules
  on which the rule-agnostic floor already succeeds at least as often as the MPC (`floor_rules`).
* Learning curves (`learning_curves`): ID and OOD strict success vs environment steps, mean over seeds with a
  percentile-bootstrap band over seeds per checkpoint. Methods evaluated at every checkpoint are curves; the
  others (methods that do not train, planners evaluated at their last K checkpoints only) are horizontal
  reference lines at their reported value (mean over seeds of the mean over their evaluated checkpoints).
* Oracle gap (`oracle_gap`): true-dynamics MPC vs the exact optimum per rule on the same episodes at the
  fixed-z oracle's L = H (16 in the paper protocol): strict success and final distance, with the diagonal.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from tapebench import registry as methods
from tapebench.ca import reference
from tapebench.defaults import CI, N_RESAMPLES, REFERENCE
from tapebench.report import style
from tapebench.report.registry import FIGURE4_H, FIGURE4_L, FIGURE4_RULES, FIGURE4_SEED, has_curve
from tapebench.report.tables import FAMILY_ORDER, display_name, family
from tapebench.stats.aggregate import group_generator, rule_agnostic_ids
from tapebench.stats.bootstrap import percentile_ci
from tapebench.stats.headroom import best_floor
from tapebench.utils.artifacts import expect_parquet, read_table
from tapebench.utils.io import read_parquet_meta
from tapebench.vocabulary import SPLIT_SIDES

FIGURE1_RULE = 30
FIGURE1_TAPE = (0, 1, 1, 0, 1, 0, 0, 1)
FIGURE1_ACTIONS = (2, 6)
FIGURE4_TYPES = {0: "stable", 90: "periodic", 30: "chaotic"}   # the paper's representatives (panel titles)


# --- Figure 1: one rollout, stage by stage ------------------------------------------------------------------
def rollout_stages(tape, actions, rule: int) -> list[dict]:
    """Initial tape, then per action the post-action (flipped) and post-update tapes.

    Each stage: label, tape (uint8 array), flipped (the cell the action flipped, or None), step (t).
    """
    tape = np.asarray(tape, dtype=np.uint8)
    stages = [{"label": "$s_0$ (initial)", "tape": tape, "flipped": None, "step": 0}]
    for t, action in enumerate(actions):
        flipped = reference.flip(tape, action)
        stages.append({"label": f"flip $a_{t}={int(action)}$", "tape": flipped, "flipped": int(action), "step": t})
        tape = reference.ca_step(flipped, rule)
        stages.append({"label": f"$s_{t + 1}$ (rule {rule})", "tape": tape, "flipped": None, "step": t + 1})
    return stages


def _draw_cells(ax, grid: np.ndarray) -> None:
    ax.imshow(grid, cmap=style.CELL_CMAP, vmin=0, vmax=1, interpolation="nearest", aspect="equal")


def render_figure1(out, *, rule: int = FIGURE1_RULE, tape=FIGURE1_TAPE, actions=FIGURE1_ACTIONS) -> list[str]:
    # matplotlib is heavy: only figure builders load it
    from matplotlib.patches import Rectangle

    plt = style.pyplot()
    stages = rollout_stages(tape, actions, rule)
    L = len(stages[0]["tape"])
    fig, ax = plt.subplots(figsize=(style.COLUMN_WIDTH, 0.32 * len(stages) + 0.5))
    grid = np.stack([s["tape"] for s in stages])
    _draw_cells(ax, grid)
    for row, stage in enumerate(stages):
        if stage["flipped"] is not None:
            ax.add_patch(Rectangle((stage["flipped"] - 0.5, row - 0.5), 1, 1, fill=False,
                                   edgecolor=style.FLIP_COLOUR, linewidth=2.2))
    ax.set_xticks(np.arange(L))
    ax.set_xticks(np.arange(-0.5, L), minor=True)
    ax.set_yticks(np.arange(len(stages)), [s["label"] for s in stages])
    ax.set_yticks(np.arange(-0.5, len(stages)), minor=True)
    ax.grid(which="minor", color="#888888", linewidth=0.5)
    ax.tick_params(which="minor", length=0)
    ax.tick_params(axis="x", length=0)
    ax.xaxis.set_ticks_position("top")
    ax.set_xlabel("cell", labelpad=2)
    ax.xaxis.set_label_position("top")
    ax.set_title(f"black = 1, white = 0; framed: the flipped cell (rule {rule}, L = {L})", fontsize=7, y=-0.2)
    return style.save_figure(fig, out)


# --- Figure 4: space-time diagrams --------------------------------------------------------------------------
def figure4_episode(seed: int = FIGURE4_SEED, L: int = FIGURE4_L, H: int = FIGURE4_H) -> tuple[np.ndarray, np.ndarray]:
    """The initial tape (L cells) and the H actions every panel of Figure 4 shares."""
    if L < 1 or H < 1:
        raise ValueError(f"Figure 4 needs L >= 1 and H >= 1, got L = {L}, H = {H}")
    rng = np.random.default_rng(seed)
    tape = rng.integers(0, 2, size=L).astype(np.uint8)
    actions = rng.integers(0, L, size=H)
    return tape, actions


def spacetime(tape, actions, rule: int) -> np.ndarray:
    """Tapes s_0..s_H (H + 1, L): s_{t+1} = F_rule(flip(s_t, a_t)). Row t is the tape the action a_t flips."""
    rows = [np.asarray(tape, dtype=np.uint8)]
    for action in actions:
        rows.append(reference.transition(rows[-1], int(action), rule))
    return np.stack(rows)


def render_figure4(out, *, rules=FIGURE4_RULES, L: int = FIGURE4_L, H: int = FIGURE4_H,
                   seed: int = FIGURE4_SEED) -> list[str]:
    # matplotlib is heavy: only figure builders load it
    from matplotlib.lines import Line2D

    plt = style.pyplot()
    tape, actions = figure4_episode(seed, L, H)
    fig, axes = plt.subplots(1, len(rules), figsize=(style.FULL_WIDTH, 0.75 + 4.2 * (H + 1) / 65 * 32 / L),
                             sharey=True)
    axes = np.atleast_1d(axes)
    for ax, rule in zip(axes, rules):
        _draw_cells(ax, spacetime(tape, actions, int(rule)))
        ax.scatter(actions, np.arange(len(actions)), s=4, color=style.FLIP_COLOUR, linewidths=0)
        rule_type = FIGURE4_TYPES.get(int(rule))
        ax.set_title(f"rule {int(rule)}" + (f" ({rule_type})" if rule_type else ""),
                     color=style.type_colour(rule_type) if rule_type else "black")
        ax.set_xlabel("cell")
    axes[0].set_ylabel("time step t (down)")
    legend = [Line2D([], [], marker="s", linestyle="", color="black", label="cell = 1"),
              Line2D([], [], marker="s", linestyle="", markerfacecolor="white", markeredgecolor="black",
                     label="cell = 0"),
              Line2D([], [], marker="o", linestyle="", color=style.FLIP_COLOUR, markersize=4,
                     label="cell flipped by the action at t")]
    fig.legend(handles=legend, loc="lower center", ncol=3, frameon=False, bbox_to_anchor=(0.5, -0.01))
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return style.save_figure(fig, out)


# --- Figure 3: per-rule performance by type -----------------------------------------------------------------
def method_order(agents) -> list[str]:
    """Agents grouped by family in the tables' family order (references last), registry order within."""
    agents = list(dict.fromkeys(str(a) for a in agents))
    registered = list(methods.registry())
    rank = {a: (list(FAMILY_ORDER).index(family(a)), registered.index(a) if a in registered else len(registered), a)
            for a in agents}
    return sorted(agents, key=rank.__getitem__)


def _read_many(paths, kind: str) -> pd.DataFrame:
    if isinstance(paths, (str, bytes)) or not hasattr(paths, "__iter__"):
        paths = [paths]
    frames = [read_table(p, kind)[0] for p in paths]
    if not frames:
        raise ValueError(f"no {kind} tables given")
    return pd.concat(frames, ignore_index=True)


def _select(frame: pd.DataFrame, what: str, **wanted) -> pd.DataFrame:
    for column, value in wanted.items():
        if value is None:
            continue
        present = sorted(frame[column].dropna().unique().tolist())
        if value not in present:
            raise ValueError(f"{what}: no rows with {column} = {value!r}; present: {present}")
        frame = frame[frame[column] == value]
    return frame


def per_rule_points(per_rule: pd.DataFrame, metric: str = "success", split: str | None = None,
                    H: int | None = None) -> pd.DataFrame:
    """One row per (agent, side, rule): the rule's value of `metric` averaged over seeds.

    Columns agent, side (train / test), rule, type, value, n_seeds; agents in `method_order`.
    """
    data = _select(per_rule, "per-rule table", metric=metric, split=split, H=H)
    data = data[data["side"].isin(SPLIT_SIDES)]
    if data.empty:
        raise ValueError(f"per-rule table has no ID / OOD rows for metric {metric!r}")
    points = (data.groupby(["agent", "side", "rule", "type"], sort=True)["value"]
              .agg(value="mean", n_seeds="size").reset_index())
    order = {a: i for i, a in enumerate(method_order(points["agent"]))}
    points["_order"] = points["agent"].map(order)
    points["_side"] = points["side"].map({s: i for i, s in enumerate(SPLIT_SIDES)})
    return (points.sort_values(["_order", "_side", "rule"]).drop(columns=["_order", "_side"])
            .reset_index(drop=True))


def floor_rules(points: pd.DataFrame, rule_agnostic=None, reference: str = REFERENCE) -> set[tuple[str, int]]:
    """(side, rule) pairs on which the rule-agnostic floor already succeeds: its per-rule success (`per_rule_points`)
    is above 0 and at least the reference's. The floor is, per side, the rule-agnostic row (registry flag
    `rule_agnostic`, or the ids given) with the highest mean over that side's rules; none without the reference or a
    rule-agnostic row among the points."""
    agnostic = set(rule_agnostic_ids() if rule_agnostic is None else rule_agnostic)
    marked = set()
    for side, d in points.groupby("side", sort=True):
        values = {a: g.set_index("rule")["value"] for a, g in d.groupby("agent", sort=True)}
        floors = {a: v.to_numpy() for a, v in values.items() if a in agnostic}
        if reference not in values or not floors:
            continue
        floor = values[best_floor(floors)]
        ref = values[reference].reindex(floor.index)
        marked |= {(str(side), int(r)) for r in floor.index[(floor > 0) & (floor >= ref)]}
    return marked


def _offsets(values: np.ndarray, width: float) -> np.ndarray:
    """Horizontal offsets that spread points with equal values (a beeswarm on a grid of 1/40)."""
    keys = np.round(np.asarray(values, dtype=float) * 40)
    out = np.zeros(len(keys))
    for key in np.unique(keys):
        idx = np.flatnonzero(keys == key)
        if len(idx) > 1:
            out[idx] = np.linspace(-width, width, len(idx))
    return out


def render_figure3(out, *, per_rule, split=None, H=None, metric: str = "success") -> list[str]:
    # matplotlib is heavy: only figure builders load it
    from matplotlib.lines import Line2D

    plt = style.pyplot()
    points = per_rule_points(_read_many(per_rule, "per_rule"), metric, split, H)
    marked = floor_rules(points) if metric == "success" else set()
    agents = list(dict.fromkeys(points["agent"]))
    width = max(style.COLUMN_WIDTH, min(style.FULL_WIDTH, 0.9 + 0.55 * len(agents)))
    fig, ax = plt.subplots(figsize=(width, 2.9))
    crowded = points.groupby(["agent", "side"]).size().max() > 60
    size, alpha = (7, 0.6) if crowded else (14, 1.0)
    for i, agent in enumerate(agents):
        for side, shift in (("train", -0.2), ("test", 0.2)):
            d = points[(points["agent"] == agent) & (points["side"] == side)]
            x = i + shift + _offsets(d["value"].to_numpy(), 0.16)
            for rule_type in style.types_present(d["type"]):
                sel = (d["type"] == rule_type).to_numpy()
                colour = style.type_colour(rule_type)
                ax.scatter(x[sel], d["value"].to_numpy()[sel], s=size, marker=style.type_marker(rule_type),
                           facecolors=colour if side == "train" else "none", edgecolors=colour, linewidths=0.8,
                           alpha=alpha)
            floor = np.array([(side, int(r)) in marked for r in d["rule"]], dtype=bool)
            if floor.any():
                ax.scatter(x[floor], d["value"].to_numpy()[floor], s=size * 0.5, marker="x", color="black",
                           linewidths=0.6, zorder=3)
        if i:
            ax.axvline(i - 0.5, color="#dddddd", linewidth=0.6, zorder=0)
    ax.set_xticks(np.arange(len(agents)), [display_name(a) for a in agents], rotation=35, ha="right",
                  rotation_mode="anchor")
    ax.set_xlim(-0.6, len(agents) - 0.4)
    ax.set_ylim(-0.04, 1.04)
    ax.set_ylabel("strict success per rule" if metric == "success" else f"{metric} per rule")
    ax.grid(axis="y", alpha=0.3)
    types = style.types_present(points["type"])
    handles = [Line2D([], [], marker=style.type_marker(t), linestyle="", color=style.type_colour(t), label=t)
               for t in types]
    handles += [Line2D([], [], marker="o", linestyle="", color="#555555", label="ID rule (left, filled)"),
                Line2D([], [], marker="o", linestyle="", markerfacecolor="none", markeredgecolor="#555555",
                       label="OOD rule (right, hollow)")]
    if width < 5.5 and len(types) == 3:     # two rows, filled column by column: types above, ID / OOD below
        handles = [handles[0], handles[3], handles[1], handles[4], handles[2]]
    if marked:
        handles.append(Line2D([], [], marker="x", linestyle="", color="black",
                              label="rule-agnostic floor $\\geq$ MPC"))
    ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False, handletextpad=0.2,
              columnspacing=0.9, ncol=len(handles) if width >= 5.5 else len(types))
    fig.tight_layout()
    return style.save_figure(fig, out)


# --- Learning curves ----------------------------------------------------------------------------------------
def curve_bands(curves: pd.DataFrame, metric: str = "success", n_resamples: int = N_RESAMPLES,
                ci: float = CI, seed: int = 0) -> pd.DataFrame:
    """Per (agent, side, checkpoint): mean over seeds and the percentile-bootstrap interval of that mean.

    The resampling of a group uses `group_generator(seed, (agent, side, checkpoint, metric))`, so a band does
    not change when other methods are added. Columns agent, side, checkpoint, mean, ci_low, ci_high, n_seeds.
    """
    data = _select(curves, "curves table", metric=metric)
    data = data[data["side"].isin(SPLIT_SIDES)]
    rows = []
    for (agent, side, checkpoint), grp in data.groupby(["agent", "side", "checkpoint"], sort=True):
        values = grp.sort_values("seed")["value"].to_numpy(np.float64)
        interval = percentile_ci(values, n_resamples, ci,
                                 group_generator(seed, (agent, side, int(checkpoint), metric)))
        rows.append({"agent": agent, "side": side, "checkpoint": int(checkpoint), "mean": interval.mean,
                     "ci_low": interval.low, "ci_high": interval.high, "n_seeds": interval.n})
    return pd.DataFrame(rows, columns=["agent", "side", "checkpoint", "mean", "ci_low", "ci_high", "n_seeds"])


def reference_levels(curves: pd.DataFrame, metric: str = "success") -> pd.DataFrame:
    """Per (agent, side): mean over seeds of each seed's mean over its evaluated checkpoints (agent, side, value)."""
    data = _select(curves, "curves table", metric=metric)
    data = data[data["side"].isin(SPLIT_SIDES)]
    per_seed = data.groupby(["agent", "side", "seed"], sort=True)["value"].mean()
    return per_seed.groupby(["agent", "side"], sort=True).mean().rename("value").reset_index()


def _steps(x, _pos=None) -> str:
    return f"{x / 1000:g}k" if abs(x) >= 1000 else f"{x:g}"


def render_learning_curves(out, *, curves, split=None, H=None, metric: str = "success",
                           n_resamples: int = N_RESAMPLES, ci: float = CI, seed: int = 0) -> list[str]:
    # matplotlib is heavy: only figure builders load it
    from matplotlib.ticker import FuncFormatter

    plt = style.pyplot()
    data = _select(_read_many(curves, "curves"), "curves table", split=split, H=H)
    agents = method_order(data["agent"].unique())
    curved = [a for a in agents if has_curve(a, data)]
    if not curved:
        raise ValueError(f"no method with a learning curve among {agents}: learning curves need a method that "
                         "trains and is evaluated at every checkpoint")
    bands = curve_bands(data[data["agent"].isin(curved)], metric, n_resamples, ci, seed)
    levels = reference_levels(data[~data["agent"].isin(curved)], metric) if len(curved) < len(agents) else None
    fig, axes = plt.subplots(1, 2, figsize=(style.FULL_WIDTH, 2.7), sharey=True)
    for ax, side in zip(axes, SPLIT_SIDES):
        for i, agent in enumerate(agents):
            look = style.method_style(i)
            if agent in curved:
                d = bands[(bands["agent"] == agent) & (bands["side"] == side)]
                ax.plot(d["checkpoint"], d["mean"], color=look["color"], linestyle=look["linestyle"],
                        linewidth=1.3, label=display_name(agent))
                ax.fill_between(d["checkpoint"], d["ci_low"], d["ci_high"], color=look["color"], alpha=0.18,
                                linewidth=0)
            else:
                level = levels[(levels["agent"] == agent) & (levels["side"] == side)]
                if not level.empty:
                    ax.axhline(float(level["value"].iloc[0]), color=look["color"], linestyle=":", linewidth=1.2,
                               label=f"{display_name(agent)} (reference)")
        ax.set_title(style.SIDE_LONG_LABELS[side])
        ax.set_xlabel("environment steps")
        ax.xaxis.set_major_formatter(FuncFormatter(_steps))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("strict success" if metric == "success" else metric)
    axes[0].set_ylim(-0.02, 1.02)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.tight_layout()
    return style.save_figure(fig, out)


# --- Oracle gap ---------------------------------------------------------------------------------------------
GAP_COLUMNS = ("mpc_success", "exact_success", "mpc_final_dist", "exact_final_dist")


def oracle_gap_points(gap: pd.DataFrame) -> pd.DataFrame:
    """The per-rule rows of an oracle-gap table (`tapebench oracle-gap`): rule, type, n and GAP_COLUMNS."""
    missing = [c for c in ("level", "rule", "type", "n", *GAP_COLUMNS) if c not in gap.columns]
    if missing:
        raise ValueError(f"oracle-gap table lacks columns {missing} (written by `tapebench oracle-gap`)")
    rows = gap[gap["level"] == "rule"]
    if rows.empty:
        raise ValueError("oracle-gap table has no per-rule rows (level = 'rule')")
    return rows[["rule", "type", "n", *GAP_COLUMNS]].sort_values("rule").reset_index(drop=True)


def read_gap(path) -> pd.DataFrame:
    if not Path(path).exists():
        raise FileNotFoundError(f"oracle-gap table not found: {path} (written by `tapebench oracle-gap`, "
                                "the fixed_z_oracle rule)")
    return pd.read_parquet(expect_parquet(path, "an oracle-gap table", "tapebench oracle-gap"))


def _label_points(ax, x: np.ndarray, y: np.ndarray, labels: list[str]) -> None:
    """Rule numbers beside the points; points at the same place share one label."""
    spots: dict[tuple, list[str]] = {}
    for xi, yi, label in zip(x, y, labels):
        spots.setdefault((round(float(xi), 6), round(float(yi), 6)), []).append(label)
    for (xi, yi), names in spots.items():
        right = xi < 0.75
        ax.annotate(", ".join(names), (xi, yi), xytext=(5 if right else -5, -7 if yi > 0.9 else 3),
                    textcoords="offset points", fontsize=6, ha="left" if right else "right")


def render_oracle_gap(out, *, gap) -> list[str]:
    # matplotlib is heavy: only figure builders load it
    from matplotlib.lines import Line2D

    plt = style.pyplot()

    points = oracle_gap_points(read_gap(gap))
    protocol = read_parquet_meta(gap).get("protocol", {})
    fig, axes = plt.subplots(1, 2, figsize=(style.FULL_WIDTH * 0.8, 2.9))
    panels = (("success", "strict success", "upper left"), ("final_dist", "final distance", "upper left"))
    for ax, (metric, label, _) in zip(axes, panels):
        x, y = points[f"mpc_{metric}"].to_numpy(), points[f"exact_{metric}"].to_numpy()
        ax.plot([0, 1], [0, 1], color="#888888", linewidth=0.8, linestyle="--", zorder=0)
        for rule_type in style.types_present(points["type"]):
            sel = (points["type"] == rule_type).to_numpy()
            ax.scatter(x[sel], y[sel], s=22, marker=style.type_marker(rule_type), color=style.type_colour(rule_type),
                       edgecolors="white", linewidths=0.4, zorder=3)
        _label_points(ax, x, y, [str(r) for r in points["rule"]])
        ax.set_xlim(-0.04, 1.04)
        ax.set_ylim(-0.04, 1.04)
        ax.set_aspect("equal")
        ax.set_xlabel(f"MPC {label}")
        ax.set_ylabel(f"exact optimum {label}")
        ax.grid(alpha=0.3)
        ax.set_title(f"{label} ({'higher' if metric == 'success' else 'lower'} is better)")
    types = style.types_present(points["type"])
    handles = [Line2D([], [], marker=style.type_marker(t), linestyle="", color=style.type_colour(t), label=t)
               for t in types] + [Line2D([], [], color="#888888", linestyle="--", label="MPC = exact")]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False, bbox_to_anchor=(0.5, -0.02))
    if {"L", "H", "episodes_per_rule"} <= set(protocol):
        fig.suptitle(f"MPC vs exact optimum on the same episodes: L = {protocol['L']}, H = {protocol['H']}, "
                     f"{protocol['episodes_per_rule']} episode{'s' if protocol['episodes_per_rule'] != 1 else ''} per rule", fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return style.save_figure(fig, out)
