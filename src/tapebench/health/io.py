"""Reading the inputs of the benchmark health report and writing `results/health/<split>.json`, its per-rule
Parquet, and the gate's verdict file (docs/protocol.md#benchmark-health)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from tapebench.health.checks import enforce_gate, health_report
from tapebench.splits.io import load_split
from tapebench.utils.artifacts import read_json, read_tables
from tapebench.utils.io import provenance, write_json, write_parquet


def _records(paths, kind: str = "records", what: str = "records") -> pd.DataFrame:
    """The records of several files, each checked as every aggregate checks it (`utils.artifacts.read_tables`)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not paths:
        raise ValueError(f"no {what} given")
    return pd.concat([frame for frame, _ in read_tables(paths, kind, what)], ignore_index=True)


def _check_protocol(frame: pd.DataFrame, what: str, L: int, H: int) -> None:
    for key, want in (("L", L), ("H", H)):
        got = sorted(set(int(v) for v in frame[key]))
        if got != [want]:
            raise ValueError(f"{what} records are at {key} = {got}, the health report's protocol has {key} = {want}")


def write_benchmark_health(*, split_path, split_health_path, reference, random, identifiability, settings: dict,
                           statistics: dict, L: int, H: int, out, per_rule_out, rule_agnostic=()) -> dict:
    split = load_split(split_path)
    gate = read_json(split_health_path)
    if gate.get("content_hash") != split.content_hash:
        raise ValueError(f"split health report {split_health_path} is of another version of split {split.name} "
                         f"(content hash {str(gate.get('content_hash'))[:12]} != {split.content_hash[:12]})")
    if identifiability is None and split.family.elementary:
        raise ValueError(f"split {split.name} is of the elementary family: its health report needs identifiability "
                         f"records (tapebench identifiability)")
    ref, rnd = _records(reference, what="reference records"), _records(random, what="random-policy records")
    ident = None if identifiability is None else _records(identifiability, "identifiability", "identifiability")
    agnostic_paths = [rule_agnostic] if isinstance(rule_agnostic, (str, Path)) else list(rule_agnostic or ())
    agnostic = _records(agnostic_paths, what="rule-agnostic records") if agnostic_paths else None
    for frame, what in ((ref, "reference"), (rnd, "random-policy"), (ident, "identifiability"),
                        (agnostic, "rule-agnostic")):
        if frame is not None:
            _check_protocol(frame, what, L, H)
    report, frame = health_report(split, gate.get("mirror_leak_pairs", []), ref, rnd, ident, settings,
                                  L=L, H=H, statistics=statistics, rule_agnostic=agnostic)
    inputs = {"split": str(split_path), "split_health": str(split_health_path),
              "reference": [str(p) for p in ([reference] if isinstance(reference, (str, Path)) else reference)],
              "random": [str(p) for p in ([random] if isinstance(random, (str, Path)) else random)],
              "rule_agnostic": [str(p) for p in agnostic_paths],
              "identifiability": None if identifiability is None else str(identifiability)}
    prov = provenance({"health": settings, "statistics": statistics, "L": L, "H": H}, statistics["seed"],
                      table="benchmark_health", inputs=inputs)
    report["provenance"] = prov
    write_parquet(per_rule_out, frame, meta=prov)
    write_json(out, report)
    return report


def write_verdict(health_path, out) -> dict:
    """Raise HealthGateError (naming the gates and rules) when a fatal check failed; else write the verdict."""
    report = read_json(health_path)
    enforce_gate(report)
    verdict = {"split": report["split"], "content_hash": report["content_hash"], "status": report["status"],
               "warnings": [name for name, c in report["checks"].items() if c["status"] in ("warn", "fail")],
               "provenance": provenance({"health_report": str(health_path)})}
    write_json(out, verdict)
    return verdict


def load_settings(text_or_path: str) -> dict:
    """A JSON object given inline (a pipeline param) or as a file."""
    text = text_or_path.strip()
    if not text.startswith("{"):
        text = Path(text).read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"expected a JSON object or a JSON file, got {text_or_path[:80]!r}: {exc}") from None
