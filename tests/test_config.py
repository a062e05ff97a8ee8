"""Config validation: hostile values stop at validation with the key named (bounds, cross-field
checks, rule lists), numbers given as text by `snakemake --config` are read as numbers, and a
malformed config file is reported with its name."""
from __future__ import annotations

import copy

import pytest
import yaml
from pipeline_helpers import REPO

from tapebench.pipeline.config import (ConfigError, load_config, load_config_file, merge_config, train_slice,
                                       training_gpus, training_stacking, validate_config)
from tapebench.settings import MAX_CHECKPOINTS_PER_RUN

SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
INJECTION = "0-255 --out x; touch /tmp/INJECTED; true"


def paper_config(**override) -> dict:
    config = load_config(root=REPO)
    return merge_config(config, copy.deepcopy(override))


def assert_rejected(config: dict, key: str, message: str = "") -> str:
    with pytest.raises(ConfigError) as info:
        validate_config(config, SCHEMA)
    text = str(info.value)
    assert f"'{key}'" in text, text
    assert message in text, text
    return text


def test_the_shipped_configs_are_valid():
    validate_config(paper_config(), SCHEMA)
    validate_config(merge_config(paper_config(), load_config_file(REPO / "config/quick.yaml")), SCHEMA)
    validate_config(merge_config(paper_config(), load_config_file(REPO / "tests/data/tiny.yaml")), SCHEMA)
    validate_config(merge_config(paper_config(), load_config_file(REPO / "config/equivariant.yaml")), SCHEMA)
    validate_config(merge_config(paper_config(), load_config_file(REPO / "config/multigoal.yaml")), SCHEMA)
    validate_config(merge_config(paper_config(), load_config_file(REPO / "config/multigoal_quick.yaml")), SCHEMA)


@pytest.mark.parametrize("override, key, message", [
    ({"seeds": 1_000_000}, "seeds", "greater than the maximum of 1000"),       # hung DAG building
    ({"seeds": 10**20}, "seeds", "greater than the maximum of 1000"),          # OverflowError, no key
    ({"seeds": 5.0}, "seeds", "not of type 'integer'"),
    ({"training": {"total_steps": 10**15, "eval_every": 1}}, "training.total_steps", "maximum"),
    ({"training": {"total_steps": 10**8, "eval_every": 1}}, "training.eval_every",
     f"at most {MAX_CHECKPOINTS_PER_RUN} are allowed (eval_every >= 100000)"),
    ({"evaluation": {"last_k": 21}}, "evaluation.last_k", "more than the 20 checkpoint(s) of a run"),
    ({"training": {"total_steps": 50_000, "eval_every": 25_000}}, "evaluation.last_k", "use last_k <= 2"),
    ({"splits": {"main": {"method": "diverse", "test_size": 30, "seed": 0, "rules": "0-300"}}},
     "splits.main.rules", "got 256"),
    ({"splits": {"main": {"method": "diverse", "test_size": 30, "seed": 0, "rules": INJECTION}}},
     "splits.main.rules", "cannot parse rule list item"),
    ({"splits": {"main": {"method": "random", "test_size": 200, "seed": 0, "rules": "0-100"}}},
     "splits.main.test_size", "at most 99"),
    ({"splits": {"main": {"method": "random", "test_size": 5, "seed": 0, "rules": "0-4", "unit": "rule"}}},
     "splits.main.test_size", "at most 4"),
    ({"splits": {"main": {"method": "random", "test_size": 1, "seed": 0, "rules": "30,86"}}},
     "splits.main.rules", "single mirror class"),
    ({"env": {"success_bonus": float("nan")}}, "env.success_bonus", "not a finite number"),
    ({"statistics": {"ci": float("inf")}}, "statistics.ci", "not a finite number"),
    ({"evaluation": {"eval_seed": 2**70}}, "evaluation.eval_seed", "maximum of 4294967295"),
    ({"env": {"H": 10**9}}, "env.H", "maximum of 1024"),
    ({"evaluation": {"horizons": [32, 10**7]}}, "evaluation.horizons.1", "maximum of 1024"),
    ({"training": {"threads": 10**6}}, "training.threads", "maximum of 256"),
    ({"oracle": {"candidates": 10**9}}, "oracle.candidates", "maximum of 65536"),
    ({"env": {"goal": "ones"}}, "env.goal", "is not one of ['zeros', 'derived']"),
    ({"env": {"goal_steps": 65}}, "env.goal_steps", "maximum of 64"),
    ({"env": {"goal_steps": 0}}, "env.goal_steps", "minimum of 1"),
    ({"env": {"goal": "derived"}, "methods": ["mpc", "goal_blind"]}, "methods[1]",
     "'goal_blind' does not take an episode's goal"),
    ({"env": {"goal": "derived"}, "methods": ["mpc"], "studies": {"ladder": {"methods": ["random", "goal_blind"]}}},
     "studies.ladder.methods[1]", "does not take an episode's goal"),
    ({"methods": ["dqn", "dqn_her"]}, "methods[1]", "'dqn_her' learns from the goals of the multi-goal protocol, so "
     "it needs env.goal: derived (docs/protocol.md#multi-goal), got env.goal: zeros"),
    ({"studies": {"ladder": {"methods": ["dqn_her"]}}}, "studies.ladder.methods[0]", "needs env.goal: derived"),
    ({"studies": {"fixed_z": {"table6": {"multi_rule": ["rad_dqn", "dqn_her"]}}}},
     "studies.fixed_z.table6.multi_rule[1]", "needs env.goal: derived"),
    ({"env": {"goal": "derived"}, "methods": ["dqn_her"], "agents": {"dqn_her": {"her_strategy": "none"}}},
     "agents.dqn_her", "'her_strategy' of method 'dqn_her' (DQN + HER) is fixed at 'future'"),
])
def test_hostile_values_stop_at_validation_naming_the_key(override, key, message, goal_blind_method):
    assert_rejected(paper_config(**override), key, message)


