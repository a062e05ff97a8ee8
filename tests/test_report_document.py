"""The compiled report (tapebench report): the document holds every registry target of the config exactly once,
captions state the config's protocol, text is LaTeX-escaped, entries added to the registry appear without edits,
and a machine without LaTeX gets installation instructions instead of a compiler error."""
from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import unicodedata
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tapebench.cli import main
from tapebench.pipeline.config import merge_config, validate_config
from tapebench.report import document, output, registry

REPO = Path(__file__).resolve().parents[1]
HAS_LATEX = (shutil.which("latexmk") is not None and shutil.which("pdftotext") is not None) or \
    os.environ.get("TAPEBENCH_REQUIRE_LATEX") == "1"            # CI installs LaTeX: these tests must not skip there
NO_LATEX = "latexmk / pdftotext not installed (apt-get install -y texlive-latex-base texlive-latex-recommended " \
           "texlive-latex-extra latexmk poppler-utils)"


def _config(*overlays, **override) -> dict:
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    for overlay in [*(yaml.safe_load((REPO / o).read_text()) for o in overlays), override]:
        config = merge_config(config, overlay)       # nested sections merge as Snakemake merges config files
    return validate_config(config, REPO / "workflow/schemas/config.schema.yaml")


def _placed(items) -> Counter:
    placed = Counter()
    for item in items:
        placed.update(item["tables"])
        placed.update(p for figure in item["figures"] for p in figure.values() if p)
        placed.update(item["data"])
    return placed


@pytest.mark.parametrize("overlays", [("tests/data/tiny.yaml",),
                                      ("tests/data/tiny.yaml", "tests/data/world_models.yaml"), ()])
def test_every_registry_target_appears_exactly_once(overlays):
    config = _config(*overlays)
    targets = registry.targets(config)
    assert _placed(document.items(config)) == Counter(targets)
    tex = document.render_tex(config, version="test")
    inputs = re.findall(r"\\input\{([^}]*)\}", tex)
    graphics = re.findall(r"\\includegraphics\[[^]]*\]\{([^}]*)\}", tex)
    assert Counter(inputs) == Counter(t for t in targets if t.endswith(".tex"))
    assert Counter(graphics) == Counter(t for t in targets if t.endswith(".pdf"))
    # sections follow the registry categories, in order of first appearance
    categories = list(dict.fromkeys(entry.category for entry, _ in registry.jobs(config)))
    assert re.findall(r"^\\section\{(.*)\}$", tex, re.M) == [document.tex_text(c) for c in categories] + \
        ["Configuration"]


def test_captions_carry_the_configs_protocol():
    config = _config("tests/data/tiny.yaml", env={"L": 13, "H": 21, "success_bonus": 1.0}, seeds=7,
                     evaluation={"episodes_per_rule": 3, "horizons": [21, 42], "last_k": 2, "eval_seed": 1},
                     training={"total_steps": 12345, "eval_every": 4000})
    captions = {job.name: document.caption(entry, job, config) for entry, job in registry.jobs(config)}
    main_study = ("table2", "table3", "table4", "table_types", "rliable", "figure3", "learning_curves")
    for name in main_study:
        for part in ("L = 13", "training horizon H = 21", "evaluated at H = 21, 42", "7 seeds",
                     "3 episodes per rule", "12,345 environment steps per run", "a checkpoint every 4,000",
                     "last 2 checkpoints"):
            assert part in captions[name], (name, captions[name])
    assert captions["table3"].startswith("ID vs OOD success, drop, OOD return, ON(p), floor-normalised score, with bootstrap CIs "
                                         "(paper Table 3). Protocol: split main;")
    assert "split random2;" in captions["identifiability_random2"]          # the job's own split, not the main one
    tex = document.render_tex(config, version="test")
    assert tex.count("Protocol: split main; L = 13, training horizon H = 21") >= 5


def _protocol_lines(tex: str) -> dict[str, str]:
    """Each subsection heading of the report's .tex and the protocol line under it (or its figure's caption)."""
    out = {}
    for block in re.split(r"\\subsection\*\{", tex)[1:]:
        heading = block.split("}", 1)[0]
        line = re.search(r"Protocol: [^}]*|Illustration: [^}]*", block)
        out[heading] = line.group(0) if line else ""
    return out


