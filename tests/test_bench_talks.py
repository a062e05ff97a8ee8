"""Benchmarks that talk (issue: a long measurement prints a progress line at least every 30 s)."""
from __future__ import annotations

import time

from tapebench.bench.training import heartbeat


def test_heartbeat_prints_while_a_measurement_runs_and_stops_after_it():
    lines = []
    with heartbeat("dqn: training", every=0.05, out=lambda text, flush=False: lines.append(text)):
        time.sleep(0.32)
    seen = len(lines)
    assert seen >= 3 and all(line.startswith("  ... dqn: training: ") for line in lines)
    time.sleep(0.15)
    assert len(lines) == seen            # silent once the block has ended
