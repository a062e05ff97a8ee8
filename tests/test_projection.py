"""`tapebench bench pipeline`'s arithmetic (docs/protocol.md#compute): the dry-run parser, the dependency graph,
list scheduling and the per-job cost model, checked by hand (the measurements themselves are benchmarks)."""
from __future__ import annotations

import pytest
from pipeline_helpers import REPO
from test_seed_blocks_dreamer import HYPER as DREAMER_HYPER

from tapebench.pipeline.config import load_config, merge_config
from tapebench.pipeline.projection import (CostModel, DagJob, _stacked_rate, arithmetic_shape, dependencies,
                                           floor_seconds, gpu_block, job_seconds, linear_fit, on_gpu, parse_dry_run,
                                           read_gpu_figures, read_gpu_sharing, schedule_wall,
                                           slow_shared_gpu_jobs, training_job)
from tapebench.utils.io import write_json

DRY_RUN = """\
Building DAG of jobs...
[Tue Nov 24 20:53:22 2026]
rule split:
    input: results/rules/features.parquet
    output: results/splits/main.json
    log: logs/splits/main.log
    jobid: 4
    reason: Forced execution
    wildcards: split=main
    resources: tmpdir=/tmp
[Tue Nov 24 20:53:22 2026]
rule train:
    input: results/splits/main.json, results/health/main.json
    output: results/runs/main/dqn/seed0/train.json
    jobid: 6
    wildcards: split=main, agent=dqn, seed=0
[Tue Nov 24 20:53:22 2026]
rule evaluate_seeds0_2:
    input: results/splits/main.json, results/runs/main/dqn/seeds0-2.json
    output: results/runs/main/dqn/seed0/eval_H32.parquet, results/runs/main/dqn/seed1/eval_H32.parquet
    jobid: 7
    wildcards: split=main, agent=dqn, H=32
[Tue Nov 24 20:53:22 2026]
localrule all:
    input: results/runs/main/dqn/seed0/train.json
    jobid: 0
"""


def test_dry_run_parse_and_dependencies():
    jobs = parse_dry_run(DRY_RUN)
    assert [(j.rule, j.jobid) for j in jobs] == [("split", 4), ("train", 6), ("evaluate", 7), ("all", 0)]
    assert jobs[1].wildcards == {"split": "main", "agent": "dqn", "seed": "0"}
    # an evaluation rule of one seed block (layout.block_rule) is its rule over the block's seeds
    assert jobs[2].wildcards == {"split": "main", "agent": "dqn", "H": "32", "first": "0", "last": "2"}
    assert jobs[1].inputs == ["results/splits/main.json", "results/health/main.json"]
    assert dependencies(jobs) == {4: set(), 6: {4}, 7: {4}, 0: {6}}


def test_list_scheduling_by_hand():
    # a -> c, b -> c; d alone. Costs a 4, b 2, c 1, d 3. On 2 cores, longest ready first:
    # t=0 a, d start; t=3 d ends, b starts; t=4 a ends; t=5 b ends, c starts; t=6 done. On 1 core: the sum 10.
    jobs = [DagJob(i, r) for i, r in enumerate("abcd")]
    seconds = {0: 4.0, 1: 2.0, 2: 1.0, 3: 3.0}
    deps = {0: set(), 1: set(), 2: {0, 1}, 3: set()}
    assert schedule_wall(jobs, seconds, deps, 2) == pytest.approx(6.0)
    assert schedule_wall(jobs, seconds, deps, 1) == pytest.approx(10.0)
    assert schedule_wall(jobs, seconds, deps, 8) == pytest.approx(5.0)      # the critical path a -> c


def test_gpu_jobs_run_one_at_a_time_per_gpu_each_holding_a_core():
    # g1, g2 on the GPU (5 and 4 s), c1, c2 on cores (3 s each), no dependencies. 1 GPU, 2 cores: g1 and c1 start
    # (g2 waits for the GPU); t=3 c1 ends, c2 starts; t=5 g1 ends, g2 starts; t=6 c2 ends; t=9 g2 ends.
    jobs = [DagJob(i, r) for i, r in enumerate(["g1", "g2", "c1", "c2"])]
    seconds = {0: 5.0, 1: 4.0, 2: 3.0, 3: 3.0}
    deps = {i: set() for i in range(4)}
    assert schedule_wall(jobs, seconds, deps, 2, frozenset({0, 1}), 1) == pytest.approx(9.0)
    assert schedule_wall(jobs, seconds, deps, 4, frozenset({0, 1}), 2) == pytest.approx(5.0)
    # a GPU job holds a core: on one core everything runs in turn
    assert schedule_wall(jobs, seconds, deps, 1, frozenset({0, 1}), 1) == pytest.approx(15.0)
    with pytest.raises(ValueError, match="need a GPU"):
        schedule_wall(jobs, seconds, deps, 2, frozenset({0}), 0)


