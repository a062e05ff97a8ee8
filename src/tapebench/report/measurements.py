"""The measured compute figures and the page made of them: `docs/measurements/*.json` hold one row per figure (its
value, unit, the command that measures it, the machine, the commit and the date), and `docs/compute.md` is rendered
from them through `templates/compute.md.j2` (`tapebench docs compute --out docs/compute.md`); never typed by hand.

A measurement file is `{"figures": {ID: ROW, ...}}`; a ROW has exactly the keys of `FIELDS` and may add a `note`.
IDs are unique over all files. The page uses every figure (an unused row is an error: a figure nobody shows is
not current), and a figure the page names that no file holds is an error naming the ID and the folder.
"""
from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

from tapebench.report.render import environment

MEASUREMENTS = Path("docs/measurements")
TEMPLATE = "compute.md.j2"
FIELDS = {"value": "a number", "unit": "a string", "command": "a string", "machine": "a string",
          "commit": "the full 40-character commit hash of the measured code", "date": "a date, YYYY-MM-DD"}
OPTIONAL = {"note": "a string"}
_ID = re.compile(r"[a-z0-9_]+")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_NO_SPACE_UNITS = {"x", "%"}


class MeasurementError(ValueError):
    """A measurement file or row that does not follow the schema, or a figure the page needs and no file holds."""


def _check_row(path: Path, key: str, row) -> None:
    where = f"{path}: figure {key!r}"
    if not _ID.fullmatch(key):
        raise MeasurementError(f"{where}: an ID is lower-case letters, digits and underscores")
    if not isinstance(row, dict):
        raise MeasurementError(f"{where}: a row is an object with keys {', '.join(FIELDS)}; got {type(row).__name__}")
    missing = [k for k in FIELDS if k not in row]
    unknown = sorted(set(row) - set(FIELDS) - set(OPTIONAL))
    if missing or unknown:
        raise MeasurementError(f"{where}: " + "; ".join(
            ([f"missing key(s) {', '.join(missing)}"] if missing else [])
            + ([f"unknown key(s) {', '.join(unknown)} (allowed: {', '.join([*FIELDS, *OPTIONAL])})"] if unknown
               else [])))
    value = row["value"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MeasurementError(f"{where}: key 'value' is {value!r}; it must be {FIELDS['value']}")
    for k in ("unit", "command", "machine", *(k for k in OPTIONAL if k in row)):
        if not isinstance(row[k], str) or not row[k].strip():
            raise MeasurementError(f"{where}: key {k!r} is {row[k]!r}; it must be a non-empty string")
    if not isinstance(row["commit"], str) or not _COMMIT.fullmatch(row["commit"]):
        raise MeasurementError(f"{where}: key 'commit' is {row['commit']!r}; it must be {FIELDS['commit']}")
    try:
        datetime.date.fromisoformat(row["date"])
    except (TypeError, ValueError):
        raise MeasurementError(f"{where}: key 'date' is {row['date']!r}; it must be {FIELDS['date']}") from None


def read_figures(folder=MEASUREMENTS) -> dict[str, dict]:
    """Every figure of every `*.json` in `folder` (not its subfolders: the raw `bench --json` outputs live there),
    checked against the schema: {ID: row}."""
    folder = Path(folder)
    paths = sorted(folder.glob("*.json"))
    if not paths:
        raise MeasurementError(f"{folder}: no measurement files (*.json) there")
    figures, source = {}, {}
    for path in paths:
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise MeasurementError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(data, dict) or set(data) != {"figures"} or not isinstance(data["figures"], dict):
            keys = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise MeasurementError(f"{path}: a measurement file is {{\"figures\": {{ID: row, ...}}}}; got {keys}")
        for key, row in data["figures"].items():
            _check_row(path, key, row)
            if key in figures:
                raise MeasurementError(f"{path}: figure {key!r} is also in {source[key]}; an ID names one figure")
            figures[key], source[key] = row, path
    return figures


def format_value(value, unit: str = "") -> str:
    """1234 -> '1,234'; seconds of a minute or more as 'M min S s'; 'x' and '%' without a space."""
    if unit == "s" and value >= 60:
        minutes, seconds = divmod(round(value), 60)
        return f"{minutes} min {seconds} s"
    text = f"{value:,}"
    if not unit:
        return text
    return text + unit if unit in _NO_SPACE_UNITS else f"{text} {unit}"


class Figures:
    """What the template reads: `fig(ID)` the value with its unit, `val(ID)` without, `raw(ID)` the number,
    `when(ID)` the machine and date; it records which IDs the page used."""

    def __init__(self, figures: dict[str, dict], folder):
        self._figures, self._folder, self.used = figures, folder, set()

    def row(self, key: str) -> dict:
        if key not in self._figures:
            raise MeasurementError(f"the page names figure {key!r}, which no file in {self._folder} holds")
        self.used.add(key)
        return self._figures[key]

    def fig(self, key: str) -> str:
        row = self.row(key)
        return format_value(row["value"], row["unit"])

    def val(self, key: str) -> str:
        return format_value(self.row(key)["value"])

    def raw(self, key: str):
        return self.row(key)["value"]

    def when(self, key: str) -> str:
        row = self.row(key)
        return f"{row['machine']}, {row['date']}"

    def command(self, key: str) -> str:
        return self.row(key)["command"]


def compute_markdown(folder=MEASUREMENTS) -> str:
    """docs/compute.md from the figures in `folder`."""
    figures = Figures(read_figures(folder), folder)
    text = environment().get_template(TEMPLATE).render(f=figures, folder=str(folder))
    unused = sorted(set(figures._figures) - figures.used)
    if unused:
        raise MeasurementError(f"{len(unused)} figure(s) of {folder} appear nowhere on the page: "
                               f"{', '.join(unused[:10])}{' ...' if len(unused) > 10 else ''}; show them in "
                               f"templates/{TEMPLATE} or delete their rows")
    return text
