"""`tapebench bench flops`: the FLOP count it relies on matches closed forms, the ceiling is the closed form of
its definition, and a tiny run reports a loop no faster than its own ceiling (a ceiling below the measured rate
would mean FLOPs were counted that the loop did not do, or a GEMM rate below what the core reaches)."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from tapebench.bench import flops
from tapebench.bench.flops import ceiling_steps_per_s, count_flops, counted_run_flops, gemm_rate, steady_flops_per_step
from tapebench.cli import main
from tapebench.training.loop import TrainSpec


def test_counted_flops_of_a_linear_layer_and_its_backward_match_the_closed_form():
    layer, x = nn.Linear(33, 64), torch.randn(10, 33)
    assert count_flops(lambda: layer(x)) == 2 * 10 * 33 * 64
    # backward: the weight gradient only (x needs no gradient), as many FLOPs again
    assert count_flops(lambda: layer(x).sum().backward()) == 2 * (2 * 10 * 33 * 64)


def test_ceiling_is_steps_times_rate_over_flops():
    assert ceiling_steps_per_s(1000, 2_000_000, 1e9) == pytest.approx(500_000.0)
    assert ceiling_steps_per_s(1000, 0, 1e9) == float("inf")


@pytest.mark.slow
def test_bench_flops_runs_and_no_loop_beats_its_ceiling(tmp_path, capsys):
    out = tmp_path / "flops.json"
    assert main(["bench", "flops", "--agents", "dqn", "--steps", "600", "--L", "8", "--H", "8", "--rules", "30,90",
                 "--seconds", "0.3", "--repeats", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())["figures"]
    dqn = figures["agents"]["dqn"]
    assert dqn["env_steps"] >= 600 and dqn["flops"] > 0
    assert 0 < dqn["steps_per_s"] <= dqn["ceiling_steps_per_s"]
    assert "ceiling" in capsys.readouterr().out


def test_bench_flops_refuses_a_method_that_does_not_train(capsys):
    assert main(["bench", "flops", "--agents", "random"]) == 2
    assert "do not train" in capsys.readouterr().err


def test_steady_flops_per_step_is_the_learning_phase_rate_in_closed_form():
    # DQN at L = 8: Q-network 9 -> 32 -> 32 -> 8, batch 16, learning from step 64, so both counted runs (128 and
    # 256 env steps) end in the learning phase and their difference is 32 batched steps of 4 env steps, each one
    # act on 4 rows and one gradient step: online and target forward on the batch, the weight gradients of every
    # layer and the input gradients of the two layers after the first
    width = 9 * 32 + 32 * 32 + 32 * 8
    batch = 16
    per_batched_step = 2 * 4 * width + 3 * (2 * batch * width) + 2 * batch * (32 * 32 + 32 * 8)
    spec = TrainSpec(agent="dqn", rules=(30, 90), seed=0, L=8, H=8, total_steps=256, eval_every=256,
                     hyperparameters={"hidden_size": 32, "batch_size": batch, "learning_starts": 64})
    assert steady_flops_per_step(spec) == per_batched_step / 4
    # the average over a whole run from step 0 counts the warm-up's act-only steps: lower
    steps, flops = counted_run_flops(spec)
    assert flops / steps < per_batched_step / 4


def test_bench_floor_is_an_option_of_bench_pipeline_and_seeds_only_and_a_power_of_two(capsys):
    assert main(["bench", "flops", "--agents", "dqn", "--floor", "4096"]) == 2
    assert "--floor is an option of bench pipeline" in capsys.readouterr().err
    for steps in ("2048", "6000"):
        assert main(["bench", "pipeline", "--floor", steps]) == 2
        assert "power of two >= 4096" in capsys.readouterr().err


def test_gemm_rate_is_measured_on_the_threads_asked_for_and_restores_torchs(monkeypatch):
    """The ceiling is one core's: a process whose torch uses every core would otherwise time its products on all."""
    seen = []
    monkeypatch.setattr(flops, "measure",
                        lambda fn, work, seconds, repeats: seen.append(torch.get_num_threads()) or 1.0)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert gemm_rate()["best"] == 1.0 and set(seen) == {1}
        assert torch.get_num_threads() == 2
        seen.clear()
        gemm_rate(threads=2)
        assert set(seen) == {2}
    finally:
        torch.set_num_threads(before)
