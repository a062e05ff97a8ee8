"""Reference sets: a protocol run once, its records shipped in the repository with their provenance
(docs/protocol.md#reference-sets).

A set is a folder `<root>/<name>/` (the root is `reference/` of a clone):

  manifest.json     the protocol slice and its hash, the seeds, and per method its records file, hyperparameters,
                    the code version that produced it, a fingerprint of the method's code, the machine, library
                    versions, commands and CPU-hours
  records/<method>.parquet
                    rule sums (`schemas.RULE_SUM_COLUMNS`): per seed, horizon, checkpoint, side and rule the episode
                    count and each metric's sum; every per-seed value, learning curve and per-rule value of the
                    pipeline is a ratio of these (`stats.aggregate.seed_tables_from_sums`)
  paper.json        optional: the published numbers the set reproduces, for the reproduction report
  SHA256SUMS        `sha256sum` format, every other file of the set

Pure functions on folders and frames; the commands (`tapebench reference ...`) and the pipeline call them.
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from tapebench.registry import get_method
from tapebench.schemas import RULE_SUM_COLUMNS
from tapebench.utils.io import atomic_path, canonical_json, file_sha256

if TYPE_CHECKING:
    import pandas as pd

ROOT = "reference"
FORMAT = 1
MANIFEST = "manifest.json"
SUMS = "SHA256SUMS"
RECORDS = "records"
PAPER = "paper.json"
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
# the parts of a method whose code decides its numbers (the world test and summary lines do not)
CODE_PARTS = ("Config", "make_agent", "make_block", "make_policy", "training_env")


class ReferenceSetError(ValueError):
    """A reference set that is missing, damaged, or does not fit the configuration."""


def set_dir(name: str, root=ROOT) -> Path:
    if not isinstance(name, str) or not NAME.match(name):
        raise ReferenceSetError(f"reference set name {name!r} is not allowed: lower-case letters, digits, '.', '_' "
                                "and '-', at most 64 characters (e.g. tape-v2)")
    return Path(root) / name


def available(root=ROOT) -> list[str]:
    """The sets under `root` (folders with a manifest)."""
    root = Path(root)
    return sorted(p.name for p in root.iterdir() if (p / MANIFEST).is_file()) if root.is_dir() else []


def read_manifest(name: str, root=ROOT) -> dict:
    folder = set_dir(name, root)
    path = folder / MANIFEST
    if not path.is_file():
        known = available(root)
        raise ReferenceSetError(f"reference set {name!r} not found: no {path}"
                                + (f"; sets under {root}/: {', '.join(known)}" if known else f"; {root}/ holds none"))
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReferenceSetError(f"{path} is not valid JSON ({exc}); `tapebench reference verify {name}` checks "
                                "the set against its SHA256SUMS") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(
            manifest.get("methods"), dict):
        raise ReferenceSetError(f"{path} is not a reference-set manifest of format {FORMAT}")
    return manifest


def write_manifest(folder: Path, manifest: dict) -> None:
    with atomic_path(folder / MANIFEST) as tmp:
        Path(tmp).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


# ------------------------------------------------------------------------------------------------------------------
# checksums


def _set_files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != SUMS)


def write_checksums(folder) -> None:
    folder = Path(folder)
    lines = [f"{file_sha256(folder / rel)}  {rel}\n" for rel in _set_files(folder)]
    with atomic_path(folder / SUMS) as tmp:
        Path(tmp).write_text("".join(lines))


def read_checksums(folder) -> dict[str, str]:
    path = Path(folder) / SUMS
    if not path.is_file():
        raise ReferenceSetError(f"{path} is missing: a reference set lists the SHA-256 of every file there")
    sums = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = re.fullmatch(r"([0-9a-f]{64})  (\S.*)", line)
        if not match:
            raise ReferenceSetError(f"{path}, line {number}: expected '<sha256>  <file>', got {line!r}")
        sums[match.group(2)] = match.group(1)
    return sums


def verify(name: str, root=ROOT) -> list[str]:
    """Every problem of a set: a file missing, changed or unlisted, a manifest that names records it lacks, records
    that are not rule sums of the manifest's methods. Empty when the set is intact."""
    folder = set_dir(name, root)
    problems = []
    try:
        sums = read_checksums(folder)
    except ReferenceSetError as exc:
        return [str(exc)]
    for rel, expected in sums.items():
        path = folder / rel
        if not path.is_file():
            problems.append(f"{path}: missing (listed in {SUMS})")
        elif file_sha256(path) != expected:
            problems.append(f"{path}: changed (its SHA-256 differs from {SUMS})")
    for rel in _set_files(folder):
        if rel not in sums:
            problems.append(f"{folder / rel}: not listed in {SUMS}")
    if problems:
        return problems
    try:
        manifest = read_manifest(name, root)
    except ReferenceSetError as exc:
        return [str(exc)]
    for method, entry in manifest["methods"].items():
        if entry.get("records") not in sums:
            problems.append(f"{folder / MANIFEST}: method {method!r} names records {entry.get('records')!r}, "
                            f"not a file of the set")
    return problems