def test_each_float_is_numbered_once_and_states_its_own_seeds_and_budgets():
    config = _config("tests/data/tiny.yaml", studies={"worldtest": {"seeds": 1, "budgets": [0, 4]},
                                                      "fixed_z": {"seeds": 1, "total_steps": 256}})
    config["seeds"] = 3
    tex = document.render_tex(config, version="test")
    # LaTeX numbers every float; the paper's number is in the heading's text, never a caption's "Figure N:" prefix
    for caption in re.findall(r"\\caption\{([^}]*)", tex):
        assert not re.match(r"\s*(Figure|Table)s? \d", caption), caption
    headings = re.findall(r"\\subsection\*\{([^}]*)\}", tex)
    assert "True-dynamics MPC strict success by rule type (paper Table 7)" in headings
    assert not any(re.match(r"(Figure|Table)s? \d", h) for h in headings), headings
    lines = _protocol_lines(tex)
    world = [line for heading, line in lines.items() if heading.startswith("World test")]
    assert world and all("; 1 seed;" in line and "interaction budgets B = 0, 4" in line for line in world), world
    fixed = [line for heading, line in lines.items() if "paper Table 5" in heading or "paper Table 6" in heading]
    assert len(fixed) == 2 and all("; 1 seed;" in line and "256 environment steps" in line for line in fixed), fixed
    main = lines["ID vs OOD success, drop, OOD return, ON(p), floor-normalised score, with bootstrap CIs (paper Table 3)"]
    assert "; 3 seeds;" in main
    oracle = lines["Planning reference (MPC, exact optimum) and feasibility (paper Table 1)"]
    assert "seed" not in oracle and "no training" in oracle


def test_first_page_summarises_the_config():
    config = _config("tests/data/tiny.yaml")
    summary = document.summary(config, presets=["tiny.yaml"], version="9.9+gabc")
    assert summary["methods"] == ["dqn", "ppo", "random", "mpc", "exact"]
    assert summary["budget"] == {"total_steps": 256, "eval_every": 128, "seeds": 2, "episodes_per_rule": 1,
                                 "horizons": [8, 16], "last_k": 2}
    assert len(summary["config_digest"]) == 12
    assert document.summary(_config("tests/data/tiny.yaml", seeds=3))["config_digest"] != summary["config_digest"]
    tex = document.render_tex(config, presets=["tiny.yaml"], version="9.9+gabc")
    assert r"\texttt{tiny.yaml} on top of \texttt{config/config.yaml}" in tex
    assert r"Code version & \texttt{9.9+gabc}" in tex
    assert "200 bootstrap resamples, 95\\% intervals" in tex
    assert yaml.safe_load(re.search(r"\\begin\{verbatim\}\n(.*?)\\end\{verbatim\}", tex, re.S).group(1)) == config


def test_text_is_latex_escaped():
    assert document.tex_text("a_b & 100% $x$ #1 {y} ~ ^ \\ × ≥") == \
        r"a\_b \& 100\% \$x\$ \#1 \{y\} \textasciitilde{} \textasciicircum{} \textbackslash{} $\times$ $\geq$"
    config = _config("tests/data/tiny.yaml", splits={"main": {"method": "diverse", "test_size": 30, "seed": 0},
                                                     "odd_name-2": {"method": "random", "test_size": 30, "seed": 1}})
    tex = document.render_tex(config, presets=["my_preset&co.yaml"], version="1.0")
    assert r"\texttt{my\_preset\&co.yaml}" in tex
    assert r"(split \texttt{odd\_name-2})" in tex and "split odd\\_name-2; L = 8" in tex
    assert r"\input{results/identifiability/odd_name-2.tex}" in tex       # paths stay paths


def _fake_entry(title, category="Figures"):
    def jobs(config):
        return [output.Job("fake_figure", "results/figures/fake", {"split": config["main_split"]})]
    return output.Output("fake_figure", output.FIGURE, title, "x:y", (), jobs, category=category)


def test_an_entry_added_to_the_registry_appears_without_edits(monkeypatch):
    monkeypatch.setitem(registry.OUTPUTS, "fake_figure", _fake_entry("Success vs depth & 50% of rules"))
    config = _config("tests/data/tiny.yaml")
    items = {item["id"]: item for item in document.items(config)}
    assert items["fake_figure"]["figures"] == [{"pdf": "results/figures/fake.pdf", "png": "results/figures/fake.png"}]
    tex = document.render_tex(config, version="test")
    assert r"\section{Figures}" in tex
    assert re.search(r"\\includegraphics\[[^]]*\]\{results/figures/fake.pdf\}\n\\caption\{Success vs depth \\& "
                     r"50\\% of rules. Protocol: split main; L = 8", tex)


def test_a_path_latex_cannot_take_is_refused(monkeypatch):
    entry = _fake_entry("x")
    monkeypatch.setitem(registry.OUTPUTS, "fake_figure", output.Output(
        entry.id, entry.kind, entry.title, entry.build, (), lambda c: [output.Job("f", "results/my fig", {})]))
    with pytest.raises(ValueError, match="'results/my fig.pdf' cannot be included in LaTeX"):
        document.items(_config("tests/data/tiny.yaml"))


