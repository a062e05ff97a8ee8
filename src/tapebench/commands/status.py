"""`tapebench status`: where a pipeline run stands, from the files it leaves behind.

A training run (split / agent / seed) is
  done         train.json is readable and every checkpoint it lists is intact;
  damaged      train.json or a checkpoint does not load (the note says which, and the rm that recovers);
  failed       no train.json, and the job's log (logs/train/...) ends in an error or a traceback;
  running      no train.json, and train.log was written in the last RUNNING_WITHIN_S seconds;
  interrupted  no train.json, train.log is older (killed or stopped: the next run resumes from resume.pt);
  pending      expected by the config, nothing written yet.
Progress, steps/s and ETA come from the last progress line of the run's train.log.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tapebench.layout import LOG_FILE, MANIFEST_FILE, RESULTS_DIR, RESUME_FILE, logs_dir
from tapebench.pipeline.integrity import scan_results
from tapebench.utils.artifacts import CorruptArtifact, recovery, what_file_is

RUNNING_WITHIN_S = 90.0      # a running job writes a progress line at least every 30 s (training.loop)
RUN_DIR = re.compile(r"^seed(\d+)$")
PROGRESS = re.compile(r"step (\d+)/(\d+) \(\d+%\) \| (\d+) steps/s \| eta (\S+) s")
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) ")
FAILURE = re.compile(r"^Traceback \(most recent call last\)|^tapebench \S+: error:|^\w*(Error|Exception)\b", re.M)


@dataclass
class RunStatus:
    split: str
    agent: str
    seed: int
    state: str = "pending"
    env_steps: int | None = None
    total_steps: int | None = None
    steps_per_second: float | None = None
    eta_s: float | None = None
    evaluations: list[int] = field(default_factory=list)
    note: str = ""

    @property
    def progress(self) -> str:
        if self.env_steps is None or not self.total_steps:
            return ""
        return f"{self.env_steps}/{self.total_steps} ({100 * self.env_steps / self.total_steps:.0f}%)"


def _last_progress(log_text: str) -> tuple[tuple[int, int, float, float | None] | None, float | None]:
    """((steps, total, steps/s, eta) of the last progress line, its time stamp as epoch seconds)."""
    for line in reversed(log_text.splitlines()):
        m = PROGRESS.search(line)
        if m:
            stamp = STAMP.match(line)
            when = time.mktime(time.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")) if stamp else None
            eta = float(m.group(4)) if m.group(4) != "nan" else None
            return (int(m.group(1)), int(m.group(2)), float(m.group(3)), eta), when
    return None, None


def _failure(job_log: Path) -> str | None:
    if not job_log.is_file():
        return None
    tail = job_log.read_text(errors="replace")[-20_000:]
    lines = [m.group(0) for m in FAILURE.finditer(tail)]
    if not lines:
        return None
    last = [line for line in tail.strip().splitlines() if line.strip()][-1].strip()
    return last[:200]


def run_status(run_dir: Path, job_log: Path, split: str, agent: str, seed: int, now: float) -> RunStatus:
    status = RunStatus(split, agent, seed)
    status.evaluations = sorted(int(p.stem[len("eval_H"):]) for p in run_dir.glob("eval_H*.parquet")
                                if p.stem[len("eval_H"):].isdigit())
    manifest_path = run_dir / MANIFEST_FILE
    if manifest_path.is_file():
        # lazy: a command loads only the modules it runs
        from tapebench.training.loop import read_manifest

        try:
            manifest = read_manifest(run_dir, verify=True)
        except CorruptArtifact as exc:
            status.state, status.note = "damaged", f"{exc.path}: {exc.problem}; {recovery(exc.path)}"
            return status
        status.state = "done"
        status.env_steps = status.total_steps = manifest.get("training", {}).get("env_steps")
        status.steps_per_second = manifest.get("steps_per_second")
        return status
    train_log = run_dir / LOG_FILE
    progress, stamp = _last_progress(train_log.read_text(errors="replace")) if train_log.is_file() else (None, None)
    if progress is not None:
        status.env_steps, status.total_steps, status.steps_per_second, eta = progress
        if eta is not None and stamp is not None:
            status.eta_s = max(0.0, eta - (now - stamp))
    failure = _failure(job_log)
    if failure is not None:
        status.state, status.note = "failed", f"{failure} (log: {job_log})"
    elif train_log.is_file() and now - train_log.stat().st_mtime <= RUNNING_WITHIN_S:
        status.state = "running"
    elif train_log.is_file():
        resumable = (run_dir / RESUME_FILE).is_file()
        status.state = "interrupted"
        status.note = "resumes from resume.pt when the pipeline runs again" if resumable else \
            "starts again when the pipeline runs again"
    status.eta_s = status.eta_s if status.state == "running" else None
    return status


def expected_runs(config: dict) -> list[tuple[str, str, int]]:
    """The runs the default target trains: main split x methods that train x seeds."""
    return [(config["main_split"], agent, seed) for agent in sorted(config["methods"]) if _trains(agent)
            for seed in range(int(config["seeds"]))]


def _trains(method: str) -> bool:
    """Methods that do not train (random, mpc, ...) have evaluation files but no training run."""
    # lazy: a command loads only the modules it runs
    from tapebench.registry import registry

    found = registry().get(method)
    return found is None or found.trains


def collect(results, logs, expected=()) -> tuple[list[RunStatus], list]:
    results, logs = Path(results), Path(logs)
    found: dict[tuple[str, str, int], None] = {key: None for key in expected}
    for run_dir in sorted(results.glob("runs/*/*/seed*")):
        m = RUN_DIR.match(run_dir.name)
        if m and run_dir.is_dir() and _trains(run_dir.parent.name):
            found[(run_dir.parent.parent.name, run_dir.parent.name, int(m.group(1)))] = None
    for log in sorted(logs.glob("train/*/*/seed*.log")):
        m = RUN_DIR.match(log.stem)
        if m:
            found[(log.parent.parent.name, log.parent.name, int(m.group(1)))] = None
    now = time.time()
    runs = [run_status(results / "runs" / split / agent / f"seed{seed}", logs / "train" / split / agent /
                       f"seed{seed}.log", split, agent, seed, now) for split, agent, seed in sorted(found)]
    others = [p for p in scan_results(results) if not (p.path.is_relative_to(results / "runs")
                                                      and p.path.suffix != ".parquet")]
    return runs, others


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def preset_mismatch(results: Path, config: dict, sources: list[str]) -> str | None:
    """A note when the main split's finished runs were trained with another training.total_steps than `config`
    (e.g. the quick preset's runs read against config/config.yaml alone), else None."""
    want = config["training"]["total_steps"]
    for manifest in sorted((results / "runs" / config["main_split"]).glob(f"*/seed*/{MANIFEST_FILE}")):
        try:
            steps = json.loads(manifest.read_text())["provenance"]["config"]["training"]["total_steps"]
        except (OSError, ValueError, KeyError, TypeError):
            continue      # a damaged manifest is reported in the table
        if steps != want:
            return (f"{manifest.parent} was trained with training.total_steps = {steps}, but {' + '.join(sources)} "
                    f"says {want}: give the preset(s) the pipeline was started with as --configfile (e.g. "
                    f"--configfile config/quick.yaml) to list the runs they expect")
    return None


def format_status(runs: list[RunStatus], others, horizons=None, sources=(), note=None) -> str:
    if not runs and not others:
        return "\n".join(["no training runs found", *([note] if note else [])])
    header = ("split", "agent", "seed", "state", "progress", "steps/s", "eta", "evaluated H", "note")
    rows = [(r.split, r.agent, str(r.seed), r.state, r.progress,
             f"{r.steps_per_second:.0f}" if r.steps_per_second else "", _duration(r.eta_s),
             ",".join(map(str, r.evaluations)) or "-", r.note) for r in runs]
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.state] = counts.get(r.state, 0) + 1
    order = ("done", "running", "interrupted", "failed", "damaged", "pending")
    summary = f"{len(runs)} training runs: " + ", ".join(f"{counts[s]} {s}" for s in order if s in counts)
    evaluated = sum(len(r.evaluations) for r in runs)
    if horizons:
        summary += f"; evaluation files {evaluated} of {len(runs) * len(horizons)}"
    running = [r for r in runs if r.state == "running" and r.eta_s is not None]
    if running:
        summary += f"; longest running ETA {_duration(max(r.eta_s for r in running))}"
    if sources:
        summary += f" (pending: expected by {' + '.join(sources)})"
    lines += ["", summary, *([note] if note else [])]
    if others:
        lines += ["", f"{len(others)} damaged file(s) outside the training runs:"]
        lines += [f"  {p.path}: {p.problem}; {recovery(p.remove)}" for p in others]
    return "\n".join(lines)


