"""Is an artifact on disk whole, and is it the kind of file the reader expects?

A file that is not of the kind asked for (README.md given as records, a YAML file as a split) raises
`WrongKind`, naming what the file is and what was expected; it is not damaged and nothing advises deleting it.
A file that claims the kind (by its name's suffix or its content) but cannot be used raises `CorruptArtifact`
(a ValueError) whose message names the file, what is wrong with it and how to recover: for a file the pipeline
wrote under results/, delete it (or, for a training run's files, the run directory) and run the pipeline again,
which regenerates exactly what is missing; for any other file, write it again with the command that made it.
`pipeline.integrity.scan_results` applies the cheap checks to a whole results folder.
"""
from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pandas as pd

from tapebench.utils.io import file_sha256  # noqa: F401  (checkpoints and blocks import it from here)
from tapebench.layout import ARTIFACT_SUFFIXES, CHECKPOINT_DIR, MANIFEST_FILE, RESULTS_DIR, RESUME_FILE, path_fields
from tapebench.schemas import TABLE_KINDS, TableKind
from tapebench.utils.io import CONTENT_HASH, read_parquet_meta, table_content_hash
from tapebench.validation import refuse_duplicates

RUN_FILES = (MANIFEST_FILE, RESUME_FILE)


class CorruptArtifact(ValueError):
    """A file that exists but cannot be used: truncated, empty, garbage, or edited after it was written."""

    def __init__(self, path, problem: str, writer: str | None = None):
        self.path, self.problem = Path(path), problem
        super().__init__(f"{path} is corrupt or unreadable ({problem}); {recovery(path, writer)}")


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


# What a file is by its name, when its content does not say: the words a WrongKind message names it by.
_KINDS_BY_NAME = {"Snakefile": "a Snakemake workflow (Snakefile)"}
_KINDS_BY_SUFFIX = {
    ".md": "a Markdown text file", ".rst": "a reStructuredText file", ".txt": "a text file",
    ".yaml": "a YAML file", ".yml": "a YAML file", ".toml": "a TOML file", ".cfg": "a configuration file",
    ".ini": "a configuration file", ".py": "a Python source file", ".smk": "a Snakemake rules file",
    ".tex": "a LaTeX file", ".csv": "a CSV file", ".pdf": "a PDF file", ".png": "a PNG image",
    ".log": "a log file", ".sh": "a shell script", ".j2": "a template", ".html": "an HTML file",
}


def what_file_is(path) -> str:
    """What a file is, in words, for a message that refuses it: the pipeline's own kinds by content
    (`describe_file`), else Parquet or JSON by content, else by its name, else text or binary."""
    path = Path(path)
    if path.is_dir():
        return "a folder"
    known = describe_file(path)
    if known is not None:
        return known
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as exc:
        return f"a file that cannot be read ({type(exc).__name__})"
    if not head:
        return "an empty file"
    named = _KINDS_BY_NAME.get(path.name) or _KINDS_BY_SUFFIX.get(path.suffix.lower())
    if named is not None:
        return named
    try:
        json.loads(path.read_text())
        return "a JSON file"
    except (OSError, ValueError):   # JSONDecodeError and UnicodeDecodeError are ValueErrors
        pass
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return "a binary file"
    return "a text file"


def claims_kind(path, suffix: str, magic: bytes | None = None) -> bool:
    """Whether a file says it is of the kind: its name ends with `suffix`, or its content starts with `magic`.
    Such a file that cannot be read is damaged (CorruptArtifact); any other is of another kind (WrongKind)."""
    path = Path(path)
    if path.suffix == suffix:
        return True
    if magic is None or not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            return f.read(len(magic)) == magic
    except OSError:
        return False


def refuse_other_kind(path, suffix: str, expected: str, writer: str | None = None, magic: bytes | None = None) -> None:
    """Raise WrongKind when `path` is not a file of the kind (`claims_kind`), naming what it is and what was
    expected: `expected` (e.g. "an aggregate table"), written by `writer`."""
    path = Path(path)
    if path.is_file() and claims_kind(path, suffix, magic):
        return
    give = f"give the file written by `{writer}`" if writer else f"give {expected}"
    raise WrongKind(f"{path} is not {expected}: it is {what_file_is(path)}; {give}")


def expect_parquet(path, expected: str, writer: str | None = None) -> Path:
    """A Parquet input that exists and is Parquet: FileNotFoundError, WrongKind (another kind of file) or
    CorruptArtifact (a damaged Parquet file) otherwise. Returns the path."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"file not found: {path} (expected {expected}"
                                + (f", written by `{writer}`)" if writer else ")"))
    refuse_other_kind(path, ".parquet", expected, writer, PARQUET_MAGIC)
    check_parquet(path, writer)
    return path


def under_results(path) -> bool:
    """A path inside a results folder (`layout.RESULTS_DIR`), where the pipeline writes."""
    return RESULTS_DIR in Path(path).absolute().parts[:-1]


def written_by_pipeline(path) -> bool:
    """A file of a kind the pipeline writes (`layout.ARTIFACT_SUFFIXES`), in a results folder: the only files
    any message advises deleting."""
    return under_results(path) and Path(path).suffix in ARTIFACT_SUFFIXES


def run_dir_of(path) -> Path | None:
    """The training run a file belongs to (its checkpoints, train.json, resume.pt), else None."""
    path = Path(path)
    if path.parent.name == CHECKPOINT_DIR and path.suffix == ".pt":
        return path.parent.parent
    if path.name in RUN_FILES:
        return path.parent
    return None


def recovery(path, writer: str | None = None) -> str:
    """How to recover from a damaged file: delete it and let the pipeline regenerate it when the pipeline wrote it
    (`written_by_pipeline`); otherwise write it again (a run: train it again, which starts a damaged run over)."""
    run = run_dir_of(path)
    if written_by_pipeline(path):
        if run is not None:
            return f"delete the run and run the pipeline again to retrain it: rm -r {run}"
        return f"delete the file and run the pipeline again to regenerate it: rm {path}"
    if run is not None:
        return f"train the run again (`tapebench train --out {run}` starts a damaged run over)"
    return f"write it again with `{writer}`" if writer else "write it again with the command that made it"


def _short(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


# --- single files ---------------------------------------------------------------------------------
def read_json(path, what: str = "JSON file", writer: str | None = None):
    """Parse a JSON artifact; a missing file raises FileNotFoundError, a file that is not JSON and not named .json
    WrongKind (naming what it is), a damaged one CorruptArtifact."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}" + (" (a folder)" if path.is_dir() else ""))
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        if not claims_kind(path, ".json"):
            refuse_other_kind(path, ".json", f"a {what}" if not what.startswith(("a ", "an ")) else what, writer)
        raise CorruptArtifact(path, f"not valid JSON: {_short(exc)}", writer) from None


def check_parquet(path, writer: str | None = None) -> None:
    """Read the Parquet footer (schema and row groups); catches empty, truncated and garbage files."""
    # pyarrow: loaded only when a Parquet file is read or written
    import pyarrow.parquet as pq

    try:
        pq.read_metadata(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ... for a damaged file
        raise CorruptArtifact(path, f"not a readable Parquet file: {_short(exc)}", writer) from None


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
    expect_parquet(path, expected.label, expected.writer)
    # pyarrow: loaded only when a Parquet file is read
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, use_pandas_metadata=True)
        raw = (table.schema.metadata or {}).get(b"tapebench")
        meta = json.loads(raw) if raw else {}
        frame = table.to_pandas()     # as pandas.read_parquet gives it
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise CorruptArtifact(path, f"not a readable Parquet file: {_short(exc)}", expected.writer) from None
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
