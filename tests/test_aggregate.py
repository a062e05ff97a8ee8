"""Per-seed values (last-K checkpoints), bootstrap aggregation, paired drop, method tests, CLI."""
import numpy as np
import pandas as pd
import pytest

from tapebench.cli import main
from tapebench.stats.aggregate import METRICS, aggregate_seeds, group_generator, method_tests, seed_tables
from tapebench.stats.bootstrap import holm, percentile_ci, resample_indices
from tapebench.utils.io import read_parquet_meta

CHECKPOINTS = (10, 20, 30, 40)
TRAIN_RULES, TEST_RULES = (1, 2), (3,)
EPISODES_PER_RULE = 2
# successes per checkpoint; train has 4 episodes per checkpoint (2 rules x 2), test has 2 (1 rule x 2)
SUCCESSES = {
    "dqn": {0: {"train": [0, 1, 2, 3], "test": [0, 0, 1, 1]},
            1: {"train": [1, 2, 2, 2], "test": [0, 1, 1, 1]},
            2: {"train": [0, 4, 4, 4], "test": [2, 2, 2, 2]}},
    "ppo": {0: {"train": [0, 0, 1, 1], "test": [0, 0, 0, 1]},
            1: {"train": [0, 1, 1, 1], "test": [0, 0, 0, 0]},
            2: {"train": [2, 2, 2, 2], "test": [0, 1, 0, 1]}},
}


def episode_table(agent: str, seed: int, checkpoints=CHECKPOINTS, successes=None, split="main", H=32):
    """Records of one (agent, seed): episodes are rule-major; the first m episodes of a checkpoint succeed."""
    successes = successes or SUCCESSES[agent][seed]
    rows = []
    for side, rules in (("train", TRAIN_RULES), ("test", TEST_RULES)):
        for c_index, checkpoint in enumerate(checkpoints):
            m = successes[side][c_index]
            eps = [(z, k) for z in rules for k in range(EPISODES_PER_RULE)]
            for i, (z, k) in enumerate(eps):
                ok = i < m
                dist = 0.0 if ok else 0.5
                rows.append({"agent": agent, "seed": seed, "checkpoint": checkpoint, "split": split, "side": side,
                             "rule": z, "type": "chaotic" if z == 3 else "periodic", "episode": k, "L": 8,
                             "H": H, "success": ok, "final_dist": dist, "auc_dist": dist / 2,
                             "return": (1.0 if ok else 0.0) - dist, "steps": 5 if ok else H})
    return pd.DataFrame(rows)


def all_episodes(H=32):
    return pd.concat([episode_table(a, s, H=H) for a in SUCCESSES for s in SUCCESSES[a]], ignore_index=True)


def expected_seed_value(agent, seed, side, k=3):
    per_checkpoint = np.array(SUCCESSES[agent][seed][side]) / (4 if side == "train" else 2)
    return per_checkpoint[-k:].mean()


def value(table, **where):
    sel = np.ones(len(table), dtype=bool)
    for col, v in where.items():
        sel &= (table[col] == v).to_numpy()
    assert sel.sum() == 1, f"{sel.sum()} rows match {where}"
    return table.loc[sel].iloc[0]


def test_per_seed_value_is_mean_of_last_k_checkpoints():
    per_seed = seed_tables(episode_table("dqn", 0), last_k=3)["per_seed"]
    row = value(per_seed, side="train", metric="success")
    assert row["value"] == pytest.approx((0.25 + 0.5 + 0.75) / 3)
    assert (row["k_used"], row["checkpoint_first"], row["checkpoint_last"], row["n_episodes"]) == (3, 20, 40, 12)
    assert value(per_seed, side="test", metric="success")["value"] == pytest.approx(1 / 3)
    assert value(per_seed, side="test", metric="steps")["value"] == pytest.approx((32 + 18.5 + 18.5) / 3)
    assert set(per_seed["metric"]) == set(METRICS)
    assert len(per_seed) == 2 * len(METRICS)


def test_fewer_checkpoints_than_k_uses_all_and_records_k_used():
    table = episode_table("dqn", 0, checkpoints=(10, 20), successes={"train": [1, 3], "test": [0, 2]})
    per_seed = seed_tables(table, last_k=3)["per_seed"]
    row = value(per_seed, side="train", metric="success")
    assert row["value"] == pytest.approx(0.5) and row["k_used"] == 2


