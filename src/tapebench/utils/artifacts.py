"""Is an artifact on disk whole, and is it the kind of file the reader expects?

Every check raises `CorruptArtifact` (a ValueError) whose message names the file, what is wrong
with it and the command that recovers: delete the file (or, for a training run's files, the run
directory) and run the pipeline again, which regenerates exactly what is missing.
`pipeline.integrity.scan_results` applies the cheap checks to a whole results folder.
"""
from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pandas as pd

from tapebench.layout import CHECKPOINT_DIR, MANIFEST_FILE, RESUME_FILE, path_fields
from tapebench.schemas import TABLE_KINDS, TableKind
from tapebench.utils.io import read_parquet_meta

RUN_FILES = (MANIFEST_FILE, RESUME_FILE)


class CorruptArtifact(ValueError):
    """A file that exists but cannot be used: truncated, empty, garbage, or edited after it was written."""

    def __init__(self, path, problem: str):
        self.path, self.problem = Path(path), problem
        super().__init__(f"{path} is corrupt or unreadable ({problem}); {recovery(path)}")


class WrongKind(ValueError):
    """A readable file of another kind than the one asked for (e.g. episode records for an aggregate)."""


PARQUET_MAGIC = b"PAR1"


def describe_file(path) -> str | None:
    """What a readable file of the pipeline is, when it can be told cheaply (a Parquet table by its recorded
    kind or columns, a training manifest, a split): the words a WrongKind message names it by; else None."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return None
    if head == PARQUET_MAGIC:
        try:
            meta = read_parquet_meta(path)
            recorded = meta.get("table")
            # pyarrow: loaded only when a Parquet file is read
            import pyarrow.parquet as pq

            columns = pq.read_schema(path).names
        except Exception:  # a damaged Parquet file: it is still not the JSON file asked for
            return "a Parquet file"
        kind = next((k for k in table_kinds() if k.name == recorded), None) or guess_kind(columns)
        return f"a Parquet table: {kind.label} (written by `{kind.writer}`)" if kind is not None \
            else "a Parquet table"
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    if isinstance(raw, dict) and {"fingerprint", "checkpoints"} <= set(raw):
        return f"a training run's manifest ({MANIFEST_FILE}, written by `tapebench train`)"
    if isinstance(raw, dict) and {"train", "test", "content_hash"} <= set(raw):
        return "a split file (written by `tapebench split`)"
    return None


def run_dir_of(path) -> Path | None:
    """The training run a file belongs to (its checkpoints, train.json, resume.pt), else None."""
    path = Path(path)
    if path.parent.name == CHECKPOINT_DIR and path.suffix == ".pt":
        return path.parent.parent
    if path.name in RUN_FILES:
        return path.parent
    return None


def recovery(path) -> str:
    run = run_dir_of(path)
    if run is not None:
        return f"delete the run and run the pipeline again to retrain it: rm -r {run}"
    return f"delete the file and run the pipeline again to regenerate it: rm {path}"


def file_sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _short(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


# --- single files ---------------------------------------------------------------------------------
def read_json(path, what: str = "JSON file"):
    """Parse a JSON artifact; a missing file raises FileNotFoundError, a damaged one CorruptArtifact."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptArtifact(path, f"not valid JSON: {_short(exc)}") from None


def check_parquet(path) -> None:
    """Read the Parquet footer (schema and row groups); catches empty, truncated and garbage files."""
    # pyarrow: loaded only when a Parquet file is read or written
    import pyarrow.parquet as pq

    try:
        pq.read_metadata(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ... for a damaged file
        raise CorruptArtifact(path, f"not a readable Parquet file: {_short(exc)}") from None


def check_checkpoint_archive(path) -> None:
    """torch.save files are zip archives: a truncated or garbage file has no readable directory."""
    try:
        with zipfile.ZipFile(path) as archive:
            if not archive.namelist():
                raise zipfile.BadZipFile("empty archive")
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise CorruptArtifact(path, f"not a readable torch checkpoint: {_short(exc)}") from None


# --- table kinds ----------------------------------------------------------------------------------
def table_kinds() -> tuple[TableKind, ...]:
    """The pipeline's Parquet tables, most specific first (the first match names an unknown file)."""
    return TABLE_KINDS


def guess_kind(columns) -> TableKind | None:
    present = set(columns)
    return next((k for k in table_kinds() if set(k.columns) <= present), None)


def read_table(path, kind: str) -> tuple[pd.DataFrame, dict]:
    """Read a pipeline Parquet table of the given kind; returns (frame, provenance metadata).

    Missing -> FileNotFoundError; damaged -> CorruptArtifact; another kind of table -> WrongKind,
    naming what the file looks like and which command writes the expected one."""
    path = Path(path)
    expected = next((k for k in table_kinds() if k.name == kind), None)
    if expected is None:
        raise ValueError(f"unknown table kind {kind!r}; known: {[k.name for k in table_kinds()]}")
    if not path.is_file():
        raise FileNotFoundError(f"file not found: {path} (expected {expected.label}, written by "
                                f"`{expected.writer}`)")
    try:
        frame = pd.read_parquet(path)
        meta = read_parquet_meta(path)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise CorruptArtifact(path, f"not a readable Parquet file: {_short(exc)}") from None
    recorded = meta.get("table")
    missing = [c for c in expected.columns if c not in frame.columns]
    if missing or (recorded and recorded != kind):
        actual = next((k for k in table_kinds() if k.name == recorded), None) or guess_kind(frame.columns)
        looks = f"it looks like {actual.label} (written by `{actual.writer}`)" if actual is not None \
            else f"it lacks the columns {missing}"
        raise WrongKind(f"{path} is not {expected.label}: {looks}. Give the file written by `{expected.writer}`")
    check_provenance(path, frame)
    return frame, meta


# --- records that must agree with their path ---------------------------------------------------------
def check_provenance(path, frame: pd.DataFrame | None = None) -> None:
    """Every record of a file at a path of the pipeline's layout must carry the provenance that path states
    (`layout.path_fields`: split, method, seed, budget, H): a file copied over another run's raises
    CorruptArtifact naming the column, what the records say and what the path says. `frame` None: read only
    those columns."""
    fields = path_fields(path)
    if not fields:
        return
    if frame is None:
        # pyarrow: loaded only when a Parquet file is read
        import pyarrow.parquet as pq

        try:
            names = pq.read_schema(path).names
            frame = pq.read_table(path, columns=[c for c in fields if c in names]).to_pandas()
        except Exception as exc:  # pyarrow raises several types for a damaged file
            raise CorruptArtifact(path, f"not a readable Parquet file: {_short(exc)}") from None
    for column, expected in fields.items():
        if column not in frame.columns or frame.empty:
            continue
        found = sorted({int(v) if isinstance(expected, int) else str(v) for v in frame[column].unique()})
        if found != [expected]:
            raise CorruptArtifact(path, f"its records have {column} {found}, but its path names {column} "
                                        f"{expected!r} (a file copied from another run?)")