def register(sub) -> None:
    p = sub.add_parser(
        "status", description="Summarise every training run of a results folder: done, running (with progress, "
                    "steps/s and ETA), interrupted (resumes when the pipeline runs again), failed (with "
                    "the log to read), damaged (with the rm that recovers) or pending, and which evaluation "
                    "files exist. The results folder is the one the config writes (results_dir: results, or a "
                    "preset's results/<name>). When config/config.yaml is found above the results folder, the "
                    "runs the config expects but that have not started are listed as pending (give the presets you "
                    "started the pipeline with as --configfile; without it, runs trained for another "
                    "training.total_steps than config/config.yaml's are named and nothing is listed as "
                    "pending). Safe to run while the pipeline is running; "
                    "it only reads files.")
    p.add_argument("--results", help="results folder of the run (default: the config's results_dir: results, or "
                                     "the preset's own folder, e.g. results/quick)")
    p.add_argument("--logs", help="Snakemake job logs (default: the results folder's, logs/ or logs/<name>)")
    p.add_argument("--configfile", nargs="+", default=[], metavar="FILE",
                   help="the preset(s) the pipeline was started with, e.g. config/quick.yaml, so that the "
                        "runs it expects are counted")
    p.add_argument("--json", action="store_true", help="print the runs as JSON instead of a table")
    p.set_defaults(func=run)


