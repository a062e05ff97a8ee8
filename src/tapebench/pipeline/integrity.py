"""Integrity of a whole results folder: the workflow runs `scan_results` before scheduling any job and
`tapebench status` reports what it finds (single-file checks: `utils.artifacts`)."""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from tapebench.layout import MANIFEST_FILE, RESULTS_FOLDERS
from tapebench.splits.io import load_split
from tapebench.utils.artifacts import (CorruptArtifact, check_checkpoint_archive, check_parquet, check_provenance,
                                       read_json, run_dir_of)


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
    """Cheap integrity checks of every artifact under `results`: Parquet footers, that records agree with their
    path (method, seed, budget, split, H), JSON, the split hash, torch checkpoint archives and that each
    train.json's checkpoints exist. No checkpoint is unpickled; `tapebench train` and `tapebench evaluate` verify
    their hashes. A folder of `results` that the layout does not write there (another preset's results/<name>) is
    another run's and is left out."""
    results = Path(results)
    if not results.is_dir():
        return []
    problems: list[Problem] = []
    for path in sorted(results.rglob("*")):
        inner = path.relative_to(results).parts
        if not path.is_file() or path.name.startswith(".") or (len(inner) > 1 and inner[0] not in RESULTS_FOLDERS):
            continue
        try:
            if path.suffix == ".parquet":
                check_parquet(path)
                check_provenance(path)
            elif path.name == MANIFEST_FILE:
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
