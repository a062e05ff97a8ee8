"""The project documents its own protocol: no reference to a spec file users do not have, and every
pointer into docs/protocol.md names a section that exists."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pipeline_helpers import REPO, make_workdir

SOURCES = [*REPO.glob("src/**/*.py"), *REPO.glob("tests/*.py"), *REPO.glob("workflow/**/*.smk"),
           *REPO.glob("workflow/**/*.yaml"), *REPO.glob("config/*.yaml"), *REPO.glob("config/*.md"),
           *REPO.glob("docs/**/*.md"), REPO / "README.md", REPO / "Snakefile"]
POINTER = re.compile(r"docs/protocol\.md#([\w-]+)((?:, #[\w-]+)*)")


def anchors() -> set[str]:
    return set(re.findall(r'<a id="([\w-]+)"></a>', (REPO / "docs" / "protocol.md").read_text()))


def test_no_reference_to_an_unshipped_spec():
    pattern = re.compile("SPEC" + r" §")
    assert [str(p.relative_to(REPO)) for p in SOURCES if pattern.search(p.read_text())] == []


def test_every_pointer_names_an_existing_section():
    known = anchors()
    assert {"environment", "splits", "mirror-classes", "decisions", "config-bounds", "methods"} <= known
    pointers = {(p.relative_to(REPO).as_posix(), name)
                for p in SOURCES for m in POINTER.finditer(p.read_text())
                for name in [m.group(1), *re.findall(r"#([\w-]+)", m.group(2))]}
    assert len(pointers) > 20
    assert sorted((f, a) for f, a in pointers if a not in known) == []
    assert "docs/methods.md" in (REPO / "docs" / "protocol.md").read_text()


# --- every example executes ------------------------------------------------------------------------------------
# A fenced ```python block of README.md or docs/**/*.md runs as written, in a fresh interpreter in an empty folder;
# a ```console block's `$ ` lines run too (each must exit 0, and every other line of the block must appear in
# what the commands print). A block is skipped only when the line before it is `<!-- skip-example: REASON -->`.
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]
FENCE = re.compile(r"(?:<!-- skip-example: ([^>]*?) -->\n)?^```(\w*)\n(.*?)^```$", re.S | re.M)


def examples(language: str):
    """(file, line, skip reason or None, code) of every fenced block of `language`."""
    found = []
    for path in DOCS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            if m.group(2) == language:
                found.append((path.relative_to(REPO).as_posix(), text.count("\n", 0, m.start(2)) + 1,
                              m.group(1), m.group(3)))
    return found


def ids(blocks):
    return [f"{file}:{line}" for file, line, _, _ in blocks]


PYTHON = examples("python")
CONSOLE = examples("console")


def test_examples_are_found_and_every_skip_states_a_reason():
    assert len(PYTHON) >= 2 and len(CONSOLE) >= 1
    skipped = [(f"{file}:{line}", reason) for file, line, reason, _ in PYTHON + CONSOLE if reason is not None]
    print("skipped examples:", skipped)
    assert all(reason.strip() for _, reason in skipped)
    assert len(skipped) < len(PYTHON) + len(CONSOLE)


@pytest.mark.parametrize("file, line, skip, code", PYTHON, ids=ids(PYTHON))
def test_python_example_runs_as_written(file, line, skip, code, tmp_path):
    if skip is not None:
        pytest.skip(skip)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{file}:{line} failed:\n{out.stderr[-3000:]}"


@pytest.mark.parametrize("file, line, skip, code", CONSOLE, ids=ids(CONSOLE))
def test_console_example_runs_as_written(file, line, skip, code, tmp_path):
    if skip is not None:
        pytest.skip(skip)
    workdir = make_workdir(tmp_path)  # a copy of the workflow: a dry run writes .snakemake/ where it runs
    commands = [ln[2:] for ln in code.splitlines() if ln.startswith("$ ")]
    expected = [ln.strip() for ln in code.splitlines() if ln.strip() and not ln.startswith("$ ")]
    assert commands, f"{file}:{line}: a console block without a `$ ` line"
    printed = ""
    for command in commands:
        out = subprocess.run(command, shell=True, cwd=workdir, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"{file}:{line}: `{command}` exited {out.returncode}:\n{out.stderr[-3000:]}"
        printed += out.stdout + out.stderr
    assert [ln for ln in expected if ln not in printed] == []


# --- links and pointers ---------------------------------------------------------------------------------------
LINKED = [*DOCS, REPO / "config" / "README.md", REPO / "CHANGELOG.md"]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text without fenced blocks and inline code, where a bracket is not a link."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"^```.*?^```$", "", text, flags=re.S | re.M))


def headings_and_anchors(path: Path) -> set[str]:
    text = path.read_text()
    unfenced = re.sub(r"^```.*?^```$", "", text, flags=re.S | re.M)
    slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")  # GitHub's heading anchors
             for h in re.findall(r"^#{1,6} (.+)$", unfenced, flags=re.M)}
    return slugs | set(re.findall(r'<a id="([\w-]+)"></a>', text))


def test_every_relative_link_points_at_an_existing_file_and_anchor():
    broken = []
    for path in LINKED:
        for target in LINK.findall(prose(path.read_text())):
            if re.match(r"[a-z]+:", target):
                continue
            name, _, anchor = target.partition("#")
            linked = (path.parent / name).resolve() if name else path
            if not linked.exists() or (anchor and anchor not in headings_and_anchors(linked)):
                broken.append(f"{path.relative_to(REPO)}: {target}")
    assert broken == []


def test_every_preset_has_its_row_in_the_config_readme():
    table = (REPO / "config" / "README.md").read_text()
    presets = sorted(p.name for p in (REPO / "config").glob("*.yaml"))
    assert [name for name in presets if f"\n| `{name}` |" not in table] == []


def test_no_tracked_file_points_outside_the_clone():
    """A user's clone has nothing beside it: no file may name the folder next to the repository."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    outside = "../" + "shared"
    hits = []
    for name in files:
        try:
            if outside in (REPO / name).read_text():
                hits.append(name)
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
    assert hits == []