def pipeline_root(results: Path | None) -> Path:
    """The pipeline folder of a results folder (results/ or results/<name>): the one above it holding
    config/config.yaml, else its parent; without one, the current folder."""
    if results is None:
        return Path(".")
    above = results.absolute().parents
    for folder in above[:2]:
        if (folder / "config" / "config.yaml").is_file():
            return folder if results.is_absolute() else Path(os.path.relpath(folder))
    return results.parent if results.name not in ("", ".", "..") else results.resolve().parent


def _inside(results: Path, root: Path) -> str:
    """`results` as the pipeline names it (results or results/<name>), for its logs folder; else results."""
    try:
        inner = results.absolute().relative_to(root.absolute()).as_posix()
    except ValueError:
        return RESULTS_DIR
    return inner if inner == RESULTS_DIR or (inner.startswith(RESULTS_DIR + "/") and inner.count("/") == 1) else \
        RESULTS_DIR


def run(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.pipeline.config import load_config, stated_config, validate_config

    results = Path(args.results) if args.results else None
    if results is not None and results.exists() and not results.is_dir():
        raise ValueError(f"--results {results} is not a folder: it is {what_file_is(results)}; give the results folder "
                         f"of a run (default: the config's results_dir)")
    root = pipeline_root(results)
    expected, horizons, sources, note, config = [], None, [], None, None
    schema = root / "workflow" / "schemas" / "config.schema.yaml"
    if (root / "config" / "config.yaml").is_file():
        config = load_config(args.configfile, root=root)
        if schema.is_file():
            validate_config(config, schema, stated=stated_config(args.configfile))
    if results is None:   # the folder the config writes
        results = root / config.get("results_dir", RESULTS_DIR) if config else Path(RESULTS_DIR)
    logs = Path(args.logs) if args.logs else root / logs_dir(_inside(results, root))
    if not results.is_dir() and config is None:
        raise FileNotFoundError(f"results folder not found: {results} (give --results PATH)")
    if config is not None and schema.is_file():
        sources = [str(root / "config" / "config.yaml"), *args.configfile]
        note = preset_mismatch(results, config, sources)
        if note is None or args.configfile:     # the presets given are taken at their word
            expected, horizons = expected_runs(config), config["evaluation"]["horizons"]
        else:                                   # not another preset's runs listed as pending
            sources = []
    runs, others = collect(results, logs, expected)
    if args.json:
        print(json.dumps({"runs": [{**asdict(r), "progress": r.progress} for r in runs],
                          "damaged_files": [{"path": str(p.path), "problem": p.problem} for p in others],
                          "expected_by": sources, "note": note}, indent=2))
    else:
        print(format_status(runs, others, horizons, sources, note))
    return 0
