"""The compiled report: one LaTeX document holding every table and figure a config produces.

The document is generated from the report registry (`registry.jobs(config)`), so an entry added there
appears here without edits: tables are `\\input` (they carry their own caption), figures are included
from their PDF with a caption built from the entry title and the protocol. A first page summarises the
config that produced it. `tapebench report` writes the .tex and compiles it with latexmk (or pdflatex
twice) in a temporary folder, then moves the PDF into place; without LaTeX it stops before doing
anything and says how to install it (`--tex-only` needs no LaTeX).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path, PurePosixPath

import yaml

from tapebench.grid_rules import GridFamily
from tapebench.report import registry
from tapebench.report.output import Job, Output
from tapebench.report.render import environment, tex_text
from tapebench.rule_family import config_family, family_phrase
from tapebench.settings import fewshot_study, noise_study, worldtest_study
from tapebench.utils.io import atomic_path, code_version, content_hash

TEMPLATE = "report.tex.j2"
# LaTeX packages the template needs beyond texlive-latex-base (checked before compiling).
REQUIRED_PACKAGES = ("booktabs", "graphicx", "adjustbox", "placeins", "geometry", "caption", "float", "needspace",
                     "hyperref")
LATEX_INSTALL = """\
Install LaTeX, then run the same command again:
  Debian/Ubuntu:  sudo apt-get install -y texlive-latex-base texlive-latex-recommended texlive-latex-extra latexmk
  Fedora:         sudo dnf install -y texlive-scheme-medium latexmk
  macOS:          MacTeX (https://tug.org/mactex/), or BasicTeX (`brew install --cask basictex`) followed by
                  `sudo tlmgr install latexmk booktabs adjustbox collectbox placeins caption`
Or skip the PDF: every table and figure is built without LaTeX (`snakemake --cores 2` builds them all),
and `tapebench report --tex-only` writes the report's .tex without compiling it."""
# Path characters a LaTeX \input / \includegraphics takes without escaping (registry paths are ours).
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./-]+$")


class LatexMissing(RuntimeError):
    """No LaTeX compiler, or one without the packages the report needs."""


# --- what the document holds ---------------------------------------------------------------------------------
def job_split(job: Job, config: dict) -> str:
    """The split a render job reports on: its `split` value, else the one configured split named by a
    path component of its output or inputs (e.g. results/identifiability/<split>.tex), else the main split."""
    if isinstance(job.values.get("split"), str):
        return job.values["split"]
    paths = [job.out] + [v for value in job.values.values()
                         for v in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(v, str)]
    named = set()
    for path in paths:
        parts = PurePosixPath(path).parts
        components = set(parts[:-1]) | {PurePosixPath(parts[-1]).name.split(".")[0]} if parts else set()
        named |= components & set(config["splits"])
    return named.pop() if len(named) == 1 else config["main_split"]


# An entry's title may carry the paper's number ("Table 7: ..."); LaTeX numbers the floats itself, so the document
# puts the paper's number in the heading's text ("... (paper Table 7)") and never in a caption.
_PAPER_NUMBER = re.compile(r"^(?P<label>(?:Figure|Table)s? [0-9][0-9–-]*):\s*(?P<rest>.+)$")


def paper_title(title: str) -> tuple[str | None, str]:
    """(the paper's label, e.g. "Table 7", or None; the title without it, capitalised)."""
    match = _PAPER_NUMBER.match(title)
    if not match:
        return None, title
    rest = match["rest"]
    return match["label"], rest[:1].upper() + rest[1:]


def heading(title: str) -> str:
    """An entry's title for running text: the paper's number, if any, after it ("... (paper Table 7)")."""
    label, rest = paper_title(title)
    return f"{rest} (paper {label})" if label else title


def split_seeds(config: dict, split: str) -> int:
    """Training seeds on a split: `seeds` on the main split, the ladder's on the ladder, the robustness study's on
    the other splits (as the workflow runs them)."""
    if split == config["main_split"]:
        return config["seeds"]
    if split == config["studies"]["ladder"]["name"]:
        return config["studies"]["ladder"]["seeds"]
    return config["studies"]["robustness"]["seeds"]


