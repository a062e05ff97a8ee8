"""A file of another kind given where a command reads an input (README.md, the Snakefile, the config) is named as
what it is and what was expected, in one line, and no command advises deleting it: `rm` advice is only for a file
under results/ that the pipeline wrote and that fails its own check (docs/guide.md#when-a-file-is-damaged)."""
from __future__ import annotations

import json

import pytest
from agent_contract import toy_split
from pipeline_helpers import REPO

from tapebench.cli import main
from tapebench.pipeline.config import load_config, validate_config
from tapebench.report import registry
from tapebench.utils.artifacts import CorruptArtifact, WrongKind, read_json, read_table, recovery

SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
FOREIGN = {"README.md": "a Markdown text file", "Snakefile": "a Snakemake workflow", "config/config.yaml": "a YAML file"}
CONFIGS = ["config/config.yaml", "config/grid.yaml", "config/multigoal.yaml", "config/extended.yaml",
           "tests/data/beside_reference.yaml", "config/budget.yaml"]


def _commands(F: str, split: str, out) -> list[list[str]]:
    """Every command that reads a file, with F in each of its file options (with the other inputs valid where
    a command reads them first)."""
    o = str(out / "out.parquet")
    settings = json.dumps({"trivial_success": 0.9})
    protocol = [{"name": "p", "split": "main", "H": 8, "side": "test", "per_seed": [F]}]
    health = ["--settings", settings, "--L", "8", "--H", "8", "--out", str(out / "h.json"),
              "--per-rule-out", o]
    commands = [
        ["train", "--agent", "dqn", "--split", F, "--out", str(out / "run"), "--device", "cpu"],
        ["evaluate", "--method", "random", "--split", F, "--H", "8", "--out", o],
        ["evaluate", "--run", F, "--split", split, "--H", "8", "--out", o, "--device", "cpu"],
        ["model-error", "--run", F, "--split", split, "--out", o, "--device", "cpu"],
        ["worldtest", "--method", "random", "--seed", "0", "--budget", "0", "--split", F, "--out", o],
        ["fewshot", "--method", "random", "--seed", "0", "--split", F, "--out", o],
        ["features", "--rule-set", F, "--out", o],
        ["identifiability", "--split", F, "--out", o],
        ["split", "--features", F, "--name", "x", "--out", str(out / "s.json")],
        ["ladder-split", "--features", F, "--name", "x", "--out", str(out / "s.json")],
        ["split-health", F, "--out", str(out / "s.json")],
        ["aggregate-seed", "--episodes", F, "--out", o],
        ["aggregate", "--per-seed", F, "--out", o],
        ["aggregate-model-error", "--inputs", F, "--out", o],
        ["aggregate-worldtest", "--inputs", F, "--out", o],
        ["aggregate-fewshot", "--inputs", F, "--out", o],
        ["protocol-comparison", "--protocols", json.dumps(protocol), "--out", o, "--ranks-out", o,
         "--reversals-out", o],
        ["mpc", "--split", F, "--side", "test", "--out", o],
        ["mpc", "--rules", "0,30", "--features", F, "--out", o],
        ["exact", "--split", F, "--side", "test", "--L", "8", "--out", o],
        ["export-mpc-by-type", "--split", F, "--out", str(out / "t.json")],
        ["oracle-gap", "--mpc", F, "--exact", F, "--out", o],
        ["benchmark-health", "--split", F, "--split-health", F, "--reference", F, "--random", F, *health],
        ["benchmark-health", "--split", split, "--split-health", F, "--reference", F, "--random", F, *health],
        ["benchmark-health", "--split", split, "--split-health", split, "--reference", F, "--random", F,
         "--identifiability", F, "--settings", F, "--L", "8", "--H", "8", "--out", str(out / "h.json"),
         "--per-rule-out", o],
        ["health-gate", F, "--out", str(out / "v.json")],
        ["status", "--results", F],
    ]
    if not F.endswith("config.yaml"):     # the config is a valid --configfile
        commands += [["config", "--configfile", F], ["status", "--configfile", F],
                     ["report", "--configfile", F, "--tex-only", "--tex", str(out / "r.tex")]]
    return commands + _render_commands(F, out)


