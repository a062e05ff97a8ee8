"""The world test (docs/protocol.md#world-test): problems, the tester interface, the built-in testers, the command."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from agent_contract import toy_split

from tapebench.cli import main
from tapebench.episodes.worldtest import (act, detection_problems, detection_score, earliest_detectable, fresh_tapes,
                                          neighbourhood_indices, planning_problems, prediction_problems, transition,
                                          worldtest_rows)
from tapebench.evaluation.worldtest import WorldTestSettings, interact, run_worldtest
from tapebench.methods import worldtest
from tapebench.methods.exact import value_tables
from tapebench.registry import Method, build_config, get_method, register, unregister
from tapebench.rule_family import ELEMENTARY, RuleFamily
from tapebench.schemas import WORLDTEST_COLUMNS
from tapebench.vocabulary import PREDICTION_CANDIDATES

SIDES = {"train": [4, 30, 110, 204, 90, 0], "test": [54, 60, 150, 18, 232]}
SMALL = WorldTestSettings(problems_per_rule=3, planner_candidates=64, prediction_lengths=(1, 4),
                          interaction_start="random")


def run(method_id: str, budget: int, settings=SMALL, seed: int = 0, sides=SIDES, L: int = 32):
    return run_worldtest(get_method(method_id), build_config(method_id, {}), settings, sides=sides, L=L, H=32,
                          seed=seed, budget=budget)


@pytest.mark.parametrize("T", [1, 4, 8])
def test_every_prediction_problem_has_exactly_one_right_candidate(T):
    rows = worldtest_rows(range(256), 2, 32, side="train", seed=3)
    problems, key = prediction_problems(rows, T, masked_cells=8)
    assert problems.candidates.shape == (512, PREDICTION_CANDIDATES, 8)
    for i in range(len(rows)):
        right = key.final[i, problems.mask[i]]
        matches = [j for j in range(PREDICTION_CANDIDATES) if np.array_equal(problems.candidates[i, j], right)]
        assert matches == [key.answers[i]]
        assert len({c.tobytes() for c in problems.candidates[i]}) == PREDICTION_CANDIDATES
        # the shown tapes follow the hidden rule
        shown = np.concatenate([problems.tapes[i], key.final[i][None]])
        assert np.array_equal(transition(shown[:-1], problems.actions[i], np.full(T, rows.rules[i])), shown[1:])
    # the right answer is not always in the same place
    assert len(set(key.answers.tolist())) == PREDICTION_CANDIDATES


def test_earliest_detectable_step_by_hand():
    # L = 4, rule 204 (identity) for step 1, rule 0 (all cells 0) from step 2 on.
    tapes = np.array([[0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]], dtype=np.uint8)
    actions = np.array([0, 0, 1])
    # step 2 flips cell 0 back: rule 204 would give 0000 as well, so the switch is invisible there;
    # step 3 flips cell 1: rule 204 gives 0100, the tape shows 0000
    assert earliest_detectable(tapes, actions, 204) == 3
    assert earliest_detectable(tapes, actions, 0) == 1          # rule 0 cannot produce 1000 at step 1
    same = np.array([[0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0]], dtype=np.uint8)
    assert earliest_detectable(same, np.array([0, 1]), 204) == 0   # nothing to detect


def test_detection_score_and_problems():
    assert detection_score([0, 2, 3, 4, 6], [3, 3, 3, 3, 3]).tolist() == [0.0, 0.0, 1.0, 0.5, 0.125]
    rows = worldtest_rows(range(0, 256, 5), 2, 16, side="test", seed=1)
    problems, key = detection_problems(rows, 12)
    assert np.all(key.switch >= 1) and np.all(key.earliest >= key.switch) and np.all(key.earliest <= 12)
    assert np.all(key.other != rows.rules)
    for i in range(len(rows)):
        assert earliest_detectable(key.tapes[i], problems.actions[i], int(rows.rules[i])) == key.earliest[i]
        before = slice(0, key.switch[i] - 1)   # steps 1..switch-1 follow the hidden rule
        expected = transition(key.tapes[i, :-1][before], problems.actions[i][before],
                              np.full(key.switch[i] - 1, rows.rules[i]))
        assert np.array_equal(expected, key.tapes[i, 1:key.switch[i]])


def test_planning_goals_are_reachable_by_exact_search():
    L, horizon = 10, 6
    rows = worldtest_rows([4, 30, 90, 110, 150, 0], 3, L, side="train", seed=2)
    problems, key = planning_problems(rows, horizon, goal_steps=4)
    assert not key.valid[rows.rules == 0].any()       # rule 0 reaches only 0...0: no derived goal
    for i in np.flatnonzero(key.valid):
        goal = problems.goals[i]
        assert goal.any() and not np.array_equal(goal, problems.starts[i])
        _, d, _ = value_tables(int(rows.rules[i]), L, horizon, goal=goal, keep_layers=False)
        start = int(np.dot(problems.starts[i].astype(np.int64), 1 << np.arange(L)))
        assert d[start] <= len(key.witnesses[i]) <= 4


def test_true_rule_reference_scores_one_on_prediction_and_detection():
    for budget in (0, 8):
        table = run("mpc", budget)
        assert list(table.columns) == list(WORLDTEST_COLUMNS)
        scores = table.groupby("task")["score"].mean()
        assert scores["prediction"] == 1.0 and scores["detection"] == 1.0
        assert 0.0 < scores["planning"] <= 1.0


def test_chance_row_matches_one_sixth():
    settings = WorldTestSettings(tasks=("prediction",), problems_per_rule=4, prediction_lengths=(1, 4, 8))
    scores = np.concatenate([run("random", 0, settings, seed=s, sides={"train": range(256)})["score"].to_numpy()
                             for s in range(2)])
    half_width = 2.58 * scores.std(ddof=1) / np.sqrt(len(scores))   # 99% normal interval of a mean of ~6000 0/1
    assert abs(scores.mean() - 1 / PREDICTION_CANDIDATES) < half_width


def test_exact_reasoning_identifies_and_active_exploration_pins_faster():
    rules = list(range(0, 256, 3))
    rows = worldtest_rows(rules, 2, 32, side="train", seed=0)
    context = worldtest.WorldTestContext(L=32, H=32, seed=0)
    unknown = {}
    for active in (False, True):
        tester = worldtest.ExactReasoningTester(context, active=active)
        interact(tester, rows, 3, reveal_rules=False)
        unknown[active] = np.array([8 - bin(m).count("1") for m in tester.known_mask])
        for i in range(len(rows)):            # the true rule is always among the consistent ones
            assert rows.rules[i] in tester.consistent(i)
    assert unknown[True].sum() < unknown[False].sum()
    assert np.all(unknown[True] <= 8)
    table = run("identify_then_plan", 32)
    assert table.loc[table.task == "prediction", "score"].mean() == 1.0


def test_every_method_gets_the_same_problems():
    """Common random numbers: a spy tester sees identical problems for every budget and method seed stream."""
    seen = []

    class Spy(worldtest.ChanceTester):
        def predict(self, problems):
            seen.append(("prediction", problems.tapes.copy(), problems.candidates.copy()))
            return super().predict(problems)

        def plan_begin(self, problems):
            seen.append(("planning", problems.starts.copy(), problems.goals.copy()))
            super().plan_begin(problems)

        def detect_begin(self, problems):
            seen.append(("detection", problems.starts.copy(), problems.actions.copy()))
            super().detect_begin(problems)

    spy = Method("wt_spy", "Spy", "reference", worldtest.ActiveConfig,
                 worldtest=lambda config, context: Spy(context))
    register(spy)
    try:
        def problems_of(budget, seed):
            seen.clear()
            run_worldtest(spy, worldtest.ActiveConfig(), SMALL, sides=SIDES, L=32, H=32, seed=seed, budget=budget)
            return list(seen)

        first, other_budget = problems_of(0, 0), problems_of(8, 0)
        assert len(first) == 2 * 4     # two sides x (two prediction lengths, planning, detection)
        for (task_a, *arrays_a), (task_b, *arrays_b) in zip(first, other_budget):
            assert task_a == task_b and all(np.array_equal(a, b) for a, b in zip(arrays_a, arrays_b))
        other_seed = problems_of(0, 1)
        assert not np.array_equal(first[0][1], other_seed[0][1])
    finally:
        unregister("wt_spy")
    # and two different methods are scored on the same rows
    keys = ["side", "rule", "problem", "task", "length"]
    assert run("random", 8)[keys].equals(run("active_identify", 8)[keys])


class AlwaysFirst(worldtest.ChanceTester):
    """A plug-in's tester: candidate 0, cell 0, a report at the last step."""

    def predict(self, problems):
        return np.zeros(len(problems), dtype=np.int64)

    def plan_act(self, tapes, t):
        return np.zeros(len(tapes), dtype=np.int64)

    def detect_step(self, t, before, actions, after):
        return np.full(len(after), t == self.T)

    def detect_begin(self, problems):
        self.T = problems.T


