"""The split health gate: a split that overlaps, or (mirror-class unit) leaks a mirror pair across
train and test, fails loudly; every split gets a short machine-readable report.

Failures: hash mismatch or malformed file (from load_split), an empty side, a rule listed twice, a
rule outside the split's family (0..255 for the elementary family, 0..k^(k^(2r+1)) - 1 for a family), train/test overlap, a rule without a known type, test_type_counts that do
not match the types, and, for unit "mirror_class", any rule whose mirror is on the other side.
For unit "rule" mirror leaks are counted and reported as a warning.

A severity ladder (kind "ladder", docs/protocol.md#severity-ladders) also fails when its training set is not
mirror-closed, its levels are not disjoint or do not make up the test side, or any level rule's exact
rule-table distance to the training set (recomputed here) differs from its level or its recorded distance.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from tapebench.rule_family import RuleFamily, family_from_config
from tapebench.rules.features import RULE_TYPES
from tapebench.rules.mirror import mirror_leaks
from tapebench.splits.io import load_split
from tapebench.splits.ladder import distances_to
from tapebench.utils.io import provenance, write_json


class SplitHealthError(ValueError):
    """The split failed the gate; the message names the offending rules."""


def _type_counts(rules, types) -> dict:
    counts = Counter(types.get(r) for r in rules)
    return {t: int(counts.get(t, 0)) for t in RULE_TYPES}


def check_split_health(path) -> dict:
    """Build the health report of the split at `path` (does not raise on failed checks)."""
    split = load_split(path)
    raw = json.loads(Path(path).read_text())
    problems: list[str] = []
    warnings: list[str] = []
    sides = {"train": list(split.train), "test": list(split.test)}
    try:
        family = split.family
    except ValueError as exc:
        raise SplitHealthError(f"split {path} names an invalid rule family: {exc}") from None
    space = "0..255" if family.elementary else f"0..{family.num_rules - 1} ({family.describe()})"
    for side, rules in sides.items():
        if not rules:
            problems.append(f"{side} side is empty")
        bad = [r for r in rules if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < family.num_rules]
        if bad:
            problems.append(f"{side} lists values that are not rules in {space}: {bad}")
        repeated = sorted(r for r, n in Counter(rules).items() if n > 1)
        if repeated:
            problems.append(f"{side} lists rules more than once: {repeated}")
    if problems:
        raise SplitHealthError(f"split {path} is malformed: " + "; ".join(problems))

    overlap = sorted(set(split.train) & set(split.test))
    if overlap:
        problems.append(f"train/test overlap on rules {overlap}")
    untyped = sorted(r for r in set(split.train) | set(split.test) if split.types.get(r) not in RULE_TYPES)
    if untyped:
        problems.append(f"rules without a valid type (allowed {list(RULE_TYPES)}): {untyped}")
    test_counts = _type_counts(split.test, split.types)
    recorded = raw.get("test_type_counts")
    if recorded is not None and recorded != test_counts:
        problems.append(f"test_type_counts {recorded} disagree with the per-rule types {test_counts}")

    leaks = mirror_leaks([r for r in split.train if r not in overlap], [r for r in split.test if r not in overlap],
                         family)
    leak_text = ", ".join(f"{t} (test) / {tr} (train)" for t, tr in leaks)
    if leaks and split.unit == "mirror_class":
        problems.append(f"mirror pairs split across train and test: {leak_text}")
    elif leaks:
        warnings.append(f"rule-level split: {len(leaks)} test rules have their mirror in train ({leak_text}); "
                        f"these test tasks are seen in training up to reflection")

    ladder = _ladder_problems(split, raw, problems) if raw.get("kind") == "ladder" else None

    return {
        "split": split.name,
        "path": str(path),
        "content_hash": split.content_hash,
        "unit": split.unit,
        **({} if family.elementary else {"family": family.as_dict()}),
        "ok": not problems,
        "problems": problems,
        "warnings": warnings,
        "n_train": len(split.train),
        "n_test": len(split.test),
        "type_counts": {"train": _type_counts(split.train, split.types), "test": test_counts},
        "mirror_leaks": len(leaks),
        "mirror_leak_pairs": [list(p) for p in leaks],
        **({"ladder": ladder} if ladder is not None else {}),
        "provenance": provenance({"split_file": str(path), "content_hash": split.content_hash}),
    }


def _ladder_problems(split, raw: dict, problems: list[str]) -> dict:
    """Check a ladder's levels (appending to `problems`); returns the per-level summary for the report."""
    try:
        family: RuleFamily = family_from_config(raw.get("family"))
    except ValueError as exc:
        problems.append(f"ladder family: {exc}")
        return {}
    unclosed = sorted(z for z in split.train if family.mirror_rule(z) not in set(split.train))
    if unclosed:
        problems.append(f"ladder training set is not mirror-closed: the mirrors of {unclosed} are missing")
    if not split.levels:
        problems.append("ladder split has no levels")
        return {}
    members = [z for rules in split.levels.values() for z in rules]
    repeated = sorted(z for z, n in Counter(members).items() if n > 1)
    if repeated:
        problems.append(f"ladder levels share rules {repeated}")
    if sorted(set(members)) != sorted(split.test):
        problems.append(f"the ladder's test side is not the union of its levels (only in one: "
                        f"{sorted(set(members) ^ set(split.test))[:10]})")
    recorded = {int(z): d for z, d in raw.get("distances", {}).items()}
    summary = {}
    for d, rules in sorted(split.levels.items()):
        exact = distances_to(family, rules, split.train).tolist() if rules else []
        wrong = [f"{z} (at {e})" for z, e in zip(rules, exact) if e != d]
        if wrong:
            problems.append(f"ladder level d={d} holds rules not at exact distance {d} from the training set: "
                            f"{', '.join(wrong)}")
        mismatched = [z for z, e in zip(rules, exact) if recorded.get(int(z)) != e]
        if mismatched:
            problems.append(f"ladder level d={d}: recorded distances disagree with the tables for rules {mismatched}")
        if not rules:
            problems.append(f"ladder level d={d} is empty")
        summary[f"d{d}"] = {"n": len(rules), "distance_checked": not wrong, "types": _type_counts(rules, split.types)}
    return summary


def split_health(path, out=None) -> dict:
    """Write the report (when `out` is given), then raise SplitHealthError if the split failed."""
    report = check_split_health(path)
    if out is not None:
        write_json(out, report)
    if not report["ok"]:
        raise SplitHealthError(f"split {path} failed the health check: " + "; ".join(report["problems"]))
    return report
