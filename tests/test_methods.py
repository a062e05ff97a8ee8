"""The method registry and the one evaluation path: every method evaluates through the runner on the
same common-random-number episodes; reference methods replay exactly what their fused kernels play;
the random policy is a reproducible per-episode stream; plug-in registration errors are clear."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from agent_contract import assert_per_episode_policy

from tapebench import registry as methods
from tapebench.episodes.sets import episode_set
from tapebench.evaluation.evaluate import evaluate_untrained, side_protocols
from tapebench.evaluation.runner import run_episodes
from tapebench.methods.exact import ExactPolicy, run_exact
from tapebench.methods.mpc import MPCConfig, MPCPolicy, run_mpc
from tapebench.methods.random_policy import RandomPolicy
from tapebench.registry import Method, PolicyContext, build_config, get_method

METRICS = ("success", "final_dist", "auc_dist", "return", "steps")


def test_registry_holds_the_builtin_methods_with_families():
    reg = methods.registry()
    assert {"dqn", "ppo", "random", "mpc", "exact"} <= set(reg)
    assert reg["dqn"].trains and reg["ppo"].trains
    assert not reg["random"].trains and reg["mpc"].sees_true_rule and reg["exact"].deterministic
    assert all(m.family in methods.FAMILIES for m in reg.values())
    assert [reg[m].family for m in ("random", "mpc", "exact")] == ["reference"] * 3
    assert not reg["random"].sees_true_rule and not reg["dqn"].sees_true_rule


@pytest.mark.parametrize("kwargs,needle", [
    (dict(id="Bad-Id"), "method id must match"),
    (dict(family="magic"), "family must be one of"),
    (dict(make_policy=None), "needs make_agent .it trains., make_policy .it does not. or worldtest"),
    (dict(make_agent=lambda *a: None), "not both"),
    (dict(needs_derived_goal=True), "needs_derived_goal is for methods that take an episode's goal"),
])
def test_method_entries_are_validated(kwargs, needle):
    base = dict(id="ok", display_name="OK", family="reference", Config=MPCConfig, make_policy=lambda c, x: None)
    with pytest.raises(ValueError, match=needle):
        Method(**{**base, **kwargs})


def test_an_unknown_keyword_names_the_field_meant():
    """A plug-in written for the old spelling (`world_test=`, now `worldtest=`) is told the new keyword, through
    `Method` and `Method.from_agent_module` alike."""
    from tapebench.methods.worldtest import ActiveConfig, chance_tester

    meant = r"'world_test' \(did you mean 'worldtest'\?\)"
    with pytest.raises(TypeError, match=r"method 'wt_old': Method has no field " + meant):
        Method("wt_old", "Old", "reference", ActiveConfig, world_test=chance_tester)
    with pytest.raises(TypeError, match=r"method 'old_dqn': .*" + meant):
        Method.from_agent_module("old_dqn", "Old DQN", "value_based", "tapebench.methods.dqn", world_test=chance_tester)
    with pytest.raises(TypeError, match=r"no field 'colour'; its fields are \['id', 'display_name'"):
        Method(id="x", display_name="X", family="reference", Config=ActiveConfig, worldtest=chance_tester, colour=1)
    assert Method("wt_new", "New", "reference", ActiveConfig, worldtest=chance_tester).worldtest is chance_tester


def test_summaries_are_whole_sentences():
    """`tapebench methods` prints each summary whole: a docstring's first sentence with its wrapped lines joined."""
    from tapebench.registry import doc_summary

    assert doc_summary("PlaNet-style MPC: a model, planned with a\ncategorical CEM. Details follow.\n\nMore.") == \
        "PlaNet-style MPC: a model, planned with a categorical CEM."
    assert doc_summary("DQN (Mnih et al., 2015), e.g. with\nDouble-DQN.") == "DQN (Mnih et al., 2015), e.g. with Double-DQN."
    assert doc_summary(None) == ""
    planet = methods.registry()["planet"].summary
    assert planet.endswith("in latent space.") and "\n" not in planet


def test_trained_method_needs_num_envs():
    @dataclasses.dataclass
    class NoEnvs:
        lr: float = 1.0

    with pytest.raises(ValueError, match="needs a num_envs field"):
        Method(id="x", display_name="X", family="value_based", Config=NoEnvs, make_agent=lambda *a: None)


def test_every_builtin_part_named_by_reference_resolves_and_is_checked_at_its_first_use():
    for method in methods.registry().values():
        assert dataclasses.is_dataclass(method.Config), method.id
        assert isinstance(method.summary, str) and method.summary, method.id
        if method.trains:
            assert callable(method.make_agent) and "num_envs" in {f.name for f in dataclasses.fields(method.Config)}
        elif method.plays_episodes:
            assert callable(method.make_policy), method.id
        assert method.worldtest is None or callable(method.worldtest), method.id
    assert get_method("rad_dqn").training_env is None and callable(get_method("ppo_dr").training_env)
    assert get_method("dqn_equivariant").Config.__name__ == "EquivariantConfig"
    assert get_method("dqn_her").Config().her_strategy == "future" and get_method("dqn_her").make_block is None
    # a Config named by reference is checked when it is read, with the same message
    lazy = Method(id="lazy", display_name="Lazy", family="value_based",
                  Config=methods.Ref("tapebench.methods.random_policy", "Config"), make_agent=lambda *a: None)
    assert lazy.trains
    with pytest.raises(ValueError, match="'lazy' trains, so its Config needs a num_envs field"):
        lazy.Config


