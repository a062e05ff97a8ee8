"""ComparedProtocol comparison (docs/protocol.md#protocol-comparison): do the evaluation protocols agree on which
method is better?

A *protocol* is a named selection of per-seed rows (`ComparedProtocol`: split, H, side, optional extra column
filters, and the per-seed files that hold them). `protocols(config)` (stats/protocols.py, which imports
neither pandas nor scipy) is the one list the pipeline compares:
the reference first (OOD on `main_split` at the training H), then ID, OOD at each other horizon of
`evaluation.horizons`, and OOD on each other split of `studies.robustness`. A new protocol family (severity
ladder levels: side `d1`..`d4`; noise levels: other per-seed files, or a `match` on a noise column) is one more
`ComparedProtocol(...)` appended there.

Per protocol and method, on one metric (`success` by default; `final_dist`, `auc_dist`, `steps` rank lower
first): the mean over seeds and the rank (1 = best, ties averaged). Between every pair of protocols, over the
methods evaluated under both: Kendall's tau-b between the two rankings (scipy.stats.kendalltau), the rank
reversals (pairs of methods ordered strictly one way under the first protocol and strictly the other way under
the second) and whether the best method changes (the sets of methods tied for best, over the common methods,
share no method).

Uncertainty: a percentile bootstrap over seeds. Each (method, protocol) resamples its own seeds; protocols
with the same `runs` key (default: the split) are evaluated on the same trained runs, so one resampling of
seed indices is shared by all of them for a method when they hold the same seeds (seed-paired: ID, OOD and
H = 64 on the main split move together; another split's runs are independent). Each resampling comes from a
generator seeded by (statistics seed, runs, method, seeds), so adding protocols or methods changes no other
number. Every resample recomputes means -> ranks -> tau, reversals and best methods; reported are tau's
percentile interval, each pair's reversal probability, the probability that the best method differs, and
each method's rank interval and probability of being best. Means are rounded to 12 decimals before ranking
so that floating-point noise does not break ties.

Tables (`compare_protocols`):
  ranks        one row per (protocol, method): protocol, family, split, H, side, agent, n_seeds, mean, rank,
               rank_ci_low, rank_ci_high, p_best, best (bool)
  comparison   one row per pair of protocols (protocol_a before protocol_b in protocol order; the reference's
               rows come first): protocol_a, protocol_b, reference (bool: protocol_a is the reference),
               methods (comma-separated), n_methods, tau, tau_ci_low, tau_ci_high, p_tau_defined (fraction of
               resamples where tau is defined), n_pairs, n_reversals, expected_reversals (bootstrap mean),
               best_a, best_b ('/'-joined ties), best_changes (bool), p_best_changes, ci, n_resamples
  reversals    one row per pair of protocols and pair of common methods: protocol_a, protocol_b, reference,
               agent_hi, agent_lo (agent_hi ranked above agent_lo under protocol_a; tied_a when equal),
               mean_a_hi, mean_a_lo, mean_b_hi, mean_b_lo, reversed (bool), p_reversed
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
from scipy import stats as sps

from tapebench.schemas import PROTOCOL_COMPARISON_COLUMNS, PROTOCOL_REVERSAL_COLUMNS
from tapebench.stats.aggregate import METRICS, group_generator
from tapebench.defaults import CI, N_RESAMPLES
from tapebench.stats.bootstrap import percentile_interval
from tapebench.stats.protocols import ComparedProtocol, protocol_files
from tapebench.utils import artifacts

LOWER_IS_BETTER = frozenset({"final_dist", "auc_dist", "steps"})
DECIMALS = 12


# --- selecting rows -------------------------------------------------------------------------------------------
def protocol_values(tables: Mapping[str, pd.DataFrame], protocol: ComparedProtocol, metric: str) -> dict[str, pd.Series]:
    """{method: per-seed values (indexed by seed, ascending)} of one protocol."""
    missing = [p for p in protocol.per_seed if p not in tables]
    if missing:
        raise ValueError(f"protocol {protocol.name!r}: per-seed file(s) not given: {missing}")
    frame = pd.concat([tables[p] for p in protocol.per_seed], ignore_index=True)
    for column in ("split", "H", "side", "metric", "agent", "seed", "value", *(k for k, _ in protocol.match)):
        if column not in frame.columns:
            raise ValueError(f"protocol {protocol.name!r}: its per-seed tables have no column {column!r}")
    keep = ((frame["split"] == protocol.split) & (frame["H"] == protocol.H) & (frame["side"] == protocol.side)
            & (frame["metric"] == metric))
    for column, value in protocol.match:
        keep &= frame[column] == value
    rows = frame[keep]
    if rows.empty:
        raise ValueError(f"protocol {protocol.name!r} selects no rows: no {metric!r} at split {protocol.split!r}, "
                         f"H = {protocol.H}, side {protocol.side!r}{_match_text(protocol)} in {list(protocol.per_seed)}"
                         f" (sides there: {sorted(frame['side'].astype(str).unique())}, H: "
                         f"{sorted(frame['H'].unique().tolist())})")
    dup = rows.duplicated(["agent", "seed"], keep=False)
    if dup.any():
        first = rows.loc[dup, ["agent", "seed"]].iloc[0].to_dict()
        raise ValueError(f"protocol {protocol.name!r}: {int(dup.sum())} rows share a (method, seed), e.g. {first}; "
                         f"narrow the selection (several L or files given twice?)")
    values = rows["value"].to_numpy(np.float64)
    if not np.isfinite(values).all():
        raise ValueError(f"protocol {protocol.name!r}: NaN or infinite {metric!r} values")
    return {str(agent): grp.set_index("seed")["value"].astype(np.float64).sort_index()
            for agent, grp in rows.groupby("agent", sort=False)}


def _match_text(protocol: ComparedProtocol) -> str:
    return "".join(f", {k} = {v!r}" for k, v in protocol.match)


# --- rankings -------------------------------------------------------------------------------------------------
def ranks_of(scores: np.ndarray) -> np.ndarray:
    """Ranks along the last axis, 1 = highest score, ties averaged."""
    return sps.rankdata(-np.asarray(scores, np.float64), method="average", axis=-1)


def tau_b_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Kendall's tau-b between the rows of x and y (B, n), vectorised: sum of sign products over all pairs of
    columns, divided by sqrt(untied pairs in x * untied pairs in y); NaN where a row is all ties."""
    x, y = np.atleast_2d(x), np.atleast_2d(y)
    i, j = np.triu_indices(x.shape[1], 1)
    sx, sy = np.sign(x[:, i] - x[:, j]), np.sign(y[:, i] - y[:, j])
    den = np.sqrt(np.count_nonzero(sx, axis=1).astype(np.float64) * np.count_nonzero(sy, axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (sx * sy).sum(axis=1) / np.where(den > 0, den, 1.0), np.nan)


def _best_mask(scores: np.ndarray) -> np.ndarray:
    """(…, n) -> boolean mask of the entries tied for the highest score."""
    return scores == scores.max(axis=-1, keepdims=True)


# --- the comparison -------------------------------------------------------------------------------------------
def compare_protocols(tables: Mapping[str, pd.DataFrame], protos: list[ComparedProtocol], *, metric: str = "success",
                      n_resamples: int = N_RESAMPLES, ci: float = CI, seed: int = 0,
                      ) -> dict[str, pd.DataFrame]:
    """Ranks, pairwise comparison and reversals (module docstring); the first protocol is the reference."""
    if metric not in METRICS:
        raise ValueError(f"metric {metric!r} is not a per-seed metric; allowed: {list(METRICS)}")
    if len(protos) < 2:
        raise ValueError(f"protocol comparison needs at least two protocols, got {len(protos)}")
    names = [p.name for p in protos]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"protocol names must be unique; repeated: {dup}")
    if not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples!r}")
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be in (0, 1), e.g. 0.95; got {ci!r}")
    direction = -1.0 if metric in LOWER_IS_BETTER else 1.0

    values = {p.name: protocol_values(tables, p, metric) for p in protos}
    agents = list(dict.fromkeys(a for p in protos for a in values[p.name]))
    means = np.full((len(protos), len(agents)), np.nan)
    boot = np.full((len(protos), n_resamples, len(agents)), np.nan)
    n_seeds = np.zeros((len(protos), len(agents)), dtype=np.int64)
    resamplings: dict[tuple, np.ndarray] = {}
    for k, proto in enumerate(protos):
        for a, agent in enumerate(agents):
            series = values[proto.name].get(agent)
            if series is None:
                continue
            x = series.to_numpy()
            key = (proto.runs, agent, tuple(int(s) for s in series.index))
            if key not in resamplings:
                resamplings[key] = group_generator(seed, ("protocol_comparison", *key[:2], *key[2])).integers(
                    0, x.size, size=(n_resamples, x.size))
            means[k, a] = x.mean()
            boot[k, :, a] = x[resamplings[key]].mean(axis=1)
            n_seeds[k, a] = x.size
    scores = np.round(direction * means, DECIMALS)
    boot_scores = np.round(direction * boot, DECIMALS)

    ranks = _rank_table(protos, agents, means, scores, boot_scores, n_seeds, ci)
    pairs, reversals = [], []
    for ia, ib in itertools.combinations(range(len(protos)), 2):
        common = [a for a in range(len(agents)) if np.isfinite(means[ia, a]) and np.isfinite(means[ib, a])]
        pa, pb = protos[ia], protos[ib]
        row, rev = _compare_pair(pa, pb, [agents[a] for a in common], means[[ia, ib]][:, common],
                                 scores[[ia, ib]][:, common], boot_scores[[ia, ib]][:, :, common], ci)
        row["reference"] = rev["reference"] = ia == 0
        pairs.append(row)
        reversals.append(rev)
    comparison = pd.DataFrame(pairs)
    comparison["ci"], comparison["n_resamples"] = float(ci), int(n_resamples)
    reversal_frame = pd.concat([r for r in reversals if len(r)], ignore_index=True) if any(
        len(r) for r in reversals) else pd.DataFrame(columns=PROTOCOL_REVERSAL_COLUMNS)
    return {"ranks": ranks, "comparison": comparison[PROTOCOL_COMPARISON_COLUMNS],
            "reversals": reversal_frame[PROTOCOL_REVERSAL_COLUMNS].reset_index(drop=True)}




