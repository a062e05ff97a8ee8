"""Config validation (before any job runs) and the config slices that become each job's params.

A job's params are exactly the slice of the config it uses, so editing one agent's
hyperparameter changes only that agent's jobs (and what depends on them).
"""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import yaml


class ConfigError(ValueError):
    pass


def _key_path(error: jsonschema.ValidationError) -> str:
    parts = [str(p) for p in error.absolute_path]
    return ".".join(parts) if parts else "<top level>"


def _apply_defaults(schema: dict, config: dict) -> None:
    for key, sub in schema.get("properties", {}).items():
        if key not in config and "default" in sub:
            config[key] = sub["default"]
        if isinstance(config.get(key), dict):
            _apply_defaults(sub, config[key])
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for key, value in config.items():
            if key not in schema.get("properties", {}) and isinstance(value, dict):
                _apply_defaults(extra, value)


def validate_config(config: dict, schema_path) -> dict:
    """Validate against the JSON schema plus cross-field checks; fill defaults; raise ConfigError naming the key."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(config),
                    key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"  config key '{_key_path(e)}': {e.message}" for e in errors[:10]]
        raise ConfigError("invalid configuration:\n" + "\n".join(lines))
    _apply_defaults(schema, config)
    if config["main_split"] not in config["splits"]:
        raise ConfigError(f"config key 'main_split': {config['main_split']!r} is not one of the configured "
                          f"splits {sorted(config['splits'])}")
    if config["training"]["eval_every"] > config["training"]["total_steps"]:
        raise ConfigError(f"config key 'training.eval_every': {config['training']['eval_every']} exceeds "
                          f"training.total_steps = {config['training']['total_steps']}")
    from ..methods import check_hyperparameters, registry

    methods = registry()
    for i, method in enumerate(config["methods"]):
        if method not in methods:
            raise ConfigError(f"config key 'methods[{i}]': unknown method {method!r}; registered methods: "
                              f"{sorted(methods)} (`tapebench methods` lists them)")
        if method == "exact" and config["env"]["L"] > 20:
            raise ConfigError(f"config key 'methods[{i}]': the exact optimum enumerates all 2^L tapes and needs "
                              f"env.L <= 20, but env.L = {config['env']['L']}")
    for agent, overrides in config["agents"].items():
        if agent not in methods:
            raise ConfigError(f"config key 'agents.{agent}': unknown method; registered methods: {sorted(methods)}")
        try:
            check_hyperparameters(agent, overrides)
        except ValueError as exc:
            raise ConfigError(f"config key 'agents.{agent}': {exc}") from None
    return config


def dumps(obj) -> str:
    """Canonical JSON for a params string (stable across runs, so Snakemake's params trigger is exact)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def train_slice(config: dict, agent: str) -> dict:
    return {
        "agent": config["agents"].get(agent, {}),
        "env": config["env"],
        "training": {k: config["training"][k] for k in ("total_steps", "eval_every")},
    }


def eval_slice(config: dict) -> dict:
    ev = config["evaluation"]
    return {
        "env": config["env"],
        "evaluation": {"episodes_per_rule": ev["episodes_per_rule"], "eval_seed": ev["eval_seed"]},
    }


def method_eval_slice(config: dict, method: str) -> dict:
    """The evaluation job of a method that does not train also depends on its hyperparameters."""
    return {"agent": config["agents"].get(method, {}), **eval_slice(config)}
