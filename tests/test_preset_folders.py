"""Each preset writes its own folder (config key `results_dir`: results/ for the paper protocol, results/<name> for a
preset, its job logs in logs/ or logs/<name>), so building one preset after another overwrites nothing of the
first: its Table 3 and records stay byte for byte, and going back to it runs no job."""
from __future__ import annotations

import hashlib
import re

import pytest
import yaml
from pipeline_helpers import REPO, copy_workdir, make_workdir, snakemake

from tapebench.pipeline.config import load_config, protocol_slice

pytestmark = pytest.mark.xdist_group("tiny_build")   # with the other users of the session's tiny build

MODIFIERS = {"gpu.yaml", "budget.yaml"}   # layered on another preset (where jobs run, a study added): they keep its folder
# presets that only add methods to the paper protocol: they share its folder, so they reuse its runs
PAPER_PROTOCOL_SUPERSETS = {"extended.yaml"}
PATH = re.compile(r"(?<![\w/.-])((?:results|logs)/[\w./{}=-]+)")


def snapshot(*folders) -> dict:
    """{path: (sha256, mtime_ns)} of every file under `folders`."""
    return {str(p): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for folder in folders for p in sorted(folder.rglob("*")) if p.is_file()}


def written_paths(dry_run: str) -> set[str]:
    """Every results/ or logs/ path a dry run (-n -p) names: the jobs' inputs, outputs, logs and commands."""
    return {m.group(1).rstrip(".,") for m in PATH.finditer(dry_run)}


def test_every_shipped_preset_has_its_own_folder():
    folders = {}
    for path in sorted((REPO / "config").glob("*.yaml")):
        stated = yaml.safe_load(path.read_text()).get("results_dir")
        if path.name not in MODIFIERS:
            folders[path.name] = stated
    assert folders.pop("config.yaml") == "results"
    paper = protocol_slice(load_config(root=REPO))
    for name in PAPER_PROTOCOL_SUPERSETS:
        assert folders.pop(name) == "results", name
        assert protocol_slice(load_config([REPO / "config" / name], root=REPO)) == paper, name
    assert all(folder == f"results/{name.removesuffix('.yaml')}" for name, folder in folders.items()), folders
    assert {"quick.yaml", "grid_quick.yaml", "multigoal_quick.yaml"} <= set(folders)


def test_quick_and_grid_quick_plan_every_file_in_their_own_folders(tmp_path):
    """The whole default DAG of each quick preset reads and writes only its own results/<name> and logs/<name>."""
    workdir = make_workdir(tmp_path)
    for name in ("quick", "grid_quick"):
        out = snakemake(workdir, "-n", "-p", configfiles=(f"config/{name}.yaml",))
        assert out.returncode == 0, out.stderr[-3000:]
        paths = written_paths(out.stdout + out.stderr)
        assert f"results/{name}/table3.tex" in paths and f"logs/{name}/report/table3.log" in paths
        assert sorted(p for p in paths if not p.startswith((f"results/{name}/", f"logs/{name}/"))) == []


