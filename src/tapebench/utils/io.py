"""Atomic writes and provenance: nothing is half-written, every artifact says where it came from."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from tapebench import __version__

if TYPE_CHECKING:       # pandas only annotates write_parquet: a module that writes text does not load it
    import pandas as pd


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600; give the file normal permissions
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def write_text(path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, indent=2, default=_json_default) + "\n"


def _json_default(o):
    # numpy: loaded only when a value needs it
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def write_json(path, obj: Any) -> None:
    write_text(path, canonical_json(obj))


def content_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=_json_default).encode()).hexdigest()


def code_version() -> str:
    """Package version plus the git commit (and '-dirty') when run from a checkout."""
    version = __version__
    repo = Path(__file__).resolve().parents[3]
    if (repo / ".git").exists():
        try:
            rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"],
                                 capture_output=True, text=True, timeout=10).stdout.strip()
            dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            if rev:
                version += f"+g{rev}" + ("-dirty" if dirty else "")
        except (OSError, subprocess.SubprocessError):
            pass
    return version


def provenance(config_slice: dict | None = None, seed: int | None = None, **extra) -> dict:
    """The record every artifact carries: config slice, seed, code version."""
    out = {"code_version": code_version(), "config": config_slice or {}, "seed": seed}
    out.update(extra)
    return out


def write_parquet(path, df: pd.DataFrame, meta: dict | None = None) -> None:
    """Write a DataFrame atomically; `meta` (e.g. provenance) goes into the Parquet schema metadata."""
    # pyarrow: loaded only when a Parquet file is read or written
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)
    if meta is not None:
        existing = table.schema.metadata or {}
        table = table.replace_schema_metadata({**existing, b"tapebench": canonical_json(meta).encode()})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_parquet_meta(path) -> dict:
    # pyarrow: loaded only when a Parquet file is read or written
    import pyarrow.parquet as pq

    md = pq.read_schema(path).metadata or {}
    raw = md.get(b"tapebench")
    return json.loads(raw) if raw else {}


def cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what `platform` knows, else "cpu"."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"