def test_a_valid_rule_subset_and_test_size_pass():
    config = paper_config(splits={"main": {"method": "random", "test_size": 98, "seed": 0, "rules": "0-99"}})
    validate_config(config, SCHEMA)


def _numeric_leaves(schema: dict, key: str = ""):
    if schema.get("type") in ("integer", "number"):
        yield key, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _numeric_leaves(sub, f"{key}.{name}" if key else name)
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _numeric_leaves(schema["additionalProperties"], f"{key}.*")
    if isinstance(schema.get("items"), dict):
        yield from _numeric_leaves(schema["items"], f"{key}[]")


def test_every_numeric_schema_key_has_an_upper_bound():
    leaves = dict(_numeric_leaves(yaml.safe_load(SCHEMA.read_text())))
    assert "seeds" in leaves and "splits.*.test_size" in leaves and "evaluation.horizons[]" in leaves
    unbounded = [k for k, s in leaves.items() if "maximum" not in s and "exclusiveMaximum" not in s]
    assert unbounded == []


def test_numbers_given_as_text_by_snakemake_config_are_read_as_numbers():
    # what `snakemake --config 'training={total_steps: 40000, eval_every: 10000}'` hands over
    config = paper_config(training={"total_steps": "40000", "eval_every": "10000"},
                          evaluation={"horizons": ["32", "64"]})
    validate_config(config, SCHEMA)
    assert config["training"]["total_steps"] == 40000 and config["training"]["eval_every"] == 10000
    assert config["evaluation"]["horizons"] == [32, 64]
    assert config["training"]["threads"] == 1           # the rest of the mapping is kept
    assert_rejected(paper_config(training={"total_steps": "lots"}), "training.total_steps", "'lots'")
    text = assert_rejected(paper_config(agents={"dqn": {"learning_rate": "0.001"}}), "agents.dqn")
    assert "--configfile" not in text      # from a config file: no hint about --config
    with pytest.raises(ConfigError, match="agents.dqn.*arrive as text.*--configfile"):   # from snakemake --config
        validate_config(paper_config(agents={"dqn": {"learning_rate": "0.001"}}), SCHEMA,
                        command_line={"agents": {"dqn": {"learning_rate": "0.001"}}})


def test_malformed_config_file_is_named_with_its_line(tmp_path):
    bad = tmp_path / "preset.yaml"
    bad.write_text("training:\n  total_steps: 5\n bad: [\n")
    with pytest.raises(ConfigError, match=r"config file .*preset\.yaml is not valid YAML at line \d+"):
        load_config_file(bad)
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match=r"preset\.yaml must hold a mapping of config keys"):
        load_config_file(bad)
    with pytest.raises(ConfigError, match="config file not found"):
        load_config_file(tmp_path / "nope.yaml")


def test_config_command_shows_the_merged_config_and_names_bad_files(tmp_path, capsys):
    from tapebench.cli import main

    assert main(["config", "--workflow", str(REPO), "--configfile", str(REPO / "config/quick.yaml")]) == 0
    out = capsys.readouterr().out
    merged = yaml.safe_load(out)
    steps = yaml.safe_load((REPO / "config/quick.yaml").read_text())["training"]["total_steps"]
    assert steps != 200000      # the preset's value, not the paper protocol's
    assert merged["training"]["total_steps"] == steps and merged["methods"][-2:] == ["random", "mpc"]
    # seed blocks of 3: one training and one evaluation job per method
    assert (f"# 18 training runs (split main: 6 methods that train x 3 seeds, in 6 jobs) of {steps} steps with 3 "
            "checkpoints each; 33 evaluations in 11 jobs (H = 32) for 11 methods") in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("training: {total_steps: 5\n")
    assert main(["config", "--workflow", str(REPO), "--configfile", str(bad)]) == 2
    assert f"config file {bad} is not valid YAML at line 2" in capsys.readouterr().err
    bad.write_text("seeds: 5000\n")
    assert main(["config", "--workflow", str(REPO), "--configfile", str(bad)]) == 2
    assert "config key 'seeds': 5000 is greater than the maximum of 1000" in capsys.readouterr().err