def test_gpu_blocks_from_bench_seeds_figures(tmp_path):
    figures = {"benchmark": "seeds", "figures": {"device": "cuda", "L": 32, "H": 32, "agents": {"dqn": {
        "1": {"env_steps": 100, "one_process_startup_s": 6.0, "one_process_loop_s": 1.0},
        "20": {"env_steps": 20_000, "one_process_startup_s": 7.0, "one_process_loop_s": 4.0}}}}}
    write_json(tmp_path / "dqn.json", figures)
    config = {"env": {"L": 32, "H": 32}, "main_split": "main", "splits": {"main": {"rules": "0-255"}},
              "training": {"total_steps": 10_000, "eval_every": 10_000}, "agents": {},
              "evaluation": {"episodes_per_rule": 5}}
    model = CostModel(light_s=1.0, figure_s=2.0, torch_s=3.0, train_s=3.0, train_steps_per_s={"dqn": 1000.0})
    model.gpu_blocks = read_gpu_figures([tmp_path / "dqn.json"], config)
    assert model.gpu_blocks == {"dqn": {20: (7.0, 5000.0)}}       # blocks of one seed train on a CPU core
    block = DagJob(1, "train_block", {"agent": "dqn", "split": "main", "first": "0", "last": "19"})
    assert on_gpu(block, model)
    assert job_seconds(block, config, model) == (pytest.approx(7.0 + 20 * 10_000 / 5000.0), "train dqn (GPU)")
    # a smaller block: the same steps/s per seed (latency-bound), so about the same wall
    assert gpu_block(model, "dqn", 5) == (7.0, pytest.approx(1250.0))
    single = DagJob(2, "train", {"agent": "dqn", "split": "main", "seed": "0"})
    assert not on_gpu(single, model) and job_seconds(single, config, model)[1] == "train dqn"
    with pytest.raises(ValueError, match="L = 32, H = 32; the config has L = 16"):
        read_gpu_figures([tmp_path / "dqn.json"], {**config, "env": {"L": 16, "H": 32}})


def test_blocks_sharing_a_gpu_are_slowed_as_bench_seeds_share_measured(tmp_path):
    write_json(tmp_path / "dqn.json", {"benchmark": "seeds", "figures": {"device": "cuda", "share": {
        "dqn": {"4": {"slowdown": 1.5}, "8": {"slowdown": 2.0}}, "dreamer": {"4": {"slowdown": 1.1}}}}})
    assert read_gpu_sharing([tmp_path / "dqn.json"], 4) == {"dqn": 1.5, "dreamer": 1.1}
    assert read_gpu_sharing([tmp_path / "dqn.json"], 8) == {"dqn": 2.0}
    assert read_gpu_sharing([tmp_path / "dqn.json"], 2) == {}
    jobs = [DagJob(0, "train_block", {"agent": "dqn"}), DagJob(1, "train_block", {"agent": "ppo"}),
            DagJob(2, "train_block", {"agent": "dreamer"}), DagJob(3, "evaluate", {"agent": "dqn"})]
    seconds = {0: 10.0, 1: 10.0, 2: 10.0, 3: 10.0}
    guessed = slow_shared_gpu_jobs(seconds, jobs, frozenset({0, 1, 2}), {"dqn": 1.5, "dreamer": 1.1})
    # ppo has no figure: slowed as the slowest measured method; the CPU job is untouched
    assert guessed == ["ppo"] and seconds == {0: 15.0, 1: 15.0, 2: pytest.approx(11.0), 3: 10.0}
    # three blocks share one GPU (3 slots) beside a CPU job: all run at once on 4 cores
    deps = {i: set() for i in range(4)}
    assert schedule_wall(jobs, seconds, deps, 4, frozenset({0, 1, 2}), 3) == pytest.approx(15.0)


def test_blocks_per_gpu_needs_share_figures(tmp_path, capsys):
    from tapebench.cli import main

    assert main(["bench", "seeds", "--blocks-per-gpu", "4"]) == 2
    assert "--blocks-per-gpu is an option of bench pipeline" in capsys.readouterr().err
    assert main(["bench", "pipeline", "--blocks-per-gpu", "4"]) == 2
    assert "--device cuda --gpu-figures" in capsys.readouterr().err
    assert main(["bench", "pipeline", "--blocks-per-gpu", "0"]) == 2
    assert "--blocks-per-gpu must be >= 1, got 0" in capsys.readouterr().err
    write_json(tmp_path / "seeds.json", {"benchmark": "seeds", "figures": {"device": "cuda", "share": {}}})
    assert main(["bench", "pipeline", "--blocks-per-gpu", "4", "--device", "cuda", "--gpu-figures",
                 str(tmp_path / "seeds.json")]) == 2     # refused before any DAG is built or measured
    assert "no `bench seeds --share 4` figure" in capsys.readouterr().err


