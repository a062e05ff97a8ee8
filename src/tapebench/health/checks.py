"""The benchmark health report of one split: six checks on the test rules of the configured protocol, each
with a number, a status (pass / warn / fail against the `health:` thresholds) and whether a failure is fatal.

  leakage            fraction of test rules that are also training rules or whose mirror image is one
                     (the split gate's mirror-leak pairs, results/splits/<split>.health.json)
  reference_unsolved fraction of test rules the reference (the exact optimum at L <= 20, true-dynamics MPC
                     otherwise) solves in none of their evaluation episodes
  headroom           reference success minus random-policy success, averaged over test rules, with a paired
                     bootstrap CI over rules (weak-baseline non-saturation)
  trivially_solved   fraction of test rules on which the random policy succeeds in >= `trivial_success`
                     of its episodes
  rule_headroom      reference success minus the rule-agnostic floor's (the best, by mean over test rules, of the
                     random policy and the other rule-agnostic rows given: live-cell policies, the prior-only
                     planner), averaged over test rules with a paired bootstrap CI over rules, and per rule type;
                     small headroom: the test rules barely need the rule (docs/protocol.md#rule-agnostic-floors)
  identifiability    fraction of test episodes in which random actions never pin the whole rule table
                     (elementary family only: for another family the check is n/a)

Every number is computed from a split's rule list and per-episode records (columns `side`, `rule`,
`success`; identifiability: `steps`, `identified`); nothing here knows how rules are numbered, so a rule
family plugs in through the records and the split file alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tapebench.stats.bootstrap import paired_ci, percentile_ci
from tapebench.stats.headroom import best_floor
from tapebench.validation import check_integer
from tapebench.vocabulary import MAX_EXACT_L

PASS, WARN, FAIL, NOT_APPLICABLE = "pass", "warn", "fail", "n/a"


@dataclass(frozen=True)
class Check:
    """One check's definition: its metric, and whether larger values are worse (else smaller are)."""

    name: str
    title: str
    metric: str
    higher_is_worse: bool = True


CHECKS: tuple[Check, ...] = (
    Check("leakage", "Leakage", "fraction of test rules in train or with their mirror in train"),
    Check("reference_unsolved", "Reference solvability", "fraction of test rules the reference never solves"),
    Check("headroom", "Weak-baseline headroom", "reference minus random success on test rules",
          higher_is_worse=False),
    Check("trivially_solved", "Trivially solved", "fraction of test rules random solves in >= trivial_success"),
    Check("rule_headroom", "Rule-dependent headroom", "reference minus best rule-agnostic success on test rules",
          higher_is_worse=False),
    Check("identifiability", "Identifiability", "fraction of test episodes never identified"),
)
CHECK_NAMES = tuple(c.name for c in CHECKS)


class HealthGateError(ValueError):
    """A split failed a fatal check; the message names the split, each failed gate and its rules."""


def _fraction(value, key: str, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value <= 1 if low_open
                                                                               else 0 <= value <= 1):
        raise ValueError(f"health setting '{key}' must be a number in {'(0' if low_open else '[0'}, 1], got {value!r}")
    return float(value)


def check_settings(settings, statistics) -> None:
    """The health: section and the bootstrap settings a report is built from, checked before any record is read:
    a missing or malformed key is named (`health.headroom.warn`), not a KeyError deep in the checks."""
    if not isinstance(settings, dict):
        raise ValueError(f"health settings must be a JSON object (the config's health: section), got {settings!r}")
    _fraction(settings.get("trivial_success"), "health.trivial_success", low_open=True)
    for check in CHECKS:
        t = settings.get(check.name)
        if not isinstance(t, dict):
            raise ValueError(f"health setting 'health.{check.name}' must be an object {{warn, fail, fatal}}, got {t!r}")
        _fraction(t.get("warn"), f"health.{check.name}.warn")
        _fraction(t.get("fail"), f"health.{check.name}.fail")
        if not isinstance(t.get("fatal"), bool):
            raise ValueError(f"health setting 'health.{check.name}.fatal' must be true or false, got {t.get('fatal')!r}")
    if not isinstance(statistics, dict):
        raise ValueError(f"statistics must be a JSON object {{n_resamples, ci, seed}}, got {statistics!r}")
    check_integer(statistics.get("n_resamples"), "statistics.n_resamples", 1)
    check_integer(statistics.get("seed"), "statistics.seed", 0)
    ci = statistics.get("ci")
    if isinstance(ci, bool) or not isinstance(ci, (int, float)) or not 0 < ci < 1:
        raise ValueError(f"statistics.ci must be a number in (0, 1), got {ci!r}")


REPORT_FIELDS = ("split", "content_hash", "status", "checks", "fatal_failures")


