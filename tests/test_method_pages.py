"""One page per method, docs/methods/<id>.md, whose generated part (registry entry, hyperparameter table) is what
`tapebench methods --write-docs docs/methods` writes, and an index in docs/methods/README.md (`tapebench.method_pages`)."""
from __future__ import annotations

import dataclasses
import shutil

import pytest
from pipeline_helpers import REPO

from tapebench import method_pages
from tapebench.cli import main
from tapebench.method_pages import problems, write_pages
from tapebench.registry import builtin_ids, field_docs

PAGES = REPO / "docs" / "methods"


@pytest.fixture
def pages(tmp_path):
    """A copy of the repository's method pages to break."""
    folder = tmp_path / "methods"
    shutil.copytree(PAGES, folder)
    return folder


def test_every_built_in_method_has_a_current_page_and_the_index_is_current():
    assert problems(PAGES) == []
    assert {p.stem for p in PAGES.glob("*.md")} == builtin_ids() | {"README"}


def test_a_method_without_a_page_fails_and_the_writer_starts_one(pages):
    (pages / "rainbow.md").unlink()
    assert problems(pages) == [f"{pages / 'rainbow.md'}: missing; `{method_pages.WRITER}` starts it"]
    assert write_pages(pages) == [pages / "rainbow.md"]
    started = (pages / "rainbow.md").read_text()
    assert started.startswith("# Rainbow (`rainbow`)") and "| `atoms` | int | `51` |" in started
    assert problems(pages) == [f"{pages / 'rainbow.md'}: started by the writer, its prose is still to be written"]


def test_a_page_without_a_method_fails(pages):
    (pages / "dqn_old.md").write_text("# DQN (old)\n")
    assert problems(pages) == [f"{pages / 'dqn_old.md'}: no built-in method has the id 'dqn_old'"]


def test_a_stale_hyperparameter_table_fails_and_the_writer_renews_it(pages):
    page = pages / "dqn.md"
    page.write_text(page.read_text().replace("| `gamma` | float | `0.99` |", "| `gamma` | float | `0.9` |"))
    assert problems(pages) == [f"{page}: its generated part is stale; run `{method_pages.WRITER}`"]
    assert write_pages(pages) == [page]
    assert problems(pages) == []
    assert page.read_text() == (PAGES / "dqn.md").read_text()   # the prose around the table is kept


def test_a_changed_field_docstring_or_default_makes_the_page_stale(pages, monkeypatch):
    """What the source says is what the page must say: a field's docstring or default changed in the code makes the
    committed page stale."""
    documented = method_pages.field_docs

    def reworded(config):
        docs = documented(config)
        return {**docs, "gamma": "the discount, reworded"} if "gamma" in docs else docs

    monkeypatch.setattr(method_pages, "field_docs", reworded)
    assert f"{pages / 'dqn.md'}: its generated part is stale; run `{method_pages.WRITER}`" in problems(pages)
    monkeypatch.undo()

    from tapebench.methods import bayes_filter

    monkeypatch.setattr(bayes_filter.Config.__init__, "__defaults__",
                        tuple(0.5 if d == 0.25 else d for d in bayes_filter.Config.__init__.__defaults__))
    stale = [p for p in problems(pages) if "stale" in p]
    assert stale == [f"{pages / name}: its generated part is stale; run `{method_pages.WRITER}`"
                     for name in ("bayes_filter.md", "bayes_filter_full.md")]


def test_an_index_out_of_date_fails(pages):
    index = pages / "README.md"
    index.write_text(index.read_text().replace("| [`dqn`](dqn.md) |", "| [`dqn`](dqn.md) | stray |"))
    assert problems(pages) == [f"{index}: its generated part is stale; run `{method_pages.WRITER}`"]


def test_a_page_without_its_markers_is_named(pages):
    (pages / "ppo.md").write_text("# PPO\n\nno generated part\n")
    assert problems(pages) == [f"{pages / 'ppo.md'}: expected one generated:method block between "
                               f"`{method_pages.BEGIN.format(name='method')}` and "
                               f"`{method_pages.END.format(name='method')}`"]


def test_the_command_writes_and_reports(pages, capsys):
    assert main(["methods", "--write-docs", str(pages)]) == 0
    assert "every method page is current" in capsys.readouterr().out
    (pages / "exact.md").unlink()
    assert main(["methods", "--write-docs", str(pages)]) == 1
    out = capsys.readouterr().out
    assert f"wrote {pages / 'exact.md'}" in out and "its prose is still to be written" in out


def test_field_docs_reads_each_fields_docstring_the_subclass_first():
    @dataclasses.dataclass
    class Base:
        steps: int = 3
        """steps per
        update"""
        undocumented: float = 1.0
        width: int = 8
        """width of the layer"""

    @dataclasses.dataclass
    class Wider(Base):
        width: int = 16
        """width of the layer (this row: 16)"""

    assert field_docs(Base) == {"steps": "steps per update", "undocumented": "", "width": "width of the layer"}
    assert field_docs(Wider) == {"steps": "steps per update", "undocumented": "",
                                 "width": "width of the layer (this row: 16)"}
