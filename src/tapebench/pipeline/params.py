"""The config's own bounds for what a command is given by hand: the sections of a job's `--params` and the options
that stand for a config key, checked against the config schema (workflow/schemas/config.schema.yaml) that
`validate_config` checks a whole config with, so a command run by hand accepts what the pipeline accepts and no
more. Each error names the option or `--params` key, the config key it stands for, and what that key allows.

  check_sections(params, {"env": "env", "evaluation": "evaluation"})   # --params sections -> config sections
  check_options(args, {"H": "evaluation.horizons[]"})                  # an option -> a config key ([]: an item)

Keys of a section that the config does not have (e.g. `evaluation.noise`, `evaluation.checkpoints`) are left to the
command's own checks.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

import jsonschema
import yaml

SCHEMA_FILE = Path("workflow") / "schemas" / "config.schema.yaml"
# the bootstrap options of every aggregate and statistics output (--n-resamples, --ci, --seed) -> their config keys
STATISTICS_OPTIONS = {"n_resamples": "statistics.n_resamples", "ci": "statistics.ci", "seed": "statistics.seed"}


class ConfigError(ValueError):
    """A config value (or a command's value that stands for one) outside what the config allows."""


def validator(schema: dict):
    """Draft 2020-12, except that 5.0 is not an integer (range(5.0) fails later, far from the key)."""
    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine(
        "integer", lambda _, v: isinstance(v, int) and not isinstance(v, bool))
    return jsonschema.validators.extend(base, type_checker=checker)(schema)


def schema_path() -> Path:
    """The config schema of this checkout (beside `src/`), else of the pipeline folder the command runs in."""
    candidates = (Path(__file__).resolve().parents[3] / SCHEMA_FILE, Path.cwd() / SCHEMA_FILE)
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(f"the config schema {SCHEMA_FILE} is needed to check the parameters and was not found "
                            f"(looked in {', '.join(str(p) for p in candidates)}); run from the pipeline folder")


@functools.lru_cache(maxsize=None)
def _schema(path: str) -> dict:
    return yaml.safe_load(Path(path).read_text())


def config_schema() -> dict:
    return _schema(str(schema_path()))


def key_schema(key: str, schema: dict | None = None) -> dict | None:
    """The schema of config key `key` ("studies.fewshot.shots", "evaluation.horizons[]" for one item), or None
    when the config has no such key."""
    node = config_schema() if schema is None else schema
    for part in key.split("."):
        items = part.endswith("[]")
        node = node.get("properties", {}).get(part[:-2] if items else part)
        if node is None:
            return None
        if items:
            node = node.get("items")
            if node is None:
                return None
    return node


def allowed(schema: dict) -> str:
    """What a schema allows, in words: 'an integer in 1..1024', 'one of ['auto', 'always']', ..."""
    if "enum" in schema:
        return f"one of {schema['enum']}"
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
    if "array" in kinds:
        size = f"up to {schema['maxItems']} " if "maxItems" in schema else ""
        each = allowed(schema.get("items", {}))
        return f"a list of {size}items, each {each}" if each else f"a list of {size}items"
    if "object" in kinds:
        return "a mapping"
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    word = "an integer" if "integer" in kinds else "a number" if "number" in kinds else \
        " or ".join(kinds) if kinds else ""
    if low is None and high is None:
        return word
    if "integer" in kinds and "exclusiveMinimum" not in schema and "exclusiveMaximum" not in schema:
        return f"{word} in {low}..{high}" if low is not None and high is not None else \
            f"{word} >= {low}" if low is not None else f"{word} <= {high}"
    left = "(" if "exclusiveMinimum" in schema else "["
    right = ")" if "exclusiveMaximum" in schema else "]"
    return f"{word} in {left}{-math.inf if low is None else low:g}, {math.inf if high is None else high:g}{right}"


def check_value(value, key: str, given_as: str, params_key: bool = False):
    """`value` as config key `key` allows it; else ConfigError naming `given_as` (an option, or with `params_key` a
    --params key), the config key and what it allows. Returns the value."""
    schema = key_schema(key)
    if schema is None:
        raise KeyError(f"the config has no key {key!r}")
    errors = sorted(validator(schema).iter_errors(value), key=lambda e: list(e.absolute_path))
    if errors:
        error = errors[0]
        where = given_as + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        where = f"--params key '{where}'" if params_key else where
        name = f"'{key[:-2]}' (each item)" if key.endswith("[]") else f"'{key}'"
        raise ConfigError(f"{where}: {error.message}; the config key {name} it stands for allows {allowed(schema)}")
    return value


def check_sections(params: dict, sections: dict, skip: tuple = ()) -> None:
    """Each key of the `--params` sections named in `sections` (section -> its config section, e.g. "fewshot" ->
    "studies.fewshot") that the config has, checked as the config checks it; `skip`: "section.key" left to the
    command (where the command accepts more than the config, e.g. `tapebench train`'s stacking "never")."""
    for section, prefix in sections.items():
        for key, value in (params.get(section) or {}).items():
            if f"{section}.{key}" in skip or key_schema(f"{prefix}.{key}") is None:
                continue
            check_value(value, f"{prefix}.{key}", f"{section}.{key}", params_key=True)


def check_options(args, options: dict) -> None:
    """Each option of `args` named in `options` (its attribute -> the config key it stands for) that was given,
    checked as the config checks that key."""
    for name, key in options.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        check_value(list(value) if isinstance(value, tuple) else value, key, "--" + name.replace("_", "-"))