ILLUSTRATIONS = ("figure1", "figure4", "grid_rollouts")    # drawn from the rules alone: no training, no evaluation


def protocol(config: dict, split: str, entry_id: str = "") -> dict:
    """The protocol numbers the caption of entry `entry_id` on `split` states: the main study's, or the study's own
    (seeds, budgets, L and H) for an entry of a study. A value of None is left out of the sentence."""
    env, training, evaluation, studies = config["env"], config["training"], config["evaluation"], config["studies"]
    p = {"split": split, "L": env["L"], "H": env["H"], "horizons": list(evaluation["horizons"]),
         "seeds": split_seeds(config, split), "episodes_per_rule": evaluation["episodes_per_rule"],
         "total_steps": training["total_steps"], "eval_every": training["eval_every"],
         "last_k": evaluation["last_k"], "notes": []}
    family = config_family(config)
    p.update(family=family_phrase(family, env["L"]), grid=isinstance(family, GridFamily))
    if split != config["main_split"]:
        p["horizons"] = [env["H"]]          # the other splits are evaluated at the training horizon only
    if entry_id in ("table5", "table6"):
        fixed = studies["fixed_z"]
        p.update(L=fixed[entry_id]["L"], H=fixed[entry_id]["H"], horizons=[fixed[entry_id]["H"]],
                 seeds=fixed["seeds"], total_steps=fixed["total_steps"], eval_every=fixed["eval_every"])
        p["notes"].append(f"rules {', '.join(map(str, fixed['rules']))}")
    elif entry_id in ("worldtest", "figure_worldtest"):
        study = worldtest_study(config)
        tasks = study["worldtest"]
        p.update(seeds=study["seeds"], horizons=None, episodes_per_rule=None, last_k=None, eval_every=None)
        p["notes"] += [f"interaction budgets B = {', '.join(map(str, study['budgets']))} environment steps",
                       f"{tasks['problems_per_rule']} problem{'s' if tasks['problems_per_rule'] != 1 else ''} per "
                       f"rule, task and side", "methods that train answer with their final checkpoint"]
    elif entry_id == "figure_fewshot":
        study = fewshot_study(config)
        rules = study["fewshot"]["rules_per_side"]
        p.update(seeds=study["seeds"], horizons=[env["H"]], last_k=None, eval_every=None)
        p["notes"] += [f"k = {', '.join(map(str, study['fewshot']['shots']))} adaptation episodes",
                       "every rule of each side" if rules is None else f"{rules} rule{'s' if rules != 1 else ''} per side",
                       "methods that train adapt their final checkpoint"]
    elif entry_id in ("noise", "figure_noise"):
        noise = noise_study(config)
        p["horizons"] = [noise["H"]]
        p["notes"].append(f"noise levels epsilon = {', '.join(str(level) for level in noise['levels'])}")
    elif entry_id == "figure5":
        others = studies["robustness"]["seeds"]
        p.update(horizons=[env["H"]], seeds=f"{config['seeds']} on {config['main_split']}, {others} on each other "
                                             f"partition")
    elif entry_id in ("sweep", "figure_sweep"):
        p["seeds"] = config["diagnostics"]["sweep"]["seeds"]
    elif entry_id in ILLUSTRATIONS:
        p["illustration"] = True
    elif entry_id in ("table1", "table7", "oracle_gap"):
        oracle = config["oracle"]
        p.update(seeds=None, total_steps=None, eval_every=None, last_k=None, horizons=[env["H"]])
        p["notes"].append(f"no training: MPC plans {oracle['horizon']} steps ahead over {oracle['candidates']} "
                          f"candidates")
    return p


