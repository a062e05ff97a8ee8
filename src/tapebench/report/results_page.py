"""docs/results.md: the paper-protocol tables of a reference set (Table 3 at the training horizon, Table 2 at every
evaluated horizon, Table 4, and Table 1's metrics over every rule of the split for each method), with CIs and the
set's provenance, rendered through `templates/results.md.j2` (`tapebench reference results NAME --out
docs/results.md`); never typed by hand.

The statistics are the pipeline's: the set's rule sums -> per-seed values -> bootstrap means and CIs
(`reproduction.set_aggregate`, the frame `tapebench aggregate` writes, and its rates pooled over all rules, the
ones docs/reproduction.md compares with the paper's Table 1), read into rows by the LaTeX tables' own
builders (`tables.table3_context`, `table2_context`, `table4_context`). The page renders whatever methods the set
holds and names them.
"""
from __future__ import annotations

from tapebench.reference_sets import read_manifest
from tapebench.report.render import environment
from tapebench.report.reproduction import methods_held, set_aggregate
from tapebench.report.tables import display_name, table2_context, table3_context, table4_context

TEMPLATE = "results.md.j2"


def _provenance(manifest: dict) -> list[dict]:
    rows = []
    for method, entry in manifest["methods"].items():
        hours = entry.get("cpu_hours", {})
        rows.append({"id": method, "name": display_name(method), "seeds": len(entry.get("seeds", [])),
                     "horizons": entry.get("horizons", []), "checkpoints": len(entry.get("checkpoints", [])),
                     "episodes": entry.get("episodes"), "training": hours.get("training"),
                     "evaluation": hours.get("evaluation"), "total": hours.get("total"),
                     "packed": entry.get("packed", ""), "where": entry.get("where", "")})
    return rows


def results_markdown(name: str, root) -> str:
    """docs/results.md from reference set `name` under `root`."""
    manifest = read_manifest(name, root)
    agg, pooled = set_aggregate(name, root, manifest)
    protocol = manifest["protocol"]
    split, H = protocol["split"]["name"], int(protocol["env"]["H"])
    meta = {"last_k": int(protocol["evaluation"]["last_k"])}
    provenance = sorted(_provenance(manifest), key=lambda r: r["name"].lower())
    table3 = table3_context(agg, split, H, meta=meta)
    every_rule = [{"name": row["name"], "cells": [dict(zip(("mean", "low", "high", "n"), pooled[(row["agent"], H, m)]),
                                                       missing=False) for m in ("success", "final_dist", "auc_dist")]}
                  for group in table3["groups"] for row in group["rows"]]
    return environment().get_template(TEMPLATE).render(
        name=name, manifest=manifest, protocol=protocol, methods=provenance, held=methods_held(manifest),
        cpu_hours=sum(r["total"] or 0.0 for r in provenance), table3=table3,
        every_rule=every_rule, table2=table2_context(agg, split, meta=meta),
        table4=table4_context(agg, split, H, meta=meta))
