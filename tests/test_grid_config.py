"""The 2D grid family in the pipeline config (docs/protocol.md#grid): bad rules, a missing torus side and methods
that do not run on grids stop at validation, before any job, with the key named; the grid presets are valid."""
from __future__ import annotations

import copy

import pytest
from pipeline_helpers import REPO

from tapebench.pipeline.config import (ConfigError, env_params, grid_rule_set, load_config, load_config_file,
                                       merge_config, validate_config)
from tapebench.grid_rules import parse_rule
from tapebench.registry import registry

SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
GRID_PRESETS = ("config/grid.yaml", "config/grid_quick.yaml", "tests/data/grid_tiny.yaml")


def grid_config(**override) -> dict:
    """tests/data/grid_tiny.yaml over tiny.yaml over the paper protocol, then `override`."""
    config = load_config(root=REPO)
    for path in ("tests/data/tiny.yaml", "tests/data/grid_tiny.yaml"):
        merge_config(config, load_config_file(REPO / path))
    return merge_config(config, copy.deepcopy(override))


def rejected(config: dict, key: str, *messages: str) -> str:
    with pytest.raises(ConfigError) as info:
        validate_config(config, SCHEMA)
    text = str(info.value)
    assert f"'{key}'" in text, text
    for message in messages:
        assert message in text, text
    return text


@pytest.mark.parametrize("path", GRID_PRESETS)
def test_the_grid_presets_are_valid_and_set_L_to_n_squared(path):
    config = load_config(root=REPO)
    if "tests/" in path:
        merge_config(config, load_config_file(REPO / "tests/data/tiny.yaml"))
    config = validate_config(merge_config(config, load_config_file(REPO / path)), SCHEMA)
    n = config["env"]["grid_n"]
    assert config["env"]["L"] == n * n
    assert "grid_n" not in env_params(config)        # jobs read the side from L; the family comes with the split
    assert all(split["rules"] == "sampled" for split in config["splits"].values())


def test_the_tiny_grid_rule_set_is_its_listed_rules_as_ids():
    config = validate_config(grid_config(), SCHEMA)
    listed = load_config_file(REPO / "tests/data/grid_tiny.yaml")["rule_set"]["rules"]
    assert grid_rule_set(config) == [parse_rule(rule).id for rule in listed]
    assert grid_rule_set(config)[0] == 194              # B1/S12V, docs/protocol.md#grid


@pytest.mark.parametrize("rule, message", [
    ("B9/S2", "0..8, got [9]"),                 # Moore counts are 0..8
    ("B5/S2V", "0..4, got [5]"),                # von Neumann counts are 0..4
    ("B3/S23X", "is not Golly notation"),
    ("", "is not Golly notation"),
    (262144, "0..262143"),                      # an id out of range
    (-1, "0..262143"),
])
def test_bad_grid_rules_are_refused_naming_the_key(rule, message):
    config = grid_config(rule_set={"family": {"neighbourhood": "moore"}, "rules": ["B3/S23", rule]})
    rejected(config, "rule_set.rules[1]", message)


def test_a_rule_of_the_other_neighbourhood_and_a_repeated_rule_are_refused():
    rejected(grid_config(rule_set={"rules": ["B1/S12V", "B3/S23"]}), "rule_set.rules[1]", "moore neighbourhood")
    rejected(grid_config(rule_set={"rules": ["B1/S12V", 194]}), "rule_set.rules", "more than once")
    rejected(grid_config(rule_set={"family": {"neighbourhood": "von_neumann"}, "rules": ["B1/S12V", 1024]}),
             "rule_set.rules[1]", "0..1023")


def test_the_grid_needs_its_side_and_its_keys_stay_off_tapes():
    config = grid_config()
    del config["env"]["grid_n"]
    rejected(config, "env.grid_n", "torus side")
    rejected(grid_config(env={"grid_n": 9}), "env.grid_n")          # one 64-bit word per grid: n <= 8
    rejected(grid_config(rule_set={"family": {"neighbourhood": "hexagonal"}}), "rule_set.family.neighbourhood")
    rejected(grid_config(rule_set={"family": {"neighbourhood": "moore"}, "rules": None}), "rule_set.rules")
    moore = grid_config(rule_set={"family": {"neighbourhood": "moore"}})
    del moore["rule_set"]["rules"]
    rejected(moore, "rule_set.sample", "too large to enumerate")
    tapes = load_config(root=REPO)
    rejected(merge_config(copy.deepcopy(tapes), {"env": {"grid_n": 8}}), "env.grid_n", "2D grid family")
    rejected(merge_config(copy.deepcopy(tapes), {"rule_set": {"rules": ["B3/S23", "B2/S"]}}), "rule_set.rules")
    rejected(grid_config(splits={"main": {"rules": "0-5"}}), "splits.main.rules", "sampled")


def test_a_sampled_moore_rule_set_is_drawn_at_validation():
    sample = grid_config(rule_set={"family": {"neighbourhood": "moore"},
                                   "sample": {"n": 8, "lambda_bins": 4, "seed": 0, "b0": False}})
    del sample["rule_set"]["rules"]
    rules = grid_rule_set(validate_config(sample, SCHEMA))
    assert len(rules) == 8 and all(r % 2 == 0 for r in rules)      # b0: false leaves every B0 rule (odd id) out
    bad = copy.deepcopy(sample)
    bad["rule_set"]["sample"]["subfamily"] = "totalistic"
    rejected(bad, "rule_set.sample.subfamily", "tape option")


def test_methods_that_do_not_run_on_grids_are_refused_by_the_registry_flag():
    grid_methods = sorted(m for m, entry in registry().items() if entry.supports_grid)
    assert {"dqn", "ppo", "bayes_filter", "live_leftmost", "live_random", "random", "mpc"} <= set(grid_methods)
    refused = sorted(m for m, entry in registry().items() if entry.plays_episodes and not entry.supports_grid)
    assert "ppo_context" in grid_methods
    assert {"ppo_dr", "context_mpc", "identify_then_plan", "mpc_prior", "exact"} <= set(refused)
    for method in refused:      # the flag is the one switch (docs/protocol.md#grid-pipeline says why each is off)
        rejected(grid_config(methods=["random", method]), "methods[1]", repr(method), "supports_grid")


@pytest.mark.parametrize("study, name", [("worldtest", "the world test"), ("fewshot", "the few-shot study")])
def test_studies_that_play_tapes_are_refused_on_the_grid(study, name):
    config = grid_config(studies={study: {"methods": ["random"]}})
    rejected(config, f"studies.{study}.methods", name, "tape families only", "von Neumann",
             f"set studies.{study}.methods: []")