def require_intact(name: str, root=ROOT, files=None) -> None:
    """Refuse a set whose files (all, or `files`, relative to the set) do not match SHA256SUMS."""
    folder = set_dir(name, root)
    sums = read_checksums(folder)
    for rel in (files if files is not None else sums):
        path = folder / rel
        if rel not in sums:
            raise ReferenceSetError(f"{path} is not listed in {folder / SUMS}")
        if not path.is_file():
            raise ReferenceSetError(f"{path} is missing from reference set {name!r}")
        if file_sha256(path) != sums[rel]:
            raise ReferenceSetError(f"{path} does not match its SHA-256 in {folder / SUMS}: the reference set is "
                                    f"damaged or was edited (restore it with `git checkout -- {folder}`)")


# ------------------------------------------------------------------------------------------------------------------
# records


def records_file(method: str) -> str:
    return f"{RECORDS}/{method}.parquet"


def load_records(name: str, method: str, root=ROOT) -> pd.DataFrame:
    """A method's rule sums, checked against SHA256SUMS first."""
    manifest = read_manifest(name, root)
    entry = manifest["methods"].get(method)
    if entry is None:
        raise ReferenceSetError(f"reference set {name!r} holds no {method!r}; it holds "
                                f"{', '.join(sorted(manifest['methods']))}")
    require_intact(name, root, [entry["records"]])
    # pandas: loaded only when records are read
    import pandas as pd

    frame = pd.read_parquet(set_dir(name, root) / entry["records"])
    missing = [c for c in RULE_SUM_COLUMNS if c not in frame.columns]
    if missing:
        raise ReferenceSetError(f"{set_dir(name, root) / entry['records']} lacks the rule-sums columns {missing}")
    return frame[list(RULE_SUM_COLUMNS)].astype(RULE_SUM_COLUMNS)


def write_records(folder, method: str, sums: pd.DataFrame) -> str:
    """Write one method's rule sums (zstd Parquet, rows in key order); returns the path relative to the set."""
    # pyarrow: loaded only when a set is written
    import pyarrow as pa
    import pyarrow.parquet as pq

    rel = records_file(method)
    frame = sums[list(RULE_SUM_COLUMNS)].astype(RULE_SUM_COLUMNS)
    frame = frame.sort_values(["H", "seed", "checkpoint", "side", "rule"], kind="stable").reset_index(drop=True)
    table = pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata({})
    path = Path(folder) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd", compression_level=19)
    return rel


# ------------------------------------------------------------------------------------------------------------------
# protocol and method code


def protocol_hash(protocol: dict) -> str:
    return hashlib.sha256(canonical_json(protocol).encode()).hexdigest()


def _flatten(obj, prefix: str = "") -> dict:
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out or {prefix: {}}
    return {prefix: obj}


def protocol_differences(shipped: dict, configured: dict) -> list[tuple[str, object, object]]:
    """(key, the set's value, the config's value) for every key where two protocol slices differ."""
    a, b = _flatten(shipped), _flatten(configured)
    missing = object()
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, missing), b.get(key, missing)
        if va != vb:
            out.append((key, None if va is missing else va, None if vb is missing else vb))
    return out