def reference_oracle(L: int, family=None) -> str:
    """The reference controller of a protocol with tape length L: 'exact' when it can be enumerated (elementary
    family, L <= MAX_EXACT_L), else true-dynamics MPC."""
    elementary = family is None or family.elementary
    return "exact" if elementary and int(L) <= MAX_EXACT_L else "mpc"


def status_of(check: Check, value: float, thresholds: dict) -> str:
    """pass / warn / fail: a value beyond `fail` fails, beyond `warn` warns (strictly, in the worse direction)."""
    worse = (lambda v, t: v > t) if check.higher_is_worse else (lambda v, t: v < t)
    if worse(value, thresholds["fail"]):
        return FAIL
    if worse(value, thresholds["warn"]):
        return WARN
    return PASS


def _test_success_by_rule(records: pd.DataFrame, rules, what: str) -> pd.Series:
    test = records[records["side"] == "test"]
    by_rule = test.groupby("rule")["success"].mean()
    missing = sorted(set(rules) - set(int(r) for r in by_rule.index))
    if missing:
        raise ValueError(f"{what} records have no test episodes of rules {missing}; they must come from the "
                         f"split's own evaluation episodes")
    return by_rule.reindex(list(rules)).astype(float)


def rule_agnostic_floor(rules, random: pd.DataFrame, rule_agnostic: pd.DataFrame | None) -> tuple[str, pd.Series]:
    """(id, success per test rule) of the rule-agnostic floor: the best by mean over `rules` of the random policy
    and each agent of the `rule_agnostic` records (column `agent`)."""
    candidates = {"random": _test_success_by_rule(random, rules, "random-policy")}
    if rule_agnostic is not None:
        for agent, frame in rule_agnostic.groupby("agent", sort=True):
            candidates[str(agent)] = _test_success_by_rule(frame, rules, f"rule-agnostic ({agent})")
    name = best_floor({a: v.to_numpy() for a, v in candidates.items()})
    return name, candidates[name]


