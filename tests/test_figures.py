"""The paper's figures and the rliable-style outputs: the data behind each figure against hand-computed
values, and every builder writing a non-empty PDF and PNG (or LaTeX + Parquet) from small synthetic tables."""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tapebench.ca import reference
from tapebench.pipeline.config import validate_config
from tapebench.report import figures, registry, rliable_outputs, style
from tapebench.stats.aggregate import GROUP, group_generator
from tapebench.utils.io import write_parquet
from tapebench.vocabulary import SPLIT_SIDES

REPO = Path(__file__).resolve().parents[1]
TYPES = {0: "stable", 4: "stable", 30: "chaotic", 90: "periodic", 110: "chaotic"}
SIDE_RULES = {"train": (0, 4, 30), "test": (90, 110)}


# --- synthetic pipeline tables ------------------------------------------------------------------------------
def per_rule_frame(scores: dict) -> pd.DataFrame:
    """scores: {(agent, side): {seed: {rule: value}}} -> a per-rule table (metric success, split main, H 8)."""
    rows = [{"split": "main", "agent": agent, "L": 8, "H": 8, "seed": seed, "side": side, "rule": rule,
             "type": TYPES[rule], "metric": "success", "value": value, "k_used": 2, "n_episodes": 4}
            for (agent, side), by_seed in scores.items() for seed, by_rule in by_seed.items()
            for rule, value in by_rule.items()]
    return pd.DataFrame(rows)


def synthetic_scores() -> dict:
    rng = np.random.default_rng(3)
    scores = {}
    for agent, seeds, level in (("dqn", 3, 0.6), ("random", 3, 0.2), ("mpc", 3, 0.9)):
        for side, rules in SIDE_RULES.items():
            scores[(agent, side)] = {s: {r: float(np.clip(level + rng.normal(0, 0.2), 0, 1)) for r in rules}
                                     for s in range(seeds)}
    return scores


def curves_frame(values: dict) -> pd.DataFrame:
    """values: {(agent, side, checkpoint): [value of seed 0, seed 1, ...]} -> a curves table."""
    rows = [{"split": "main", "agent": agent, "L": 8, "H": 8, "seed": seed, "side": side, "checkpoint": ckpt,
             "metric": "success", "value": v, "n_episodes": 5}
            for (agent, side, ckpt), vs in values.items() for seed, v in enumerate(vs)]
    return pd.DataFrame(rows)


def write_table(path: Path, frame: pd.DataFrame, kind: str) -> Path:
    write_parquet(path, frame, meta={"table": kind})
    return path


# --- Figure 1 -----------------------------------------------------------------------------------------------
def test_figure1_stages_are_the_reference_transitions_of_rule_30():
    stages = figures.rollout_stages(figures.FIGURE1_TAPE, figures.FIGURE1_ACTIONS, 30)
    tapes = [s["tape"].tolist() for s in stages]
    # by hand, rule 30 = 0b00011110 on the periodic tape
    assert tapes == [[0, 1, 1, 0, 1, 0, 0, 1],
                     [0, 1, 0, 0, 1, 0, 0, 1],      # flip cell 2
                     [0, 1, 1, 1, 1, 1, 1, 1],      # rule 30 update
                     [0, 1, 1, 1, 1, 1, 0, 1],      # flip cell 6
                     [0, 1, 0, 0, 0, 0, 0, 1]]      # rule 30 update
    assert [s["flipped"] for s in stages] == [None, 2, None, 6, None]
    s1 = reference.transition(np.array(figures.FIGURE1_TAPE), 2, 30)
    assert np.array_equal(stages[2]["tape"], s1)
    assert np.array_equal(stages[4]["tape"], reference.transition(s1, 6, 30))


def test_figure4_space_time_follows_the_reference_kernel():
    tape, actions = figures.figure4_episode(seed=0, L=32, H=64)
    assert tape.shape == (32,) and actions.shape == (64,) and actions.min() >= 0 and actions.max() < 32
    again_tape, again_actions = figures.figure4_episode(seed=0, L=32, H=64)
    assert np.array_equal(tape, again_tape) and np.array_equal(actions, again_actions)
    rule0 = figures.spacetime(tape, actions, 0)
    assert rule0.shape == (65, 32) and np.array_equal(rule0[0], tape) and not rule0[1:].any()
    identity = figures.spacetime(tape, actions, 204)         # rule 204 copies the cell: only the flip acts
    for t, a in enumerate(actions):
        changed = np.flatnonzero(identity[t + 1] != identity[t])
        assert changed.tolist() == [a]
    rule30 = figures.spacetime(tape, actions, 30)
    for t in (0, 17, 63):
        assert np.array_equal(rule30[t + 1], reference.transition(rule30[t], int(actions[t]), 30))
    with pytest.raises(ValueError, match="L >= 1"):
        figures.figure4_episode(L=0)