def _source_file(part) -> str | None:
    try:
        return inspect.getsourcefile(part)
    except TypeError:
        return None


def _part_name(part) -> str:
    return getattr(part, "__qualname__", type(part).__name__)


def _parts(method_id: str) -> tuple[list[str], list[str]]:
    """(name=qualname of each part that decides the method's numbers, their source files)."""
    method = get_method(method_id)
    parts, files = [], set()
    for name in CODE_PARTS:
        part = getattr(method, name)        # imported: an optional part that is absent reads as None
        if part is not None:
            part = inspect.unwrap(part)     # the registry's contract checks wrap a method's own functions
            parts.append(f"{name}={_part_name(part)}")
            source = _source_file(part)
            if source:
                files.add(source)
    return parts, sorted(files)


def method_sources(method_id: str) -> list[str]:
    """The source files of the parts of a method that decide its numbers (`method_fingerprint`)."""
    return _parts(method_id)[1]


def code_of(source: str) -> str:
    """A module's code without its comments, docstrings and layout: the AST with every statement that is a bare
    string (module, class, function and field docstrings) left out. A fingerprint of it changes with the code, not
    with a reworded docstring or a moved comment."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            kept = [n for n in body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
                                             and isinstance(n.value.value, str))]
            node.body = kept or [ast.Pass()]
    return ast.dump(tree, include_attributes=False)


def _source_at(path: str, commit: str | None) -> str:
    if commit is None:
        return Path(path).read_text()
    # the file as the commit holds it: `git show COMMIT:PATH` from the checkout that holds the file
    import subprocess

    top = subprocess.run(["git", "-C", str(Path(path).parent), "rev-parse", "--show-toplevel"], capture_output=True,
                         text=True, check=True).stdout.strip()
    rel = Path(path).resolve().relative_to(Path(top).resolve()).as_posix()
    shown = subprocess.run(["git", "-C", top, "show", f"{commit}:{rel}"], capture_output=True, text=True)
    if shown.returncode != 0:
        raise ReferenceSetError(f"cannot read {rel} at commit {commit}: {shown.stderr.strip()}")
    return shown.stdout


def method_fingerprint(method_id: str, commit: str | None = None) -> str:
    """SHA-256 over the code (`code_of`: no comments or docstrings) of the source files of the parts of a method
    that decide its numbers (its Config, agent, seed block, policy and training-environment modules), as installed
    or as `commit` holds them. A shipped row whose fingerprint differs from the installed code's was made by other
    code. Shared code (environment, training loop) is not in it; the drift test and `tapebench reference
    reproduce` cover that."""
    parts, files = _parts(method_id)
    digest = hashlib.sha256("\n".join(parts).encode() + b"\0")
    for path in files:
        digest.update(Path(path).name.encode() + b"\0" + code_of(_source_at(path, commit)).encode() + b"\0")
    return digest.hexdigest()


def changed_methods(manifest: dict) -> dict[str, str]:
    """Methods of a set whose code differs from the installed code: id -> why."""
    out = {}
    for method, entry in manifest["methods"].items():
        try:
            current = method_fingerprint(method)
        except (KeyError, ValueError) as exc:
            out[method] = f"not registered here ({exc})"
            continue
        accepted = {entry.get("method_code_sha256"), *(v["method_code_sha256"] for v in entry.get("verified_code", []))}
        if current not in accepted:
            out[method] = (f"its code differs from the code that made the set (fingerprint "
                           f"{str(entry.get('method_code_sha256'))[:12]} shipped, {current[:12]} installed)")
    return out


def compare_cell(shipped: pd.DataFrame, fresh: pd.DataFrame, seed: int, horizons) -> str:
    """A rerun cell's rule sums against the shipped ones of that seed and those horizons: "identical ..." when
    every key and value agrees exactly, else "differs ..." with the largest difference per metric and the
    seed's strict success both ways."""
    keys = ["split", "agent", "L", "H", "seed", "side", "checkpoint", "rule", "type"]
    metrics = [c for c in RULE_SUM_COLUMNS if c not in keys]
    a = shipped[(shipped["seed"] == seed) & shipped["H"].isin(list(horizons))].sort_values(keys)
    b = fresh[list(RULE_SUM_COLUMNS)].astype(RULE_SUM_COLUMNS).sort_values(keys)
    a, b = a.reset_index(drop=True), b.reset_index(drop=True)
    merged = a.merge(b, on=keys, how="outer", suffixes=("_shipped", "_rerun"), indicator=True)
    only_shipped = int((merged["_merge"] == "left_only").sum())
    only_rerun = int((merged["_merge"] == "right_only").sum())
    both = merged[merged["_merge"] == "both"]
    lines, equal = [], only_shipped == 0 and only_rerun == 0
    for metric in metrics:
        diff = (both[f"{metric}_shipped"] - both[f"{metric}_rerun"]).abs()
        if len(diff) and float(diff.max()) != 0.0:
            equal = False
            lines.append(f"  {metric}: {int((diff != 0).sum())} of {len(diff)} rows differ, largest |difference| "
                         f"{float(diff.max()):.6g}")
    rates = []
    for name, frame in (("shipped", a), ("rerun", b)):
        last = frame[frame["checkpoint"] == frame["checkpoint"].max()] if len(frame) else frame
        by_side = last.groupby(["H", "side"])[["success", "n_episodes"]].sum()
        rates.append(f"  {name}: last checkpoint strict success " + ", ".join(
            f"H={h} {side} {row.success / row.n_episodes:.4f}" for (h, side), row in by_side.iterrows()))
    head = (f"identical: {len(both)} rule rows of seed {seed} agree exactly" if equal else
            f"differs: {len(both)} rule rows compared, {only_shipped} only shipped, {only_rerun} only in the rerun")
    return "\n".join([head, *lines, *rates])