def test_a_family_world_test_answers_prediction_and_detection_and_refuses_planning():
    family = merge_config(paper_config(), load_config_file(REPO / "config/family_k3r1.yaml"))
    validate_config(family, SCHEMA)
    assert family["studies"]["worldtest"]["methods"] and "planning" not in family["studies"]["worldtest"]["tasks"]
    planning = merge_config(family, {"studies": {"worldtest": {"tasks": ["prediction", "planning"]}}})
    assert_rejected(planning, "studies.worldtest.tasks", "planning is defined for the elementary family")


@pytest.mark.parametrize("device, method, seeds, gpus", [
    ("auto", "dqn", 20, 1),        # a stacked block: CUDA where present, so it asks for the GPU
    ("auto", "dqn", 1, 0),         # one seed at a time trains on a CPU core
    ("auto", "context_mpc", 20, 0),   # a method that does not stack trains its block's seeds one at a time
    ("cuda", "context_mpc", 1, 1),
    ("cpu", "dqn", 20, 0),
])
def test_training_jobs_request_a_gpu_where_they_train_on_cuda(device, method, seeds, gpus):
    config = {"training": {"device": device, "gpus": 1}, "logging": {"tensorboard": False}}
    assert training_gpus(config, method, seeds) == gpus


@pytest.mark.parametrize("stacking, device, method, seeds, tensorboard, passed", [
    ("always", "auto", "dreamer", 4, False, "always"),   # not bit for bit on the CPU: "always" changes the job
    ("always", "cpu", "planet", 4, False, "always"),
    ("always", "auto", "dqn", 4, False, "auto"),         # stacked bit for bit under "auto" already
    ("always", "auto", "context_mpc", 4, False, "auto"),  # no stacked block
    ("always", "auto", "dreamer", 1, False, "auto"),
    ("always", "cuda", "dreamer", 4, False, "auto"),     # "auto" stacks on CUDA too
    ("always", "auto", "dreamer", 4, True, "auto"),      # TensorBoard trains one after another
    ("auto", "auto", "dreamer", 4, False, "auto"),
])
def test_training_stacking_reaches_only_the_jobs_it_changes(stacking, device, method, seeds, tensorboard, passed):
    config = paper_config(training={"stacking": stacking, "device": device, "seeds_per_job": 4},
                          logging={"tensorboard": tensorboard})
    if not tensorboard:     # validation asks for the tensorboard package where logging is on
        validate_config(config, SCHEMA)
    assert training_stacking(config, method, seeds) == passed
    training = train_slice(config, method, seeds)["training"]
    assert training.get("stacking", "auto") == passed and ("stacking" in training) == (passed != "auto")


def test_training_stacking_is_auto_or_always():
    assert_rejected(paper_config(training={"stacking": "never"}), "training.stacking", "'never' is not one of")


# --- a job's hyperparameters are its method's resolved Config (docs/protocol.md#job-params) ------------------------
def _every_slice(config: dict, method: str) -> list[str]:
    """The params of every kind of job of `method` that carries its hyperparameters."""
    from tapebench.pipeline.config import (dumps, fewshot_slice, fixed_z_train_slice, method_eval_slice,
                                           worldtest_slice)

    return [dumps(train_slice(config, method)), dumps(fixed_z_train_slice(config, method, 16, 16)),
            dumps(method_eval_slice(config, method)), dumps(worldtest_slice(config, method)),
            dumps(fewshot_slice(config, method))]


@pytest.mark.parametrize("method, stated", [
    ("dqn", {"learning_rate": 0.0005}),                 # DQN's default
    ("dqn", {"learning_rate": 5e-4, "gamma": 0.99, "num_envs": 4}),
    ("ppo", {"gamma": 0.99}),
    ("mpc", {"candidates": 512, "horizon": 8}),         # a method that does not train
])
def test_stating_a_default_changes_no_params(method, stated):
    from tapebench.registry import build_config, get_method

    assert build_config(method, stated) == get_method(method).Config()    # the values are the defaults
    plain = validate_config(paper_config(), SCHEMA)
    restated = validate_config(paper_config(agents={method: stated}), SCHEMA)
    assert _every_slice(restated, method) == _every_slice(plain, method)


def test_a_changed_value_changes_that_methods_params_only():
    plain = validate_config(paper_config(), SCHEMA)
    edited = validate_config(paper_config(agents={"dqn": {"learning_rate": 0.001, "gamma": 0.99}}), SCHEMA)
    assert train_slice(edited, "dqn")["agent"] == {"learning_rate": 0.001}
    assert _every_slice(edited, "dqn") != _every_slice(plain, "dqn")
    assert _every_slice(edited, "ppo") == _every_slice(plain, "ppo")


def test_a_whole_number_for_a_float_is_the_same_value():
    one = validate_config(paper_config(agents={"dqn": {"learning_rate": 1.0e-3, "gamma": 1}}), SCHEMA)
    other = validate_config(paper_config(agents={"dqn": {"learning_rate": 0.001, "gamma": 1.0}}), SCHEMA)
    assert _every_slice(one, "dqn") == _every_slice(other, "dqn")
    assert train_slice(one, "dqn")["agent"] == {"learning_rate": 0.001, "gamma": 1.0}
