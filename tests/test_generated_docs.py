"""Pages of docs/ made from data: docs/compute.md from docs/measurements/*.json (`tapebench docs compute`),
docs/results.md from the reference set (`tapebench reference results`); no commit hash in the prose of docs/; the
package version and the CHANGELOG's releases agree."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

import tapebench
from tapebench import reference_sets
from tapebench.cli import main
from tapebench.report.measurements import MeasurementError, compute_markdown, format_value, read_figures

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
MEASUREMENTS = DOCS / "measurements"
SHIPPED = REPO / "reference"
SET = "tape-v2"


# --- docs/compute.md ------------------------------------------------------------------------------------------------
def test_docs_compute_is_rendered_from_the_measurements():
    assert (DOCS / "compute.md").read_text() == compute_markdown(MEASUREMENTS), (
        "docs/compute.md is stale: tapebench docs compute --out docs/compute.md")


@pytest.fixture
def measurements(tmp_path):
    folder = tmp_path / "measurements"
    shutil.copytree(MEASUREMENTS, folder, ignore=shutil.ignore_patterns("bench"))
    return folder


def _edit(folder: Path, file: str, change) -> None:
    path = folder / file
    data = json.loads(path.read_text())
    change(data["figures"])
    path.write_text(json.dumps(data))


def test_a_changed_figure_makes_the_page_stale_and_regenerating_shows_it(measurements, tmp_path, capsys):
    page = tmp_path / "compute.md"
    page.write_text((DOCS / "compute.md").read_text())
    args = ["docs", "compute", "--measurements", str(measurements), "--out", str(page)]
    assert main([*args, "--check"]) == 0
    _edit(measurements, "paper.json", lambda f: f["paper_projected_cpu_hours"].update(value=12345.67))
    assert main([*args, "--check"]) == 1
    assert "stale" in capsys.readouterr().err
    assert main(args) == 0
    text = page.read_text()
    assert "projects 12,345.67 CPU-hours" in text and "48.71 CPU-hours" not in text
    assert main([*args, "--check"]) == 0


@pytest.mark.parametrize("change, message", [
    (lambda f: f["startup_help"].pop("machine"), "figure 'startup_help': missing key(s) machine"),
    (lambda f: f["startup_help"].update(speed=1), "figure 'startup_help': unknown key(s) speed"),
    (lambda f: f["startup_help"].update(value="0.12"), "figure 'startup_help': key 'value' is '0.12'"),
    (lambda f: f["startup_help"].update(value=True), "figure 'startup_help': key 'value' is True"),
    (lambda f: f["startup_help"].update(commit="75f0d5b"), "figure 'startup_help': key 'commit' is '75f0d5b'"),
    (lambda f: f["startup_help"].update(date="29/11/2026"), "figure 'startup_help': key 'date' is '29/11/2026'"),
    (lambda f: f["startup_help"].update(unit=""), "figure 'startup_help': key 'unit' is ''"),
    (lambda f: f.update({"Bad-ID": f["startup_help"]}), "figure 'Bad-ID': an ID is lower-case letters"),
])
def test_a_row_off_the_schema_is_refused_naming_file_and_key(measurements, change, message):
    _edit(measurements, "startup.json", change)
    with pytest.raises(MeasurementError) as err:
        read_figures(measurements)
    assert str(measurements / "startup.json") in str(err.value) and message in str(err.value)


def test_an_id_in_two_files_a_file_of_another_shape_and_an_unused_row_are_refused(measurements):
    duplicate = json.loads((measurements / "startup.json").read_text())["figures"]["startup_help"]
    (measurements / "zz.json").write_text(json.dumps({"figures": {"startup_help": duplicate}}))
    with pytest.raises(MeasurementError, match=r"zz.json: figure 'startup_help' is also in .*startup.json"):
        read_figures(measurements)
    (measurements / "zz.json").write_text(json.dumps({"benchmark": "seeds", "figures": {}}))
    with pytest.raises(MeasurementError, match=r"zz.json: a measurement file is .*got \['benchmark', 'figures'\]"):
        read_figures(measurements)
    (measurements / "zz.json").write_text(json.dumps({"figures": {"nobody_shows_this": duplicate}}))
    with pytest.raises(MeasurementError, match="1 figure.* appear nowhere on the page: nobody_shows_this"):
        compute_markdown(measurements)
    (measurements / "zz.json").unlink()
    _edit(measurements, "startup.json", lambda f: f.pop("startup_help"))
    with pytest.raises(MeasurementError, match="the page names figure 'startup_help', which no file in"):
        compute_markdown(measurements)


def test_figures_are_formatted_with_their_units():
    assert format_value(3183, "jobs") == "3,183 jobs"
    assert format_value(48.71, "CPU-hours") == "48.71 CPU-hours"
    assert format_value(730, "s") == "12 min 10 s"
    assert format_value(59.5, "s") == "59.5 s"
    assert format_value(446, "CPU-s") == "446 CPU-s"
    assert format_value(2.69, "x") == "2.69x" and format_value(36, "%") == "36%"
    assert format_value(12476) == "12,476"


def test_every_raw_bench_output_is_the_source_of_some_row():
    commands = " ".join(row["command"] for row in read_figures(MEASUREMENTS).values())
    raw = sorted(p.name for p in (MEASUREMENTS / "bench").glob("*.json"))
    assert raw and [name for name in raw if f"docs/measurements/bench/{name}" not in commands] == []


# --- docs/results.md ------------------------------------------------------------------------------------------------
def test_docs_results_is_rendered_from_the_shipped_set():
    from tapebench.report.results_page import results_markdown

    assert (DOCS / "results.md").read_text() == results_markdown(SET, SHIPPED), (
        "docs/results.md is stale: tapebench reference results tape-v2 --out docs/results.md")


def test_the_results_page_names_exactly_the_methods_the_set_holds(tmp_path):
    """A set with one method fewer renders a page without it, and says how many it holds."""
    from tapebench.report.results_page import results_markdown
    from tapebench.report.tables import display_name

    shutil.copytree(SHIPPED / SET, tmp_path / SET)
    folder = tmp_path / SET
    manifest = json.loads((folder / "manifest.json").read_text())
    dropped = "bayes_filter_full"
    (folder / manifest["methods"][dropped]["records"]).unlink()
    del manifest["methods"][dropped]
    reference_sets.write_manifest(folder, manifest)
    reference_sets.write_checksums(folder)
    text = results_markdown(SET, tmp_path)
    held = sorted(manifest["methods"])
    assert f"**What the set holds.** {len(held)} methods (not in the set yet: {dropped}). 20 seeds each" in text
    for method in held:
        assert f"| {display_name(method)} | `{method}` |" in text
    assert f"`{dropped}`" not in text and display_name(dropped) not in text
    # Table 3's rows carry the aggregate's numbers: DQN's ID success in the shipped page is the same here
    shipped = (DOCS / "results.md").read_text()
    dqn_row = next(line for line in shipped.splitlines() if line.startswith("| DQN | 20 |"))
    assert dqn_row in text


# --- commit hashes --------------------------------------------------------------------------------------------------
# A commit hash as a word: 7-40 hex digits with at least one letter and one digit, or a version's `+g<hash>`. Not a
# hex colour (`#a1b2c3`) and not a longer hex string (a SHA-256 checksum is 64 digits).
COMMIT_HASH = re.compile(r"(?:(?<=\+g)|(?<![\w#]))(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![0-9a-zA-Z_])")


def commit_hashes(text: str) -> list[str]:
    return COMMIT_HASH.findall(text)


def test_the_commit_hash_pattern():
    assert commit_hashes("measured at commit 5e2f8e5, then 81580fa69c6875f3d6b94556010a735465456528.") == [
        "5e2f8e5", "81580fa69c6875f3d6b94556010a735465456528"]
    assert commit_hashes("records of code 0.1.0+gbea1e61ae60d") == ["bea1e61ae60d"]
    assert commit_hashes("file blocks4-276db97.json") == ["276db97"]
    assert commit_hashes("colour #a1b2c3d, date 2026-11-28, deadbeef, x86_64, cu130, torch 2.11.0+cu130") == []
    assert commit_hashes("sha256 acbb1d7a7b67533095fe1ff0eb61b318b9dd4667a025ddfe1b740cdce9ba6111") == []


def test_no_file_under_docs_has_a_commit_hash_in_its_prose():
    """Measurement JSON (docs/measurements/, where each row names its commit) aside; git has the history."""
    found = {}
    for path in sorted(DOCS.rglob("*")):
        if not path.is_file() or path.suffix == ".json" or path.suffix in {".png", ".pdf", ".svg"}:
            continue
        hits = commit_hashes(path.read_text())
        if hits:
            found[str(path.relative_to(REPO))] = sorted(set(hits))
    assert found == {}, f"commit hashes in the prose of docs/ (the commit belongs in git or a measurement row): {found}"


# --- version and CHANGELOG ------------------------------------------------------------------------------------------
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d\d-\d\d)$")


def test_the_package_version_is_the_newest_release_of_the_changelog():
    text = (REPO / "CHANGELOG.md").read_text()
    versions = [line for line in text.splitlines() if line.startswith("## ")]
    assert versions[0] == "## [Unreleased]", "the CHANGELOG starts with an [Unreleased] section for new entries"
    releases = [RELEASE.match(line) for line in versions[1:]]
    assert all(releases), [line for line, m in zip(versions[1:], releases) if not m]
    numbers = [tuple(map(int, m.group(1).split("."))) for m in releases]
    dates = [m.group(2) for m in releases]
    assert numbers == sorted(numbers, reverse=True) and len(set(numbers)) == len(numbers)
    assert dates == sorted(dates, reverse=True)
    pyproject = re.search(r'^version = "([^"]+)"$', (REPO / "pyproject.toml").read_text(), flags=re.M).group(1)
    assert pyproject == tapebench.__version__ == releases[0].group(1)


def test_each_changelog_section_has_each_heading_at_most_once():
    sections = re.split(r"^## ", (REPO / "CHANGELOG.md").read_text(), flags=re.M)[1:]
    for section in sections:
        headings = re.findall(r"^### (.+)$", section, flags=re.M)
        assert len(headings) == len(set(headings)), f"{section.splitlines()[0]}: headings {headings}"
        assert set(headings) <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
