"""The package's layers (docs/architecture.md): every import, inside functions too, points down a layer or
stays in its own, the import graph has no circle, and an import inside a function says why it is lazy."""
from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"

# Bottom to top; a module belongs to the longest prefix listed. The command line (`cli`, `commands/`, `bench/`)
# is the top floor: no library module lives there and no library module imports it.
LAYERS = (
    ("foundation", ("tapebench", "tapebench.vocabulary", "tapebench.defaults", "tapebench.schemas",
                    "tapebench.settings", "tapebench.layout", "tapebench.utils", "tapebench.rule_family",
                    "tapebench.grid_rules",
                    "tapebench.validation", "tapebench.gymnasium_ids")),
    ("kernels", ("tapebench.ca",)),
    ("environments, rule space and splits", ("tapebench.envs", "tapebench.rules", "tapebench.splits")),
    ("episodes and random streams", ("tapebench.episodes",)),
    ("methods", ("tapebench.methods",)),
    ("registry", ("tapebench.registry", "tapebench.method_pages")),
    ("evaluation and training", ("tapebench.evaluation", "tapebench.training", "tapebench.oracle")),
    ("statistics and health", ("tapebench.stats", "tapebench.health")),
    ("reference sets", ("tapebench.reference_sets",)),
    ("report", ("tapebench.report",)),
    ("pipeline and command line", ("tapebench.pipeline", "tapebench.cli", "tapebench.__main__", "tapebench.commands",
                                   "tapebench.bench", "tapebench.jobserver")),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted((SRC / "tapebench").rglob("*.py"))}


def layer_of(module: str) -> int:
    best, index = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, index = len(prefix), i
    if index is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS and docs/architecture.md")
    return index


def imports(module: str):
    """(imported tapebench module, line, inside a function, source line) of every import statement."""
    path = MODULES[module]
    source = path.read_text()
    lines = source.splitlines()
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    tree = ast.parse(source)
    in_function = {id(node) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for node in ast.walk(fn) if node is not fn}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        targets = {n for n in names if n in MODULES and n != module}
        yield node, targets, id(node) in in_function, lines


def graph() -> dict[str, set[str]]:
    return {m: {t for _, targets, _, _ in imports(m) for t in targets} for m in MODULES}


def test_every_module_has_a_layer():
    for module in MODULES:
        layer_of(module)


def test_imports_point_down():
    upward = [f"{MODULES[m].relative_to(SRC)}:{node.lineno} {m} ({LAYERS[layer_of(m)][0]}) imports {t} "
              f"({LAYERS[layer_of(t)][0]})"
              for m in MODULES for node, targets, _, _ in imports(m) for t in sorted(targets)
              if layer_of(t) > layer_of(m)]
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    circles = strongly_connected(graph())
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def package_of(module: str) -> str:
    """The package a module belongs to: `tapebench.X` for `tapebench.X` and everything under it."""
    return ".".join(module.split(".")[:2])


def test_no_circle_between_packages():
    """Packages are the rooms of the house: no package imports one that (through others) imports it back,
    which a command-line module living inside a lower package would do."""
    packages: dict[str, set[str]] = {}
    for module, targets in graph().items():
        here = package_of(module)
        packages.setdefault(here, set()).update(package_of(t) for t in targets if package_of(t) not in (here, "tapebench"))
    circles = strongly_connected(packages)
    assert not circles, "circles between packages:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_library_packages_hold_no_command_line_module():
    misplaced = [m for m in MODULES if layer_of(m) < len(LAYERS) - 1
                 and re.fullmatch(r"cli|bench|\w+_bench", m.rsplit(".", 1)[-1])]
    assert not misplaced, f"command-line modules belong in tapebench.commands or tapebench.bench: {misplaced}"


def test_circle_finder_finds_a_circle():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_imports_inside_functions_say_why():
    """An import inside a function is for lazily loading a heavy dependency: a comment on its line or the line
    above says so (never to dodge a circle: the tests above see those imports too)."""
    silent = []
    for m, path in MODULES.items():
        found = list(imports(m))
        ends = {node.end_lineno: node for node, _, _, _ in found}
        for node, _, inside, lines in found:
            if inside and not explained(node, lines, ends):
                silent.append(f"{path.relative_to(SRC)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not silent, "imports inside functions without a comment saying why they are lazy:\n" + "\n".join(silent)


def explained(node, lines, ends) -> bool:
    """A comment on the import's line, on the line above, or above the block of imports it ends."""
    while True:
        if "#" in lines[node.lineno - 1] or lines[node.lineno - 2].strip().startswith("#"):
            return True
        node = ends.get(node.lineno - 1)
        if node is None:
            return False


def test_architecture_doc_lists_the_layers_in_order():
    text = DOCS.read_text()
    documented = re.findall(r"^\d+\. \*\*(.+?)\*\*", text, re.M)
    assert documented == [name for name, _ in reversed(LAYERS)], \
        "docs/architecture.md lists the layers top to bottom as numbered bold items, as LAYERS has them"
