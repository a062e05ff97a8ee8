"""`tapebench bench world-model`: variant parsing, and one tiny study run (random-policy data, the RSSM alone)
that is deterministic and measures the probe's one-step error at the points asked for."""
from __future__ import annotations

import pytest

from tapebench.bench.world_model import (DEFAULT_VARIANTS, StudyRun, Variant, bayes_one_step_error,
                                         check_world_model_agents, parse_variant, run_study, study_rows)
from tapebench.cli import main


def test_variants_parse_into_typed_overrides():
    assert parse_variant("deter_size=256; hidden_size=256") == Variant(
        "deter_size=256; hidden_size=256", (("deter_size", 256), ("hidden_size", 256)))
    assert parse_variant("kl_rep_scale=0.5").overrides == (("kl_rep_scale", 0.5),)
    for text in DEFAULT_VARIANTS:
        parse_variant(text)


@pytest.mark.parametrize("text,needle", [
    ("actor_lr=1e-3", "FIELD one of the world model's settings"),
    ("deter_size", "must be FIELD=VALUE"),
    ("deter_size=big", "deter_size needs a int value, got 'big'"),
    ("train_ratio=1024", r"train_ratio must be in 1\.\.batch_size \* sequence_length = 512"),
    (";", "overrides nothing"),
])
def test_bad_variants_are_refused(text, needle):
    with pytest.raises(ValueError, match=needle):
        parse_variant(text)


def test_bad_variant_on_the_command_line_exits_2(capsys):
    assert main(["bench", "world-model", "--variants", "nope=1"]) == 2
    assert "nope=1" in capsys.readouterr().err


def test_a_study_run_is_deterministic_and_measures_each_point(toy_split):
    variant = parse_variant("deter_size=16;hidden_size=16;stoch_groups=8;batch_size=4;sequence_length=8;"
                            "learning_starts=64")
    run = StudyRun(variant, seed=3, steps=512, points=2, split=toy_split, L=8, H=8, episodes_per_rule=6)
    first, second = run_study(run), run_study(run)
    assert [p["env_steps"] for p in first["curve"]] == [256, 512]
    assert first["curve"][-1]["updates"] > first["curve"][0]["updates"] > 0
    assert first["curve"] == second["curve"]
    for point in first["curve"]:
        assert 0.0 <= point["ID"] <= 1.0 and 0.0 <= point["OOD"] <= 1.0 and point["ID_n"] > 0
    row, = study_rows([first, {**second, "seed": 4}])
    assert row["ID"]["mean"] == first["curve"][-1]["ID"] and row["seeds"] == 2


def test_bayes_floor_is_zero_when_the_prior_is_the_true_rule_and_grows_with_the_prior():
    from tapebench.episodes.sets import episode_set

    for rule in (30, 90, 110):
        episodes = episode_set([rule], 20, 16, eval_seed=0, side="rules")
        assert bayes_one_step_error(episodes, prior_rules=[rule]) == (0.0, 20)
    episodes = episode_set([30, 110], 20, 16, eval_seed=0, side="rules")
    # no context: every cell's next value is 1 under exactly half the rules, so the floor predicts 0 everywhere
    blind, _ = bayes_one_step_error(episodes, context=0)
    assert 0.2 < blind < 0.8
    one_step, _ = bayes_one_step_error(episodes, context=1)
    assert bayes_one_step_error(episodes, context=1, prior_rules=[30, 110])[0] <= one_step < blind
    assert bayes_one_step_error(episodes, context=4)[0] <= one_step
    with pytest.raises(ValueError, match="not among prior_rules"):
        bayes_one_step_error(episodes, prior_rules=[0])


def test_persistence_is_exact_for_the_identity_rule_and_not_for_rule_30():
    from tapebench.bench.world_model import persistence_one_step_error
    from tapebench.episodes.sets import episode_set

    assert persistence_one_step_error(episode_set([204], 20, 16, eval_seed=0, side="rules")) == (0.0, 20)
    assert persistence_one_step_error(episode_set([30], 20, 16, eval_seed=0, side="rules"))[0] > 0.2


@pytest.mark.parametrize("agent", ["ensemble_mpc", "ensemble_mpc_equivariant"])
def test_an_agent_study_run_trains_the_whole_method_deterministically(toy_split, agent):
    small = (("learning_starts", 64), ("batch_size", 16), ("ensemble_size", 2), ("hidden_size", 16),
             ("conv_channels", 8), ("conv_layers", 2))
    run = StudyRun(Variant(agent, small), seed=3, steps=512, points=2, split=toy_split, L=8, H=8, episodes_per_rule=6,
                   agent=agent)
    first, second = run_study(run), run_study(run)
    assert first["variant"] == agent and first["curve"] == second["curve"]
    assert [p["env_steps"] for p in first["curve"]] == [256, 512]
    assert first["curve"][-1]["updates"] > first["curve"][0]["updates"] > 0
    for point in first["curve"]:
        assert 0.0 <= point["ID"] <= 1.0 and 0.0 <= point["OOD"] <= 1.0 and point["ID_n"] > 0


def test_agents_must_have_a_world_model_and_exclude_variants(capsys):
    assert check_world_model_agents(["ensemble_mpc_equivariant", "dreamer", "dreamer"]) == \
        ["ensemble_mpc_equivariant", "dreamer"]
    with pytest.raises(ValueError, match=r"\['dqn'\].*studies methods with a world model; allowed: \[.*'dreamer'"):
        check_world_model_agents(["dqn"])
    assert main(["bench", "world-model", "--agents", "dqn"]) == 2
    assert "'dqn'" in capsys.readouterr().err
    assert main(["bench", "world-model", "--agents", "dreamer", "--variants", "train_ratio=4"]) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_bayes_floor_from_the_last_transitions_only_is_between_all_and_none():
    from tapebench.episodes.sets import episode_set

    episodes = episode_set([30, 110, 90, 54], 30, 8, eval_seed=0, side="rules")
    full, n = bayes_one_step_error(episodes, context=4)
    last, n_last = bayes_one_step_error(episodes, context=4, seen=1)
    none, _ = bayes_one_step_error(episodes, context=4, seen=0)
    assert n == n_last and full <= last <= none and full < none
    assert bayes_one_step_error(episodes, context=4, seen=4) == (full, n)
    assert bayes_one_step_error(episodes, context=1) == bayes_one_step_error(episodes, context=1, seen=1)
