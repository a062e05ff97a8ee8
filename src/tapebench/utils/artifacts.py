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
from tapebench.utils.io import CONTENT_HASH, read_parquet_meta, table_content_hash
from tapebench.validation import refuse_duplicates

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

    Missing -> FileNotFoundError; damaged, edited after it was written (its data no longer match the content hash
    its writer recorded) or inconsistent records -> CorruptArtifact; another kind of table -> WrongKind, naming what
    the file looks like and which command writes the expected one. A file without a recorded hash (written before
    tables carried one) is read unverified."""
    frame, meta, _ = _read_verified(path, kind)
    return frame, meta


def read_tables(paths, kind: str, what: str) -> list[tuple[pd.DataFrame, dict]]:
    """The input tables of an aggregate, each read by `read_table`: a file given twice (under any spelling of its
    path) or the same content under another path (a copy) is refused, since its records would count twice."""
    paths = refuse_duplicates(paths, what)
    tables, seen = [], {}
    for path in paths:
        frame, meta, digest = _read_verified(path, kind)
        if digest in seen:
            raise ValueError(f"{what} files {seen[digest]} and {path} hold the same records (a copy under another "
                             f"path?); each input is counted once: give each file once")
        seen[digest] = path
        tables.append((frame, meta))
    return tables


def _read_verified(path, kind: str) -> tuple[pd.DataFrame, dict, str]:
    """(frame, metadata, content hash) of a table of `kind`, checked as `read_table` describes."""
    path = Path(path)
    expected = next((k for k in table_kinds() if k.name == kind), None)
    if expected is None:
        raise ValueError(f"unknown table kind {kind!r}; known: {[k.name for k in table_kinds()]}")
    if not path.is_file():
        raise FileNotFoundError(f"file not found: {path} (expected {expected.label}, written by "
                                f"`{expected.writer}`)")
    # pyarrow: loaded only when a Parquet file is read
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, use_pandas_metadata=True)
        raw = (table.schema.metadata or {}).get(b"tapebench")
        meta = json.loads(raw) if raw else {}
        frame = table.to_pandas()     # as pandas.read_parquet gives it
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise CorruptArtifact(path, f"not a readable Parquet file: {_short(exc)}") from None
    recorded = meta.get("table")
    missing = [c for c in expected.columns if c not in frame.columns]
    if missing or (recorded and recorded != kind):
        actual = next((k for k in table_kinds() if k.name == recorded), None) or guess_kind(frame.columns)
        looks = f"it looks like {actual.label} (written by `{actual.writer}`)" if actual is not None \
            else f"it lacks the columns {missing}"
        raise WrongKind(f"{path} is not {expected.label}: {looks}. Give the file written by `{expected.writer}`")
    digest = check_content(path, table, meta)
    check_provenance(path, frame)
    check_records(path, frame, kind, meta)
    return frame, meta, digest


def check_content(path, table, meta: dict) -> str:
    """The content hash of a read pyarrow table; CorruptArtifact naming the file when its writer recorded another
    (`utils.io.write_parquet`): a value edited after the file was written. No recorded hash: unverified."""
    digest = table_content_hash(table)
    recorded = meta.get(CONTENT_HASH)
    if recorded is not None and recorded != digest:
        raise CorruptArtifact(path, f"its data do not match the content hash written with them ({CONTENT_HASH} "
                                    f"{str(recorded)[:12]}..., the data hash to {digest[:12]}...): a value was edited "
                                    f"after the pipeline wrote it")
    return digest


RECORD_KINDS = ("episodes", "records", "fewshot", "worldtest")      # the tables of per-episode (per-problem) records
# the columns within which every rule of an episode-records file plays the same episodes, each once
EPISODE_GROUP = ("agent", "seed", "checkpoint", "side", "shots", "adaptation")


def check_records(path, frame: pd.DataFrame, kind: str, meta: dict) -> None:
    """Records that contradict themselves raise CorruptArtifact naming the file: a file at a path of the pipeline's
    layout without provenance (every command that writes records records it, so such a file was rewritten by
    something else, e.g. edited with pandas, which drops the content hash with it), strict success where the final
    distance is not 0 (or the reverse), an episode twice, rules with unequal episode counts at a checkpoint.
    Records elsewhere without provenance (hand-made tables) are read unverified."""
    if kind not in RECORD_KINDS:
        return
    if not meta and path_fields(path):
        raise CorruptArtifact(path, "it carries no provenance (the pipeline's metadata under the key 'tapebench', "
                                    "with the content hash of its data), though every command that writes records "
                                    "records it: the file was rewritten by something else")
    if frame.empty:
        return
    success, dist = frame["success"], frame["final_dist"]
    known = success.notna() & dist.notna()
    wrong = known & (success.astype(bool) != (dist == 0))
    if wrong.any():
        row = frame[wrong].iloc[0]
        raise CorruptArtifact(path, f"{int(wrong.sum())} record(s) with success {bool(row['success'])} but final_dist "
                                    f"{float(row['final_dist']):g} (success is final_dist = 0), e.g. side "
                                    f"{row['side']!r} rule {int(row['rule'])}")
    if "episode" not in frame.columns:
        return
    keys = [c for c in EPISODE_GROUP if c in frame.columns]
    repeated = frame.duplicated([*keys, "rule", "episode"])
    if repeated.any():
        row = frame[repeated].iloc[0]
        raise CorruptArtifact(path, f"{int(repeated.sum())} episode record(s) appear twice, e.g. "
                                    f"{ {k: row[k] for k in [*keys, 'rule', 'episode']} }")
    counts = frame.groupby([*keys, "rule"], sort=True, observed=True).size()
    spread = counts.groupby(level=list(range(len(keys)))).nunique() if keys else pd.Series([counts.nunique()])
    if (spread > 1).any():
        group = spread.index[(spread > 1).to_numpy()][0] if keys else ()
        group = group if isinstance(group, tuple) else (group,)
        per_rule = counts.loc[group] if keys else counts
        where = ", ".join(f"{k} {v!r}" for k, v in zip(keys, group))
        raise CorruptArtifact(path, f"its rules have unequal episode counts at {where}: "
                                    f"{ {int(r): int(n) for r, n in per_rule.items()} } (every rule plays the same "
                                    f"episodes)")


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