def test_unknown_method_and_hyperparameters_are_named():
    with pytest.raises(ValueError, match="unknown method 'nope'; registered methods: .*'dqn'"):
        get_method("nope")
    with pytest.raises(ValueError, match=r"unknown hyperparameter\(s\) \['depth'\] for method 'mpc'"):
        build_config("mpc", {"depth": 3})
    with pytest.raises(ValueError, match="'candidates' of method 'mpc' must be int"):
        build_config("mpc", {"candidates": "many"})
    with pytest.raises(ValueError, match=r"candidates must be an integer in 1\.\.65536"):
        build_config("mpc", {"candidates": 0})
    with pytest.raises(ValueError, match=r"num_envs of method 'dqn' must be in 1..65536, got 1000000000"):
        build_config("dqn", {"num_envs": 10**9})


@pytest.mark.parametrize("L,H,goal,bonus", [(8, 8, None, 1.0), (12, 10, [1, 0] * 6, 0.5)])
def test_mpc_through_the_runner_plays_exactly_the_fused_kernel(L, H, goal, bonus):
    episodes = episode_set([30, 54, 110, 0, 90], 4, L, eval_seed=3, side="test", key=11, goal=goal)
    config = MPCConfig(horizon=4, candidates=48, seed=5)
    fused = run_mpc(episodes, H, config, goal=goal, success_bonus=bonus)
    via_runner = run_episodes(MPCPolicy(config), episodes, H, goal=goal, success_bonus=bonus, reveal_rules=True,
                              batch_size=7)
    for key in METRICS:
        assert np.array_equal(fused[key], via_runner[key]), key
    assert 0 < fused["success"].mean() < 1


def test_exact_through_the_runner_plays_exactly_the_dp_controller():
    episodes = episode_set([30, 110, 4, 45], 5, 10, eval_seed=1, side="rules")
    direct = run_exact(episodes, 10)
    via_runner = run_episodes(ExactPolicy(), episodes, 10, reveal_rules=True, by_rule=True)
    for key in METRICS:
        assert np.array_equal(direct[key], via_runner[key]), key


def test_reference_methods_refuse_to_run_without_the_true_rule():
    episodes = episode_set([30], 2, 8)
    for policy in (MPCPolicy(MPCConfig(candidates=4)), ExactPolicy()):
        with pytest.raises(ValueError, match="needs each episode's true rule"):
            run_episodes(policy, episodes, 4)


def test_random_policy_is_a_per_episode_stream_uniform_over_cells():
    assert_per_episode_policy(lambda: RandomPolicy(seed=3))
    assert_per_episode_policy(lambda: MPCPolicy(MPCConfig(horizon=3, candidates=16, seed=2)), reveal_rules=True)
    # uniform: 64 episodes x 16 steps of rule 204 (identity: never terminates early from a dense tape)
    episodes = episode_set([204], 64, 16, eval_seed=0)
    seen = []

    class Spy(RandomPolicy):
        def act(self, obs):
            actions = super().act(obs)
            seen.append(actions.numpy().copy())
            return actions

    run_episodes(Spy(seed=0), episodes, 16)
    counts = np.bincount(np.concatenate(seen), minlength=16)
    from scipy.stats import chisquare
    assert chisquare(counts).pvalue > 1e-3
    other = run_episodes(RandomPolicy(seed=4), episode_set([30, 110], 10, 16), 16)
    again = run_episodes(RandomPolicy(seed=3), episode_set([30, 110], 10, 16), 16)
    same = run_episodes(RandomPolicy(seed=3), episode_set([30, 110], 10, 16), 16)
    assert np.array_equal(again["auc_dist"], same["auc_dist"])
    assert not np.array_equal(other["auc_dist"], again["auc_dist"])


def test_random_policy_solves_rule_0_always_and_is_a_floor_elsewhere():
    sides = side_protocols(L=16, H=16, episodes_per_rule=20, eval_seed=1, rules=[0, 30])
    records, summary = evaluate_untrained("random", {}, 0, sides)
    by_rule = records.groupby("rule")["success"].mean()
    assert by_rule[0] == 1.0 and (records.loc[records["rule"] == 0, "steps"] == 1).all()
    assert by_rule[30] < 0.5
    assert set(records["checkpoint"]) == {0} and set(records["agent"]) == {"random"}
    assert summary["checkpoints"] == [0]


def test_untrained_evaluation_refuses_methods_that_train():
    sides = side_protocols(L=8, H=8, episodes_per_rule=1, eval_seed=1, rules=[0])
    with pytest.raises(ValueError, match="method 'dqn' trains"):
        evaluate_untrained("dqn", {}, 0, sides)


def test_exact_method_refuses_long_tapes_early():
    with pytest.raises(ValueError, match="needs L in 3..20"):
        get_method("exact").make_policy(build_config("exact", {}), PolicyContext(L=32, H=32, seed=0))
