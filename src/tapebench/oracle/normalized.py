"""Oracle-normalised score ON(p) = 100 * p / p_oracle (docs/protocol.md#metrics, paper Eq. 1 and App. L.3).

p_oracle is the strict success of the true-dynamics MPC records measured under the *same* protocol
as p: same L, H, split (content hash), side, episodes per rule and evaluation seed (and, where the
caller states them, goal and success bonus). H = 32 and H = 64 are different protocols with their
own oracle files; pass both and the matching one is picked. A protocol mismatch is an error, never a
silent cross-protocol normalisation.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from tapebench.evaluation.protocol import protocol_differences, read_records
from tapebench.utils.artifacts import expect_parquet
from tapebench.utils.io import read_parquet_meta

REQUIRED_FIELDS = ("L", "H", "split_hash", "side", "episodes_per_rule", "eval_seed")
OPTIONAL_FIELDS = ("goal", "success_bonus")


def oracle_success(path) -> tuple[float, dict]:
    """(p_oracle, protocol) of an MPC record file."""
    frame, meta = read_records(path)
    if meta.get("oracle", "mpc") != "mpc":
        raise ValueError(f"{path} holds {meta.get('oracle')!r} records; ON(p) is normalised by the MPC reference")
    return float(frame["success"].mean()), meta["protocol"]


def evaluation_protocol(path, side: str) -> dict:
    """The protocol of one side of a learned agent's evaluation file (`tapebench evaluate` records)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"evaluation records not found: {path}")
    meta = read_parquet_meta(expect_parquet(path, "evaluation records", "tapebench evaluate"))
    evaluation = meta.get("evaluation")
    if not evaluation or not all(k in evaluation for k in ("H", "episodes_per_rule", "eval_seed")):
        raise ValueError(f"{path} records no evaluation protocol (H, episodes_per_rule, eval_seed) in its provenance")
    frame = pd.read_parquet(path, columns=["side", "L"])
    sides = sorted(set(frame["side"].astype(str)))
    if side not in sides:
        raise ValueError(f"side {side!r} is not in {path}; available: {sides}")
    lengths = sorted(set(frame.loc[frame["side"] == side, "L"].astype(int)))
    if len(lengths) != 1:
        raise ValueError(f"{path} mixes tape lengths {lengths} on side {side!r}")
    split = meta.get("split") or {}
    return {"L": lengths[0], "H": int(evaluation["H"]), "split_hash": split.get("content_hash", ""), "side": side,
            "episodes_per_rule": int(evaluation["episodes_per_rule"]), "eval_seed": int(evaluation["eval_seed"])}


def normalized_score(p: float, protocol: dict, oracle_files) -> float:
    """ON(p) for a success rate `p` measured under `protocol` (a dict with at least REQUIRED_FIELDS).

    `oracle_files`: one MPC record file or several (e.g. the H = 32 and H = 64 references); the one
    whose protocol matches is used. Raises ValueError naming the differing fields when none matches.
    """
    missing = [f for f in REQUIRED_FIELDS if f not in protocol]
    if missing:
        raise ValueError(f"cannot check protocol match for ON(p): the protocol lacks {missing} "
                         f"(needed: {list(REQUIRED_FIELDS)})")
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"success rate p must be in [0, 1], got {p}")
    fields = REQUIRED_FIELDS + tuple(f for f in OPTIONAL_FIELDS if f in protocol)
    files = [oracle_files] if isinstance(oracle_files, (str, Path)) else list(oracle_files)
    if not files:
        raise ValueError("no oracle record files given for ON(p)")
    mismatches = []
    for path in files:
        p_oracle, oracle_protocol = oracle_success(path)
        diffs = protocol_differences(protocol, oracle_protocol, fields)
        if diffs:
            mismatches.append(f"{path}: " + "; ".join(diffs))
            continue
        if p_oracle == 0.0:
            raise ValueError(f"p_oracle = 0 in {path}: ON(p) is undefined under this protocol")
        return 100.0 * p / p_oracle
    raise ValueError("no oracle record file matches the protocol of p (differences listed as "
                     "'field (p's value vs oracle's value)'): " + " | ".join(mismatches))