def test_readme_methods_table_is_the_registry():
    """The README's table of methods: every registered built-in method, its row name and family, whether it
    trains, and the presets that run it, in `tapebench methods`' order."""
    import yaml

    from tapebench.registry import FAMILIES, _builtin, registry

    presets = {"paper": "config.yaml", **{name: f"{name}.yaml" for name in
                                          ("extended", "quick", "equivariant", "dreamer_large",
                                           "multigoal", "multigoal_quick")}}
    runs = {name: yaml.safe_load((REPO / "config" / file).read_text())["methods"] for name, file in presets.items()}
    rows = ["| id | row | family | trains | presets |", "|---|---|---|---|---|"]
    builtin = {m.id for m in _builtin()}  # a plug-in installed beside tapebench is not the README's
    for m in sorted((m for m in registry().values() if m.id in builtin),
                    key=lambda m: (list(FAMILIES).index(m.family), m.id)):
        used = ", ".join(name for name in presets if m.id in runs[name]) or "—"
        rows.append(f"| `{m.id}` | {m.display_name} | {m.family_name.replace('--', '-')} | "
                    f"{'yes' if m.trains else 'no'} | {used} |")
    assert "\n".join(rows) in (REPO / "docs" / "methods" / "README.md").read_text()


# The pages users read first stay readable: README a page of a few screens, the protocol a specification (no
# measured results or history; those are generated into docs/results.md, docs/compute.md and the CHANGELOG).
SIZE_BUDGETS = {"README.md": 12_000, "docs/protocol.md": 50_000}


@pytest.mark.parametrize("page, budget", SIZE_BUDGETS.items())
def test_front_pages_keep_their_size_budget(page, budget):
    size = len((REPO / page).read_bytes())
    assert size <= budget, f"{page} is {size:,} bytes, over its budget of {budget:,}: cut before adding"