def test_a_plug_in_answers_through_the_interface(tmp_path):
    plugin = Method("wt_plugin", "Plug-in", "reference", worldtest.ActiveConfig,
                    worldtest=lambda config, context: AlwaysFirst(context))
    register(plugin)
    try:
        split = toy_split(tmp_path / "toy.json")
        out = tmp_path / "plugin.parquet"
        params = {"env": {"L": 16, "H": 16}, "worldtest": {"problems_per_rule": 2, "prediction": {"lengths": [2]},
                                                           "planner": {"candidates": 16}}}
        assert main(["worldtest", "--method", "wt_plugin", "--seed", "0", "--budget", "4", "--split", str(split),
                     "--params", json.dumps(params), "--out", str(out), "--quiet"]) == 0
        table = pd.read_parquet(out)
        assert set(table["task"]) == {"prediction", "planning", "detection"}
        assert set(table["side"]) == {"train", "test"}
        assert (table["agent"] == "wt_plugin").all() and (table["budget"] == 4).all()
        predictions = table[table.task == "prediction"]
        assert 0.0 < predictions["score"].mean() < 1.0      # candidate 0 is right only where the shuffle put it
    finally:
        unregister("wt_plugin")


def test_bad_answers_and_methods_fail_clearly(tmp_path):
    class Bad(worldtest.ChanceTester):
        def predict(self, problems):
            return np.full(len(problems), 7)

    bad = Method("wt_bad", "Bad", "reference", worldtest.ActiveConfig, worldtest=lambda c, x: Bad(x))
    with pytest.raises(ValueError, match=r"prediction answers must be in 0\.\.5"):
        run_worldtest(bad, worldtest.ActiveConfig(), SMALL, sides=SIDES, L=32, H=32, seed=0, budget=0)
    with pytest.raises(ValueError, match="does not take part in the world test"):
        run("dqn", 0)
    with pytest.raises(ValueError, match="tasks must be distinct names"):
        WorldTestSettings(tasks=("prediction", "guessing"))
    split = toy_split(tmp_path / "toy.json")
    assert main(["worldtest", "--method", "dreamer", "--seed", "0", "--budget", "0", "--split", str(split),
                 "--out", str(tmp_path / "x.parquet")]) == 2      # trains: needs --run


