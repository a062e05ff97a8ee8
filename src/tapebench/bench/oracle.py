"""`tapebench bench mpc` and `tapebench bench dp`: oracle throughput with NumPy baselines from the same run.

mpc: the paper protocol — every test rule of results/splits/main.json (or, without that split, 30
rules drawn with seed 0) x 20 episodes at --L/--H (default 32/32), horizon 8, 512 candidates. The
fused numba kernel (all cores, and one core) beside a straightforward vectorised NumPy MPC that plays
the same episodes with the same candidates; both must give identical records. Goal: <= 5 s.
dp: the exact DP for all 256 rules at L = H = 16 — feasibility (parallel over rules) and the
controller's full value tables — beside a plain NumPy value iteration timed on a few rules and
projected to 256. Goal: <= 5 s.
Figures are medians over --repeats runs; tape-steps/s counts simulated CA transitions.
"""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import numpy as np

from tapebench import defaults
from tapebench.episodes.sets import episode_set
from tapebench.episodes.streams import GAMMA, episode_keys, split_key
from tapebench.layout import split_file
from tapebench.methods.exact import _hypercube_min, feasibility_arrays, transition_table, value_tables
from tapebench.methods.mpc import MPCConfig, run_mpc
from tapebench.validation import check_horizon, check_length

MPC_GOAL_S = 5.0
DP_GOAL_S = 5.0
MAIN_SPLIT = Path(split_file("main"))
EPISODES_PER_RULE = 20
DP_L = DP_H = 16
DP_BASELINE_RULES = (0, 30, 90, 110, 150, 204)
RULE_BITS = ((np.arange(256)[:, None] >> np.arange(8)) & 1).astype(np.uint8)   # (256, 8) truth tables


def _timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def _load_avg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


# --- plain NumPy re-statements (baselines only) ------------------------------------------------

def _mix64_np(x: np.ndarray) -> np.ndarray:
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _numpy_step(tapes: np.ndarray, tables: np.ndarray) -> np.ndarray:
    """CA step of (N, L) uint8 tapes, row i under truth table tables[i] (np.roll neighbourhoods)."""
    idx = (np.roll(tapes, 1, axis=1) << 2) | (tapes << 1) | np.roll(tapes, -1, axis=1)
    return np.take_along_axis(tables, idx, axis=1)


def numpy_mpc(episodes, H: int, config: MPCConfig, success_bonus: float = defaults.SUCCESS_BONUS) -> dict:
    """Vectorised NumPy random-shooting MPC over (active episodes x candidates), all-zero goal."""
    n, L = episodes.tapes.shape
    C, horizon = config.candidates, config.horizon
    keys = episode_keys(episodes.keys, config.seed)
    tapes = episodes.tapes.copy()
    tables = RULE_BITS[episodes.rules]
    active = np.ones(n, dtype=bool)
    auc, ret, final = np.zeros(n), np.zeros(n), np.zeros(n)
    steps = np.zeros(n, dtype=np.int64)
    bonus32 = np.float64(np.float32(success_bonus))
    counters = ((np.arange(C, dtype=np.uint64)[:, None] * np.uint64(horizon)
                 + np.arange(horizon, dtype=np.uint64)[None, :] + np.uint64(1)) * GAMMA)   # (C, horizon)
    with np.errstate(over="ignore"):
        for t in range(H):
            idx = np.flatnonzero(active)
            if not len(idx):
                break
            m, depth = len(idx), min(horizon, H - t)
            step_keys = _mix64_np(keys[idx] + np.uint64(t + 1) * GAMMA)
            z = _mix64_np(step_keys[:, None, None] + counters[None, :, :depth])
            acts = (((z >> np.uint64(32)) * np.uint64(L)) >> np.uint64(32)).astype(np.int64)   # (m, C, depth)
            cand = np.repeat(tapes[idx], C, axis=0)
            cand_tables = np.repeat(tables[idx], C, axis=0)
            rows = np.arange(m * C)
            score = np.zeros(m * C)
            alive = np.ones(m * C, dtype=bool)
            for k in range(depth):
                cand[rows, acts[:, :, k].ravel()] ^= 1
                cand = _numpy_step(cand, cand_tables)
                mism = cand.sum(axis=1, dtype=np.int64)
                hit = mism == 0
                score += np.where(alive, np.where(hit, success_bonus * L, -mism), 0.0)
                alive &= ~hit
            best = score.reshape(m, C).argmax(axis=1)          # first maximum: lowest candidate index
            chosen = acts[np.arange(m), best, 0]
            tapes[idx, chosen] ^= 1
            tapes[idx] = _numpy_step(tapes[idx], tables[idx])
            mism = tapes[idx].sum(axis=1, dtype=np.int64)
            dist = (mism.astype(np.float32) / np.float32(L)).astype(np.float64)
            auc[idx] += dist
            final[idx] = dist
            ret[idx] += np.where(mism == 0, bonus32, -dist)
            steps[idx] = t + 1
            active[idx[mism == 0]] = False
    return {"success": final == 0, "final_dist": final, "auc_dist": auc / H, "return": ret, "steps": steps}