def test_job_costs_from_the_config():
    config = {"env": {"L": 32, "H": 32}, "main_split": "main",
              "splits": {"main": {"rules": "0-255"}},
              "training": {"total_steps": 30000, "eval_every": 10000},
              "evaluation": {"episodes_per_rule": 5, "last_k": 2}, "agents": {},
              "studies": {"fixed_z": {"total_steps": 1000, "eval_every": 500}}}
    model = CostModel(light_s=1.0, figure_s=2.0, torch_s=3.0, train_s=3.0, H=32, train_steps_per_s={"dqn": 1000.0},
                      episode_s={"dqn": 1e-3, "random": 2e-4}, batch_s={"dqn": 0.1, "random": 0.05})
    seconds, centre = job_seconds(DagJob(1, "train", {"agent": "dqn"}), config, model)
    assert seconds == pytest.approx(3.0 + 30.0) and centre == "train dqn"
    # 3 checkpoints x 2 sides batches, 3 x 256 rules x 5 episodes, at the measured H
    seconds, _ = job_seconds(DagJob(2, "evaluate", {"agent": "dqn", "split": "main", "H": "32"}), config, model)
    assert seconds == pytest.approx(3.0 + 6 * 0.1 + 3 * 256 * 5 * 1e-3)
    # a block of three seeds in one job: three seeds' evaluations, one start-up
    block = DagJob(6, "evaluate", {"agent": "dqn", "split": "main", "H": "32", "first": "3", "last": "5"})
    assert job_seconds(block, config, model)[0] == pytest.approx(3.0 + 3 * (6 * 0.1 + 3 * 256 * 5 * 1e-3))
    # a method's evaluation at twice the measured horizon costs twice as much per batch and episode
    seconds, _ = job_seconds(DagJob(3, "evaluate_method", {"agent": "random", "split": "main", "H": "64"}), config,
                             model)
    assert seconds == pytest.approx(3.0 + 2 * (2 * 0.05 + 256 * 5 * 2e-4))
    # a budget study run trains its own budget and is evaluated at its last K checkpoints (budget 0: its one)
    budget = DagJob(7, "train_budget", {"split": "main", "method": "dqn", "steps": "90000", "seed": "0"})
    assert job_seconds(budget, config, model) == (pytest.approx(3.0 + 90.0), "train dqn")
    for steps, checkpoints in (("90000", 2), ("0", 1)):
        seconds, _ = job_seconds(DagJob(8, "evaluate_budget", {"split": "main", "method": "dqn", "steps": steps,
                                                                "seed": "0", "H": "32"}), config, model)
        assert seconds == pytest.approx(3.0 + checkpoints * 2 * 0.1 + checkpoints * 256 * 5 * 1e-3)
    assert job_seconds(DagJob(4, "render_table3"), config, model) == (2.0, "tables and figures")
    assert job_seconds(DagJob(5, "aggregate_seed"), config, model) == (1.0, "other jobs")


def test_linear_fit_separates_fixed_and_per_unit_cost():
    assert linear_fit(10, 3.0, 20, 5.0) == pytest.approx((1.0, 0.2))
    assert linear_fit(10, 3.0, 20, 2.9) == pytest.approx((0.0, 2.9 / 20))     # noise: the big run's mean