# --- Figure 3 -----------------------------------------------------------------------------------------------
def test_figure3_points_are_per_rule_means_over_seeds_in_family_order():
    frame = per_rule_frame({("random", "test"): {0: {90: 0.0, 110: 1.0}, 1: {90: 0.5, 110: 1.0}},
                            ("dqn", "train"): {0: {0: 0.25, 30: 1.0}, 1: {0: 0.75, 30: 0.0}, 2: {0: 0.5, 30: 0.5}},
                            ("dqn", "test"): {0: {90: 0.1, 110: 0.2}, 1: {90: 0.3, 110: 0.2}, 2: {90: 0.2, 110: 0.2}}})
    points = figures.per_rule_points(frame)
    assert list(dict.fromkeys(points["agent"])) == ["dqn", "random"]      # learned before the references
    dqn = points[points["agent"] == "dqn"].set_index(["side", "rule"])
    assert dqn.loc[("train", 0), "value"] == pytest.approx(0.5) and dqn.loc[("train", 30), "value"] == pytest.approx(0.5)
    assert dqn.loc[("test", 90), "value"] == pytest.approx(0.2) and dqn.loc[("test", 90), "n_seeds"] == 3
    assert dqn.loc[("train", 30), "type"] == "chaotic"
    random = points[points["agent"] == "random"].set_index("rule")
    assert random.loc[90, "value"] == pytest.approx(0.25) and random.loc[110, "value"] == 1.0
    with pytest.raises(ValueError, match="no rows with metric = 'return'"):
        figures.per_rule_points(frame, metric="return")


def test_figure3_marks_the_rules_the_rule_agnostic_floor_already_solves():
    frame = per_rule_frame({("live_leftmost", "test"): {0: {90: 0.5, 110: 0.25, 30: 0.0}},
                            ("random", "test"): {0: {90: 0.0, 110: 0.5, 30: 0.0}},
                            ("mpc", "test"): {0: {90: 0.5, 110: 0.75, 30: 0.0}}})
    points = figures.per_rule_points(frame)
    # the floor is live_leftmost (mean 0.25 > random's 0.17): rule 90 equals the MPC; 110 is below; 30 is 0
    assert figures.floor_rules(points) == {("test", 90)}
    assert figures.floor_rules(points, rule_agnostic=["random"]) == set()
    assert figures.floor_rules(points[points["agent"] != "mpc"]) == set()      # no reference: nothing marked


# --- learning curves ----------------------------------------------------------------------------------------
def test_curve_band_is_the_percentile_bootstrap_of_the_seed_mean():
    values = [0.1, 0.4, 0.3, 0.9]
    curves = curves_frame({("dqn", "test", 1000): values, ("dqn", "test", 2000): [0.5] * 4,
                           ("dqn", "train", 1000): [0.2, 0.2, 0.6, 0.6]})
    bands = figures.curve_bands(curves, n_resamples=500, ci=0.9, seed=7).set_index(["side", "checkpoint"])
    band = bands.loc[("test", 1000)]
    # by hand: B resamples of the 4 seeds from the group's generator, their means, the 5th / 95th percentiles
    gen = group_generator(7, ("dqn", "test", 1000, "success"))
    boot = np.asarray(values)[gen.integers(0, 4, size=(500, 4))].mean(axis=1)
    assert band["mean"] == pytest.approx(np.mean(values)) and band["n_seeds"] == 4
    assert (band["ci_low"], band["ci_high"]) == pytest.approx(tuple(np.percentile(boot, [5, 95])))
    constant = bands.loc[("test", 2000)]
    assert constant["ci_low"] == constant["ci_high"] == pytest.approx(0.5)
    assert bands.loc[("train", 1000), "mean"] == pytest.approx(0.4)


def test_methods_without_a_curve_are_reference_levels():
    assert registry.has_curve("dqn") and not registry.has_curve("random") and not registry.has_curve("mpc")
    assert not registry.has_curve("planet")                   # evaluated at its last K checkpoints only
    unknown = curves_frame({("plugin", "test", 1): [0.0], ("plugin", "test", 2): [1.0]})
    assert registry.has_curve("plugin", unknown) and not registry.has_curve("plugin")
    levels = figures.reference_levels(curves_frame({("planet", "test", 3000): [0.2, 0.4],
                                                    ("planet", "test", 4000): [0.4, 1.0]}))
    # seed 0: (0.2 + 0.4) / 2 = 0.3, seed 1: (0.4 + 1.0) / 2 = 0.7 -> 0.5
    assert levels.set_index("side").loc["test", "value"] == pytest.approx(0.5)