def numpy_value_layers(F: np.ndarray, L: int, H: int) -> tuple[np.ndarray, np.ndarray]:
    """Plain NumPy version of the exact DP (all-zero goal): (d, last layer W[H])."""
    n = F.shape[0]
    tapes = np.arange(n)
    W = np.array([bin(s).count("1") for s in range(n)], dtype=np.uint8)
    d = np.full(n, 255, dtype=np.uint8)
    neighbours = tapes[:, None] ^ (1 << np.arange(L))[None, :]
    for r in range(1, H + 1):
        q = np.where(F == 0, 0, W[F]).astype(np.uint8)
        W = q[neighbours].min(axis=1)
        d[(W == 0) & (d == 255)] = r
    return d, W


# --- benchmarks ----------------------------------------------------------------------------------

def _protocol_rules() -> tuple[list[int], str, int]:
    if MAIN_SPLIT.is_file():
        # lazy: a command loads only the modules it runs
        from tapebench.splits.io import load_split

        split = load_split(MAIN_SPLIT)
        return list(split.test), f"test rules of {MAIN_SPLIT}", split_key(split.content_hash)
    rules = sorted(np.random.default_rng(0).choice(256, 30, replace=False).tolist())
    return rules, f"30 rules drawn with seed 0 (no {MAIN_SPLIT})", 0


def bench_mpc(args) -> dict:
    # numba is heavy: loaded only when this runs
    import numba

    L, H, repeats = check_length(args.L), check_horizon(args.H), args.repeats
    config = MPCConfig(seed=args.seed)
    rules, where, key = _protocol_rules()
    side = "test" if key else "rules"
    episodes = episode_set(rules, EPISODES_PER_RULE, L, key=key, side=side)
    threads = numba.get_num_threads()
    print(f"tapebench bench mpc: {where}; {len(rules)} rules x {EPISODES_PER_RULE} episodes = {len(episodes)}, "
          f"L={L}, H={H}, horizon {config.horizon}, {config.candidates} candidates; {os.cpu_count()} CPU cores, "
          f"numba {numba.__version__} ({threads} threads); load average {_load_avg()}")
    play = lambda: run_mpc(episodes, H, config)
    play()   # compile (or load the cache) outside the timing
    fused_s, fused = _timed(play, repeats)
    numba.set_num_threads(1)
    try:
        single_s, _ = _timed(play, repeats)
    finally:
        numba.set_num_threads(threads)
    numpy_s, base = _timed(lambda: numpy_mpc(episodes, H, config), 1)
    identical = all(np.array_equal(fused[k], base[k]) for k in base)
    decisions = [min(config.horizon, H - t) for t in range(H)]
    work = sum(config.candidates * sum(decisions[:s]) for s in fused["steps"])   # candidate transitions
    print(f"  {'implementation':<34} {'seconds':>8} {'tape-steps/s':>13}")
    for name, secs in ((f"numba fused kernel ({threads} threads)", fused_s), ("numba fused kernel (1 thread)", single_s),
                       ("NumPy vectorised (baseline)", numpy_s)):
        print(f"  {name:<34} {secs:>8.3f} {work / secs:>13.3g}")
    print(f"  speed-up over NumPy: {numpy_s / fused_s:.0f}x; records identical to the baseline: {identical}; "
          f"goal <= {MPC_GOAL_S:g} s: {'met' if fused_s <= MPC_GOAL_S else 'MISSED'}")
    print(f"  MPC on these episodes: success {fused['success'].mean():.3f}, final dist "
          f"{fused['final_dist'].mean():.3f}, AUC {fused['auc_dist'].mean():.3f}")
    if not identical:
        raise RuntimeError("the NumPy baseline and the numba MPC disagree")
    return {"episodes": len(episodes), "rules": rules, "L": L, "H": H, "seconds": fused_s,
            "seconds_1thread": single_s, "numpy_seconds": numpy_s, "tape_steps": work,
            "success": float(fused["success"].mean())}


