"""The world-model prediction-error probe (evaluation.model_error) against models whose error is known."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tapebench.ca import reference
from tapebench.episodes.sets import episode_set
from tapebench.evaluation.model_error import error_table, observations, probe_trajectories, rollout_errors, summarize


class TrueRuleModel:
    """Predicts with a fixed rule: exact when the episodes are of that rule."""

    def __init__(self, rule: int):
        self.rule = rule
        self.calls = []

    def world_model_rollout(self, obs_prefix, action_prefix, actions):
        self.calls.append((obs_prefix.shape, action_prefix.shape, actions.shape))
        L = obs_prefix.shape[2] - 1
        tapes = obs_prefix[:, -1, :L].numpy().astype(np.uint8)
        out = np.empty((len(tapes), actions.shape[1], L), dtype=np.float32)
        for n, tape in enumerate(tapes):
            for k, a in enumerate(actions[n].tolist()):
                tape = reference.transition(tape, a, self.rule)
                out[n, k] = tape
        return torch.from_numpy(out)


class FlipOnlyModel(TrueRuleModel):
    """Predicts that only the flip happens (rule 204, the identity CA)."""

    def __init__(self):
        super().__init__(204)


def test_probe_trajectories_follow_the_true_rule_and_are_shared():
    eps = episode_set([30, 110], 3, 12, eval_seed=5)
    tapes, actions = probe_trajectories(eps, 6)
    assert tapes.shape == (6, 7, 12) and actions.shape == (6, 6)
    assert ((actions >= 0) & (actions < 12)).all()
    for n in range(len(eps)):
        tape = eps.tapes[n]
        for t in range(6):
            tape = reference.transition(tape, int(actions[n, t]), int(eps.rules[n]))
            assert np.array_equal(tape, tapes[n, t + 1])
    # a row's probe depends only on its own episode identity, not on the batch around it
    sub_tapes, sub_actions = probe_trajectories(eps.subset(slice(3, 5)), 6)
    assert np.array_equal(sub_actions, actions[3:5]) and np.array_equal(sub_tapes, tapes[3:5])


def test_observations_carry_the_time_feature():
    obs = observations(np.zeros((2, 5, 4), dtype=np.uint8), H=8)
    assert obs.shape == (2, 5, 5)
    assert np.allclose(obs[0, :, 4], np.arange(5) / 8)


def test_a_model_of_the_true_rule_has_zero_error_at_every_depth():
    eps = episode_set([30], 10, 16, eval_seed=1)
    model = TrueRuleModel(30)
    errors, valid = rollout_errors(model, eps, H=16, context=3, depth=5)
    assert errors.shape == (10, 5) and valid.all()
    assert np.all(errors == 0.0)
    assert model.calls == [((10, 4, 17), (10, 3), (10, 5))]


def test_error_equals_the_fraction_of_wrong_cells_computed_independently():
    L, context, depth = 12, 2, 4
    eps = episode_set([110, 90], 4, L, eval_seed=3)
    errors, valid = rollout_errors(FlipOnlyModel(), eps, H=16, context=context, depth=depth, batch_size=3)
    tapes, actions = probe_trajectories(eps, context + depth)
    for n in range(len(eps)):
        predicted = tapes[n, context]
        for k in range(depth):
            predicted = reference.flip(predicted, int(actions[n, context + k]))
            truth = tapes[n, context + k + 1]
            assert errors[n, k] == pytest.approx(np.mean(predicted != truth))


def test_steps_after_the_goal_do_not_count():
    # rule 0 sends every tape to the goal in one step: only the first prediction from the initial tape is real
    eps = episode_set([0], 5, 10, eval_seed=2)
    errors, valid = rollout_errors(TrueRuleModel(0), eps, H=10, context=0, depth=3)
    assert valid[:, 0].all() and not valid[:, 1:].any()
    table = error_table(errors, valid, eps, "rules", {0: "collapse"})
    assert table["depth"].tolist() == [1] and table["n"].tolist() == [5]
    # with a context the episode ends before the model predicts anything
    errors, valid = rollout_errors(TrueRuleModel(0), eps, H=10, context=2, depth=3)
    assert not valid.any()
    assert error_table(errors, valid, eps, "rules", {}).empty


def test_summary_weights_rules_by_their_valid_episodes():
    eps = episode_set([30, 90], 2, 8, eval_seed=0)
    errors = np.array([[0.5, 0.2], [0.5, 0.2], [0.1, 0.0], [0.1, 0.0]])
    valid = np.array([[True, True], [True, False], [True, True], [True, True]])
    table = error_table(errors, valid, eps, "test", {30: "chaotic", 90: "chaotic"})
    assert table.loc[(table["rule"] == 30) & (table["depth"] == 2), "n"].item() == 1
    summary = summarize(table)
    assert summary.loc[summary["depth"] == 2, "error"].item() == pytest.approx((0.2 + 0.0 + 0.0) / 3)
    assert summary.loc[summary["depth"] == 1, "n"].item() == 4


@pytest.mark.parametrize("bad", [{"context": -1}, {"depth": 0}, {"depth": 2.5}, {"context": True}])
def test_bad_probe_settings_are_named(bad):
    eps = episode_set([30], 1, 8)
    settings = {"context": 2, "depth": 3, **bad}
    name = next(iter(bad))
    with pytest.raises(ValueError, match=f"model-error {name}"):
        rollout_errors(TrueRuleModel(30), eps, H=8, **settings)


def test_a_model_returning_the_wrong_shape_is_reported():
    class Broken(TrueRuleModel):
        def world_model_rollout(self, obs_prefix, action_prefix, actions):
            return super().world_model_rollout(obs_prefix, action_prefix, actions)[:, :1]

    with pytest.raises(ValueError, match="returned shape"):
        rollout_errors(Broken(30), episode_set([30], 2, 8), H=8, context=1, depth=3)


def test_probe_trajectories_of_a_k_colour_family_step_as_its_environment_does():
    from tapebench.envs.batched import BatchedTapeEnv
    from tapebench.rule_family import RuleFamily

    family = RuleFamily(3, 1)
    rules = [int(z) for z in np.random.default_rng(0).integers(0, family.num_rules, 3)]
    eps = episode_set(rules, 2, 10, eval_seed=5, family=family)
    assert eps.tapes.max() == 2
    tapes, actions = probe_trajectories(eps, 5)
    env = BatchedTapeEnv(len(eps), L=10, H=8, rules=rules, family=family, autoreset=False)
    env.load(eps.tapes, eps.rules)
    for t in range(5):
        obs = env.step(torch.as_tensor(actions[:, t]))[0]
        assert np.array_equal(obs[:, :10].numpy().astype(np.uint8), tapes[:, t + 1])
    assert tapes.max() == 2 and not np.array_equal(tapes[:, 1:], tapes[:, :-1])