def reference_methods(config: dict, root=ROOT) -> list[str]:
    """The methods whose rows come from the config's `reference_set` (none without one)."""
    name = config.get("reference_set")
    return sorted(read_manifest(name, root)["methods"]) if name else []


def shown_methods(config: dict, root=ROOT) -> list[str]:
    """The rows of the main split's tables and figures: the reference set's methods, then the methods that run
    (`methods`, which validation leaves holding only the methods the set lacks)."""
    held = reference_methods(config, root)
    return held + [m for m in config["methods"] if m not in held]


def accept_code(name: str, method: str, how: str, commit: str, root=ROOT) -> None:
    """Record that the installed code of `method` reproduced the set's records (`how`): its fingerprint joins the
    entry's `verified_code`, so `verify` stops flagging it; the records and their provenance stay as they were."""
    folder = set_dir(name, root)
    manifest = read_manifest(name, root)
    entry = manifest["methods"][method]
    current = method_fingerprint(method)
    known = [v["method_code_sha256"] for v in entry.get("verified_code", [])]
    if current != entry.get("method_code_sha256") and current not in known:
        entry.setdefault("verified_code", []).append({"method_code_sha256": current, "commit": commit, "how": how})
        write_manifest(folder, manifest)
        write_checksums(folder)


def lacking_methods(manifest: dict) -> list[str] | None:
    """The methods of the config that made the set (`default_methods`, written by `pack`) that the set does not
    hold yet, in the config's order; None for a set that does not record them."""
    default = manifest.get("default_methods")
    if default is None:
        return None
    return [m for m in default if m not in manifest["methods"]]


def summary(manifest: dict) -> pd.DataFrame:
    """One row per method of a set: seeds, horizons, checkpoints, rows, CPU-hours, code version."""
    # pandas: loaded only when a set is listed as a table
    import pandas as pd

    rows = []
    for method, entry in sorted(manifest["methods"].items()):
        rows.append({"method": method, "seeds": len(entry.get("seeds", [])), "horizons": entry.get("horizons"),
                     "checkpoints": len(entry.get("checkpoints", [])), "rows": entry.get("rows"),
                     "cpu_hours": entry.get("cpu_hours", {}).get("total"),
                     "code_version": entry.get("code_version")})
    return pd.DataFrame(rows)
