"""Start-up: a command loads only what it runs, and numba kernels load from their on-disk cache instead of
compiling again in every job (docs/architecture.md). These tests look at what a fresh interpreter imports and
at numba's own cache counters, never at a clock."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

HEAVY = ("torch", "numba", "scipy", "pandas", "matplotlib", "pyarrow", "gymnasium")


def modules_after(code: str, env=None) -> set[str]:
    """The top-level modules a fresh interpreter holds after running `code`."""
    probe = textwrap.dedent(code) + "\nimport json, sys\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["render", "--help"]])
def test_a_command_line_that_runs_nothing_imports_nothing_heavy(argv):
    loaded = modules_after(f"""
        from tapebench.cli import main
        try:
            main({argv!r})
        except SystemExit:
            pass
    """)
    assert not loaded & set(HEAVY), f"`tapebench {' '.join(argv)}` imported {sorted(loaded & set(HEAVY))}"


def test_tables_and_figures_read_the_method_registry_without_importing_an_agent():
    """A table or figure job needs each method's name, family and kind, not its code: the registry names every
    part of a built-in method by reference, so a render job does not import torch (~1.4 s a job). The built-ins
    only: an installed plug-in is the plug-in's own (tests/test_plugins.py checks the example's)."""
    loaded = modules_after("""
        import importlib.metadata as md
        entry_points = md.entry_points
        md.entry_points = lambda **kw: [] if kw.get("group") == "tapebench.methods" else entry_points(**kw)
        from tapebench.registry import registry
        from tapebench.report.registry import has_curve
        from tapebench.report.tables import grouped
        for m in registry().values():
            m.display_name, m.family_name, m.trains, m.plays_episodes, m.world_model, m.deterministic, has_curve(m.id)
        grouped(list(registry()))
    """)
    assert "torch" not in loaded


def test_the_package_root_imports_nothing_heavy():
    assert not modules_after("import tapebench") & set(HEAVY)


@pytest.mark.parametrize("imports", ["import gymnasium, tapebench", "import tapebench, gymnasium"])
def test_importing_the_package_registers_the_gymnasium_id_in_either_order(imports):
    """`import tapebench` registers tapebench/Tape-v0 and tapebench/Grid-v0 as `import minigrid` does, before or
    after Gymnasium is imported, and making the environments loads no torch."""
    loaded = modules_after(f"""
        {imports}
        env = gymnasium.make("tapebench/Tape-v0", rule=30, L=8, H=8)
        assert env.reset(seed=0)[0].shape == (9,)
        grid = gymnasium.make("tapebench/Grid-v0", rule="B3/S23", n=8, H=32)
        assert grid.reset(seed=0)[0].shape == (65,)
    """)
    assert "gymnasium" in loaded and "torch" not in loaded


def test_numba_kernels_load_from_the_cache_in_a_second_process(tmp_path):
    """The first process compiles (or finds) the kernels and writes the cache; a second one only loads it."""
    code = """
        import numpy as np
        from tapebench.ca.packed import pack, step_words
        from tapebench.methods.mpc import MPCConfig, run_mpc
        from tapebench.episodes.sets import episode_set
        run_mpc(episode_set([30, 90], 1, 8), 8, MPCConfig(candidates=4, horizon=2))
        stats = {name: (f.stats.cache_hits, f.stats.cache_misses) for name, f in
                 [("step_words", step_words)] + [(n, getattr(__import__("tapebench.methods.mpc", fromlist=[n]), n))
                                                 for n in ("_plan_episodes",)]}
        print(__import__("json").dumps({k: [sum(v[0].values()), sum(v[1].values())] for k, v in stats.items()}))
    """
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                             timeout=600, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    second = runs[1]
    assert second["_plan_episodes"][0] >= 1 and second["_plan_episodes"][1] == 0, second


def test_deterministic_cpu_settings_do_not_load_the_compiler_stack():
    """`torch_settings` turns on deterministic algorithms on CPU (and restores them) without importing
    torch._inductor, which `torch.use_deterministic_algorithms` imports only for compiled graphs (~1.3 s a job)."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import json, sys, torch
        from tapebench.training.loop import torch_settings
        before = torch.are_deterministic_algorithms_enabled()
        with torch_settings(torch.device("cpu"), 1):
            inside = torch.are_deterministic_algorithms_enabled()
        print(json.dumps([before, inside, torch.are_deterministic_algorithms_enabled(),
                          "torch._inductor" in sys.modules]))
    """)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, True, False, False]


def test_training_an_agent_does_not_load_the_compiler_stack():
    """Agents' Adam (`methods.common.Adam`) is torch's update without `torch.optim.Optimizer`, whose constructor
    and `step` import torch._dynamo (~1.3 s a job): neither evaluating nor training an agent imports it."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import json, sys, torch
        from tapebench.methods.contract import EnvSpec
        from tapebench.registry import build_config, make_agent
        spec = EnvSpec.for_tape(8, 8)
        agent = make_agent("dqn", build_config("dqn", {"learning_starts": 8, "batch_size": 8}), spec, 64, "cpu")
        obs = torch.zeros(4, spec.obs_dim)
        agent.act(obs, greedy=True)
        evaluated = "torch._dynamo" in sys.modules
        before = [p.clone() for p in agent.q_network.parameters()]
        for _ in range(16):
            actions = agent.act(obs)
            agent.observe(obs, actions, torch.ones(len(obs)), obs, torch.zeros(len(obs), dtype=torch.bool),
                          torch.zeros(len(obs), dtype=torch.bool))
            agent.update()
        trained = any(not torch.equal(a, b) for a, b in zip(before, agent.q_network.parameters()))
        print(json.dumps([evaluated, trained, "torch._dynamo" in sys.modules]))
    """)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, True, False]