# --- LaTeX missing or broken ---------------------------------------------------------------------------------
def _fake_tools(bin_dir: Path, *names: str, kpsewhich_missing=()) -> None:
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        script = bin_dir / name
        if name == "kpsewhich":
            missing = " ".join(f"{p}.sty" for p in kpsewhich_missing)
            script.write_text(f'#!/bin/sh\nfor m in {missing}; do [ "$1" = "$m" ] && exit 1; done\necho /x/$1\n')
        else:
            script.write_text("#!/bin/sh\nexit 0\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_missing_latex_stops_with_install_instructions(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))           # no latexmk, no pdflatex
    with pytest.raises(document.LatexMissing) as err:
        document.latex_command()
    message = str(err.value)
    assert "latexmk or pdflatex on PATH" in message
    assert ("apt-get install -y texlive-latex-base texlive-latex-recommended texlive-latex-extra latexmk"
            in message)
    assert "MacTeX" in message and "BasicTeX" in message and "--tex-only" in message
    assert main(["report", "--check-latex"]) == 3
    assert "apt-get install -y texlive-latex-base" in capsys.readouterr().err
    # the full command stops before reading the config or writing anything
    assert main(["report", "--workflow", str(tmp_path), "--tex", "out.tex"]) == 3
    assert not (tmp_path / "out.tex").exists()


def test_latex_without_the_needed_packages_names_them(tmp_path, monkeypatch):
    _fake_tools(tmp_path, "latexmk", "pdflatex", "kpsewhich", kpsewhich_missing=("adjustbox", "placeins"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(document.LatexMissing, match="lacks the package\\(s\\) adjustbox, placeins"):
        document.latex_command()
    _fake_tools(tmp_path, "kpsewhich")
    assert document.latex_command()[0] == "latexmk"
    (tmp_path / "latexmk").unlink()
    assert document.latex_command()[0] == "pdflatex"


def _workflow_with_targets(tmp_path: Path, config_overlay="tests/data/tiny.yaml") -> Path:
    for name in ("config", "workflow"):
        shutil.copytree(REPO / name, tmp_path / name)
    shutil.copy(REPO / config_overlay, tmp_path / "tiny.yaml")
    return tmp_path


def test_tex_only_needs_no_latex_and_missing_tables_are_named(tmp_path, monkeypatch, capsys):
    root = _workflow_with_targets(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    args = ["report", "--workflow", str(root), "--configfile", str(root / "tiny.yaml"), "--tex-only"]
    assert main(args) == 2
    assert "missing: results/table1.tex, results/table2.tex" in capsys.readouterr().err
    config = _config("tests/data/tiny.yaml")
    for target in registry.targets(config):
        (root / target).parent.mkdir(parents=True, exist_ok=True)
        (root / target).write_text("% table\n")
    assert main(args) == 0
    tex = (root / "results/report.tex").read_text()
    assert tex == document.render_tex(config, presets=[str(root / "tiny.yaml")])
    assert not (root / "results/report.pdf").exists()


@pytest.mark.skipif(not HAS_LATEX, reason=NO_LATEX)
def test_compiled_pdf_holds_tables_and_figures_with_captions(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.setitem(registry.OUTPUTS, "fake_figure", _fake_entry("Error versus depth"))
    config = _config("tests/data/tiny.yaml")
    for number, (entry, job) in enumerate(registry.jobs(config)):
        for path in [*job.outputs(entry).values(), *entry.extra_outputs(job).values()]:
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            if path.endswith(".tex"):
                (tmp_path / path).write_text(f"\\begin{{table}}[t]\\centering\\caption{{Caption number {number}.}}"
                                             f"\\begin{{tabular}}{{ll}}a & b\\\\\\end{{tabular}}\\end{{table}}\n")
            elif path.endswith(".pdf"):
                fig, ax = plt.subplots(figsize=(3.3, 2.2))
                ax.plot([1, 2, 3], [3, 1, 2])
                fig.savefig(tmp_path / path)
                plt.close(fig)
    pdf = tmp_path / "results/report.pdf"
    document.compile_pdf(document.render_tex(config, version="test"), pdf, root=tmp_path)
    text = _pdf_text(pdf)
    for number, (entry, job) in enumerate(registry.jobs(config)):
        if entry.kind == output.TABLE:
            assert f"Captionnumber{number}." in text
    assert re.search(r"Figure\d+:Errorversusdepth\.Protocol:splitmain;L=8", text), text[-2000:]
    assert not re.search(r"(Figure|Table)\d+:(Figure|Table)\d", text)      # each float numbered once
    assert not list(pdf.parent.glob(".report-*"))                  # the temporary folder is gone


@pytest.mark.skipif(not HAS_LATEX, reason=NO_LATEX)
def test_a_latex_error_is_reported_and_leaves_no_pdf(tmp_path):
    pdf = tmp_path / "report.pdf"
    tex = "\\documentclass{article}\\begin{document}\n\\undefinedmacro\n\\end{document}\n"
    with pytest.raises(RuntimeError, match="Undefined control sequence"):
        document.compile_pdf(tex, pdf, root=tmp_path)
    assert not pdf.exists() and list(tmp_path.iterdir()) == []


def _pdf_text(pdf: Path) -> str:
    """pdftotext output without whitespace (line breaks fall anywhere) and with ligatures spelled out."""
    text = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    return re.sub(r"\s+", "", unicodedata.normalize("NFKC", text))