def test_floor_charges_each_training_job_its_runs_flops_and_each_evaluation_its_episodes_flops():
    config = {"env": {"L": 32, "H": 32}, "main_split": "main", "splits": {"main": {"rules": "0-255"}},
              "agents": {"dreamer": {"train_ratio": 4}}, "training": {"total_steps": 1000, "eval_every": 500},
              "evaluation": {"episodes_per_rule": 5, "last_k": 2},
              "diagnostics": {"sweep": {"method": "dreamer", "hyperparameter": "imagination_horizon"}},
              "studies": {"fixed_z": {"total_steps": 400, "eval_every": 200}}}
    jobs = [DagJob(1, "train", {"agent": "dqn", "split": "main", "seed": "0"}),
            DagJob(2, "train", {"agent": "dqn", "split": "main", "seed": "1"}),
            DagJob(3, "train_fixed_z", {"agent": "dqn", "L": "16", "H": "16", "rule": "4", "seed": "0"}),
            DagJob(4, "train_sweep", {"split": "main", "method": "dreamer", "field": "imagination_horizon",
                                      "value": "5", "seed": "0"}),
            DagJob(5, "render_table3"),
            DagJob(6, "evaluate", {"agent": "dqn", "split": "main", "seed": "0", "H": "64"}),
            DagJob(7, "evaluate_fixed_z", {"agent": "dqn", "L": "16", "H": "16", "rule": "4", "seed": "0"})]
    shapes = [arithmetic_shape(*training_job(job, config)) for job in jobs[:4]]
    assert shapes[0] == shapes[1] and len(set(shapes)) == 3          # L = 16 and the sweep value are runs of their own
    assert training_job(jobs[4], config) is None and training_job(jobs[5], config) is None
    assert '"imagination_horizon":5' in shapes[3] and '"train_ratio":4' in shapes[3]
    floor = {"gemm_flops_per_s": 1e9, "flops_per_env_step": {shapes[0]: 2e6, shapes[2]: 1e6, shapes[3]: 5e6}}
    model = CostModel(light_s=1.0, figure_s=2.0, torch_s=3.0, H=32, eval_flops_per_episode={"dqn": 4e5})
    seconds = [floor_seconds(job, config, model, floor) for job in jobs]
    assert seconds[:5] == pytest.approx([1000 * 2e6 / 1e9, 1000 * 2e6 / 1e9, 400 * 1e6 / 1e9, 1000 * 5e6 / 1e9, None])
    # 2 checkpoints x 256 rules x 5 episodes, each twice the measured horizon's FLOPs; another L: not counted
    assert seconds[5] == pytest.approx(2 * 256 * 5 * 4e5 * 2 / 1e9)
    assert seconds[6] == 0.0


@pytest.mark.parametrize("preset, methods", [("config/grid_quick.yaml", ["ppo", "bayes_filter"]),
                                             ("config/multigoal_quick.yaml", ["ppo", "live_leftmost"])])
def test_the_projection_trains_and_evaluates_on_the_configs_family_and_goals(monkeypatch, preset, methods):
    from pathlib import Path

    from tapebench.pipeline import projection
    from tapebench.pipeline.config import load_config, validate_config

    repo = Path(__file__).resolve().parents[1]
    config = validate_config(load_config([repo / preset], root=repo), repo / "workflow/schemas/config.schema.yaml")
    monkeypatch.setattr(projection, "calibrate_jobs", lambda **_: {"evaluate": 1.0, "train": 1.0, "light": 0.5,
                                                                   "figure": 1.0, "server": 0.0})
    trained = []
    from tapebench.training import loop

    real_train = loop.train

    def spy(spec, run_dir, **kwargs):
        trained.append(spec)
        return real_train(spec, run_dir, **kwargs)

    monkeypatch.setattr(loop, "train", spy)
    model = projection.measure(config, methods, steps=256, log=lambda *a, **k: None)
    assert set(model.episode_s) == set(methods) and all(s > 0 for s in model.episode_s.values())
    fields = projection.run_fields(config)
    assert [(s.family, s.goal, s.goal_steps) for s in trained] == [(fields["family"], fields["goal"],
                                                                    fields["goal_steps"])]
    if "grid" in preset:
        assert fields["family"] == {"neighbourhood": "moore"} and trained[0].L == 64
    else:
        assert fields["family"] is None and fields["goal"] == "derived"


@pytest.mark.parametrize("stacking", ["auto", "always"])
def test_a_projection_times_a_dreamer_block_only_where_the_dag_stacks_it(stacking):
    config = merge_config(load_config(root=REPO), {"env": {"L": 8, "H": 8}, "agents": {"dreamer": DREAMER_HYPER},
                                                    "training": {"stacking": stacking, "device": "cpu"}})
    rate = _stacked_rate("dreamer", 2, config, rules=[30, 90, 110], steps=128)
    # auto: the DAG trains a CPU block's DreamerV3 seeds one after another, at the one-seed rate (None)
    assert rate is None if stacking == "auto" else rate > 0