def test_learned_world_model_tester_runs_deterministically():
    # torch is heavy: loaded only by this test
    import torch

    from tapebench.methods.contract import EnvSpec
    from tapebench.registry import make_agent

    torch.manual_seed(0)
    config = build_config("ensemble_mpc", {})
    agent = make_agent("ensemble_mpc", config, EnvSpec.for_tape(16, 16), 1000)
    settings = WorldTestSettings(problems_per_rule=2, planner_candidates=16, prediction_lengths=(2,),
                                 planning_horizon=4, goal_steps=2, detection_length=4)
    sides = {"train": [4, 30], "test": [90]}
    tables = [run_worldtest(get_method("ensemble_mpc"), config, settings, sides=sides, L=16, H=16, seed=0,
                             budget=6, agent=agent) for _ in range(2)]
    assert tables[0].equals(tables[1])
    assert tables[0]["score"].between(0, 1).all()


def test_interaction_starts_on_a_random_or_the_zero_tape_and_resets_to_fresh_random_tapes():
    rows = worldtest_rows([30, 110], 2, 16, side="train", seed=0)

    class Recorder(worldtest.ChanceTester):
        def explore_begin(self, batch):
            super().explore_begin(batch)
            self.seen = []

        def explore_act(self, tapes, step):
            return np.full(len(tapes), self.L if step == 1 else 3)      # flip, reset, flip

        def explore_observe(self, tapes, actions, next_tapes):
            self.seen.append((tapes, actions, next_tapes))

    context = worldtest.WorldTestContext(L=16, H=16, seed=0)
    for start in ("random", "zeros"):
        tester = Recorder(context)
        interact(tester, rows, 3, reveal_rules=False, start=start)
        first = tester.seen[0][0]
        assert (first.any(axis=1).all() if start == "random" else not first.any())
        assert np.array_equal(tester.seen[1][2], fresh_tapes(rows.keys, 1, 16))   # the first reset's tape
        assert np.array_equal(tester.seen[2][2], transition(tester.seen[1][2], np.full(4, 3), rows.rules))
    with pytest.raises(ValueError, match="interaction_start must be one of"):
        WorldTestSettings(interaction_start="ones")


