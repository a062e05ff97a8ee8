"""The report registry: the CLI and the Snakemake render jobs come from it, and data flows one way
(report/ imports the stages, no stage imports report/)."""
from __future__ import annotations

import ast
import copy
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tapebench.cli import build_parser
from tapebench.pipeline.config import validate_config
from tapebench.report import registry

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "tapebench"


def _config(*overlays) -> dict:
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    for overlay in overlays:
        for key, value in yaml.safe_load((REPO / overlay).read_text()).items():
            if isinstance(value, dict) and isinstance(config.get(key), dict):
                config[key] = {**config[key], **value}
            else:
                config[key] = value
    return validate_config(config, REPO / "workflow/schemas/config.schema.yaml")


def test_no_stage_imports_the_report_layer():
    """Only the report itself and the command line above it (`tapebench render`, `tapebench report`) import it."""
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.is_relative_to(SRC / "report") or path.is_relative_to(SRC / "commands"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = ("." * node.level) + (node.module or "")
                if "report" in module.split(".") and (node.level or module.startswith("tapebench.report")):
                    offenders.append(f"{path.relative_to(SRC)}: from {module} import ...")
            elif isinstance(node, ast.Import):
                offenders += [f"{path.relative_to(SRC)}: import {a.name}" for a in node.names
                              if a.name.startswith("tapebench.report")]
    assert offenders == []


def test_every_entry_is_a_render_subcommand_that_parses_its_jobs_arguments():
    parser = build_parser()
    config = _config("tests/data/tiny.yaml", "tests/data/world_models.yaml")
    config["methods"] = ["dqn", *config["methods"]]      # a method with learning curves beside the planner
    grid = _config("tests/data/tiny.yaml", "tests/data/grid_tiny.yaml")
    beside = _config("tests/data/beside_reference.yaml")          # a run beside the shipped reference set
    jobs = (registry.jobs(config) + [(e, j) for e, j in registry.jobs(grid) if e.id == "grid_rollouts"]
            + [(e, j) for e, j in registry.jobs(beside) if e.id in ("compare", "reproduction")])
    assert {entry.id for entry, _ in jobs} == set(registry.OUTPUTS)   # these configs ask for every entry
    for entry, job in jobs:
        args = parser.parse_args(["render", *job.args(entry)])
        assert args.entry == entry.id and args.out == job.out
        for option in entry.options:
            given = job.values.get(option.name)
            if given is None or given == []:
                continue
            parsed = getattr(args, option.name)
            expected = [option.type(v) for v in given] if option.many else option.type(given)
            assert parsed == expected, (entry.id, option.name)


def test_jobs_follow_the_config():
    tiny = _config("tests/data/tiny.yaml")
    ids = {entry.id for entry, _ in registry.jobs(tiny)}
    assert {"table1", "table2", "table3", "table4", "table7", "identifiability"} <= ids
    assert "model_error" not in ids and "sweep" not in ids        # no world model in the tiny methods
    identifiability = [job.out for entry, job in registry.jobs(tiny) if entry.id == "identifiability"]
    assert sorted(identifiability) == sorted(f"results/identifiability/{s}.tex" for s in tiny["splits"])
    no_random = copy.deepcopy(tiny)
    no_random["methods"] = ["dqn", "mpc"]
    table3 = next(job for entry, job in registry.jobs(no_random) if entry.id == "table3")
    assert "--random-per-rule" not in table3.args(registry.OUTPUTS["table3"])
    assert "results/quick/diagnostics/model_error.tex" in registry.targets(_config("config/quick.yaml"))


def test_a_duplicated_id_is_refused():
    entries = [*registry.OUTPUTS.values(), registry.OUTPUTS["table3"]]
    with pytest.raises(ValueError, match="registered twice: \\['table3'\\]"):
        registry._assemble(entries)


def test_listing_the_outputs_loads_no_builder():
    """The registry names builders as strings: importing it (what `tapebench render --help` and the Snakefile
    do) loads none of the heavy libraries the builders use."""
    probe = "import json, sys\nimport tapebench.report.registry\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = {m.split(".")[0] for m in json.loads(out.stdout)}
    assert not loaded & {"matplotlib", "scipy", "pandas", "torch", "numba", "pyarrow"}
    builders = sorted({e.build.split(":")[0] for e in registry.OUTPUTS.values()})
    assert not set(json.loads(out.stdout)) & set(builders)


@pytest.mark.parametrize("entry", list(registry.OUTPUTS.values()), ids=list(registry.OUTPUTS))
def test_every_builder_takes_its_options_and_out(entry):
    builder = entry.builder()
    assert callable(builder), entry.build
    parameters = inspect.signature(builder).parameters
    keyword = {name for name, p in parameters.items()
               if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    assert {"out", *(o.name for o in entry.options)} <= keyword, \
        f"{entry.build} lacks parameters {sorted({'out', *(o.name for o in entry.options)} - keyword)}"
