"""The generated parts of the method pages, docs/methods/: on each `<id>.md` the registry entry and the hyperparameter
table read from the method's `Config` (defaults, and the docstring of each field), on README.md the index of the
methods. They sit between marker comments; `tapebench methods --write-docs docs/methods` rewrites them, and
`problems` names every page that is missing, has no method, or whose generated part is not what the command writes
(tests/test_method_pages.py runs it on the repository's pages).

The pages are for the built-in methods: a plug-in installed beside tapebench documents itself.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from tapebench.registry import FAMILIES, Method, builtin_ids, field_docs, registry

INDEX = "README.md"
WRITER = "tapebench methods --write-docs docs/methods"
BEGIN = "<!-- generated:{name} begin (written by `" + WRITER + "`; do not edit by hand) -->"
END = "<!-- generated:{name} end -->"
# a page the writer created for a method that had none: the test fails until someone writes its prose
TO_WRITE = "<!-- to write: "


def listed_methods() -> list[Method]:
    """The built-in methods in `tapebench methods`' order: by table family, then id."""
    builtin = builtin_ids()
    return sorted((m for m in registry().values() if m.id in builtin),
                  key=lambda m: (list(FAMILIES).index(m.family), m.id))


def _cell(text: str) -> str:
    """Text for a Markdown table cell: a `|` would end the cell."""
    return text.replace("|", "\\|")


def hyperparameter_table(method: Method) -> str:
    """The method's hyperparameters: every `Config` field with its type, default and docstring."""
    fields = dataclasses.fields(method.Config)
    if not fields:
        return "No hyperparameters: its `Config` has no fields."
    docs = field_docs(method.Config)
    default = method.Config()
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for f in fields:
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        fixed = " (fixed: it defines the row)" if f.name in method.fixed else ""
        rows.append(f"| `{f.name}` | {_cell(kind)} | `{getattr(default, f.name)!r}`{fixed} | "
                    f"{_cell(docs[f.name]) or '—'} |")
    return "\n".join(rows)


def _rule_families(method: Method) -> str:
    families = ["elementary rules", "every tape rule family (k colours, radius r)" if method.any_rule_family else None,
                "the 2D grid family" if method.supports_grid else None]
    return ", ".join(f for f in families if f)


def _kind(method: Method) -> str:
    if method.trains:
        return "trains (`make_agent`" + ("; seed blocks stacked, `make_block`" if method.make_block else "") + ")"
    if method.plays_episodes:
        return "does not train (`make_policy`" + ("; `grid_policy` on the grid" if method.grid_policy else "") + ")"
    return "world test only (`worldtest`; it plays no TAPE episodes)"


def _flags(method: Method) -> str:
    flags = [name for name in ("sees_true_rule", "deterministic", "by_rule", "rule_agnostic", "goal_conditioned",
                               "needs_derived_goal", "world_model") if getattr(method, name)]
    if method.trains and not method.every_checkpoint:
        flags.append("every_checkpoint=False")
    if method.worldtest is not None:
        flags.append("worldtest")
    return ", ".join(f"`{name}`" for name in flags) or "none"


def method_block(method: Method) -> str:
    """A method page's generated part: its registry entry, its hyperparameters and where its results are."""
    results = ("[README, Results](../../README.md#results) (the shipped reference set's rows) and "
               "[docs/reproduction.md](../reproduction.md) (beside the paper's numbers, when the set has the row)")
    if not method.plays_episodes:
        results = "the world test's tables ([protocol](../protocol.md#world-test))"
    elif method.worldtest is not None:
        results += "; the world test's tables ([protocol](../protocol.md#world-test))"
    return "\n".join([
        "| registry | |", "|---|---|",
        f"| id | `{method.id}` |",
        f"| table name | {_cell(method.display_name)} |",
        f"| family | {method.family_name.replace('--', '–')} |",
        f"| kind | {_kind(method)} |",
        f"| runs on | {_rule_families(method)} |",
        f"| flags ([what each changes](README.md#method-flags)) | {_flags(method)} |",
        f"| summary | {_cell(method.summary)} |",
        "",
        "**Hyperparameters** (`agents." + method.id + "` in a config overrides them; `tapebench methods -v` lists "
        "them too):",
        "",
        hyperparameter_table(method),
        "",
        f"**Results**: {results}.",
    ])


