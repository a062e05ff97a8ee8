#!/usr/bin/env python3
"""Compare two pipeline results/ trees built with different code (e.g. before and after a refactor).

    python3 tools/compare_results.py BEFORE_DIR AFTER_DIR

BEFORE_DIR and AFTER_DIR are either work directories holding a results/ folder or results/ folders
themselves. Every file under one tree must exist in the other (a missing or extra file is a failure).
Then, by kind:

  .tex and other text    byte-identical, else a failure.
  .json                  byte-identical, or equal as JSON once the IGNORED keys below are dropped
                         (a failure otherwise).
  .parquet               same Arrow schema (columns, types), same pandas dtypes, equal data
                         (pandas DataFrame.equals, NaN == NaN) and equal `tapebench` schema metadata
                         (the provenance) once the IGNORED keys are dropped; a failure otherwise.
  .pt                    training checkpoints: byte-identical, or, loaded with torch (weights_only),
                         the same nested content (tensors torch.equal) once the IGNORED keys are
                         dropped; a failure otherwise. torch.save output embeds the provenance, hence
                         the code version, so the bytes differ whenever the code version does.
  .png                   reported only: identical bytes, identical pixels, or differing pixels.
  .pdf                   reported only: identical bytes, equal but for the creation date, or differing.
  .log                   reported only: identical bytes, equal but for time stamps and speeds, or differing.

Hidden files (.snakemake_timestamp, atomic-write temporaries, .latex_check) are skipped. Absolute
paths and time stamps do not occur in the tables, JSON or Parquet of the tiny protocol (they hold
results/-relative paths), so nothing else is ignored; a new one showing up is a failure to look at.
The script does not import tapebench, so the same script reads trees written by any code version.
Exit status: 0 when nothing failed, 1 when something did, 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

# Keys whose values legitimately differ between two builds of the same protocol. A key is dropped
# wherever it appears in a JSON file, a Parquet file's `tapebench` metadata or a checkpoint's dict.
IGNORED_KEYS = {
    # code version: "<package version>+g<commit>[-dirty]" (tapebench.utils.io.code_version)
    "code_version",               # provenance of every artifact; also inputs[].code_version of aggregates
    "features_code_version",      # splits/*.json provenance
    # timings
    "wall_time_s",                # train.json: training wall-clock seconds
    "steps_per_second",           # train.json: training speed
    "seconds",                    # evaluation summary in eval Parquet metadata: evaluation wall-clock seconds
}
# Keys dropped only under a given parent key (the parent is a list of dicts or a dict).
IGNORED_NESTED = {
    # train.json checkpoints[].sha256: the hash of the checkpoint's bytes, which embed the provenance
    # (code version); the checkpoints themselves are compared by content below.
    ("checkpoints", "sha256"),
}
REPORT_ONLY_SUFFIXES = {".png", ".pdf", ".log"}


# --- helpers ------------------------------------------------------------------------------------------
def strip_ignored(obj, parent: str | None = None):
    """`obj` without the ignored keys (recursively)."""
    if isinstance(obj, dict):
        return {k: strip_ignored(v, k) for k, v in obj.items() if not is_ignored(parent, k)}
    if isinstance(obj, (list, tuple)):
        return [strip_ignored(v, parent) for v in obj]
    return obj   # tensors and scalars unchanged


def is_ignored(parent: str | None, key) -> bool:
    return key in IGNORED_KEYS or (parent, key) in IGNORED_NESTED


def ignored_differences(a, b, path: str = "", parent: str | None = None) -> list[str]:
    """Paths of the ignored keys whose values differ between `a` and `b` (for the report)."""
    out = []
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) & set(b), key=str):
            if is_ignored(parent, k):
                if a[k] != b[k]:
                    out.append(f"{path}/{k}")
            else:
                out.extend(ignored_differences(a[k], b[k], f"{path}/{k}", k))
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            out.extend(ignored_differences(x, y, f"{path}[{i}]", parent))
    return out


def first_difference(a, b, path: str = "") -> str | None:
    """Where two (stripped) JSON-like values first differ, e.g. '/summary/success: 0.5 != 0.6'."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            only_a, only_b = sorted(set(a) - set(b), key=str), sorted(set(b) - set(a), key=str)
            return f"{path or '/'}: keys only in BEFORE {only_a}, only in AFTER {only_b}"
        for k in sorted(a, key=str):
            d = first_difference(a[k], b[k], f"{path}/{k}")
            if d:
                return d
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    if type(a) is not type(b) or a != b:
        return f"{path or '/'}: {short(a)} != {short(b)}"
    return None