@pytest.mark.parametrize("method_id", ["ensemble_mpc", "dreamer"])
def test_a_world_model_scores_many_candidates_from_one_filtered_prefix(method_id):
    """`world_model_rollout(..., repeat=k)` equals the rollout from the prefix repeated k times, and the learned
    tester plans the same with and without it."""
    # torch is heavy: loaded only by this test
    import torch

    from tapebench.methods.contract import EnvSpec
    from tapebench.registry import make_agent

    torch.manual_seed(1)
    config = build_config(method_id, {})
    agent = make_agent(method_id, config, EnvSpec.for_tape(16, 16), 1000)
    gen = torch.Generator().manual_seed(0)
    obs = torch.cat([torch.randint(0, 2, (3, 5, 16), generator=gen).float(), torch.rand(3, 5, 1, generator=gen)], 2)
    prefix_actions = torch.randint(0, 16, (3, 4), generator=gen)
    actions = torch.randint(0, 16, (3 * 4, 6), generator=gen)
    once = agent.world_model_rollout(obs, prefix_actions, actions, repeat=4)
    repeated = agent.world_model_rollout(obs.repeat_interleave(4, 0), prefix_actions.repeat_interleave(4, 0), actions)
    assert torch.allclose(once, repeated, atol=1e-6)

    class WithoutRepeat:          # a plug-in world model that does not offer `repeat`
        def world_model_rollout(self, obs_prefix, action_prefix, following):
            return agent.world_model_rollout(obs_prefix, action_prefix, following)

    settings = WorldTestSettings(tasks=("planning",), problems_per_rule=2, planner_candidates=8, planning_horizon=4,
                                 goal_steps=2)
    tables = [run_worldtest(get_method(method_id), config, settings, sides={"train": [30, 90]}, L=16, H=16, seed=0,
                             budget=3, agent=a) for a in (agent, WithoutRepeat())]
    assert tables[0].equals(tables[1])


# --- k-colour radius-r families ------------------------------------------------------------------------------
K3R1 = RuleFamily(3, 1)