def test_k_one_is_the_last_checkpoint_and_row_order_does_not_matter():
    table = episode_table("ppo", 2).sample(frac=1.0, random_state=0)
    per_seed = seed_tables(table, last_k=1)["per_seed"]
    assert value(per_seed, side="test", metric="success")["value"] == pytest.approx(0.5)
    assert value(per_seed, side="train", metric="success")["checkpoint_first"] == 40


def test_soft_success_thresholds():
    table = episode_table("dqn", 0, checkpoints=(10,), successes={"train": [0], "test": [0]})
    train = table["side"] == "train"
    table.loc[train, "final_dist"] = [0.03125, 0.0625, 0.1, 0.5]
    per_seed = seed_tables(table, last_k=3)["per_seed"]
    got = {m: value(per_seed, side="train", metric=m)["value"] for m in METRICS if m.startswith("soft")}
    assert got == {"soft_success@0.03125": 0.25, "soft_success@0.0625": 0.5, "soft_success@0.1": 0.75}


def test_curves_and_per_rule_values():
    tables = seed_tables(episode_table("dqn", 0), last_k=3)
    curves = tables["curves"]
    got = curves[(curves["side"] == "train") & (curves["metric"] == "success")]["value"].tolist()
    assert got == [0.0, 0.25, 0.5, 0.75]
    per_rule = tables["per_rule"]
    # last 3 checkpoints have 1, 2, 3 successes among (rule 1 ep 0, rule 1 ep 1, rule 2 ep 0, rule 2 ep 1)
    assert value(per_rule, rule=1, metric="success")["value"] == pytest.approx((0.5 + 1 + 1) / 3)
    rule2 = value(per_rule, rule=2, metric="success")
    assert rule2["value"] == pytest.approx(0.5 / 3)
    assert (rule2["type"], rule2["k_used"], rule2["n_episodes"]) == ("periodic", 3, 6)


def test_seed_stage_rejects_bad_input():
    table = episode_table("dqn", 0)
    with pytest.raises(ValueError, match="duplicated episode records"):
        seed_tables(pd.concat([table, table]))
    with pytest.raises(ValueError, match="different checkpoints"):
        seed_tables(table[~((table["side"] == "test") & (table["checkpoint"] == 40))])
    with pytest.raises(ValueError, match="lacks columns.*checkpoint"):
        seed_tables(table.drop(columns="checkpoint"))
    with pytest.raises(ValueError, match="last_k"):
        seed_tables(table, last_k=0)


def per_seed_all(H=32):
    return seed_tables(all_episodes(H), last_k=3)["per_seed"]


def test_aggregate_means_and_paired_drop():
    summary = aggregate_seeds(per_seed_all(), n_resamples=2000, ci=0.95, seed=0)
    for agent in SUCCESSES:
        id_values = np.array([expected_seed_value(agent, s, "train") for s in range(3)])
        ood_values = np.array([expected_seed_value(agent, s, "test") for s in range(3)])
        id_row = value(summary, agent=agent, side="train", metric="success")
        drop_row = value(summary, agent=agent, side="drop", metric="success")
        assert id_row["n"] == 3 and id_row["mean"] == pytest.approx(id_values.mean())
        assert id_row["sd"] == pytest.approx(id_values.std(ddof=1))
        assert value(summary, agent=agent, side="test", metric="success")["mean"] == pytest.approx(ood_values.mean())
        assert drop_row["mean"] == pytest.approx((id_values - ood_values).mean())
        # the drop's CI is the bootstrap of per-seed differences with the group's resampled indices
        indices = resample_indices(3, 2000, group_generator(0, ("main", agent, 8, 32, (0, 1, 2))))
        expected = percentile_ci(id_values - ood_values, indices=indices)
        assert (drop_row["ci_low"], drop_row["ci_high"]) == pytest.approx((expected.low, expected.high))
        assert id_row["ci_low"] <= id_row["mean"] <= id_row["ci_high"]
    # dqn hand check: ID seeds (0.5, 0.5, 1.0), OOD seeds (1/3, 0.5, 1.0) -> drop (1/6, 0, 0)
    assert value(summary, agent="dqn", side="drop", metric="success")["mean"] == pytest.approx(1 / 18)
    assert value(summary, agent="dqn", side="drop", metric="success")["ci_low"] == pytest.approx(0.0)