def protocol_text(p: dict) -> str:
    """One sentence, plain text (escape it for LaTeX or RST where it goes)."""
    def plural(n, word):
        return f"{n} {word}{'s' if n != 1 else ''}"

    family = p.get("family")
    if p.get("illustration"):
        return f"Illustration: drawn from the rules alone{f' ({family})' if family else ''}, no training or evaluation."

    parts = [f"split {p['split']}"]
    where = "" if p.get("grid") else f"L = {p['L']}, "       # a grid's family phrase gives its torus
    where = f"{family + ', ' if family else ''}{where}training horizon H = {p['H']}"
    if p.get("horizons"):
        where += f" (evaluated at H = {', '.join(map(str, p['horizons']))})"
    parts.append(where)
    if p.get("seeds") is not None:
        parts.append(plural(p["seeds"], "seed") if isinstance(p["seeds"], int) else f"seeds: {p['seeds']}")
    if p.get("episodes_per_rule") is not None:
        parts.append(f"{plural(p['episodes_per_rule'], 'episode')} per rule")
    if p.get("total_steps") is not None:
        budget = f"training budget {p['total_steps']:,} environment steps per run"
        if p.get("eval_every") is not None:
            budget += f", a checkpoint every {p['eval_every']:,}"
        if p.get("last_k") is not None:
            budget += f", final value over the last {plural(p['last_k'], 'checkpoint')}"
        parts.append(budget)
    parts += p.get("notes", [])
    return "Protocol: " + "; ".join(parts) + "."


def caption(entry: Output, job: Job, config: dict) -> str:
    """Plain-text caption of a render job's outputs: the entry's heading and its protocol."""
    return f"{heading(entry.title)}. {protocol_text(protocol(config, job_split(job, config), entry.id))}"


_RST_SPECIALS = re.compile(r"([\\`*_|<>\[\]])")


def caption_rst(entry: Output, job: Job, config: dict) -> str:
    """The caption for Snakemake's HTML report (reStructuredText, so its markup characters escaped)."""
    return _RST_SPECIALS.sub(r"\\\1", caption(entry, job, config))


def _checked_path(path: str) -> str:
    if not _SAFE_PATH.match(path) or ".." in PurePosixPath(path).parts:
        raise ValueError(f"report: the path {path!r} cannot be included in LaTeX as is; registry outputs must "
                         f"be relative paths of letters, digits and _ . / -")
    return path


def items(config: dict) -> list[dict]:
    """One item per render job, in registry order: its tables (.tex), figures (PDF with the PNG beside it) and
    other files, each registry target of the config in exactly one place."""
    out = []
    for entry, job in registry.jobs(config):
        files = list(job.outputs(entry).values()) + list(entry.extra_outputs(job).values())
        tables, figures, data = [], {}, []
        for path in files:
            suffix = PurePosixPath(path).suffix
            if suffix == ".tex":
                tables.append(_checked_path(path))
            elif suffix in (".pdf", ".png"):
                figures.setdefault(path[: -len(suffix)], {"pdf": None, "png": None})[suffix[1:]] = _checked_path(path)
            else:
                data.append(path)
        split = job_split(job, config)
        out.append({"id": entry.id, "job": job.name, "kind": entry.kind, "category": entry.category,
                    "title": heading(entry.title), "caption": paper_title(entry.title)[1], "split": split,
                    "protocol": protocol_text(protocol(config, split, entry.id)),
                    "tables": tables, "figures": list(figures.values()), "data": data})
    return out


def sections(config: dict) -> list[dict]:
    """Items grouped by registry category, in order of first appearance."""
    grouped: dict[str, list[dict]] = {}
    for item in items(config):
        grouped.setdefault(item["category"], []).append(item)
    return [{"title": title, "items": group} for title, group in grouped.items()]


def summary(config: dict, presets=(), version: str | None = None) -> dict:
    """The first page: which config produced the report."""
    training, evaluation, stats = config["training"], config["evaluation"], config["statistics"]
    return {
        "code_version": version if version is not None else code_version(),
        "config_digest": content_hash(config)[:12],
        "presets": list(presets),
        "methods": list(config["methods"]),
        "main_split": config["main_split"],
        "splits": [{"name": name, **{k: spec.get(k, "") for k in ("method", "test_size", "seed", "unit", "rules")}}
                   for name, spec in config["splits"].items()],
        "env": config["env"],
        "budget": {"total_steps": training["total_steps"], "eval_every": training["eval_every"],
                   "seeds": config["seeds"], "episodes_per_rule": evaluation["episodes_per_rule"],
                   "horizons": list(evaluation["horizons"]), "last_k": evaluation["last_k"]},
        "statistics": stats,
        "config_yaml": yaml.safe_dump(config, sort_keys=False, default_flow_style=None, width=110).rstrip(),
    }