def bench_dp(args) -> dict:
    # numba is heavy: loaded only when this runs
    import numba

    L, H, repeats = DP_L, DP_H, args.repeats
    rules = list(range(256))
    threads = numba.get_num_threads()
    print(f"tapebench bench dp: exact DP, all 256 rules, L={L}, H={H} ({1 << L} tapes x {L} actions x {H} layers "
          f"per rule); {os.cpu_count()} CPU cores, numba {numba.__version__} ({threads} threads); "
          f"load average {_load_avg()}")
    feasibility_arrays(rules[:2], L, H)
    value_tables(0, L, H)
    _hypercube_min(np.zeros(1 << L, np.uint8), L, np.zeros(1 << L, np.uint8))
    transitions = 256 * (1 << L) * L * H
    feas_s, (hist, _) = _timed(lambda: feasibility_arrays(rules, L, H), repeats)
    tables_s, _ = _timed(lambda: [value_tables(z, L, H) for z in rules], repeats)
    start = time.perf_counter()
    agree = True
    for z in DP_BASELINE_RULES:
        d_np, W_np = numpy_value_layers(transition_table(z, L).astype(np.int64), L, H)
        _, d, W = value_tables(z, L, H)
        agree &= bool(np.array_equal(d, d_np) and np.array_equal(W[H], W_np))
    numpy_s = (time.perf_counter() - start) * 256 / len(DP_BASELINE_RULES)
    print(f"  {'implementation':<46} {'seconds':>8} {'tape-steps/s':>13}")
    for name, secs in ((f"feasibility, numba ({threads} threads over rules)", feas_s),
                       ("controller value tables, numba (1 thread)", tables_s),
                       (f"NumPy value iteration (projected from {len(DP_BASELINE_RULES)} rules)", numpy_s)):
        print(f"  {name:<46} {secs:>8.3f} {transitions / secs:>13.3g}")
    print(f"  speed-up over NumPy: {numpy_s / feas_s:.0f}x (feasibility), {numpy_s / tables_s:.0f}x (tables); "
          f"NumPy agrees on rules {list(DP_BASELINE_RULES)}: {agree}; goal <= {DP_GOAL_S:g} s: "
          f"{'met' if max(feas_s, tables_s) <= DP_GOAL_S else 'MISSED'}")
    print(f"  rules with a solvable tape: {int((hist[:, 1:H + 1].sum(axis=1) > 0).sum())}/256")
    if not agree:
        raise RuntimeError("the NumPy baseline and the numba DP disagree")
    return {"L": L, "H": H, "feasibility_seconds": feas_s, "tables_seconds": tables_s,
            "numpy_projected_seconds": numpy_s, "tape_steps": transitions}