# --- oracle gap ---------------------------------------------------------------------------------------------
def gap_frame() -> pd.DataFrame:
    rules = [(0, "stable", 1.0, 1.0, 0.0, 0.0), (4, "stable", 1.0, 1.0, 0.0, 0.0), (30, "chaotic", 0.4, 0.9, 0.2, 0.05),
             (110, "chaotic", 0.3, 1.0, 0.3, 0.0), (90, "periodic", 0.6, 0.6, 0.1, 0.1)]
    rows = [{"level": "rule", "rule": r, "type": t, "n": 10, "mpc_success": ms, "exact_success": es,
             "mpc_final_dist": md, "exact_final_dist": ed, "success_gap": es - ms, "exact_worse": 0}
            for r, t, ms, es, md, ed in rules]
    rows.append({"level": "all", "rule": -1, "type": "all", "n": 50, "mpc_success": 0.66, "exact_success": 0.9,
                 "mpc_final_dist": 0.12, "exact_final_dist": 0.03, "success_gap": 0.24, "exact_worse": 0})
    return pd.DataFrame(rows)


def test_oracle_gap_points_are_the_per_rule_rows():
    points = figures.oracle_gap_points(gap_frame())
    assert points["rule"].tolist() == [0, 4, 30, 90, 110]
    assert points.set_index("rule").loc[110, ["mpc_success", "exact_success"]].tolist() == [0.3, 1.0]
    with pytest.raises(ValueError, match="lacks columns"):
        figures.oracle_gap_points(gap_frame().drop(columns="exact_success"))


# --- rliable --------------------------------------------------------------------------------------------------
def test_rliable_summary_and_profile_against_hand_values():
    # dqn on OOD: seeds x rules (90, 110) = [[0, .5], [1, .25], [.5, .5]]
    scores = {("dqn", "test"): {0: {90: 0.0, 110: 0.5}, 1: {90: 1.0, 110: 0.25}, 2: {90: 0.5, 110: 0.5}},
              ("random", "test"): {0: {90: 0.0, 110: 0.0}, 1: {90: 0.0, 110: 0.5}}}
    frame = per_rule_frame(scores)
    summary = rliable_outputs.rliable_summary(frame, n_resamples=300, ci=0.95, seed=0)
    dqn = summary[(summary["agent"] == "dqn")].set_index("statistic")
    task_means = [0.5, 1.25 / 3]
    assert dqn.loc["mean", "point"] == pytest.approx(np.mean(task_means))
    assert dqn.loc["median", "point"] == pytest.approx(np.median(task_means))
    assert dqn.loc["iqm", "point"] == pytest.approx(np.mean([0.25, 0.5, 0.5, 0.5]))   # drop 1 of 6 at each end
    assert dqn.loc["optimality_gap", "point"] == pytest.approx(1 - np.mean(task_means))
    assert (dqn["n_runs"] == 3).all() and (dqn["n_tasks"] == 2).all() and set(summary["side"]) == {"test"}
    assert (summary["ci_low"] <= summary["point"] + 1e-12).all() and (summary["point"] <= summary["ci_high"] + 1e-12).all()

    profile = rliable_outputs.profiles(frame, "test", taus=[0.0, 0.4, 0.5, 1.0], n_resamples=200)["dqn"]
    # fraction of the 6 (seed, rule) scores strictly above tau
    assert profile.point.tolist() == pytest.approx([5 / 6, 4 / 6, 1 / 6, 0.0])
    assert np.all(profile.low <= profile.point + 1e-12) and np.all(profile.point <= profile.high + 1e-12)

    matrix = rliable_outputs.improvement_matrix(frame, "test", n_resamples=200)
    # rule 90: dqn runs (0, 1, .5) vs random (0, 0): pairs 6 -> ties .5 x 2, wins 4 -> 5/6; rule 110:
    # dqn (.5, .25, .5) vs random (0, .5): wins 3 (vs 0), ties 2 (.5 = .5), losses 1 (.25 < .5) -> 4/6
    assert matrix.methods == ("dqn", "random")
    assert matrix.point[0, 1] == pytest.approx((5 / 6 + 4 / 6) / 2)
    assert matrix.point[1, 0] == pytest.approx(1 - matrix.point[0, 1])


