"""The "Benchmark health" table (docs/protocol.md#benchmark-health): one row per split, each check's number and
status from `results/health/<split>.json`."""
from __future__ import annotations

from tapebench.health.checks import CHECKS, FAIL, NOT_APPLICABLE, WARN
from tapebench.report.render import render_table
from tapebench.utils.artifacts import read_json

STATUS_MARK = {"pass": "", WARN: "warn", FAIL: "FAIL", NOT_APPLICABLE: "n/a"}


def health_rows(reports: list[dict]) -> list[dict]:
    rows = []
    for report in reports:
        checks = report["checks"]
        missing = [c.name for c in CHECKS if c.name not in checks]
        if missing:
            raise ValueError(f"health report of split {report.get('split')!r} lacks checks {missing}")
        rows.append({
            "split": report["split"],
            "reference": report["protocol"]["reference"],
            "n_test": report["protocol"]["n_test_rules"],
            "random": checks["headroom"]["random_success"]["mean"],
            "headroom_low": checks["headroom"]["low"], "headroom_high": checks["headroom"]["high"],
            "floor": checks["rule_headroom"]["floor"],
            "floor_success": checks["rule_headroom"]["floor_success"]["mean"],
            "rule_headroom_low": checks["rule_headroom"]["low"], "rule_headroom_high": checks["rule_headroom"]["high"],
            "by_type": [{"type": kind, **v} for kind, v in checks["rule_headroom"]["by_type"].items()],
            "cells": {c.name: {"value": checks[c.name]["value"], "status": checks[c.name]["status"],
                               "mark": STATUS_MARK[checks[c.name]["status"]] + ("*" if checks[c.name]["status"] == FAIL
                                                                                 and checks[c.name]["fatal"] else "")}
                      for c in CHECKS},
            "status": report["status"],
        })
    return rows


def render_health(out, *, reports) -> str:
    """One row per health report (`results/health/<split>.json`, paths)."""
    reports = [read_json(p, "benchmark health report", writer="tapebench benchmark-health") for p in reports]
    if not reports:
        raise ValueError("the benchmark health table needs at least one report")
    protocols = {(r["protocol"]["L"], r["protocol"]["H"]) for r in reports}
    if len(protocols) != 1:
        raise ValueError(f"benchmark health reports of different protocols (L, H): {sorted(protocols)}")
    (L, H), = protocols
    first = reports[0]
    thresholds = {name: first["checks"][name] for name in (c.name for c in CHECKS)}
    return render_table("health.tex.j2", out, rows=health_rows(reports), checks=CHECKS, L=L, H=H,
                        thresholds=thresholds, trivial_success=first["protocol"]["trivial_success"],
                        reference=first["protocol"]["reference"], ci=first["checks"]["headroom"]["ci"])