def short(value, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def ignored_note(a, b) -> str:
    diffs = ignored_differences(a, b)
    if not diffs:
        return ""
    keys = sorted({d.split("/")[-1] for d in diffs})
    return f"ignored differences in {', '.join(keys)}"


# --- one comparison per file kind: each returns (status, reason); status in ok / differ / fail ------------
def compare_text(a: Path, b: Path):
    if a.read_bytes() == b.read_bytes():
        return "ok", "identical bytes"
    la, lb = a.read_bytes().splitlines(), b.read_bytes().splitlines()
    for i, (x, y) in enumerate(zip(la, lb), 1):
        if x != y:
            x, y = (short(line.decode(errors="replace")) for line in (x, y))
            return "fail", f"line {i} differs: {x} != {y}"
    return "fail", f"{len(la)} lines != {len(lb)} lines (one is a prefix of the other)"


def compare_json(a: Path, b: Path):
    if a.read_bytes() == b.read_bytes():
        return "ok", "identical bytes"
    try:
        ja, jb = json.loads(a.read_text()), json.loads(b.read_text())
    except ValueError as exc:
        return "fail", f"not valid JSON: {exc}"
    d = first_difference(strip_ignored(ja), strip_ignored(jb))
    if d:
        return "fail", d
    return "ok", "equal JSON; " + (ignored_note(ja, jb) or "formatting differs")


def compare_parquet(a: Path, b: Path):
    import pyarrow.parquet as pq

    sa, sb = pq.read_schema(a), pq.read_schema(b)
    if not sa.remove_metadata().equals(sb.remove_metadata()):
        return "fail", f"Arrow schema differs: {schema_diff(sa, sb)}"
    da, db = pq.read_table(a).to_pandas(), pq.read_table(b).to_pandas()
    if list(da.columns) != list(db.columns):
        return "fail", f"columns differ: {list(da.columns)} != {list(db.columns)}"
    if not da.dtypes.equals(db.dtypes):
        cols = [c for c in da.columns if da[c].dtype != db[c].dtype]
        return "fail", f"dtypes differ in {cols}"
    if da.shape != db.shape:
        return "fail", f"shape {da.shape} != {db.shape}"
    if not da.equals(db):
        return "fail", f"data differ: {data_diff(da, db)}"
    ma, mb = (json.loads((s.metadata or {}).get(b"tapebench", b"{}")) for s in (sa, sb))
    d = first_difference(strip_ignored(ma), strip_ignored(mb))
    if d:
        return "fail", f"data equal, provenance differs at {d}"
    if a.read_bytes() == b.read_bytes():
        return "ok", "identical bytes"
    return "ok", "equal data and provenance; " + (ignored_note(ma, mb) or "other Parquet metadata differs")


def schema_diff(sa, sb) -> str:
    fa, fb = {f.name: str(f.type) for f in sa}, {f.name: str(f.type) for f in sb}
    if list(fa) != list(fb):
        return f"columns {list(fa)} != {list(fb)}"
    return ", ".join(f"{n}: {fa[n]} != {fb[n]}" for n in fa if fa[n] != fb[n]) or "field metadata/nullability"


def data_diff(da, db) -> str:
    for col in da.columns:
        if not da[col].equals(db[col]):
            sa, sb = da[col], db[col]
            neq = ~((sa == sb) | (sa.isna() & sb.isna()))
            try:
                row = int(neq.to_numpy().nonzero()[0][0])
                return (f"column {col!r}, {int(neq.sum())} of {len(sa)} rows, first at row {row}: "
                        f"{short(sa.iloc[row])} != {short(sb.iloc[row])}")
            except (IndexError, TypeError, ValueError):
                return f"column {col!r}"
    return "index or frame attributes"


def compare_checkpoint(a: Path, b: Path):
    if a.read_bytes() == b.read_bytes():
        return "ok", "identical bytes"
    try:
        import torch
    except ImportError:
        return "fail", "bytes differ and torch is not importable to compare the content"
    try:
        pa, pb = (torch.load(p, map_location="cpu", weights_only=True) for p in (a, b))
    except Exception as exc:  # noqa: BLE001 - any load failure is reported
        return "fail", f"bytes differ and torch cannot load it: {type(exc).__name__}: {str(exc)[:80]}"
    d = tensor_difference(strip_ignored(pa), strip_ignored(pb))
    if d:
        return "fail", d
    return "ok", "equal content; " + (ignored_note(to_plain(pa), to_plain(pb)) or "serialisation differs")


def to_plain(obj):
    """Tensors replaced by a marker so that ignored_note can walk the structure."""
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj if isinstance(obj, (str, int, float, bool, type(None))) else "<object>"


def tensor_difference(a, b, path: str = "") -> str | None:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{path}: tensor vs {type(b if isinstance(a, torch.Tensor) else a).__name__}"
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{path}: {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}"
        return None if torch.equal(a, b) else f"{path}: tensor values differ"
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            only_a, only_b = sorted(set(a) - set(b), key=str), sorted(set(b) - set(a), key=str)
            return f"{path or '/'}: keys only in BEFORE {only_a}, only in AFTER {only_b}"
        for k in a:
            d = tensor_difference(a[k], b[k], f"{path}/{k}")
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = tensor_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return first_difference(a, b, path)


def compare_png(a: Path, b: Path):
    if a.read_bytes() == b.read_bytes():
        return "ok", "identical bytes"
    try:
        import numpy as np
        from PIL import Image
    except ImportError:
        return "differ", "bytes differ (Pillow not importable: pixels not compared)"
    with Image.open(a) as ia, Image.open(b) as ib:
        if ia.size != ib.size:
            return "differ", f"image size {ia.size} != {ib.size}"
        pa, pb = np.asarray(ia.convert("RGBA")), np.asarray(ib.convert("RGBA"))
    if np.array_equal(pa, pb):
        return "ok", "identical pixels (bytes/metadata differ)"
    n = int((pa != pb).any(axis=-1).sum())
    return "differ", f"{n} of {pa.shape[0] * pa.shape[1]} pixels differ"


# What report-only files may differ in between two builds of the same code: masked before comparing.
LOG_MASKS = [
    (rb"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", b"<time> "),          # the time stamp opening each line
    (rb"[\d.]+ steps/s", b"<n> steps/s"),                               # training speed
    (rb"eta [\d.]+ s", b"eta <n> s"),
    (rb"in [\d.]+ s\b", b"in <n> s"),                                   # "done: 256 env steps in 0.2 s"
    (rb"\([\d.]+ s\)", b"(<n> s)"),                                     # "(0.0 s)" after an evaluation
]
PDF_MASKS = [(rb"/(CreationDate|ModDate) \(D:[^)]*\)", rb"/\1 (<date>)")]


def masked(data: bytes, masks) -> bytes:
    for pattern, repl in masks:
        data = re.sub(pattern, repl, data, flags=re.M)
    return data


def compare_report_only(a: Path, b: Path):
    da, db = a.read_bytes(), b.read_bytes()
    if da == db:
        return "ok", "identical bytes"
    masks, what = (PDF_MASKS, "creation date") if a.suffix == ".pdf" else (LOG_MASKS, "time stamps and speeds")
    if masked(da, masks) == masked(db, masks):
        return "ok", f"equal but for {what}"
    return "differ", f"bytes differ beyond {what}"


def compare_file(a: Path, b: Path):
    suffix = a.suffix.lower()
    if suffix == ".json":
        return compare_json(a, b)
    if suffix == ".parquet":
        return compare_parquet(a, b)
    if suffix == ".pt":
        return compare_checkpoint(a, b)
    if suffix == ".png":
        return compare_png(a, b)
    if suffix in REPORT_ONLY_SUFFIXES:
        return compare_report_only(a, b)
    return compare_text(a, b)   # .tex and everything else: byte-identical


# --- main ---------------------------------------------------------------------------------------------
def results_root(path: str) -> Path | None:
    p = Path(path)
    if (p / "results").is_dir():
        return p / "results"
    return p if p.is_dir() else None


def files_under(root: Path) -> set[str]:
    # hidden files (.snakemake_timestamp, .latex_check, atomic-write temporaries) are not results
    return {str(f.relative_to(root)) for f in root.rglob("*")
            if f.is_file() and not any(part.startswith(".") for part in f.relative_to(root).parts)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Ignored keys: " + ", ".join(sorted(IGNORED_KEYS)) + "; "
                                            + ", ".join(f"{p}[].{k}" for p, k in sorted(IGNORED_NESTED)))
    parser.add_argument("before", help="work directory (holding results/) or results/ folder built BEFORE")
    parser.add_argument("after", help="the same, built AFTER")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print a line for every file, not only differences")
    args = parser.parse_args(argv)
    before, after = results_root(args.before), results_root(args.after)
    for given, root in ((args.before, before), (args.after, after)):
        if root is None:
            parser.error(f"not a directory: {given}")
    fb, fa = files_under(before), files_under(after)

    rows = []   # (status, path, reason)
    for rel in sorted(fb - fa):
        rows.append(("fail", rel, "only in BEFORE"))
    for rel in sorted(fa - fb):
        rows.append(("fail", rel, "only in AFTER"))
    for rel in sorted(fb & fa):
        try:
            status, reason = compare_file(before / rel, after / rel)
        except Exception as exc:  # noqa: BLE001 - one unreadable file is a failure, not a crash
            status, reason = "fail", f"cannot compare: {type(exc).__name__}: {str(exc)[:100]}"
        rows.append((status, rel, reason))

    identical = [r for r in rows if r[0] == "ok"]
    differ = [r for r in rows if r[0] == "differ"]
    failed = [r for r in rows if r[0] == "fail"]
    print(f"BEFORE {before}\nAFTER  {after}")
    if args.verbose:
        for status, rel, reason in identical:
            print(f"  ok      {rel}: {reason}")
    for status, rel, reason in differ:
        print(f"  DIFFER  {rel}: {reason}   (reported, not a failure)")
    for status, rel, reason in failed:
        print(f"  FAIL    {rel}: {reason}")
    by_kind: dict[str, list[int]] = {}
    for status, rel, _ in rows:
        counts = by_kind.setdefault(Path(rel).suffix or "(none)", [0, 0, 0])
        counts[("ok", "differ", "fail").index(status)] += 1
    print("by kind: " + "; ".join(f"{k} {c[0]} equal" + (f", {c[1]} differ (report only)" if c[1] else "")
                                  + (f", {c[2]} FAIL" if c[2] else "") for k, c in sorted(by_kind.items())))
    same_bytes = sum(1 for r in identical if r[2] == "identical bytes")
    print(f"summary: {len(rows)} files, {len(identical)} equal ({same_bytes} byte-identical, "
          f"{len(identical) - same_bytes} equal once ignored fields are dropped), {len(differ)} differ (report only), "
          f"{len(failed)} failed -> {'FAIL' if failed else 'PASS'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
