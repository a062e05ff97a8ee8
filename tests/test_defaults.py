"""The paper protocol's defaults agree in their three homes: tapebench.defaults (what Python falls back to),
config/config.yaml (the paper protocol every preset is merged onto) and the `default:` entries of
workflow/schemas/config.schema.yaml (what a config that leaves a key out gets). The rule: tapebench/defaults.py."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from tapebench import defaults

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config" / "config.yaml"
SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"

# keys whose schema default means "off" or "none" and which config.yaml turns on for the paper run
SCHEMA_OFF = {
    "training.gpus": "0 = CPU only",
    "studies.noise.levels": "[] = the noise study is off",
    "studies.worldtest.methods": "[] = the world test is off",
    "studies.ladder.train_types": "[] = classes of any type",
    "studies.fewshot.methods": "[] = the few-shot study is off",
}
ABSENT = object()


def _plain(value):
    """Tuples as lists, so that a constant (1, 2) equals the YAML list [1, 2]."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _same(a, b) -> bool:
    """Equal values of the same kind: 1 and 1.0 are the same number, True is not the number 1."""
    a, b = _plain(a), _plain(b)
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        return a == b
    return type(a) is type(b) and a == b


def _walk(schema: dict, config, path: str = ""):
    """(dotted key, schema default or ABSENT, config.yaml value or ABSENT) for every key the schema names and every
    key config.yaml sets under an additionalProperties schema (e.g. each split's `unit`)."""
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties")
    keys = list(properties)
    if isinstance(extra, dict) and isinstance(config, dict):
        keys += [k for k in config if k not in properties]
    for key in keys:
        sub = properties.get(key, extra)
        value = config.get(key, ABSENT) if isinstance(config, dict) else ABSENT
        name = f"{path}.{key}" if path else key
        yield name, sub.get("default", ABSENT), value
        if "properties" in sub or isinstance(sub.get("additionalProperties"), dict):
            yield from _walk(sub, value if isinstance(value, dict) else {}, name)


def _mismatches(config: dict, schema: dict) -> list[str]:
    rows = {name: (default, value) for name, default, value in _walk(schema, config)}
    problems = []
    for name, constant in defaults.CONFIG_KEYS.items():
        default, value = rows.get(name, (ABSENT, ABSENT))
        if value is ABSENT:
            problems.append(f"{name}: tapebench.defaults names it but config/config.yaml does not set it")
        elif not _same(value, constant) or (default is not ABSENT and not _same(default, constant)):
            shown = "(none)" if default is ABSENT else repr(default)
            problems.append(f"{name}: tapebench.defaults {constant!r}, config/config.yaml {value!r}, "
                            f"schema default {shown}")
    for name, (default, value) in rows.items():
        if name in defaults.CONFIG_KEYS or default is ABSENT or value is ABSENT or isinstance(value, dict):
            continue
        if name in SCHEMA_OFF:
            if _same(default, value):
                problems.append(f"{name}: listed as an 'off' schema default ({SCHEMA_OFF[name]}) but "
                                f"config/config.yaml repeats it ({value!r}); remove it from SCHEMA_OFF")
        elif not _same(default, value):
            problems.append(f"{name}: config/config.yaml {value!r}, schema default {default!r}")
    for name in SCHEMA_OFF:
        if name not in rows:
            problems.append(f"{name}: listed in SCHEMA_OFF but not a key of the schema")
    return problems


def _load():
    return yaml.safe_load(CONFIG.read_text()), yaml.safe_load(SCHEMA.read_text())


def test_config_yaml_schema_defaults_and_tapebench_defaults_agree_key_by_key():
    config, schema = _load()
    problems = _mismatches(config, schema)
    assert not problems, "protocol defaults disagree:\n  " + "\n  ".join(problems)


