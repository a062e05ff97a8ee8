"""Mirror equivalence of elementary rules (docs/protocol.md#mirror-classes).

Reflecting the tape (cell i -> cell L-1-i) swaps the roles of the left and right neighbour, so
rule z on a reflected tape behaves like rule `mirror_rule(z)` on the original one:
reflect(ca_step(x, z)) == ca_step(reflect(x), mirror_rule(z)), and the action a maps to L-1-a.
The all-zero goal and the Bernoulli(0.5) start are reflection-invariant, so z and its mirror are the
same task. The 256 rules form 160 mirror classes; 64 rules are their own mirror.
"""
from __future__ import annotations

import numpy as np

from tapebench.rule_family import ELEMENTARY, RuleFamily
from tapebench.validation import NUM_RULES, check_action


def mirror_rule(rule: int, family: RuleFamily = ELEMENTARY) -> int:
    """The rule whose truth table is `rule`'s with left and right neighbour swapped."""
    return family.mirror_rule(rule)


def is_self_mirror(rule: int, family: RuleFamily = ELEMENTARY) -> bool:
    return family.is_self_mirror(rule)


def class_representative(rule: int, family: RuleFamily = ELEMENTARY) -> int:
    """The smaller rule number of {rule, mirror(rule)} names the class."""
    return family.class_representative(rule)


def mirror_classes(rules=None, family: RuleFamily = ELEMENTARY) -> list[tuple[int, ...]]:
    """Mirror classes restricted to `rules` (default all 256 elementary rules), sorted by representative.

    A class whose mirror partner lies outside `rules` has one member here.
    """
    if rules is None:
        if not family.elementary:
            raise ValueError(f"mirror_classes of {family.describe()} needs an explicit rule list "
                             f"(the family has {family.num_rules} rules)")
        rules = range(NUM_RULES)
    rules = sorted(set(family.check_rules(rules)))
    members: dict[int, list[int]] = {}
    for rule in rules:
        members.setdefault(family.class_representative(rule), []).append(rule)
    return [tuple(members[rep]) for rep in sorted(members)]


def reflect_tape(tape) -> np.ndarray:
    """Cell i -> cell L-1-i (works on (L,) tapes and on (N, L) batches)."""
    return np.ascontiguousarray(np.asarray(tape)[..., ::-1])


def reflect_action(action: int, L: int) -> int:
    return L - 1 - check_action(action, L)


def mirror_leaks(train, test, family: RuleFamily = ELEMENTARY) -> list[tuple[int, int]]:
    """(test rule, train rule) pairs that are each other's mirror: the split leaks these tasks."""
    train_set = set(family.check_rules(train)) if len(train) else set()
    leaks = []
    for rule in sorted(set(test)):
        partner = family.mirror_rule(rule)
        if partner != rule and partner in train_set:
            leaks.append((rule, partner))
    return leaks
