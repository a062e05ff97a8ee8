"""What one table or figure of the report is: `Output` (an entry of `report/registry.py`), the `Option`s its
builder takes, and the render `Job`s a config asks for. The registry lists the entries; `tapebench render`
and the Snakemake render rules (workflow/rules/report.smk) are generated from them.

An entry says what the output is (`kind` table or figure, a title for the HTML report), which options its
builder takes (`Option`: files the pipeline produces are inputs of the render job, the rest are values),
the builder (`"module:function"`, imported when it runs; called as `builder(out=..., **options)`), and
`jobs(config)`: the render jobs this config asks for, each with the concrete input paths and values (no
job: the output is not built for this config, e.g. the world-model table without a world model).

A table's `out` is a .tex file; a figure's `out` is a path stem and the builder writes `<stem>.pdf` and
`<stem>.png`.
"""
from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from tapebench.grid_rules import GridFamily
from tapebench.rule_family import config_family

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
    config_key: str | None = None   # the config key whose bounds a value (each value of `many`) must keep

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


def elementary_only(jobs: Callable[[dict], list[Job]]) -> Callable[[dict], list[Job]]:
    """Jobs of an output that exists only for the elementary family (fixed rules 0, 30, 90..., 2^L tables, a
    belief over the 256 rules): none when the config's rule family is another (docs/protocol.md#rule-sets)."""
    def family_jobs(config):
        return jobs(config) if config_family(config).elementary else []
    return family_jobs


def grid_only(jobs: Callable[[dict], list[Job]]) -> Callable[[dict], list[Job]]:
    """Jobs of an output that exists only for the 2D grid family (grid rollouts): none on a tape family
    (docs/protocol.md#grid-pipeline)."""
    def family_jobs(config):
        return jobs(config) if isinstance(config_family(config), GridFamily) else []
    return family_jobs