def test_rliable_table_and_figures_are_written(tmp_path):
    scores = synthetic_scores()
    paths = [write_table(tmp_path / f"{a}.per_rule.parquet", per_rule_frame({k: v for k, v in scores.items() if k[0] == a}),
                         "per_rule") for a in ("dqn", "random", "mpc")]
    tex = rliable_outputs.render_rliable(tmp_path / "rliable.tex", per_rule=paths, n_resamples=200, ci=0.95,
                                         seed=0, parquet=tmp_path / "rliable.parquet")
    summary = pd.read_parquet(tmp_path / "rliable.parquet")
    assert len(summary) == 3 * 2 * 4
    iqm = summary[(summary["agent"] == "dqn") & (summary["side"] == "test") & (summary["statistic"] == "iqm")].iloc[0]
    assert f"{iqm['point']:.3f}" in tex and "DQN & 3" in tex and "True-dynamics MPC & 3" in tex
    assert tex.index("DQN") < tex.index("Random policy")             # learned rows first
    assert "3 ID and 2 OOD rules" in tex
    for stem, render in (("poi", rliable_outputs.render_probability_of_improvement),
                         ("profile", rliable_outputs.render_performance_profile)):
        kwargs = {"parquet": tmp_path / "poi.parquet"} if stem == "poi" else {}
        render(tmp_path / stem, per_rule=paths, n_resamples=100, **kwargs)
        for ext in ("pdf", "png"):
            assert (tmp_path / f"{stem}.{ext}").stat().st_size > 5000
    poi = pd.read_parquet(tmp_path / "poi.parquet")
    assert len(poi) == 6 and set(poi["side"]) == {"test"}


def test_figure_builders_write_pdf_and_png(tmp_path):
    scores = synthetic_scores()
    per_rule = [write_table(tmp_path / f"{a}.per_rule.parquet",
                            per_rule_frame({k: v for k, v in scores.items() if k[0] == a}), "per_rule")
                for a in ("dqn", "random", "mpc")]
    curve_values = {("dqn", side, c): [min(1, c / 4000 + 0.1 * s) for s in range(3)]
                    for side in SPLIT_SIDES for c in (1000, 2000, 3000, 4000)}
    curve_values.update({("random", side, 0): [0.1, 0.15, 0.12] for side in SPLIT_SIDES})
    curves = [write_table(tmp_path / "curves.parquet", curves_frame(curve_values), "curves")]
    gap = tmp_path / "gap.parquet"
    write_parquet(gap, gap_frame())
    builds = {"figure1": lambda out: figures.render_figure1(out),
              "figure4": lambda out: figures.render_figure4(out, L=16, H=20),
              "figure3": lambda out: figures.render_figure3(out, per_rule=per_rule),
              "curves": lambda out: figures.render_learning_curves(out, curves=curves, n_resamples=100),
              "gap": lambda out: figures.render_oracle_gap(out, gap=gap)}
    for name, build in builds.items():
        written = build(tmp_path / name)
        assert written == [f"{tmp_path / name}.pdf", f"{tmp_path / name}.png"]
        for path in written:
            assert Path(path).stat().st_size > 5000, path
    only_random = [write_table(tmp_path / "random_curves.parquet",
                               curves_frame({("random", "test", 0): [0.1], ("random", "train", 0): [0.2]}), "curves")]
    with pytest.raises(ValueError, match="no method with a learning curve"):
        figures.render_learning_curves(tmp_path / "none", curves=only_random)


# --- registry jobs ------------------------------------------------------------------------------------------
def _tiny_config() -> dict:
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    for key, value in yaml.safe_load((REPO / "tests/data/tiny.yaml").read_text()).items():
        config[key] = {**config[key], **value} if isinstance(value, dict) and isinstance(config.get(key), dict) else value
    return validate_config(config, REPO / "workflow/schemas/config.schema.yaml")


def test_jobs_ask_for_the_tables_of_the_configured_methods():
    config = _tiny_config()
    jobs = {entry.id: job for entry, job in registry.jobs(config)}
    assert jobs["figure3"].values["per_rule"] == [f"results/aggregate/main/{m}_H8.per_rule.parquet"
                                                  for m in config["methods"]]
    assert jobs["learning_curves"].values["curves"] == [f"results/aggregate/main/{m}_H8.curves.parquet"
                                                        for m in config["methods"]]
    assert jobs["oracle_gap"].values["gap"] == "results/oracle/fixed_z_L8_H8/gap.parquet"
    assert jobs["rliable"].values["n_resamples"] == 200 and jobs["rliable"].values["seed"] == 0
    assert jobs["figure1"].files(registry.OUTPUTS["figure1"]) == {}
    targets = registry.targets(config)
    assert {"results/rliable.tex", "results/rliable.parquet", "results/figures/performance_profile.png",
            "results/figures/figure4_spacetime.pdf", "results/probability_of_improvement.parquet"} <= set(targets)
    untrained = copy.deepcopy(config)
    untrained["methods"] = ["random", "mpc"]
    ids = {entry.id for entry, _ in registry.jobs(untrained)}
    assert "learning_curves" not in ids and {"figure3", "rliable", "probability_of_improvement"} <= ids
    alone = copy.deepcopy(config)
    alone["methods"] = ["mpc"]
    assert "probability_of_improvement" not in {entry.id for entry, _ in registry.jobs(alone)}