def index_block() -> str:
    """README.md's generated part: one row per built-in method, linked to its page."""
    rows = ["| page | table name | family | trains | summary |", "|---|---|---|---|---|"]
    for m in listed_methods():
        rows.append(f"| [`{m.id}`]({m.id}.md) | {_cell(m.display_name)} | {m.family_name.replace('--', '–')} | "
                    f"{'yes' if m.trains else 'no'} | {_cell(m.summary)} |")
    return "\n".join(rows)


def with_block(text: str, name: str, content: str) -> str:
    """`text` with the generated part `name` between its markers replaced by `content`."""
    begin, end = BEGIN.format(name=name), END.format(name=name)
    pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
    if len(pattern.findall(text)) != 1:
        raise ValueError(f"expected one generated:{name} block between `{begin}` and `{end}`")
    return pattern.sub(lambda _: f"{begin}\n{content}\n{end}", text)


def skeleton(method: Method) -> str:
    """The page the writer starts for a method that has none: its prose is still to be written."""
    return "\n".join([
        f"# {method.display_name} (`{method.id}`)", "",
        f"{TO_WRITE}what it is, the paper's description it follows, our decisions and why, its cost -->", "",
        BEGIN.format(name="method"), method_block(method), END.format(name="method"), ""])


def expected_page(path: Path, method: Method | None) -> str:
    """A page as the writer leaves it: its generated part rewritten (`method` None: the index), or, for a method
    without a page, the page started. A page whose markers are missing or doubled raises ValueError."""
    if method is None:
        return with_block(path.read_text(encoding="utf-8"), "index", index_block())
    if not path.exists():
        return skeleton(method)
    return with_block(path.read_text(encoding="utf-8"), "method", method_block(method))


def pages(folder: Path) -> dict[Path, Method | None]:
    """Every page the writer keeps in `folder`: one per built-in method, and the index (None)."""
    folder = Path(folder)
    return {**{folder / f"{m.id}.md": m for m in listed_methods()}, folder / INDEX: None}


def problems(folder: Path) -> list[str]:
    """What keeps `folder` from being one current page per built-in method and an index: an empty list when none."""
    folder = Path(folder)
    found = []
    ids = {m.id for m in listed_methods()}
    for path in sorted(folder.glob("*.md")):
        if path.name != INDEX and path.stem not in ids:
            found.append(f"{path}: no built-in method has the id {path.stem!r}")
    for path, method in pages(folder).items():
        if not path.exists():
            found.append(f"{path}: missing" + (f"; `{WRITER}` starts it" if method else
                                                " (the method contract and the index)"))
            continue
        current = path.read_text(encoding="utf-8")
        try:
            stale = expected_page(path, method) != current
        except ValueError as exc:
            found.append(f"{path}: {exc}")
            continue
        if stale:
            found.append(f"{path}: its generated part is stale; run `{WRITER}`")
        elif TO_WRITE in current:
            found.append(f"{path}: started by the writer, its prose is still to be written")
    return found


def write_pages(folder: Path) -> list[Path]:
    """Rewrite the generated parts of `folder`'s pages and start a page for a method without one; the paths written.
    The index must exist (it holds the contract); a page whose markers are missing or doubled raises ValueError."""
    changed = []
    for path, method in pages(folder).items():
        text = expected_page(path, method)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


__all__ = ["expected_page", "hyperparameter_table", "index_block", "listed_methods", "method_block", "pages",
           "problems", "with_block", "write_pages"]