def test_aggregate_is_deterministic_and_independent_of_other_agents():
    per_seed = per_seed_all()
    both = aggregate_seeds(per_seed, n_resamples=500, seed=3)
    again = aggregate_seeds(per_seed.sample(frac=1.0, random_state=1), n_resamples=500, seed=3)
    pd.testing.assert_frame_equal(both, again)
    dqn_only = aggregate_seeds(per_seed[per_seed["agent"] == "dqn"], n_resamples=500, seed=3)
    pd.testing.assert_frame_equal(dqn_only, both[both["agent"] == "dqn"].reset_index(drop=True))
    # with many seeds of continuous values the interval ends depend on the statistics seed
    rng = np.random.default_rng(0)
    many = per_seed[per_seed["seed"] == 0].merge(pd.DataFrame({"new_seed": range(12)}), how="cross")
    many = many.assign(seed=many.pop("new_seed"), value=rng.uniform(size=len(many)))
    assert not np.allclose(aggregate_seeds(many, n_resamples=500, seed=4)["ci_low"],
                           aggregate_seeds(many, n_resamples=500, seed=3)["ci_low"])


def test_aggregate_requires_matched_seeds():
    per_seed = per_seed_all()
    missing_ood = per_seed[~((per_seed["agent"] == "ppo") & (per_seed["seed"] == 1) & (per_seed["side"] == "test"))]
    with pytest.raises(ValueError, match=r"agent=ppo.*OOD only: \[\].*|agent=ppo.*ID only: \[1\]"):
        aggregate_seeds(missing_ood)
    no_ood = per_seed[per_seed["side"] == "train"]
    with pytest.raises(ValueError, match="none for 'test'"):
        aggregate_seeds(no_ood)
    with pytest.raises(ValueError, match="duplicated per-seed rows"):
        aggregate_seeds(pd.concat([per_seed, per_seed]))


def test_method_tests_welch_holm_and_effect_size():
    per_seed = per_seed_all()
    tests = method_tests(per_seed, n_resamples=500)
    row = value(tests, metric="success")
    assert (row["agent_a"], row["agent_b"], row["side"], row["n_a"], row["n_b"]) == ("dqn", "ppo", "test", 3, 3)
    dqn = np.array([expected_seed_value("dqn", s, "test") for s in range(3)])
    ppo = np.array([expected_seed_value("ppo", s, "test") for s in range(3)])
    assert row["diff"] == pytest.approx(dqn.mean() - ppo.mean())
    assert row["p_holm"] == pytest.approx(row["p"])  # a family of one comparison
    # three agents: Holm within the metric's family of three comparisons
    third = per_seed[per_seed["agent"] == "ppo"].assign(agent="rad_dqn", value=lambda d: d["value"] * 0.5)
    tests3 = method_tests(pd.concat([per_seed, third]), n_resamples=200)
    family = tests3[tests3["metric"] == "success"]
    assert len(family) == 3
    np.testing.assert_allclose(family["p_holm"], holm(family["p"].to_numpy()))


