"""The studies' tables and figure against hand-computed synthetic inputs (per-type micro / macro averages,
fixed-z Tables 5 and 6, split robustness and its ranks), the studies' config checks and registry jobs."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tapebench.pipeline.config import ConfigError, load_config, validate_config
from tapebench.report import registry
from tapebench.report.fixed_z import table5_context, table6_context
from tapebench.report.per_type import MACRO, MICRO, per_seed_by_type, type_summary
from tapebench.report.robustness import per_partition, rank_summary, render_robustness
from tapebench.stats.aggregate import group_generator
from tapebench.stats.bootstrap import bootstrap_means, percentile_ci, percentile_interval, resample_indices

REPO_SCHEMA = "workflow/schemas/config.schema.yaml"


def _per_rule(rows, *, agent="dqn", split="main", L=8, H=8, k_used=2) -> pd.DataFrame:
    """rows: (seed, side, rule, type, value, n_episodes) -> a per-rule table of strict success."""
    return pd.DataFrame([{"split": split, "agent": agent, "L": L, "H": H, "seed": s, "side": side, "rule": z,
                          "type": t, "metric": "success", "value": v, "k_used": k_used, "n_episodes": n}
                         for s, side, z, t, v, n in rows])


# --- success by rule type ----------------------------------------------------------------------------------------
# OOD side: 1 stable, 1 periodic, 4 chaotic rules, 20 episodes each (imbalanced, as the paper's test split)
IMBALANCED = {
    0: {1: ("stable", 1.0), 4: ("periodic", 0.5), 30: ("chaotic", 0.0), 45: ("chaotic", 0.0),
        86: ("chaotic", 0.0), 110: ("chaotic", 0.0)},
    1: {1: ("stable", 0.0), 4: ("periodic", 0.5), 30: ("chaotic", 0.25), 45: ("chaotic", 0.25),
        86: ("chaotic", 0.25), 110: ("chaotic", 0.25)},
}


def _imbalanced() -> pd.DataFrame:
    return _per_rule([(s, "test", z, t, v, 20) for s, rules in IMBALANCED.items() for z, (t, v) in rules.items()])


def test_micro_and_macro_differ_on_an_imbalanced_side_as_by_hand():
    per_seed = per_seed_by_type(_imbalanced()).set_index(["seed", "stratum"])["value"]
    # seed 0: micro = (1 + 0.5 + 4 * 0) / 6 = 0.25, macro = (1 + 0.5 + 0) / 3 = 0.5
    assert per_seed[(0, MICRO)] == pytest.approx(0.25) and per_seed[(0, MACRO)] == pytest.approx(0.5)
    # seed 1: micro = (0 + 0.5 + 4 * 0.25) / 6 = 0.25, macro = (0 + 0.5 + 0.25) / 3 = 0.25
    assert per_seed[(1, MICRO)] == pytest.approx(0.25) and per_seed[(1, MACRO)] == pytest.approx(0.25)
    assert per_seed[(1, "chaotic")] == pytest.approx(0.25) and per_seed[(0, "stable")] == 1.0

    summary = type_summary(_imbalanced(), n_resamples=500, ci=0.9, seed=3).set_index("stratum")
    assert summary.loc[MICRO, "mean"] == pytest.approx(0.25)
    assert summary.loc[MACRO, "mean"] == pytest.approx(0.375)
    assert summary.loc["stable", "mean"] == pytest.approx(0.5)
    assert summary["n_rules"].to_dict() == {"stable": 1, "periodic": 1, "chaotic": 4, MICRO: 6, MACRO: 6}
    assert (summary["n_seeds"] == 2).all()


def test_micro_weights_rules_by_their_episodes():
    rows = [(0, "train", 0, "stable", 1.0, 10), (0, "train", 30, "chaotic", 0.0, 30)]
    per_seed = per_seed_by_type(_per_rule(rows)).set_index("stratum")["value"]
    assert per_seed[MICRO] == pytest.approx(10 / 40) and per_seed[MACRO] == pytest.approx(0.5)


def test_type_ci_is_the_percentile_bootstrap_over_seeds():
    values = {0: 0.1, 1: 0.4, 2: 0.35, 3: 0.9}
    rows = [(s, "test", 30, "chaotic", v, 20) for s, v in values.items()]
    summary = type_summary(_per_rule(rows), n_resamples=1000, ci=0.95, seed=7)
    row = summary[summary["stratum"] == "chaotic"].iloc[0]
    indices = resample_indices(4, 1000, group_generator(7, ("main", "dqn", "test", "types")))
    low, high = percentile_interval(bootstrap_means(np.array(list(values.values())), indices=indices), 0.95)
    assert row["mean"] == pytest.approx(np.mean(list(values.values())))
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((low, high))
    assert low < row["mean"] < high


def test_type_table_has_the_rule_dependent_headroom_per_type():
    from tapebench.report.per_type import HEADROOM_ROW, per_type_context

    rules = [(30, "chaotic"), (4, "stable")]
    levels = {"mpc": {30: 0.5, 4: 1.0}, "live_leftmost": {30: 0.25, 4: 1.0}, "random": {30: 0.0, 4: 0.5},
              "dqn": {30: 0.1, 4: 0.2}}
    frame = pd.concat([_per_rule([(s, "test", z, t, levels[a][z], 20) for s in (0, 1) for z, t in rules], agent=a)
                       for a in levels], ignore_index=True)
    summary = type_summary(frame, n_resamples=200, seed=1)
    head = summary[summary["agent"] == HEADROOM_ROW].set_index("stratum")
    # the floor is live_leftmost (micro 0.625 > random's 0.25): MPC minus it per type
    assert head.loc["chaotic", "mean"] == pytest.approx(0.25) and head.loc["stable", "mean"] == pytest.approx(0.0)
    assert head.loc[MICRO, "mean"] == pytest.approx(0.125) and head.loc["chaotic", "n_rules"] == 1
    context = per_type_context(summary, split="main", H=8)
    assert context["headroom"] and context["rows"][-1]["name"].startswith("Rule-dependent headroom")
    assert HEADROOM_ROW not in set(type_summary(frame[frame["agent"] != "mpc"], n_resamples=50)["agent"])


# --- Table 5 ------------------------------------------------------------------------------------------------------
def _fixed_z_per_rule(agent, rule, successes, dists) -> pd.DataFrame:
    rows = []
    for seed, (s, d) in enumerate(zip(successes, dists)):
        for metric, v in (("success", s), ("soft_success@0.1", min(1.0, s + 0.1)), ("final_dist", d)):
            rows.append({"split": "", "agent": agent, "L": 32, "H": 32, "seed": seed, "side": "rules", "rule": rule,
                         "type": "", "metric": metric, "value": v, "k_used": 3, "n_episodes": 60})
    return pd.DataFrame(rows)


def test_table5_rows_are_means_over_seeds_with_bootstrap_cis():
    per_rule = pd.concat([_fixed_z_per_rule("rad_dqn", 0, [1.0, 1.0, 0.97], [0.0, 0.0, 0.01]),
                          _fixed_z_per_rule("curl_dqn", 0, [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]),
                          _fixed_z_per_rule("rad_dqn", 30, [0.0, 0.05, 0.1], [0.5, 0.45, 0.4]),
                          _fixed_z_per_rule("curl_dqn", 30, [0.0, 0.0, 0.0], [0.52, 0.5, 0.48])])
    context = table5_context(per_rule, {0: "stable", 30: "chaotic"}, rules=[30, 0], agents=["rad_dqn", "curl_dqn"],
                             n_resamples=400, ci=0.95, seed=1)
    assert [(r["rule"], r["type"], r["name"]) for r in context["rows"]] == [
        (30, "chaotic", "DQN + RAD"), (30, "chaotic", "DQN + CURL"), (0, "stable", "DQN + RAD"),
        (0, "stable", "DQN + CURL")]
    rad30 = context["rows"][0]["cells"]
    assert rad30[0]["mean"] == pytest.approx(0.05) and rad30[2]["mean"] == pytest.approx(0.45)
    expected = percentile_ci([0.0, 0.05, 0.1], 400, 0.95, rng=group_generator(1, ("rad_dqn", 32, 32, "rules", 30,
                                                                                   "success")))
    assert (rad30[0]["low"], rad30[0]["high"]) == pytest.approx((expected.low, expected.high))
    assert context["rows"][3]["cells"][0] == {"mean": 1.0, "low": 1.0, "high": 1.0, "n": 3}
    assert (context["L"], context["H"], context["seeds"], context["last_k"], context["episodes"]) == (32, 32, 3, 3, 20)
    with pytest.raises(ValueError, match=r"\('curl_dqn', 4\)"):
        table5_context(per_rule, {0: "stable", 4: "periodic"}, rules=[0, 4], agents=["curl_dqn"])


# --- Table 6 ------------------------------------------------------------------------------------------------------
def _records(side, successes, rule0=0) -> pd.DataFrame:
    return pd.DataFrame({"split": "main", "side": side, "rule": [rule0 + i // 2 for i in range(len(successes))],
                         "type": "", "episode": [i % 2 for i in range(len(successes))], "L": 16, "H": 16,
                         "success": successes, "final_dist": 0.0, "auc_dist": 0.0, "return": 0.0, "steps": 1})


def test_table6_oracle_rows_use_episodes_and_learned_rows_use_seeds():
    multi_oracle = {"mpc": {"train": _records("train", [True, False, True, True]),
                            "test": _records("test", [False, False, True, False])}}
    aggregate = pd.DataFrame([{"split": "main", "agent": "pearl_dqn", "L": 16, "H": 16, "side": side,
                               "metric": "success", "n": 5, "mean": m, "sd": 0.01, "ci_low": m - 0.02,
                               "ci_high": m + 0.02, "ci": 0.95, "n_resamples": 100}
                              for side, m in (("train", 0.35), ("test", 0.2))])
    rule_mpc = pd.DataFrame({"rule": [0, 0, 30, 30], "episode": [0, 1, 0, 1], "success": [True, True, False, True]})
    rule_exact = rule_mpc.assign(success=True)
    per_rule = pd.concat([_fixed_z_per_rule("pearl_dqn", z, [0.9, 1.0], [0.0, 0.0]) for z in (0, 30)])
    context = table6_context(multi_oracle=multi_oracle, multi_aggregate=aggregate,
                             rule_oracle={"mpc": rule_mpc, "exact": rule_exact}, per_rule=per_rule,
                             types={0: "stable", 30: "chaotic"}, rules=[0, 30], agents=["pearl_dqn"],
                             multi_agents=["pearl_dqn"], n_resamples=300, ci=0.95, seed=0)
    mpc, pearl = context["multi"]
    assert mpc["unit"] == "episodes" and mpc["train"]["mean"] == 0.75 and mpc["train"]["n"] == 4
    assert mpc["test"]["mean"] == 0.25
    expected = percentile_ci([1.0, 0.0, 1.0, 1.0], 300, 0.95, rng=group_generator(0, ("table6", "mpc", "train")))
    assert (mpc["train"]["low"], mpc["train"]["high"]) == pytest.approx((expected.low, expected.high))
    assert pearl["unit"] == "seeds" and pearl["train"]["mean"] == 0.35 and pearl["test"]["high"] == 0.22
    assert [(r["rule"], r["mpc"]["mean"], r["exact"]["mean"]) for r in context["rows"]] == [(0, 1.0, 1.0), (30, 0.5, 1.0)]
    assert context["rows"][1]["learned"][0]["mean"] == pytest.approx(0.95) and context["rule_episodes"] == 2


# --- split robustness ---------------------------------------------------------------------------------------------
def _aggregate(split, means) -> pd.DataFrame:
    return pd.DataFrame([{"split": split, "agent": a, "L": 8, "H": 8, "side": "test", "metric": "success", "n": 3,
                          "mean": m, "sd": 0.0, "ci_low": m, "ci_high": m, "ci": 0.95, "n_resamples": 100}
                         for a, m in means.items()])


AGGREGATES = {"main": {"dqn": 0.3, "ppo": 0.2, "rad_dqn": 0.1},
              "random1": {"dqn": 0.3, "ppo": 0.2, "rad_dqn": 0.1},
              "random2": {"dqn": 0.1, "ppo": 0.2, "rad_dqn": 0.3},
              "diverse2": {"dqn": 0.2, "ppo": 0.2, "rad_dqn": 0.0}}


def test_ranks_per_partition_and_kendall_tau_by_hand():
    table = per_partition({s: _aggregate(s, m) for s, m in AGGREGATES.items()}, L=8, H=8)
    ranks = table.set_index(["split", "agent"])["rank"]
    assert ranks[("main", "dqn")] == 1 and ranks[("random2", "dqn")] == 3
    assert ranks[("diverse2", "dqn")] == ranks[("diverse2", "ppo")] == 1.5     # tie: average rank
    summary, tau = rank_summary(table, list(AGGREGATES))
    dqn = summary.set_index("agent").loc["dqn"]
    assert dqn["mean"] == pytest.approx(0.225) and dqn["min"] == 0.1 and dqn["max"] == 0.3
    assert dqn["sd"] == pytest.approx(np.std([0.3, 0.3, 0.1, 0.2], ddof=1))
    assert dqn["mean_rank"] == pytest.approx((1 + 1 + 3 + 1.5) / 4) and dqn["rank_range"] == 2
    # tau-b per pair: main/random1 1, main/random2 -1, random1/random2 -1, and each with diverse2 (dqn = ppo
    # tied): concordant 2 of 3 pairs for main and random1, discordant for random2
    tau_tie = 2 / np.sqrt(3 * 2)
    assert tau == pytest.approx((1 - 1 - 1 + tau_tie + tau_tie - tau_tie) / 6)


def test_robustness_figure_and_summary_files(tmp_path):
    from tapebench.utils.io import write_parquet

    paths = []
    for split, means in AGGREGATES.items():
        path = tmp_path / f"{split}.parquet"
        write_parquet(path, _aggregate(split, means), meta={"table": "aggregate"})
        paths.append(str(path))
    stem = tmp_path / "figure5"
    written = render_robustness(str(tmp_path / "robustness.tex"), aggregate=paths, splits=list(AGGREGATES),
                                kinds=["diverse", "random", "random", "diverse"], L=8, H=8,
                                parquet=str(tmp_path / "robustness.parquet"), figure=str(stem))
    assert written == [f"{stem}.pdf", f"{stem}.png"]
    assert all((tmp_path / f"figure5.{e}").stat().st_size > 1000 for e in ("pdf", "png"))
    data = pd.read_parquet(tmp_path / "robustness.parquet")
    assert len(data) == 12 and set(data["split"]) == set(AGGREGATES)
    tex = (tmp_path / "robustness.tex").read_text()
    assert r"DQN & 0.225 & " in tex and "1.5" in tex
    with pytest.raises(ValueError, match="one aggregate table and one kind per split"):
        render_robustness(None, aggregate=paths[:2], splits=list(AGGREGATES), kinds=["random"] * 4, L=8, H=8)


# --- config and registry ------------------------------------------------------------------------------------------
def _config(*overrides) -> dict:
    config = load_config(["tests/data/tiny.yaml"])
    for o in overrides:
        from tapebench.pipeline.config import merge_config
        merge_config(config, o)
    return validate_config(config, REPO_SCHEMA)


@pytest.mark.parametrize("override, key", [
    ({"studies": {"robustness": {"splits": ["main", "nope"]}}}, "studies.robustness.splits[1]"),
    ({"studies": {"fixed_z": {"table5": {"methods": ["mpc"]}}}}, "studies.fixed_z.table5.methods[0]"),
    ({"studies": {"fixed_z": {"table6": {"multi_rule": ["sac"]}}}}, "studies.fixed_z.table6.multi_rule[0]"),
    ({"studies": {"fixed_z": {"total_steps": 256, "eval_every": 256}}}, "evaluation.last_k"),
    ({"studies": {"fixed_z": {"rules": [0, 256]}}}, "studies.fixed_z.rules.1"),
    ({"studies": {"fixed_z": {"table6": {"L": 32}}}}, "studies.fixed_z.table6.L"),
    ({"studies": {"robustness": {"seeds": 5000}}}, "studies.robustness.seeds"),
])
def test_bad_study_config_names_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        _config(override)


def test_study_jobs_follow_the_study_config_not_env():
    config = load_config([])
    validate_config(config, REPO_SCHEMA)
    jobs = {job.name: job for _, job in registry.jobs(config)}
    table5, table6 = jobs["table5"].values, jobs["table6"].values
    assert table5["per_rule"][0] == "results/fixed_z/L32_H32/rad_dqn/rule0.per_rule.parquet"
    assert len(table5["per_rule"]) == 12 and table5["rules"] == [0, 4, 108, 204, 30, 110]
    assert table6["per_rule"][-1] == "results/fixed_z/L16_H16/pearl_dqn/rule110.per_rule.parquet"
    assert table6["mpc"] == "results/oracle/fixed_z_L16_H16/mpc.parquet"
    assert table6["multi_aggregate"] == "results/fixed_z/L16_H16/multi_main/aggregate.parquet"
    assert jobs["figure5"].values["aggregate"] == [f"results/aggregate/{s}/aggregate.parquet" for s in
                                                   ("main", "diverse2", "random1", "random2", "random3")]
    assert jobs["figure5"].values["kinds"] == ["diverse", "diverse", "random", "random", "random"]
    assert jobs["table_types"].values["per_rule"][0] == "results/aggregate/main/dqn_H32.per_rule.parquet"
