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


def file_sha256(path) -> str:
    """The SHA-256 of a file's bytes, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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


CONTENT_HASH = "content_sha256"   # the key of a table's data hash in its provenance record (`table_content_hash`)


def table_content_hash(table) -> str:
    """sha256 of a pyarrow Table's data: each column's name and values, in schema order.

    The values are hashed in a canonical form, so the hash is the same for the table a writer builds and the one
    read back from its Parquet file: integers as int64 (uint64 when unsigned), floats as float64 (every NaN the
    same), booleans as bytes, strings as UTF-8 with their lengths, dictionary columns (pandas categoricals) decoded
    to their values, a null mask beside each; no schema metadata, chunking or integer width enters it. Any other
    column type is hashed as canonical JSON of its values. Every piece is length-prefixed, so no two tables share a
    serialisation (unlike summing per-row hashes)."""
    # numpy, pyarrow: loaded only when a table is hashed
    import numpy as np
    import pyarrow as pa

    digest = hashlib.sha256()

    def piece(data: bytes) -> None:
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)

    piece(b"tapebench-table-v1")
    piece(len(table).to_bytes(8, "little"))
    for name, column in zip(table.column_names, table.columns):
        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        kind = array.type
        nulls = np.asarray(array.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        if pa.types.is_boolean(kind):
            tag, values = b"bool", np.asarray(array.fill_null(False).to_numpy(zero_copy_only=False), dtype=np.uint8)
        elif pa.types.is_integer(kind):
            wide = pa.uint64() if pa.types.is_unsigned_integer(kind) else pa.int64()
            tag, values = str(wide).encode(), array.fill_null(0).cast(wide).to_numpy(zero_copy_only=False)
        elif pa.types.is_floating(kind):
            values = np.array(array.fill_null(0).cast(pa.float64()).to_numpy(zero_copy_only=False), dtype="<f8")
            values[np.isnan(values)] = np.nan
            tag = b"float64"
        elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
            tag = b"string"
            text = array.fill_null("").cast(pa.large_string())
            offsets = np.frombuffer(text.buffers()[1], dtype="<i8")[text.offset:text.offset + len(text) + 1]
            data = text.buffers()[2]
            values = np.diff(offsets).astype("<i8").tobytes() + (
                bytes(data)[int(offsets[0]):int(offsets[-1])] if len(text) and data is not None else b"")
        else:
            tag, values = b"json", json.dumps(array.to_pylist(), sort_keys=True, default=str).encode()
        piece(name.encode())
        piece(tag)
        piece(np.packbits(nulls).tobytes())
        if not isinstance(values, bytes):
            values = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<")).tobytes()
        piece(values)
    return digest.hexdigest()


def write_parquet(path, df: pd.DataFrame, meta: dict | None = None) -> None:
    """Write a DataFrame atomically; `meta` (e.g. provenance) goes into the Parquet schema metadata, with the hash
    of the data (`table_content_hash`) under CONTENT_HASH, which `utils.artifacts.read_table` checks on read."""
    # pyarrow: loaded only when a Parquet file is read or written
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)
    if meta is not None:
        meta = {**meta, CONTENT_HASH: table_content_hash(table)}
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
