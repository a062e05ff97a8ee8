"""The front door's smaller items: a closed pipe ends a listing quietly, `tapebench methods` loads no torch, a grid's
env.L that contradicts env.grid_n is refused, the grid env names its rule in notation, a YAML key given twice is
refused in the config loading the CLI and the Snakefile share."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pipeline_helpers import REPO, make_workdir

from tapebench.envs.grid_env import GridEnv
from tapebench.pipeline.config import ConfigError, load_config, load_config_file, stated_config, validate_config

SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"


def _into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """Run `tapebench ARGS` with stdout a pipe whose reader has already gone (as `| head` does once it has read)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", "tapebench", *args], stdout=write, stderr=subprocess.PIPE,
                              text=True, cwd=REPO, timeout=300)
    finally:
        os.close(write)


@pytest.mark.parametrize("args", [("methods", "-v"), ("config",)])
def test_a_closed_pipe_ends_the_command_quietly(args):
    proc = _into_a_closed_pipe(*args)
    assert proc.returncode == 141, proc.stderr       # as a shell reports a command a closed pipe ended
    assert proc.stderr == "", proc.stderr             # no BrokenPipeError traceback, no "Exception ignored"


def test_listing_the_methods_imports_no_torch():
    probe = ("import io, sys, contextlib\nfrom tapebench.cli import main\nout = io.StringIO()\n"
             "with contextlib.redirect_stdout(out):\n    main(['methods'])\n"
             "print('dqn' in out.getvalue(), 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False"]


def _grid(tmp_path, env: str):
    preset = tmp_path / "grid_L.yaml"
    preset.write_text(f"env:\n{env}")
    files = [REPO / "config" / "grid_quick.yaml", preset]
    return load_config(files, root=REPO), stated_config(files)


def test_a_grid_env_L_that_contradicts_grid_n_is_refused(tmp_path, capsys):
    from tapebench.cli import main

    (tmp_path / "x.yaml").write_text("env: {grid_n: 4, L: 32}\n")
    assert main(["config", "--workflow", str(REPO), "--configfile", str(REPO / "config" / "grid_quick.yaml"),
                 str(tmp_path / "x.yaml")]) == 2
    assert "'env.L' and 'env.grid_n' contradict" in capsys.readouterr().err
    config, stated = _grid(tmp_path, "  grid_n: 4\n  L: 32\n")
    with pytest.raises(ConfigError, match=r"config keys 'env\.L' and 'env\.grid_n' contradict each other: env\.L = "
                                          r"32, .* 4 x 4 = 16 cells"):
        validate_config(config, SCHEMA, stated=stated)
    config, stated = _grid(tmp_path, "  grid_n: 4\n  L: 16\n")          # stating the derived value is fine
    assert validate_config(config, SCHEMA, stated=stated)["env"]["L"] == 16
    config, stated = _grid(tmp_path, "  grid_n: 4\n")                    # config.yaml's L is not the user's
    assert validate_config(config, SCHEMA, stated=stated)["env"]["L"] == 16


def test_the_grid_env_names_its_rule_in_notation():
    env = GridEnv(rule="B3/S23", n=8, H=4)
    _, info = env.reset(seed=0)
    assert info["rule"] == "B3/S23" and info["rule_id"] == 6152
    *_, info = env.step(3)
    assert info["rule"] == "B3/S23" and info["rule_id"] == 6152


def test_a_yaml_key_given_twice_is_refused_naming_it_and_the_file(tmp_path, capsys):
    preset = tmp_path / "twice.yaml"
    preset.write_text("seeds: 2\nenv:\n  L: 16\n  H: 8\n  L: 12\n")
    with pytest.raises(ConfigError, match=rf"config file {preset}: key 'L' is given twice in one mapping "
                                          r"\(lines 3 and 5\)"):
        load_config_file(preset)
    from tapebench.cli import main

    assert main(["config", "--workflow", str(REPO), "--configfile", str(preset)]) == 2
    err = capsys.readouterr().err
    assert "key 'L' is given twice" in err and str(preset) in err
    (tmp_path / "wd").mkdir()
    workdir = make_workdir(tmp_path / "wd")
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(preset)],
                          cwd=workdir, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and f"config file {preset}: key 'L' is given twice" in out, out[-3000:]
