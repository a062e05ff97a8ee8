"""A stacked seed block's seeds are as independent as separate runs (issue: many seeds, one process): one method
trained as 8 one-seed runs and as one stacked block of the same 8 seeds, on fixed rule 4 at L = H = 16 with a
budget at which seeds still differ; each seed's greedy strict success on the same 200 evaluation episodes. The
block's mean lies inside the 95% bootstrap CI of the one-seed runs' mean, and the two sets of per-seed values do not
differ significantly (Welch)."""
from __future__ import annotations

import numpy as np
import pytest

from tapebench.evaluation.evaluate import greedy_success
from tapebench.registry import get_method
from tapebench.stats.bootstrap import percentile_ci, welch_test
from tapebench.training import checkpoint as ckpt
from tapebench.training.blocks import train_block
from tapebench.training.loop import TrainSpec, train

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]
L = H = 16
RULE = 4
SEEDS = list(range(8))
BUDGETS = {"dqn": 2_000}


def success(run_dir, manifest) -> float:
    agent, _ = ckpt.load_policy(run_dir / manifest["checkpoints"][-1]["file"])
    return greedy_success(agent, [RULE], H=H, L=L, episodes_per_rule=200, eval_seed=7)


@pytest.mark.parametrize("method", sorted(BUDGETS))
def test_a_stacked_blocks_seeds_match_one_seed_runs_in_distribution(tmp_path, method):
    assert get_method(method).make_block is not None
    specs = [TrainSpec(agent=method, rules=(RULE,), seed=s, L=L, H=H, total_steps=BUDGETS[method],
                       eval_every=BUDGETS[method]) for s in SEEDS]
    alone = np.array([success(tmp_path / f"alone{s.seed}", train(s, tmp_path / f"alone{s.seed}", quiet=True))
                      for s in specs])
    runs = [tmp_path / f"block{s}" for s in SEEDS]
    manifests = train_block(specs, runs, quiet=True)
    assert all(m["block"]["stacked"] for m in manifests)
    block = np.array([success(run, m) for run, m in zip(runs, manifests)])
    ci = percentile_ci(alone, n_resamples=10_000, rng=0)
    print(f"{method}: one-seed runs {alone.round(3)} mean {alone.mean():.3f} CI [{ci.low:.3f}, {ci.high:.3f}]; "
          f"block {block.round(3)} mean {block.mean():.3f}")
    assert alone.std() > 0                      # the budget leaves the seeds different: the comparison has power
    assert ci.low <= block.mean() <= ci.high
    assert welch_test(alone, block).p_value > 0.01