def per_rule_frame(split, reference: pd.DataFrame, random: pd.DataFrame, identifiability: pd.DataFrame | None,
                   trivial_success: float, rule_agnostic: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per test rule: reference, random and rule-agnostic floor success, the two headrooms, the two
    flags, identifiability (NaN without identifiability records)."""
    rules = list(split.test)
    ref = _test_success_by_rule(reference, rules, "reference")
    rnd = _test_success_by_rule(random, rules, "random-policy")
    floor_name, floor = rule_agnostic_floor(rules, random, rule_agnostic)
    if identifiability is None:
        identifiability = pd.DataFrame({"side": pd.Series(dtype=str), "rule": pd.Series(dtype=np.int64),
                                        "identified": pd.Series(dtype=bool), "steps": pd.Series(dtype=float)})
    ident = identifiability[identifiability["side"] == "test"].groupby("rule")
    frame = pd.DataFrame({
        "split": split.name,
        "rule": rules,
        "type": [split.types.get(r, "") for r in rules],
        "reference_success": ref.to_numpy(),
        "random_success": rnd.to_numpy(),
        "floor": floor_name,
        "floor_success": floor.to_numpy(),
        "n_reference_episodes": [int(((reference["side"] == "test") & (reference["rule"] == r)).sum()) for r in rules],
        "n_random_episodes": [int(((random["side"] == "test") & (random["rule"] == r)).sum()) for r in rules],
        "never_identified": ident["identified"].apply(lambda s: 1.0 - s.mean()).reindex(rules).to_numpy(),
        "identify_steps": ident["steps"].mean().reindex(rules).to_numpy(),
    })
    frame["headroom"] = frame["reference_success"] - frame["random_success"]
    frame["rule_headroom"] = frame["reference_success"] - frame["floor_success"]
    frame["reference_unsolved"] = frame["reference_success"] == 0.0
    frame["trivially_solved"] = frame["random_success"] >= trivial_success
    return frame


def _rules(mask) -> list[int]:
    return sorted(int(r) for r in mask)


def headroom_by_type(frame: pd.DataFrame, boot: dict) -> dict:
    """The rule-dependent headroom per rule type of the test rules (paired bootstrap over a type's rules)."""
    out = {}
    for kind, group in frame.groupby("type", sort=True):
        iv = paired_ci(group["reference_success"], group["floor_success"], **boot)
        out[str(kind)] = {"mean": iv.mean, "low": iv.low, "high": iv.high, "n": iv.n}
    return out


def health_report(split, leak_pairs, reference: pd.DataFrame, random: pd.DataFrame,
                  identifiability: pd.DataFrame | None, settings: dict, *, L: int, H: int, statistics: dict,
                  rule_agnostic: pd.DataFrame | None = None):
    """(report dict without provenance, per-rule frame). `settings` is the config's `health:` section,
    `leak_pairs` the split gate's (test rule, train rule) mirror pairs, `statistics` gives n_resamples, ci, seed.
    `identifiability` None (a family other than the elementary one) makes that check n/a. `rule_agnostic`: the
    records of the rule-agnostic rows other than the random policy (column `agent`), candidates of the floor."""
    frame = per_rule_frame(split, reference, random, identifiability, settings["trivial_success"], rule_agnostic)
    n_test = len(frame)
    overlap = sorted(set(split.train) & set(split.test))
    leaked = sorted(set(overlap) | {int(t) for t, _ in leak_pairs})
    boot = {"n_resamples": statistics["n_resamples"], "ci": statistics["ci"], "rng": statistics["seed"]}
    headroom = paired_ci(frame["reference_success"], frame["random_success"], **boot)
    rule_headroom = paired_ci(frame["reference_success"], frame["floor_success"], **boot)
    random_ci = percentile_ci(frame["random_success"], **boot)
    reference_ci = percentile_ci(frame["reference_success"], **boot)
    if identifiability is None:
        ident_numbers = {"value": None, "rules": [], "mean_steps_identified": None,
                         "reason": f"identifiability pins the 8-entry table of an elementary rule; "
                                   f"{split.family.describe()} has no such analysis"}
    else:
        test_ident = identifiability[identifiability["side"] == "test"]
        identified = test_ident[test_ident["identified"]]
        ident_numbers = {"value": float(1.0 - test_ident["identified"].mean()),
                         "rules": _rules(frame.loc[frame["never_identified"] == 1.0, "rule"]),
                         "mean_steps_identified": float(identified["steps"].mean()) if len(identified) else None}

    numbers = {
        "leakage": {"value": len(leaked) / n_test, "rules": leaked, "overlap": overlap,
                    "mirror_leak_pairs": [list(map(int, p)) for p in leak_pairs]},
        "reference_unsolved": {"value": float(frame["reference_unsolved"].mean()),
                               "rules": _rules(frame.loc[frame["reference_unsolved"], "rule"]),
                               "reference_success": _interval(reference_ci)},
        "headroom": {"value": headroom.mean, "low": headroom.low, "high": headroom.high,
                     "rules": _rules(frame.loc[frame["headroom"] <= 0, "rule"]),
                     "random_success": _interval(random_ci), "ci": statistics["ci"]},
        "trivially_solved": {"value": float(frame["trivially_solved"].mean()),
                             "rules": _rules(frame.loc[frame["trivially_solved"], "rule"])},
        "rule_headroom": {"value": rule_headroom.mean, "low": rule_headroom.low, "high": rule_headroom.high,
                          "rules": _rules(frame.loc[frame["rule_headroom"] <= 0, "rule"]),
                          "floor": str(frame["floor"].iloc[0]),
                          "floor_success": _interval(percentile_ci(frame["floor_success"], **boot)),
                          "by_type": headroom_by_type(frame, boot), "ci": statistics["ci"]},
        "identifiability": ident_numbers,
    }
    checks = {}
    for check in CHECKS:
        thresholds = settings[check.name]
        entry = numbers[check.name]
        applicable = entry["value"] is not None
        if applicable:
            entry["value"] = float(entry["value"])
        checks[check.name] = {"title": check.title, "metric": check.metric, **entry,
                              "status": status_of(check, entry["value"], thresholds) if applicable else NOT_APPLICABLE,
                              "warn": thresholds["warn"], "fail": thresholds["fail"], "fatal": thresholds["fatal"]}
    fatal = [name for name, c in checks.items() if c["status"] == FAIL and c["fatal"]]
    statuses = [c["status"] for c in checks.values()]
    report = {
        "split": split.name,
        "content_hash": split.content_hash,
        "protocol": {"L": int(L), "H": int(H), "reference": reference_oracle(L, split.family), "side": "test",
                     "n_test_rules": n_test, "trivial_success": settings["trivial_success"]},
        "checks": checks,
        "status": FAIL if FAIL in statuses else WARN if WARN in statuses else PASS,
        "fatal_failures": fatal,
    }
    return report, frame


def _interval(iv) -> dict:
    return {"mean": iv.mean, "low": iv.low, "high": iv.high, "n": iv.n}


def gate_message(report: dict) -> str | None:
    """The message that stops the pipeline, or None when no fatal check failed."""
    if not report["fatal_failures"]:
        return None
    parts = []
    for name in report["fatal_failures"]:
        c = report["checks"][name]
        bound = f"> {c['fail']}" if next(k for k in CHECKS if k.name == name).higher_is_worse else f"< {c['fail']}"
        parts.append(f"split {report['split']} fails gate '{name}': rules {c['rules']} "
                     f"({c['metric']} = {c['value']:.3f} {bound}; health.{name}.fail)")
    return "; ".join(parts) + ". Fix the split or change the thresholds in the config's health: section."


def enforce_gate(report: dict) -> None:
    message = gate_message(report)
    if message is not None:
        raise HealthGateError(message)