def _rank_table(protos, agents, means, scores, boot_scores, n_seeds, ci) -> pd.DataFrame:
    rows = []
    for k, proto in enumerate(protos):
        present = np.flatnonzero(np.isfinite(means[k]))
        point = ranks_of(scores[k, present])
        boot_ranks = ranks_of(boot_scores[k][:, present])
        low, high = percentile_interval(boot_ranks, ci)
        best = _best_mask(scores[k, present])
        p_best = _best_mask(boot_scores[k][:, present]).mean(axis=0)
        for j, a in enumerate(present):
            rows.append({"protocol": proto.name, "family": proto.family, "split": proto.split, "H": proto.H,
                         "side": proto.side, "agent": agents[a], "n_seeds": int(n_seeds[k, a]),
                         "mean": float(means[k, a]), "rank": float(point[j]), "rank_ci_low": float(low[j]),
                         "rank_ci_high": float(high[j]), "p_best": float(p_best[j]), "best": bool(best[j])})
    return pd.DataFrame(rows)


def _joined_best(names, mask) -> str:
    return "/".join(n for n, m in zip(names, mask) if m)


def _compare_pair(pa: ComparedProtocol, pb: ComparedProtocol, names, means, scores, boot_scores, ci) -> tuple[dict, pd.DataFrame]:
    """One pair of protocols over their common methods: means / scores (2, n), boot_scores (2, B, n)."""
    n = len(names)
    row = {"protocol_a": pa.name, "protocol_b": pb.name, "methods": ",".join(names), "n_methods": n,
           "n_pairs": n * (n - 1) // 2}
    if n == 0:
        return {**row, "tau": np.nan, "tau_ci_low": np.nan, "tau_ci_high": np.nan, "p_tau_defined": 0.0,
                "n_reversals": 0, "expected_reversals": 0.0, "best_a": "", "best_b": "", "best_changes": False,
                "p_best_changes": np.nan}, pd.DataFrame(columns=PROTOCOL_REVERSAL_COLUMNS)
    tau = float(sps.kendalltau(scores[0], scores[1]).statistic) if n >= 2 else np.nan
    boot_tau = tau_b_rows(boot_scores[0], boot_scores[1]) if n >= 2 else np.full(boot_scores.shape[1], np.nan)
    defined = np.isfinite(boot_tau)
    low, high = percentile_interval(boot_tau[defined], ci) if defined.any() else (np.nan, np.nan)

    i, j = np.triu_indices(n, 1)
    sign_a, sign_b = np.sign(scores[0, i] - scores[0, j]), np.sign(scores[1, i] - scores[1, j])
    reversed_ = sign_a * sign_b < 0
    boot_reversed = (np.sign(boot_scores[0][:, i] - boot_scores[0][:, j])
                     * np.sign(boot_scores[1][:, i] - boot_scores[1][:, j])) < 0
    best_a, best_b = _best_mask(scores[0]), _best_mask(scores[1])
    boot_changes = ~(_best_mask(boot_scores[0]) & _best_mask(boot_scores[1])).any(axis=1)
    row.update({"tau": tau, "tau_ci_low": float(low), "tau_ci_high": float(high),
                "p_tau_defined": float(defined.mean()), "n_reversals": int(reversed_.sum()),
                "expected_reversals": float(boot_reversed.sum(axis=1).mean()),
                "best_a": _joined_best(names, best_a), "best_b": _joined_best(names, best_b),
                "best_changes": not bool((best_a & best_b).any()), "p_best_changes": float(boot_changes.mean())})

    hi_first = sign_a >= 0          # order each pair as protocol_a ranks it (ties: in method order)
    hi, lo = np.where(hi_first, i, j), np.where(hi_first, j, i)
    rev = pd.DataFrame({"protocol_a": pa.name, "protocol_b": pb.name, "agent_hi": [names[k] for k in hi],
                        "agent_lo": [names[k] for k in lo], "tied_a": sign_a == 0,
                        "mean_a_hi": means[0, hi], "mean_a_lo": means[0, lo], "mean_b_hi": means[1, hi],
                        "mean_b_lo": means[1, lo], "reversed": reversed_, "p_reversed": boot_reversed.mean(axis=0)})
    return row, rev


def compare_protocol_files(protos: list[ComparedProtocol], *, metric: str = "success", n_resamples: int = N_RESAMPLES,
                           ci: float = CI, seed: int = 0) -> dict[str, pd.DataFrame]:
    """`compare_protocols` on the per-seed files the protocols name (each read once; two files of the same
    content are refused, as by every aggregate)."""
    paths = protocol_files(protos)
    missing = [str(p) for p in paths if not Path(p).is_file()]
    if missing:
        raise FileNotFoundError(f"per-seed file(s) not found: {', '.join(missing)}")
    files = {}      # a file named by several protocols (under any spelling) is read once
    for path in paths:
        files.setdefault(Path(path).resolve(), path)
    frames = dict(zip(files, (frame for frame, _ in artifacts.read_tables(list(files.values()), "per_seed",
                                                                          "per-seed"))))
    tables = {path: frames[Path(path).resolve()] for path in paths}
    return compare_protocols(tables, protos, metric=metric, n_resamples=n_resamples, ci=ci, seed=seed)