def test_cli_end_to_end_with_provenance(tmp_path):
    per_seed_paths = []
    for agent in SUCCESSES:
        for H in (32, 64):
            episode_paths = []
            for seed in SUCCESSES[agent]:
                path = tmp_path / f"{agent}_s{seed}_H{H}.parquet"
                episode_table(agent, seed, H=H).to_parquet(path)
                episode_paths.append(str(path))
            out = tmp_path / f"{agent}_H{H}.per_seed.parquet"
            rc = main(["aggregate-seed", "--episodes", *episode_paths, "--last-k", "3", "--out", str(out),
                       "--curves-out", str(tmp_path / f"{agent}_H{H}.curves.parquet")])
            assert rc == 0
            per_seed_paths.append(str(out))
    meta = read_parquet_meta(per_seed_paths[0])
    assert meta["config"] == {"last_k": 3} and meta["code_version"] and len(meta["inputs"]) == 3
    agg_path, tests_path = tmp_path / "aggregate.parquet", tmp_path / "tests.parquet"
    rc = main(["aggregate", "--per-seed", *per_seed_paths, "--n-resamples", "2000", "--ci", "0.95", "--seed", "0",
               "--out", str(agg_path), "--tests-out", str(tests_path)])
    assert rc == 0
    agg = pd.read_parquet(agg_path)
    assert sorted(agg["H"].unique()) == [32, 64] and set(agg["side"]) == {"train", "test", "drop"}
    meta = read_parquet_meta(agg_path)
    assert meta["seed"] == 0 and meta["config"]["n_resamples"] == 2000 and meta["last_k"] == 3
    assert len(pd.read_parquet(tests_path)) == 2 * len(METRICS)
    tex = tmp_path / "table3.tex"
    assert main(["render", "table3", "--aggregate", str(agg_path), "--split", "main", "--H", "32",
                 "--out", str(tex)]) == 0
    text = tex.read_text()
    assert "DQN & 3 & 0.667 & 0.611 & 0.056" in text
    for table in ("table2", "table4"):
        assert main(["render", table, "--aggregate", str(agg_path), "--split", "main",
                     "--out", str(tmp_path / f"{table}.tex")]) == 0


def test_cli_errors_are_clean(tmp_path, capsys):
    rc = main(["aggregate-seed", "--episodes", str(tmp_path / "nope.parquet"), "--out", str(tmp_path / "x.parquet")])
    assert rc == 2
    assert "not found" in capsys.readouterr().err
    path = tmp_path / "dqn.parquet"
    per_seed = per_seed_all()
    per_seed[per_seed["side"] == "train"].to_parquet(path)
    rc = main(["aggregate", "--per-seed", str(path), "--out", str(tmp_path / "agg.parquet")])
    assert rc == 2
    assert "paired ID-OOD drop needs both sides" in capsys.readouterr().err
    assert not (tmp_path / "agg.parquet").exists()


def _ood_success(agent: str, values) -> pd.DataFrame:
    rows = [{"split": "main", "agent": agent, "L": 32, "H": 32, "seed": s, "side": side, "metric": "success",
             "value": v, "k_used": 1, "checkpoint_first": 0, "checkpoint_last": 0, "n_episodes": 10}
            for s, v in enumerate(values) for side in ("train", "test")]
    return pd.DataFrame(rows)


def test_oracle_normalized_score_is_the_ratio_of_means_with_an_independent_bootstrap():
    from tapebench.stats.aggregate import ON_METRIC, oracle_normalized

    agent, ref = [0.05, 0.04, 0.06, 0.03], [0.20, 0.18, 0.22]
    per_seed = pd.concat([_ood_success("dqn", agent), _ood_success("mpc", ref)], ignore_index=True)
    on = oracle_normalized(per_seed, "mpc", n_resamples=4000, seed=1)
    assert on["agent"].tolist() == ["dqn"] and on["metric"].tolist() == [ON_METRIC]
    row = on.iloc[0]
    assert row["mean"] == pytest.approx(100 * np.mean(agent) / np.mean(ref))   # 22.5
    assert row["n"] == 4 and row["side"] == "test"
    assert row["ci_low"] < row["mean"] < row["ci_high"]
    # the CI resamples both groups: wider than resampling the agent alone with the reference fixed
    agent_only = 100 * np.percentile(np.random.default_rng(0).choice(agent, (4000, 4)).mean(1), [2.5, 97.5]) / np.mean(ref)
    assert row["ci_high"] - row["ci_low"] > 0.9 * (agent_only[1] - agent_only[0])
    # a reference that never succeeds gives NaN, not a division error; no reference -> no rows
    zero = pd.concat([_ood_success("dqn", agent), _ood_success("mpc", [0.0, 0.0])], ignore_index=True)
    assert np.isnan(oracle_normalized(zero, "mpc")["mean"].iloc[0])
    assert oracle_normalized(_ood_success("dqn", agent), "mpc").empty
    # it lands in the aggregate table beside the other rows
    summary = aggregate_seeds(per_seed, n_resamples=500)
    assert ((summary["metric"] == ON_METRIC) & (summary["agent"] == "dqn")).sum() == 1
