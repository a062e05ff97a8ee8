"""Plug-ins: a third-party package adds a method through the `tapebench.methods` entry-point group, without
editing this repository. The example package (tests/data/plugin_example, shown in the README) is installed
into a throw-away directory and run through training, evaluation, aggregation and Table 3."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
from agent_contract import toy_split
from pipeline_helpers import REPO, make_workdir, scheduled_jobs

from tapebench.registry import Method, _load_plugin

PLUGIN = Path(__file__).resolve().parent / "data" / "plugin_example"
NOT_A_METHOD = object()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The plug-in installed (not editable, no dependencies) into its own directory."""
    root = tmp_path_factory.mktemp("plugin")
    source = shutil.copytree(PLUGIN, root / "source")   # pip builds in the source tree: keep the checkout clean
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(root / "site"), str(source)], check=True, capture_output=True, timeout=300)
    return root / "site"


def tapebench(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "tapebench.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_plugin_method_trains_evaluates_and_lands_in_table3(site, tmp_path):
    listing = tapebench(site, "methods").stdout
    assert any(line.split()[:3] == ["linear_q", "Linear", "Q"] and "Value-based" in line
               for line in listing.splitlines()), listing
    split = toy_split(tmp_path / "toy.json")
    params = json.dumps({"env": {"L": 8, "H": 8}, "training": {"total_steps": 400, "eval_every": 200},
                         "evaluation": {"episodes_per_rule": 4}})
    run = tmp_path / "runs" / "linear_q"
    tapebench(site, "train", "--agent", "linear_q", "--split", split, "--seed", 0, "--params", params, "--out", run,
              "--device", "cpu", "--quiet")
    per_seed = []
    for method, source in (("linear_q", ["--run", run]), ("random", ["--method", "random", "--seed", 0])):
        episodes = tmp_path / f"{method}.parquet"
        tapebench(site, "evaluate", *source, "--split", split, "--H", 8, "--params", params, "--out", episodes,
                  "--device", "cpu", "--quiet")
        per_seed.append(tmp_path / f"{method}.per_seed.parquet")
        tapebench(site, "aggregate-seed", "--episodes", episodes, "--last-k", 1, "--out", per_seed[-1])
    aggregate = tmp_path / "aggregate.parquet"
    tapebench(site, "aggregate", "--per-seed", *per_seed, "--n-resamples", 100, "--out", aggregate)
    table = tmp_path / "table3.tex"
    tapebench(site, "render", "table3", "--aggregate", aggregate, "--split", "toy", "--H", 8, "--out", table)
    text = table.read_text()
    assert "\nLinear Q & 1 & " in text and "\nRandom policy & 1 & " in text
    assert text.index("Linear Q &") < text.index("Reference (not learned)") < text.index("Random policy &")


def readme_recipe() -> tuple[str, str, str]:
    """(file name, its text, the command) of the README's plug-in recipe: the ```yaml block under "Plugging in your
    own method" (its first line names the file) and the command of the ```console block after it."""
    section = (REPO / "README.md").read_text().split("## Plugging in your own method", 1)[1].split("\n## ", 1)[0]
    text = re.search(r"^```yaml\n(.*?)^```$", section, re.S | re.M).group(1)
    command = re.search(r"^```console\n\$ (.*?)\n", section, re.M).group(1)
    return re.match(r"# (\S+)\n", text).group(1), text, command


def test_the_readme_recipe_runs_the_plugin_beside_the_references(site, tmp_path):
    """The README's recipe as written, a dry run: a preset that narrows `methods` to the plug-in and the reference
    rows builds Table 3 without an edit of the studies (docs/protocol.md#study-methods)."""
    name, text, command = readme_recipe()
    assert "linear_q" in text and command.startswith("snakemake ") and name in command
    workdir = make_workdir(tmp_path)
    (workdir / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(f"{command} --dry-run", shell=True, cwd=workdir, capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = scheduled_jobs(proc.stdout + proc.stderr)
    assert ("render_table3", {}) in jobs
    assert {w.get("agent") for rule, w in jobs if rule.startswith("train")} == {"linear_q"}


def test_the_example_plugin_imports_torch_only_to_make_an_agent(site):
    """As the docs ask of a plug-in: listing the methods (every table and figure job does) imports no torch."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    probe = ("import sys\nfrom tapebench.registry import registry\nm = registry()['linear_q']\n"
             "print(m.display_name, m.trains, 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["Linear", "Q", "True", "False"]


def test_plugins_are_not_visible_without_installation():
    proc = subprocess.run([sys.executable, "-m", "tapebench.cli", "methods"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "linear_q" not in proc.stdout


@pytest.mark.parametrize("value,needle", [
    ("test_plugins:NOT_A_METHOD", "must name a tapebench.registry.Method"),
    ("no_such_module_xyz:METHOD", "cannot load tapebench method plug-in 'thing'.*ModuleNotFoundError"),
    ("tapebench.registry:Method", "must name a tapebench.registry.Method"),
    ("test_plugins:old_keyword_method", r"plug-in 'thing'.*TypeError: method 'thing': Method has no field "
                                        r"'world_test' \(did you mean 'worldtest'\?\)"),
])
def test_broken_plugins_are_named(value, needle):
    with pytest.raises((ValueError, TypeError), match=needle):
        _load_plugin(EntryPoint(name="thing", value=value, group="tapebench.methods"))


def test_plugin_id_must_equal_its_entry_point_name():
    from tapebench.registry import get_method

    with pytest.raises(ValueError, match="entry point name and the method id must be the same"):
        _load_plugin(EntryPoint(name="thing", value="test_plugins:random_method", group="tapebench.methods"))
    assert get_method("random").id == "random"


def random_method() -> Method:
    from tapebench.registry import get_method

    return get_method("random")


def old_keyword_method() -> Method:
    """A plug-in still spelling the registry field `world_test=` (now `worldtest=`)."""
    from tapebench.methods.worldtest import ActiveConfig, chance_tester

    return Method("thing", "Thing", "reference", ActiveConfig, world_test=chance_tester)