def test_a_second_preset_leaves_the_first_in_place(tiny_build, tmp_path):
    """The tiny protocol built in results/; then a grid preset in results/grid_tiny: its jobs write there (and
    logs/grid_tiny), the tiny build's files keep their bytes and times, and the tiny protocol is still up to date."""
    workdir = copy_workdir(tiny_build, tmp_path / "work")
    (workdir / "grid_tiny.yaml").write_text((REPO / "tests/data/grid_tiny.yaml").read_text())
    (workdir / "own_folder.yaml").write_text("results_dir: results/grid_tiny\n")
    grid = ("tiny.yaml", "grid_tiny.yaml", "own_folder.yaml")
    before = snapshot(workdir / "results", workdir / "logs")
    assert str(workdir / "results/table3.tex") in before

    planned = snakemake(workdir, "-n", "-p", configfiles=grid)
    assert planned.returncode == 0, planned.stderr[-3000:]
    paths = written_paths(planned.stdout + planned.stderr)
    assert "results/grid_tiny/table3.tex" in paths   # the whole DAG again, none of the tiny build's files reused
    assert sorted(p for p in paths if not p.startswith(("results/grid_tiny/", "logs/grid_tiny/"))) == []

    built = snakemake(workdir, "results/grid_tiny/splits/main.json", configfiles=grid)
    assert built.returncode == 0, built.stderr[-3000:]
    assert (workdir / "results/grid_tiny/splits/main.json").is_file()
    assert (workdir / "logs/grid_tiny/splits/main.log").is_file()
    assert snapshot(workdir / "results", workdir / "logs") == {
        **before, **{k: v for k, v in snapshot(workdir / "results/grid_tiny", workdir / "logs/grid_tiny").items()}}

    back = snakemake(workdir, "-n")
    assert back.returncode == 0 and "Nothing to be done" in back.stdout + back.stderr, back.stdout[-3000:]

    wrong = snakemake(workdir, "-n", "results/table3.tex", configfiles=grid)
    assert wrong.returncode != 0
    assert "ask for results/grid_tiny/table3.tex" in wrong.stdout + wrong.stderr


@pytest.mark.parametrize("folder, message", [
    ("results/runs", "'results_dir': 'results/runs' is a folder the pipeline writes in results/"),
    ("/tmp/elsewhere", "config key 'results_dir': '/tmp/elsewhere' does not match"),
    ("results/../x", "config key 'results_dir': 'results/../x' does not match"),
    ("results/a/b", "config key 'results_dir': 'results/a/b' does not match"),
])
def test_a_results_folder_outside_results_or_inside_the_layout_is_refused(folder, message):
    from tapebench.pipeline.config import ConfigError, load_config, validate_config

    config = load_config([REPO / "config/quick.yaml"], root=REPO)
    config["results_dir"] = folder
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_config(config, REPO / "workflow/schemas/config.schema.yaml")


@pytest.mark.parametrize("target, folder, ask", [
    ("results/quick/table3.tex", "results", "ask for results/table3.tex, or give --configfile the preset whose "
                                            "results_dir is results/quick"),
    ("results/table3.tex", "results/quick", "ask for results/quick/table3.tex, or leave out the presets"),
    ("results/grid_quick/figures/figure3_per_rule.pdf", "results/quick",
     "ask for results/quick/figures/figure3_per_rule.pdf"),
])
def test_a_target_in_another_folder_names_the_one_to_ask_for(target, folder, ask):
    from tapebench.pipeline.config import ConfigError, check_targets

    with pytest.raises(ConfigError, match=re.escape(ask)):
        check_targets([target], folder)
    check_targets(["all", "results/runs/main/dqn/seed0/train.json" if folder == "results" else
                   f"{folder}/runs/main/dqn/seed0/train.json"], folder)   # its own files and rule names pass


def test_the_report_command_writes_in_the_presets_folder(tmp_path, monkeypatch, capsys):
    """`tapebench report --tex-only` with a preset reads its tables in its folder and writes its report.tex there."""
    from tapebench.cli import main
    from tapebench.pipeline.config import load_config, validate_config
    from tapebench.report import registry

    root = make_workdir(tmp_path)
    (root / "own.yaml").write_text("results_dir: results/own\n")
    presets = [str(root / "tiny.yaml"), str(root / "own.yaml")]
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))   # no LaTeX
    args = ["report", "--workflow", str(root), "--configfile", *presets, "--tex-only"]
    assert main(args) == 2
    assert "missing: results/own/table1.tex, results/own/table2.tex" in capsys.readouterr().err
    config = validate_config(load_config(presets, root=root), root / "workflow/schemas/config.schema.yaml")
    targets = registry.targets(config)
    assert targets and all(t.startswith("results/own/") for t in targets)
    for target in targets:
        (root / target).parent.mkdir(parents=True, exist_ok=True)
        (root / target).write_text("% table\n")
    assert main(args) == 0
    assert (root / "results/own/report.tex").is_file() and not (root / "results/report.tex").exists()