def context(config: dict, presets=(), version: str | None = None) -> dict:
    return {"summary": summary(config, presets, version), "sections": sections(config)}


def render_tex(config: dict, presets=(), version: str | None = None) -> str:
    env = environment()
    env.filters["tex"] = tex_text
    return env.get_template(TEMPLATE).render(**context(config, presets, version))


# --- LaTeX ---------------------------------------------------------------------------------------------------
def latex_command() -> list[str]:
    """The compile command (latexmk, else pdflatex), after checking the packages the template needs.

    Raises LatexMissing with installation instructions."""
    if shutil.which("latexmk") and shutil.which("pdflatex"):
        command = ["latexmk", "-pdf", "-silent", "-interaction=nonstopmode", "-halt-on-error", "-file-line-error"]
    elif shutil.which("pdflatex"):
        command = ["pdflatex", "-interaction=batchmode", "-halt-on-error", "-file-line-error"]
    else:
        raise LatexMissing("the PDF report needs LaTeX (latexmk or pdflatex on PATH) and neither was found.\n"
                           + LATEX_INSTALL)
    if shutil.which("kpsewhich"):
        missing = [p for p in REQUIRED_PACKAGES if not _has_package(p)]
        if missing:
            raise LatexMissing(f"LaTeX is installed but lacks the package(s) {', '.join(missing)} that the report "
                               f"needs.\n" + LATEX_INSTALL)
    return command


def _has_package(name: str) -> bool:
    found = subprocess.run(["kpsewhich", f"{name}.sty"], capture_output=True, text=True, timeout=60)
    return found.returncode == 0 and bool(found.stdout.strip())


def compile_pdf(tex: str, pdf_path, root=".") -> str:
    """Compile `tex` in a temporary folder beside `pdf_path` (inputs are found relative to `root`), move the
    PDF onto `pdf_path` atomically; returns the compiler's output. Raises RuntimeError with LaTeX's error."""
    command = latex_command()
    pdf_path = Path(pdf_path)
    pdf_path.parent.mkdir(parents=True, exist_ok=True)
    # inputs relative to root (the trailing separator keeps TeX's own paths); unwrapped log lines
    env = {**os.environ, "TEXINPUTS": f"{Path(root).resolve()}{os.pathsep}", "max_print_line": "10000"}
    with tempfile.TemporaryDirectory(prefix=".report-", dir=pdf_path.parent) as tmp:
        (Path(tmp) / "report.tex").write_text(tex)
        runs = [command + ["report.tex"]] if command[0] == "latexmk" else [command + ["report.tex"]] * 2
        output = []
        for run in runs:
            proc = subprocess.run(run, cwd=tmp, env=env, capture_output=True, text=True, errors="replace",
                                  timeout=600)
            output.append(proc.stdout + proc.stderr)
            if proc.returncode != 0 or not (Path(tmp) / "report.pdf").is_file():
                log = Path(tmp) / "report.log"
                log_text = log.read_text(errors="replace") if log.is_file() else output[-1]
                raise RuntimeError(f"LaTeX failed ({' '.join(run)}):\n{_latex_errors(log_text)}")
        with atomic_path(pdf_path) as target:
            shutil.move(str(Path(tmp) / "report.pdf"), target)
    return "\n".join(output)


def _latex_errors(log: str) -> str:
    """The error lines of a LaTeX log with a little context, or its tail."""
    lines = log.splitlines()
    hits = [i for i, line in enumerate(lines) if line.startswith("!") or re.match(r"^\S+:\d+: ", line)]
    if not hits:
        return "\n".join(lines[-30:])
    return "\n".join("\n".join(lines[i:i + 4]) for i in hits[:5])
