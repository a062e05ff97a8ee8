"""The project documents its own protocol: no reference to a spec file users do not have, and every
pointer into docs/protocol.md names a section that exists."""
from __future__ import annotations

import re

from pipeline_helpers import REPO

SOURCES = [*REPO.glob("src/**/*.py"), *REPO.glob("tests/*.py"), *REPO.glob("workflow/**/*.smk"),
           *REPO.glob("workflow/**/*.yaml"), *REPO.glob("config/*.yaml"), *REPO.glob("config/*.md"),
           *REPO.glob("docs/*.md"), REPO / "README.md", REPO / "Snakefile"]
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