def test_the_projection_times_evaluation_and_the_world_test_as_the_jobs_run_them(monkeypatch):
    """On one torch and one numba thread, as the jobs run (`--threads 1`, NUMBA_NUM_THREADS=1): timed on more, a
    process's CPU time would hold the other threads' spin-waits too (the quick preset's DreamerV3 world test: 54
    instead of 27 ms per problem on 2 cores); and the world test on enough rules per side."""
    import numba
    import torch

    from tapebench.evaluation import evaluate, worldtest
    from tapebench.methods.worldtest import LearnedModelTester
    from tapebench.pipeline import projection
    from tapebench.pipeline.config import validate_config

    config = validate_config(load_config([REPO / "tests/data/tiny.yaml"], root=REPO),
                             REPO / "workflow/schemas/config.schema.yaml")
    monkeypatch.setattr(projection, "calibrate_jobs", lambda **_: {"evaluate": 1.0, "train": 1.0, "light": 0.5,
                                                                   "figure": 1.0, "server": 0.0})
    calls = []   # (function, torch threads, numba threads, rules per side of a world test)

    def spy(function):
        def call(*args, **kwargs):
            sizes = [len(rules) for rules in kwargs.get("sides", {}).values()]
            calls.append((function.__name__, torch.get_num_threads(), numba.get_num_threads(), sizes))
            return function(*args, **kwargs)
        return call

    monkeypatch.setattr(evaluate, "evaluate_untrained", spy(evaluate.evaluate_untrained))
    monkeypatch.setattr(worldtest, "run_worldtest", spy(worldtest.run_worldtest))
    before = torch.get_num_threads(), numba.get_num_threads()
    many = 2, min(2, numba.config.NUMBA_NUM_THREADS)
    torch.set_num_threads(many[0])
    numba.set_num_threads(many[1])
    try:
        model = projection.measure(config, ["random"], steps=256, log=lambda *a, **k: None)
        after = torch.get_num_threads(), numba.get_num_threads()
    finally:
        torch.set_num_threads(before[0])
        numba.set_num_threads(before[1])
    assert model.problem_s["random"] > 0 and model.episode_s["random"] > 0
    assert {name for name, _, _, _ in calls} == {"evaluate_untrained", "run_worldtest"}
    assert {(t, n) for _, t, n, _ in calls} == {(1, 1)}
    assert after == many                                       # the caller's settings come back
    # a learned model plans its rows in chunks: timed on fewer rows per side than two chunks, a chunk's fixed cost
    # would be read as a cost per side (the quick preset's DreamerV3 world test: 7.4 instead of 27 ms per problem)
    assert max(size for name, _, _, sizes in calls if name == "run_worldtest" for size in sizes) >= \
        2 * LearnedModelTester.CHUNK


def test_the_floor_is_measured_as_a_job_runs_and_leaves_the_callers_threads(monkeypatch):
    """The GEMM rate of one core under the jobs' settings, and the caller's torch threads as they were."""
    import torch

    from tapebench.bench import flops
    from tapebench.pipeline import projection
    from tapebench.pipeline.config import validate_config

    config = validate_config(load_config([REPO / "tests/data/tiny.yaml"], root=REPO),
                             REPO / "workflow/schemas/config.schema.yaml")
    seen = []
    monkeypatch.setattr(flops, "gemm_rate", lambda: seen.append(
        (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())) or {"best": 2e9})
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        floor = projection.measure_floor([], config, steps=64, log=lambda *a, **k: None)
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert floor == {"gemm_flops_per_s": 2e9, "flops_per_env_step": {}}
    assert seen == [(1, True)]
    assert after == 2


def test_the_timed_rules_play_episodes_of_the_usual_length():
    """The evaluation cost is timed on SAMPLE_RULES rules and scaled to all of them. By the shipped records of the
    prior-only planner (its episodes end at the goal, so their length varies by rule), the sample's episodes and
    its first half's are within 20% of the mean length over all 256 rules at both horizons. Every 16th rule, the
    sample before, was at a quarter of it (6.8 vs 26.0 steps at H = 32)."""
    import pandas as pd

    from tapebench.pipeline.projection import SAMPLE_RULES, sample_rules

    records = pd.read_parquet(REPO / "reference" / "tape-v2" / "records" / "mpc_prior.parquet")
    rules = list(range(256))
    sample = sample_rules(rules, SAMPLE_RULES)
    assert len(set(sample)) == SAMPLE_RULES and set(sample) <= set(rules) and sample == sample_rules(rules, SAMPLE_RULES)
    assert sample_rules(rules[:5], SAMPLE_RULES) == rules[:5]
    for H in (32, 64):
        per_rule = records[records["H"] == H].groupby("rule")[["steps", "n_episodes"]].sum()
        length = per_rule["steps"] / per_rule["n_episodes"]
        for timed in (sample, sample[: SAMPLE_RULES // 2]):
            assert abs(length.reindex(timed).mean() / length.mean() - 1) < 0.2, (H, timed)
        assert length.reindex(rules[::16]).mean() < 0.5 * length.mean()       # why the progression was replaced