def _render_commands(F: str, out) -> list[list[str]]:
    """`tapebench render ID` for every entry one of the presets builds, its input files all F."""
    jobs = {}
    for preset in CONFIGS:
        config = validate_config(load_config([REPO / preset], root=REPO), SCHEMA, note=lambda text: None)
        for entry in registry.OUTPUTS.values():
            for job in entry.jobs(config)[:1]:
                if any(o.file and job.values.get(o.name) not in (None, []) for o in entry.options):
                    jobs.setdefault(entry.id, (entry, job))
    commands = []
    for entry, job in jobs.values():
        values = {**job.values, **{o.name: [F] * len(job.values[o.name]) if o.many else F for o in entry.options
                                   if o.file and job.values.get(o.name) not in (None, [])}}
        args = type(job)(job.name, str(out / "render" / job.name), values).args(entry)
        commands.append(["render", *args])
    return commands


def test_the_sweep_covers_every_entry_that_reads_a_file():
    """Every render entry with a file option is in the sweep (none left out because no preset builds it)."""
    swept = {c[1] for c in _render_commands("README.md", REPO)}
    with_files = {e.id for e in registry.OUTPUTS.values() if any(o.file for o in e.options)}
    assert with_files - swept == set()


@pytest.mark.parametrize("foreign", sorted(FOREIGN))
def test_no_command_calls_a_file_of_another_kind_corrupt(foreign, tmp_path, capsys, monkeypatch):
    """One line naming the file and what it is (and, the messages say, what was expected); no `rm`, no traceback."""
    monkeypatch.chdir(REPO)
    split = str(toy_split(tmp_path / "toy.json"))
    failures = []
    for argv in _commands(foreign, split, tmp_path):
        try:
            status = main(argv)
        except BaseException as exc:  # noqa: BLE001 - a traceback is what the sweep looks for
            failures.append(f"{' '.join(argv[:3])}: raised {type(exc).__name__}: {exc}")
            continue
        err = capsys.readouterr().err.strip()
        if status != 2 or "\n" in err or "rm " in err or "corrupt" in err or "Traceback" in err \
                or foreign not in err or FOREIGN[foreign] not in err:
            failures.append(f"{' '.join(argv[:3])}: exit {status}: {err}")
    assert not failures, "\n".join(failures)


def test_a_file_of_another_kind_is_named_as_what_it_is(tmp_path):
    with pytest.raises(WrongKind, match=r"README\.md is not an aggregate table: it is a Markdown text file") as info:
        read_table(REPO / "README.md", "aggregate")
    assert "`tapebench aggregate --out`" in str(info.value)
    with pytest.raises(WrongKind, match=r"config\.yaml is not a split file: it is a YAML file"):
        read_json(REPO / "config" / "config.yaml", "split file")
    with pytest.raises(WrongKind, match=r"Snakefile is not per-episode records: it is a Snakemake workflow"):
        read_table(REPO / "Snakefile", "records")


def test_rm_advice_only_for_the_pipelines_own_files_under_results(tmp_path):
    damaged = tmp_path / "results" / "aggregate" / "main" / "aggregate.parquet"
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(b"")
    with pytest.raises(CorruptArtifact, match=f"rm {damaged}"):
        read_table(damaged, "aggregate")
    outside = tmp_path / "mine" / "aggregate.parquet"
    outside.parent.mkdir()
    outside.write_bytes(b"")
    with pytest.raises(CorruptArtifact, match="is corrupt or unreadable") as info:
        read_table(outside, "aggregate")
    assert "rm " not in str(info.value) and "`tapebench aggregate --out`" in str(info.value)
    run = tmp_path / "results" / "runs" / "main" / "dqn" / "seed0"
    assert recovery(run / "checkpoints" / "step_0000064.pt") .endswith(f"rm -r {run}")
    assert "rm " not in recovery(tmp_path / "seed0" / "checkpoints" / "step_0000064.pt")
    assert "rm " not in recovery(tmp_path / "results" / "notes.md")     # not a file the pipeline writes
