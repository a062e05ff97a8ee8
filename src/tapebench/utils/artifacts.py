"""Is an artifact on disk whole, and is it the kind of file the reader expects?

Every check raises `CorruptArtifact` (a ValueError) whose message names the file, what is wrong
with it and the command that recovers: delete the file (or, for a training run's files, the run
directory) and run the pipeline again, which regenerates exactly what is missing.
`scan_results` applies the cheap checks to a whole results folder; the workflow runs it before
scheduling any job and `tapebench status` reports what it finds.
"""
from __future__ import annotations

import hashlib
import json
import shlex
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

RUN_FILES = ("train.json", "resume.pt")


class CorruptArtifact(ValueError):
    """A file that exists but cannot be used: truncated, empty, garbage, or edited after it was written."""

    def __init__(self, path, problem: str):
        self.path, self.problem = Path(path), problem
        super().__init__(f"{path} is corrupt or unreadable ({problem}); {recovery(path)}")


class WrongKind(ValueError):
    """A readable file of another kind than the one asked for (e.g. episode records for an aggregate)."""


def run_dir_of(path) -> Path | None:
    """The training run a file belongs to (its checkpoints, train.json, resume.pt), else None."""
    path = Path(path)
    if path.parent.name == "checkpoints" and path.suffix == ".pt":
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
@dataclass(frozen=True)
class Kind:
    name: str
    label: str
    writer: str
    columns: tuple[str, ...]


def table_kinds() -> list[Kind]:
    """The pipeline's Parquet tables, most specific first (the first match names an unknown file)."""
    from tapebench.evaluation.records import AGENT_COLUMNS, EPISODE_COLUMNS
    from tapebench.stats.aggregate import AGGREGATE_COLUMNS, GROUP, PER_SEED_COLUMNS
    from tapebench.stats.model_error import COLUMNS as MODEL_ERROR_AGGREGATE_COLUMNS, RUN_COLUMNS as MODEL_ERROR_COLUMNS
    from tapebench.stats.protocol_comparison import (COMPARISON_COLUMNS as PROTOCOL_COMPARISON_COLUMNS,
                                             REVERSAL_COLUMNS as PROTOCOL_REVERSAL_COLUMNS)

    episode = tuple(EPISODE_COLUMNS)
    return [
        Kind("per_seed", "a per-seed table", "tapebench aggregate-seed --out", tuple(PER_SEED_COLUMNS)),
        Kind("per_rule", "a per-rule table", "tapebench aggregate-seed --per-rule-out",
             (*GROUP, "rule", "type", "metric", "value", "k_used", "n_episodes")),
        Kind("curves", "a learning-curve table", "tapebench aggregate-seed --curves-out",
             (*GROUP, "checkpoint", "metric", "value", "n_episodes")),
        Kind("aggregate", "an aggregate table", "tapebench aggregate --out", tuple(AGGREGATE_COLUMNS)),
        Kind("tests", "a Welch-tests table", "tapebench aggregate --tests-out",
             ("agent_a", "agent_b", "metric", "p", "p_holm")),
        Kind("model_error", "a world model's prediction-error table", "tapebench model-error",
             tuple(MODEL_ERROR_COLUMNS)),
        Kind("model_error_aggregate", "a model-error aggregate", "tapebench aggregate-model-error",
             tuple(MODEL_ERROR_AGGREGATE_COLUMNS)),
        Kind("episodes", "per-episode evaluation records of an agent", "tapebench evaluate",
             (*AGENT_COLUMNS, *episode)),
        Kind("records", "per-episode records", "tapebench mpc / tapebench exact", episode),
        Kind("feasibility", "a feasibility table", "tapebench feasibility",
             ("rule", "L", "H", "solvable_fraction", "any_solvable")),
        Kind("identifiability", "an identifiability table", "tapebench identifiability",
             ("split", "side", "rule", "type", "episode", "steps", "identified")),
        Kind("protocol_comparison", "a protocol-comparison table", "tapebench protocol-comparison --out",
             tuple(PROTOCOL_COMPARISON_COLUMNS)),
        Kind("protocol_ranks", "a protocol-ranks table", "tapebench protocol-comparison --ranks-out",
             ("protocol", "agent", "mean", "rank", "rank_ci_low", "rank_ci_high", "p_best")),
        Kind("protocol_reversals", "a protocol-reversals table", "tapebench protocol-comparison --reversals-out",
             tuple(PROTOCOL_REVERSAL_COLUMNS)),
        Kind("features", "a rule-features table", "tapebench features", ("rule", "type", "mirror_rule")),
    ]


def guess_kind(columns) -> Kind | None:
    present = set(columns)
    return next((k for k in table_kinds() if set(k.columns) <= present), None)


def read_table(path, kind: str) -> tuple[pd.DataFrame, dict]:
    """Read a pipeline Parquet table of the given kind; returns (frame, provenance metadata).

    Missing -> FileNotFoundError; damaged -> CorruptArtifact; another kind of table -> WrongKind,
    naming what the file looks like and which command writes the expected one."""
    from tapebench.utils.io import read_parquet_meta

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
    return frame, meta


# --- a whole results folder -----------------------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    path: Path
    problem: str

    @property
    def remove(self) -> Path:
        """What to delete so that the pipeline regenerates it."""
        return run_dir_of(self.path) or self.path


def _manifest_problems(path: Path) -> list[Problem]:
    try:
        manifest = read_json(path, "training manifest")
    except CorruptArtifact as exc:
        return [Problem(path, exc.problem)]
    entries = manifest.get("checkpoints") if isinstance(manifest, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "file" in e for e in entries):
        return [Problem(path, "no list of checkpoints")]
    missing = [e["file"] for e in entries if not (path.parent / e["file"]).is_file()]
    return [Problem(path, f"lists checkpoint(s) that are gone: {missing}")] if missing else []


def scan_results(results) -> list[Problem]:
    """Cheap integrity checks of every artifact under `results`: Parquet footers, JSON, the split
    hash, torch checkpoint archives and that each train.json's checkpoints exist. No checkpoint is
    unpickled; `tapebench train` and `tapebench evaluate` verify their hashes."""
    from tapebench.splits.io import load_split

    results = Path(results)
    if not results.is_dir():
        return []
    problems: list[Problem] = []
    for path in sorted(results.rglob("*")):
        if not path.is_file() or path.name.startswith("."):
            continue
        try:
            if path.suffix == ".parquet":
                check_parquet(path)
            elif path.name == "train.json":
                problems += _manifest_problems(path)
            elif path.suffix == ".json" and path.parent.name == "splits" and not path.name.endswith(".health.json"):
                load_split(path)
            elif path.suffix == ".json":
                read_json(path)
            elif path.suffix == ".pt" and path.parent.name == "checkpoints":
                check_checkpoint_archive(path)
        except CorruptArtifact as exc:
            problems.append(Problem(path, exc.problem))
        except ValueError as exc:
            problems.append(Problem(path, str(exc)))
    return problems


class CorruptResults(Exception):
    """Raised by the workflow before any job when `scan_results` finds damaged files."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__(problems_report(problems))


def problems_report(problems: list[Problem]) -> str:
    """The message the workflow stops with: each file and its problem, then one command that recovers."""
    lines = [f"{len(problems)} corrupt or unreadable file(s) in the results; no job was started:"]
    lines += [f"  {p.path}: {p.problem}" for p in problems]
    remove = sorted({str(p.remove) for p in problems})
    lines.append("Delete them and run the same command again; the pipeline regenerates what is missing:")
    lines.append("  rm -r " + " ".join(shlex.quote(r) for r in remove))
    return "\n".join(lines)
