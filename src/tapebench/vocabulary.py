"""The names every layer shares, each defined once: the sides of a split, the protocol names, fixed limits.

A split has two sides: the training rules (evaluated in distribution, ID) and the held-out test rules
(out of distribution, OOD). An explicit rule list without a split is the side "rules"; the severity
ladder's test levels are the sides "d1", "d2", ... (docs/protocol.md#severity-ladders).
"""
from __future__ import annotations

ID_SIDE = "train"            # the training rules: in-distribution evaluation
OOD_SIDE = "test"            # the held-out test rules: out-of-distribution evaluation
SPLIT_SIDES = (ID_SIDE, OOD_SIDE)
RULES_SIDE = "rules"         # an explicit rule list, no split
DROP_SIDE = "drop"           # the paired ID - OOD difference in aggregate tables
LADDER_SIDE_PREFIX = "d"

ID_PROTOCOL = "ID"           # protocol names of the protocol comparison (docs/protocol.md#protocol-comparison)
OOD_PROTOCOL = "OOD"         # the reference protocol: OOD on the main split at the training horizon

ZEROS_GOAL = "zeros"         # env.goal: every episode's goal is the all-zero tape (docs/protocol.md#multi-goal)
DERIVED_GOAL = "derived"     # env.goal: each episode's goal is reached from its start by its rule in random steps
GOAL_MODES = (ZEROS_GOAL, DERIVED_GOAL)
MAX_GOAL_STEPS = 64          # env.goal_steps: at most this many random steps to a derived goal

MAX_EXACT_L = 20             # the exact optimum enumerates all 2^L tapes: L <= 20

# the world test (docs/protocol.md#world-test): its tasks, in the order tables list them
PREDICTION_TASK = "prediction"   # masked-tape prediction: choose the masked cells among candidates
PLANNING_TASK = "planning"       # reach a derived goal tape
DETECTION_TASK = "detection"     # report the first step whose tape the hidden rule does not produce
WORLDTEST_TASKS = (PREDICTION_TASK, PLANNING_TASK, DETECTION_TASK)
PREDICTION_CANDIDATES = 6        # answers offered per prediction problem, exactly one right: chance 1/6


def ladder_side(d: int) -> str:
    """The evaluation side of ladder level d: 'd1', 'd2', ..."""
    return f"{LADDER_SIDE_PREFIX}{int(d)}"


def ladder_level(side: str) -> int | None:
    """The level d of a ladder side 'd<d>' (d >= 1), None for any other side."""
    if isinstance(side, str) and side.startswith(LADDER_SIDE_PREFIX) and side[1:].isdigit() and int(side[1:]) >= 1 \
            and side == ladder_side(int(side[1:])):
        return int(side[1:])
    return None
