"""Context builders for paper Table 1 (planning reference + feasibility) and Table 7 (MPC by type).

LaTeX comes from the one renderer (`report.render.render_table`) with the templates
`templates/table1.tex.j2` and `templates/table7.tex.j2`.
"""
from __future__ import annotations

from pathlib import Path

from tapebench.evaluation.protocol import read_records
from tapebench.oracle.by_type import read_by_type
from tapebench.oracle.feasibility import feasibility_summary
from tapebench.report.render import render_table
from tapebench.utils.artifacts import read_table

ORACLE_NAMES = {"mpc": "True-dynamics MPC", "exact": "Exact optimum (DP)"}
SIDE_NAMES = {"train": "ID (train rules)", "test": "OOD (test rules)", "rules": "rule list"}


def _protocol_text(protocol: dict) -> str:
    where = f"split {protocol['split']}, {SIDE_NAMES.get(protocol['side'], protocol['side'])}" \
        if protocol.get("split") else f"{len(protocol['rules'])} rules"
    return f"{where}, {protocol['episodes_per_rule']} ep./rule"


def _records_row(path) -> dict:
    frame, meta = read_records(path)
    protocol = meta["protocol"]
    oracle = meta.get("oracle", "mpc")
    row = {"name": ORACLE_NAMES.get(oracle, oracle), "L": protocol["L"], "H": protocol["H"],
           "protocol": _protocol_text(protocol), "n": int(len(frame)),
           "success": float(frame["success"].mean()), "final_dist": float(frame["final_dist"].mean()),
           "auc_dist": float(frame["auc_dist"].mean())}
    if oracle == "mpc":
        planner = meta.get("config", {}).get("planner", {})
        row["planner"] = f"horizon {planner.get('horizon')}, {planner.get('candidates')} candidates"
    return row


def table1_context(mpc_files, feasibility_file=None, exact_files=()) -> dict:
    """Rows: MPC records (one per file), exact-optimum records, and rule-/tape-wise feasibility."""
    rows = [_records_row(p) for p in mpc_files] + [_records_row(p) for p in exact_files]
    feasibility = None
    if feasibility_file is not None:
        path = Path(feasibility_file)
        if not path.is_file():
            raise FileNotFoundError(f"feasibility table not found: {path} (written by `tapebench feasibility`)")
        feas, _ = read_table(path, "feasibility")
        missing = [c for c in ("solvable_tapes", "optimal_final_dist_mean") if c not in feas.columns]
        if missing:
            raise ValueError(f"{path} is not a feasibility table: missing columns {missing}")
        feasibility = feasibility_summary(feas)
        rows.append({"name": "Feasibility, rule-wise", "L": feasibility["L"], "H": feasibility["H"],
                     "protocol": f"{feasibility['rules']} rules, every non-goal tape",
                     "success": feasibility["rulewise_solvable"], "final_dist": None, "auc_dist": None})
        rows.append({"name": "Feasibility, tape-wise", "L": feasibility["L"], "H": feasibility["H"],
                     "protocol": "mean over rules", "success": feasibility["mean_solvable_fraction"],
                     "final_dist": feasibility["mean_optimal_final_dist"], "auc_dist": None})
    if not rows:
        raise ValueError("Table 1 needs at least one of --mpc, --exact, --feasibility")
    return {"rows": rows, "feasibility": feasibility}


TYPE_LABELS = {"stable": "Stable", "periodic": "Periodic", "chaotic": "Chaotic", "": "(untyped)"}


def table7_context(by_type_file) -> dict:
    payload = read_by_type(by_type_file)
    protocol = payload["protocol"]
    canonical = ("stable", "periodic", "chaotic")
    order = [t for t in canonical if t in payload["by_type"]] + sorted(set(payload["by_type"]) - set(canonical))
    rows = [{"label": TYPE_LABELS.get(t, t), **payload["by_type"][t]} for t in order
            if payload["by_type"][t]["n_episodes"] > 0 or t in canonical]
    side = protocol["side"]
    rows.append({"label": f"All ({side})", **payload["all"]})
    planner = payload.get("planner", {})
    return {"rows": rows, "split": protocol.get("split", ""), "side": side, "L": protocol["L"], "H": protocol["H"],
            "episodes_per_rule": protocol["episodes_per_rule"], "horizon": planner.get("horizon"),
            "candidates": planner.get("candidates")}


def render_table1(out, *, mpc, exact=None, feasibility=None) -> str:
    """Table 1 from MPC records (`mpc`), exact-optimum records (`exact`) and a feasibility table."""
    return render_table("table1.tex.j2", out, **table1_context(mpc, feasibility, exact or ()))


def render_table7(out, *, by_type) -> str:
    """Table 7 from the by-type JSON of `tapebench export-mpc-by-type`."""
    return render_table("table7.tex.j2", out, **table7_context(by_type))