def test_a_changed_value_in_any_of_the_three_places_is_named(monkeypatch):
    config, schema = _load()
    config["evaluation"]["eval_seed"] += 1
    assert _mismatches(config, schema) == [
        f"evaluation.eval_seed: tapebench.defaults {defaults.EVAL_SEED}, config/config.yaml {defaults.EVAL_SEED + 1}, "
        f"schema default (none)"]
    config, schema = _load()
    schema["properties"]["diagnostics"]["properties"]["model_error"]["properties"]["depth"]["default"] = 8
    depth = defaults.MODEL_ERROR_DEPTH
    assert _mismatches(config, schema) == [
        f"diagnostics.model_error.depth: tapebench.defaults {depth}, config/config.yaml {depth}, schema default 8"]
    config, schema = _load()
    monkeypatch.setitem(defaults.CONFIG_KEYS, "statistics.ci", 0.9)
    assert _mismatches(config, schema) == [
        f"statistics.ci: tapebench.defaults 0.9, config/config.yaml {config['statistics']['ci']}, "
        "schema default (none)"]
    monkeypatch.undo()
    config, schema = _load()
    seeds = schema["properties"]["studies"]["properties"]["fixed_z"]["properties"]["seeds"]
    seeds["default"] += 1
    assert _mismatches(config, schema) == [
        f"studies.fixed_z.seeds: config/config.yaml {config['studies']['fixed_z']['seeds']}, schema default "
        f"{seeds['default']}"]
    config, schema = _load()
    config["training"]["gpus"] = 0
    assert [p.split(":")[0] for p in _mismatches(config, schema)] == ["training.gpus"]
    config, schema = _load()
    config["env"]["success_bonus"] = True          # a bool is not the number 1
    assert [p.split(":")[0] for p in _mismatches(config, schema)] == ["env.success_bonus"]


def test_python_dataclass_defaults_are_the_config_values():
    """The dataclasses whose fields are config keys default to config.yaml's values: the world test's task
    settings, the oracle planner, the rule features, the severity ladder, a training run."""
    from tapebench.evaluation.worldtest import WorldTestSettings
    from tapebench.methods.mpc import MPCConfig
    from tapebench.rules.features import FeatureProtocol
    from tapebench.splits.ladder import LadderParams
    from tapebench.training.loop import TrainSpec

    config, _ = _load()
    assert WorldTestSettings.from_config(config["studies"]["worldtest"]) == WorldTestSettings()
    oracle = config["oracle"]
    assert MPCConfig(horizon=oracle["horizon"], candidates=oracle["candidates"], seed=oracle["seed"]) == MPCConfig()
    assert FeatureProtocol(**config["features"]) == FeatureProtocol()
    ladder = config["studies"]["ladder"]
    params = LadderParams(name=ladder["name"])
    for key in ("train_classes", "levels", "level_size", "seed"):
        default = getattr(params, key)
        assert _same(default, ladder[key]), (f"studies.ladder.{key}: LadderParams default {default!r}, "
                                             f"config/config.yaml {ladder[key]!r}")
    fields = {f.name: f.default for f in dataclasses.fields(TrainSpec)}
    # env.goal / env.goal_steps are the evaluation episodes' (docs/protocol.md#multi-goal), not a training run's
    training_env = {k: config["env"][k] for k in ("L", "H", "success_bonus")}
    for key, value in {**training_env, **{k: config["training"][k] for k in ("total_steps", "eval_every")}}.items():
        assert _same(fields[key], value), f"TrainSpec.{key} default {fields[key]!r}, config/config.yaml {value!r}"


def _agent_mismatches(agents: dict) -> list[str]:
    from tapebench.registry import build_config

    problems = []
    for method, overrides in agents.items():
        default = dataclasses.asdict(build_config(method, {}))
        for key, value in overrides.items():
            if not _same(default[key], value):
                problems.append(f"agents.{method}.{key}: the method's Config default {default[key]!r}, "
                                f"config/config.yaml {value!r}")
    return problems


def test_agents_entries_in_config_yaml_repeat_the_method_defaults():
    """config.yaml is the paper protocol, whose hyperparameters are the methods' Config defaults: an `agents:`
    entry there may only restate a default (a preset is where a hyperparameter is changed)."""
    from tapebench.registry import build_config

    config, _ = _load()
    assert _agent_mismatches(config["agents"]) == []
    rate = build_config("dqn", {}).learning_rate
    assert _agent_mismatches({"dqn": {"learning_rate": rate}}) == []
    assert _agent_mismatches({"dqn": {"learning_rate": rate * 10}}) == [
        f"agents.dqn.learning_rate: the method's Config default {rate!r}, config/config.yaml {rate * 10!r}"]