def test_a_k3r1_transition_pins_the_entries_of_the_neighbourhoods_it_shows():
    context = worldtest.WorldTestContext(L=6, H=8, seed=0, family=K3R1)
    tester = worldtest.ExactReasoningTester(context, active=False)
    tester.explore_begin(worldtest.WorldTestBatch(L=6, budget=1, keys=np.zeros(1, dtype=np.uint64)))
    before = np.array([[0, 1, 2, 0, 0, 2]], dtype=np.uint8)
    post = [0, 1, 0, 0, 0, 2]                         # cell 2 incremented mod 3: 2 -> 0
    after = np.array([[1, 2, 0, 1, 1, 2]], dtype=np.uint8)
    tester.explore_observe(before, np.array([2]), after)
    expected = np.full(27, worldtest.UNPINNED)
    for c in range(6):                                # neighbourhood (x[c-1], x[c], x[c+1]), left most significant
        expected[9 * post[c - 1] + 3 * post[c] + post[(c + 1) % 6]] = after[0, c]
    assert np.array_equal(tester.pins[0], expected) and (tester.pins[0] != worldtest.UNPINNED).sum() == 6
    # a transition that contradicts a pin is reported and leaves the pins as they were; one that agrees is not
    assert tester.detect_step(1, before, np.array([2]), (after + 1) % 3).tolist() == [True]
    assert np.array_equal(tester.pins[0], expected)
    assert tester.detect_step(1, before, np.array([2]), after).tolist() == [False]


def test_k3r1_prediction_is_exact_once_the_needed_entries_are_pinned_and_at_chance_before():
    rules = [K3R1.number(np.random.default_rng(z).integers(0, 3, 27)) for z in range(6)]
    rows = worldtest_rows(rules, 4, 16, side="train", seed=0, family=K3R1)
    problems, key = prediction_problems(rows, 1, 4)
    assert np.all(problems.candidates < 3) and np.all(problems.tapes < 3)
    context = worldtest.WorldTestContext(L=16, H=16, seed=0, family=K3R1)
    tester = worldtest.ExactReasoningTester(context, active=False)
    tester.explore_begin(worldtest.WorldTestBatch(L=16, budget=0, keys=rows.keys))
    blind = tester.predict(problems)                 # nothing pinned: every candidate is possible, the lowest wins
    assert np.all(blind == 0)
    tables = K3R1.tables(rows.rules)                 # pin exactly the entries the masked cells read
    posts = act(problems.tapes[:, -1], problems.actions[:, -1], 3)
    entries = neighbourhood_indices(posts, K3R1)
    for i in range(len(rows)):
        needed = entries[i, problems.mask[i]]
        tester.pins[i, needed] = tables[i, needed]
    assert np.array_equal(tester.predict(problems), key.answers)


@pytest.mark.parametrize("family", [ELEMENTARY, K3R1], ids=["eca", "k3r1"])
def test_from_the_zero_tape_exact_reasoning_rises_with_the_budget_and_records_the_family(family):
    rng = np.random.default_rng(1)
    rules = [30, 110, 90, 54, 150, 60] if family.elementary else \
        [family.number(rng.integers(0, 3, 27)) for _ in range(6)]
    settings = WorldTestSettings(tasks=("prediction", "detection"), problems_per_rule=4, prediction_lengths=(1,),
                                 detection_length=2, interaction_start="zeros")
    scores = {}
    for budget in (0, 16):
        table = run_worldtest(get_method("active_identify"), build_config("active_identify", {}), settings,
                              sides={"train": rules}, L=16, H=16, seed=0, budget=budget, family=family)
        assert (table["family"] == family.name).all()
        scores[budget] = table.groupby("task")["score"].mean()
    assert scores[0]["prediction"] <= 0.4 < 0.9 <= scores[16]["prediction"]
    assert scores[16]["detection"] > scores[0]["detection"]


def test_a_k3r1_world_test_refuses_planning_and_elementary_only_testers():
    with pytest.raises(ValueError, match="planning is defined for the elementary family"):
        run_worldtest(get_method("identify_then_plan"), build_config("identify_then_plan", {}), SMALL,
                      sides={"train": [5]}, L=16, H=16, seed=0, budget=0, family=K3R1)
    assert worldtest.supports_family(get_method("active_identify").worldtest, K3R1)
    assert not worldtest.supports_family(worldtest.learned_model_tester, K3R1)
    assert worldtest.supports_family(worldtest.learned_model_tester, ELEMENTARY)
