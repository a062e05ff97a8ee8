"""The reports on the tiny protocol: `snakemake results/report.pdf` compiles every table and figure into one PDF
(needs LaTeX: skipped without latexmk, unless TAPEBENCH_REQUIRE_LATEX=1 as in CI), and `snakemake --report`
writes the HTML report with each output's caption and category; the PDF stays out of the default target
unless `report.pdf` is switched on."""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
import unicodedata

import pytest
import yaml
from pipeline_helpers import REPO, copy_workdir, make_workdir, scheduled_jobs, snakemake

from tapebench import layout
from tapebench.pipeline.config import validate_config
from tapebench.report import document, registry

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("tiny_build_2")]      # a tiny-DAG pipeline build: `python3 -m pytest -m slow` (CI runs it)

HAS_LATEX = all(shutil.which(tool) for tool in ("latexmk", "pdftotext", "pdfinfo"))
REQUIRE_LATEX = os.environ.get("TAPEBENCH_REQUIRE_LATEX") == "1"
needs_latex = pytest.mark.skipif(
    not HAS_LATEX and not REQUIRE_LATEX,
    reason="LaTeX not installed (latexmk, pdftotext, pdfinfo): apt-get install -y texlive-latex-base "
           "texlive-latex-recommended texlive-latex-extra latexmk poppler-utils")


def _tiny_config() -> dict:
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    for key, value in yaml.safe_load((REPO / "tests/data/tiny.yaml").read_text()).items():
        config[key] = {**config[key], **value} if isinstance(value, dict) and isinstance(config.get(key), dict) \
            else value
    return validate_config(config, REPO / "workflow/schemas/config.schema.yaml")


@pytest.fixture(scope="module")
def tiny_reports(tiny_build, tmp_path_factory):
    """The tiny pipeline's default targets (a copy of the session's build), the PDF report where LaTeX is
    installed, then the HTML report."""
    workdir = copy_workdir(tiny_build, tmp_path_factory.mktemp("reports"))
    targets = ["all", layout.REPORT_PDF] if HAS_LATEX or REQUIRE_LATEX else ["all"]
    proc = snakemake(workdir, *targets)
    (workdir / "snakemake.out").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = subprocess.run([sys.executable, "-m", "snakemake", "--report", "report.html", "--configfile", "tiny.yaml"],
                            cwd=workdir, capture_output=True, text=True, timeout=600)
    assert report.returncode == 0, report.stderr[-4000:]
    return workdir


@needs_latex
def test_pdf_report_holds_every_table_with_its_caption(tiny_reports):
    pdf = tiny_reports / "results/report.pdf"
    pages = int(re.search(r"^Pages:\s+(\d+)", subprocess.run(["pdfinfo", str(pdf)], capture_output=True, text=True,
                                                               check=True).stdout, re.M).group(1))
    assert pages > 1
    text = _flat(subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True, check=True).stdout)
    config = _tiny_config()
    for entry, job in registry.jobs(config):
        assert _flat(document.heading(entry.title)) in text, entry.title
        for table in (path for path in job.outputs(entry).values() if path.endswith(".tex")):
            title = _caption_title((tiny_reports / table).read_text())
            assert _flat(title) in text, (table, title)
            assert not re.match(r"(Figure|Table)s? \d", title), (table, title)   # LaTeX numbers the float itself
    assert _flat("Protocol: split main; L = 8, training horizon H = 8 (evaluated at H = 8, 16); 2 seeds") in text
    assert _flat("tiny.yaml on top of config/config.yaml") in text
    source = (tiny_reports / "results/report.tex").read_text()
    assert source.count(r"\input{") == len([t for t in registry.targets(config) if t.endswith(".tex")])
    log = (tiny_reports / "logs/report/report_pdf.log").read_text()
    assert "report: results/report.pdf" in log
    assert not (tiny_reports / "results/.latex_check").exists()          # temporary: checked on every build


@needs_latex
def test_pdf_report_is_up_to_date_after_the_build(tiny_reports):
    proc = snakemake(tiny_reports, "--dry-run", "all", layout.REPORT_PDF)
    assert proc.returncode == 0, proc.stderr
    assert scheduled_jobs(proc.stdout) == []


def test_html_report_has_every_output_with_caption_and_category(tiny_reports):
    page = (tiny_reports / "report.html").read_text()
    config = _tiny_config()
    for entry, job in registry.jobs(config):
        assert json.dumps(entry.category) in page
        caption = html.escape(document.caption(entry, job, config), quote=False)
        assert json.dumps(caption)[1:-1] in page, caption
        for path in job.outputs(entry).values():
            assert json.dumps(path) in page
    assert "TAPE benchmark outputs of this configuration: main split" in page


def test_html_report_after_a_partial_build_reports_what_was_built(tiny_build, tmp_path):
    """The README's quick start builds Table 3 only; `snakemake --report` afterwards reports the outputs that exist
    (here: the whole tiny build but Table 1 and one figure) instead of stopping at a missing one."""
    workdir = copy_workdir(tiny_build, tmp_path)
    (workdir / "results/table1.tex").unlink()
    (workdir / "results/figures/figure4_spacetime.png").unlink()
    report = subprocess.run([sys.executable, "-m", "snakemake", "--report", "report.html", "--configfile", "tiny.yaml"],
                            cwd=workdir, capture_output=True, text=True, timeout=600)
    assert report.returncode == 0, report.stderr[-4000:]
    page = (workdir / "report.html").read_text()
    assert '"results/table3.tex": {"name"' in page and '"results/figures/figure4_spacetime.pdf": {"name"' in page
    assert '"results/table1.tex": {"name"' not in page
    assert '"results/figures/figure4_spacetime.png": {"name"' not in page


def test_pdf_joins_the_default_target_only_when_switched_on(tmp_path):
    workdir = make_workdir(tmp_path)
    default = {rule for rule, _ in scheduled_jobs(snakemake(workdir, "--dry-run").stdout)}
    assert "render_table3" in default and not default & {"report_pdf", "latex_check"}
    (workdir / "pdf.yaml").write_text(yaml.safe_dump({"report": {"pdf": True}}))
    proc = snakemake(workdir, "--dry-run", configfiles=("tiny.yaml", "pdf.yaml"))
    assert proc.returncode == 0, proc.stderr
    assert {"report_pdf", "latex_check"} <= {rule for rule, _ in scheduled_jobs(proc.stdout)}


def _caption_title(table_tex: str) -> str:
    """A table's caption up to its first LaTeX command, math or full stop (the words pdftotext gives back)."""
    caption = re.search(r"\\caption\{(.*)", table_tex).group(1)
    return re.split(r"[\\$.{}]", caption)[0].strip()


def _flat(text: str) -> str:
    """Text without whitespace or hyphens (LaTeX breaks and hyphenates long headings across lines), with
    LaTeX's typographic quotes read as straight ones."""
    text = unicodedata.normalize("NFKC", text).translate({0x2019: "'", 0x2018: "'"})
    return re.sub(r"[\s\-\u00ad\u2010]+", "", text)
