"""Every table and figure: one registry, from which the `tapebench render` CLI and the Snakemake render
rules (workflow/rules/report.smk) are both generated.

An entry says what the output is (`kind` table or figure, a title for the HTML report), which options its
builder takes (`Option`: files the pipeline produces are inputs of the render job, the rest are values),
the builder (`"module:function"`, imported when it runs; called with the parsed options and `out`), and
`jobs(config)`: the render jobs this config asks for, each with the concrete input paths and values (no
job: the output is not built for this config, e.g. the world-model table without a world model).

Adding a figure is one builder function plus one entry here. A table's `out` is a .tex file; a figure's
`out` is a path stem and the builder writes `<stem>.pdf` and `<stem>.png`.
"""
from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from tapebench import layout
from tapebench.registry import get_method
from tapebench.rules.family import config_family

TABLE, FIGURE = "table", "figure"


@dataclass(frozen=True)
class Option:
    """One option of a builder: `--name` on the CLI, an input (file) or param (value) of its render job."""

    name: str
    help: str
    file: bool = True          # a file another stage writes (a Snakemake input)
    many: bool = False         # several values (nargs "+")
    required: bool = True
    type: Callable = str
    default: Any = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class Job:
    """One render job of an entry for a given config."""

    name: str                   # rule name suffix and log name
    out: str                    # .tex path (table) or figure stem
    values: dict                # option name -> path / list of paths / value

    def files(self, entry: "Output") -> dict:
        return {o.name: self.values[o.name] for o in entry.options if o.file and self.values.get(o.name) not in
                (None, [])}

    def args(self, entry: "Output") -> list[str]:
        """`tapebench render` arguments: the entry id, every option given, --out."""
        args = [entry.id]
        for o in entry.options:
            value = self.values.get(o.name)
            if value is None or value == []:
                continue
            args.append(o.flag)
            args.extend(str(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
        return [*args, "--out", self.out]

    def outputs(self, entry: "Output") -> dict:
        if entry.kind == TABLE:
            return {"tex": self.out}
        return {"pdf": f"{self.out}.pdf", "png": f"{self.out}.png"}


@dataclass(frozen=True)
class Output:
    id: str
    kind: str
    title: str
    build: str                              # "module:function"
    options: tuple[Option, ...]
    jobs: Callable[[dict], list[Job]]
    category: str = "Tables"
    extra_outputs: Callable[[Job], dict] = field(default=lambda job: {})   # e.g. a Parquet beside a table

    def builder(self) -> Callable:
        module, func = self.build.split(":")
        return getattr(importlib.import_module(module), func)

    def run(self, args: argparse.Namespace) -> None:
        values = {o.name: getattr(args, o.name) for o in self.options}
        self.builder()(out=args.out, **values)


# --- the entries ---------------------------------------------------------------------------------------------
def elementary_only(jobs: Callable[[dict], list[Job]]) -> Callable[[dict], list[Job]]:
    """Jobs of an output that exists only for the elementary family (fixed rules 0, 30, 90..., 2^L tables, a
    belief over the 256 rules): none when the config's rule family is another (docs/protocol.md#rule-sets)."""
    def family_jobs(config):
        return jobs(config) if config_family(config).elementary else []
    return family_jobs


def _main(config) -> str:
    return config["main_split"]


def _result_table(table: str) -> Callable[[dict], list[Job]]:
    def jobs(config):
        split = _main(config)
        values = {"aggregate": layout.aggregate(split), "split": split}
        if table == "table2":
            values["H"] = list(config["evaluation"]["horizons"])
        else:
            values["H"] = config["env"]["H"]
        if table == "table3":
            values["split_file"] = layout.split_file(split)
            values["random_per_rule"] = (layout.per_rule(split, "random", config["env"]["H"])
                                         if "random" in config["methods"] else None)
        return [Job(table, f"results/{table}.tex", values)]
    return jobs


def _table1_jobs(config):
    feas = config["oracle"].get("feasibility", {"L": 16, "H": 16})
    split, H = _main(config), config["env"]["H"]
    if not config_family(config).elementary:   # exact feasibility and the fixed-z oracle rows are elementary
        return [Job("table1", "results/table1.tex", {
            "mpc": [layout.mpc_records(split, side, H) for side in ("train", "test")]})]
    return [Job("table1", "results/table1.tex", {
        "mpc": [layout.mpc_records(split, side, H) for side in ("train", "test")] + [layout.fixed_z(feas, "mpc")],
        "exact": [layout.fixed_z(feas, "exact")], "feasibility": layout.feasibility(feas)})]


def _table7_jobs(config):
    return [Job("table7", "results/table7.tex", {"by_type": layout.mpc_by_type(_main(config))})]


def _identifiability_jobs(config):
    return [Job(f"identifiability_{layout.rule_safe(split)}", f"results/identifiability/{split}.tex",
                {"identifiability": layout.identifiability(split)}) for split in config["splits"]]


def _model_error_jobs(config):
    if not any(get_method(m).trains and get_method(m).world_model for m in config["methods"]):
        return []
    split = _main(config)
    return [Job("model_error", "results/diagnostics/model_error.tex", {
        "model_error": layout.model_error_aggregate(split), "aggregate": layout.aggregate(split), "split": split,
        "H": config["env"]["H"], "depth": config["diagnostics"]["model_error"]["depth"],
        "figure": "results/figures/model_error"})]


def _sweep_jobs(config):
    sweep = config["diagnostics"]["sweep"]
    if sweep["method"] not in config["methods"]:
        return []
    split, values = _main(config), [int(v) for v in sweep["values"]]
    points = [layout.sweep_point(split, sweep["method"], sweep["hyperparameter"], v) for v in values]
    stats = config["statistics"]
    return [Job("sweep", "results/diagnostics/sweep.tex", {
        "method": sweep["method"], "hyperparameter": sweep["hyperparameter"], "values": values,
        "per_seed": [p["per_seed"] for p in points], "model_error": [p["model_error"] for p in points],
        "split": split, "H": config["env"]["H"], "n_resamples": stats["n_resamples"], "ci": stats["ci"],
        "seed": stats["seed"], "parquet": "results/diagnostics/sweep.parquet", "figure": "results/figures/sweep"})]


def _value(name, help, type=str, many=False, required=True, default=None) -> Option:
    return Option(name, help, file=False, type=type, many=many, required=required, default=default)


_AGGREGATE = Option("aggregate", "aggregate Parquet from `tapebench aggregate`")
_SPLIT = _value("split", "split name as in the aggregate table")
_AGENTS = _value("agents", "methods and their order (default: all, grouped by family)", many=True, required=False)
_L = _value("L", "tape length (needed only if the table holds several)", type=int, required=False)

_CORE: list[Output] = [
    Output("table1", TABLE, "Table 1: planning reference (MPC, exact optimum) and feasibility",
           "tapebench.report.oracle_tables:render_table1_cli", (
               Option("mpc", "MPC records Parquet(s), one row each", many=True),
               Option("exact", "exact-optimum records Parquet(s), one row each", many=True, required=False),
               Option("feasibility", "feasibility Parquet (tapebench feasibility)", required=False)),
           _table1_jobs),
    Output("table2", TABLE, "Table 2: holdout length, success and final distance, ID/OOD x H",
           "tapebench.report.tables:render_table2", (
               _AGGREGATE, _SPLIT, _value("H", "evaluation horizons (default: all in the table)", int, many=True,
                                          required=False), _L, _AGENTS),
           _result_table("table2")),
    Output("table3", TABLE, "Table 3: ID vs OOD success, drop, OOD return, ON(p), with bootstrap CIs",
           "tapebench.report.tables:render_table3", (
               _AGGREGATE, _SPLIT, _value("H", "evaluation horizon (default 32)", int, required=False, default=32),
               _L, _AGENTS,
               Option("split_file", "split JSON: the caption counts test rules solved by any action", required=False),
               Option("random_per_rule", "the random policy's per-rule Parquet: the caption counts test rules it "
                                         "solves in >= 90% of episodes", required=False)),
           _result_table("table3")),
    Output("table4", TABLE, "Table 4: final distance, AUC, soft success@0.1 by family",
           "tapebench.report.tables:render_table4", (
               _AGGREGATE, _SPLIT, _value("H", "evaluation horizon (default 32)", int, required=False, default=32),
               _L, _AGENTS),
           _result_table("table4")),
    Output("table7", TABLE, "Table 7: true-dynamics MPC strict success by rule type",
           "tapebench.report.oracle_tables:render_table7_cli", (
               Option("by_type", "by-type JSON (tapebench export-mpc-by-type)"),),
           _table7_jobs),
    Output("identifiability", TABLE, "Identifiability of the rule by operational type",
           "tapebench.report.identifiability:render_identifiability_cli", (
               Option("identifiability", "Parquet from `tapebench identifiability`"),),
           elementary_only(_identifiability_jobs), category="Belief and identifiability"),
    Output("model_error", TABLE, "World models: success beside open-loop prediction error, ID / OOD",
           "tapebench.report.world_model:render_model_error_cli", (
               Option("model_error", "aggregate from `tapebench aggregate-model-error`"),
               Option("aggregate", "aggregate Parquet from `tapebench aggregate` (the success columns)",
                      required=False),
               _SPLIT, _value("H", "evaluation horizon of the success columns (default 32)", int, required=False,
                              default=32),
               _value("depth", "the deep open-loop column (default 16)", int, required=False, default=16),
               _value("figure", "also write the error-vs-depth figure to FIGURE.pdf and FIGURE.png",
                      required=False)),
           _model_error_jobs, category="World models",
           extra_outputs=lambda job: {"pdf": f"{job.values['figure']}.pdf", "png": f"{job.values['figure']}.png"}),
    Output("sweep", TABLE, "Sensitivity of one method to one hyperparameter (success, one-step error)",
           "tapebench.report.world_model:render_sweep_cli", (
               _value("method", "the swept method's id"), _value("hyperparameter", "the swept field of its Config"),
               _value("values", "the swept values, in order", int, many=True),
               Option("per_seed", "one per-seed table per value (same order)", many=True),
               Option("model_error", "one model-error aggregate per value (same order)", many=True),
               _SPLIT, _value("H", "evaluation horizon (default 32)", int, required=False, default=32),
               _value("n_resamples", "bootstrap resamples (default 2000)", int, required=False, default=2000),
               _value("ci", "confidence level (default 0.95)", float, required=False, default=0.95),
               _value("seed", "bootstrap seed (default 0)", int, required=False, default=0),
               _value("parquet", "also write the summary table", required=False),
               _value("figure", "also write the figure to FIGURE.pdf and FIGURE.png", required=False)),
           _sweep_jobs, category="World models",
           extra_outputs=lambda job: {"parquet": job.values["parquet"], "pdf": f"{job.values['figure']}.pdf",
                                      "png": f"{job.values['figure']}.png"}),
]

# Modules that contribute entries: each defines `ENTRIES: list[Output]` (figures, studies, ...).
ENTRY_MODULES: tuple[str, ...] = ("tapebench.report.figure_entries", "tapebench.report.study_entries",
                                  "tapebench.report.noise_entries", "tapebench.report.ladder",
                                  "tapebench.report.health_entries", "tapebench.report.protocol_comparison")


def _assemble() -> dict[str, Output]:
    entries = list(_CORE)
    for name in ENTRY_MODULES:
        entries.extend(importlib.import_module(name).ENTRIES)
    ids = [e.id for e in entries]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        raise ValueError(f"report registry: output ids registered twice: {duplicated}")
    return {e.id: e for e in entries}


OUTPUTS: dict[str, Output] = _assemble()


def outputs() -> list[Output]:
    return list(OUTPUTS.values())


def jobs(config: dict) -> list[tuple[Output, Job]]:
    """Every render job the config asks for, in registry order."""
    return [(entry, job) for entry in OUTPUTS.values() for job in entry.jobs(config)]


def targets(config: dict) -> list[str]:
    """The files the render jobs of this config write (the pipeline's default targets)."""
    files = []
    for entry, job in jobs(config):
        files.extend(job.outputs(entry).values())
        files.extend(entry.extra_outputs(job).values())
    return files
