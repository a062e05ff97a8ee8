"""Protocol comparison (docs/protocol.md#protocol-comparison): Kendall's tau-b against closed forms, rank
reversals on constructed rankings, the seed bootstrap (collapse, coverage, pairing, determinism), best-method
changes, the protocol list from the config, and the CLI -> table / figure path."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml
from pipeline_helpers import REPO, TINY
from scipy import stats as sps

from tapebench import layout
from tapebench.cli import main as cli_main
from tapebench.pipeline.config import load_config, validate_config
from tapebench.stats.aggregate import METRICS, PER_SEED_COLUMNS
from tapebench.stats.protocol_comparison import compare_protocols, ranks_of, tau_b_rows
from tapebench.stats.protocols import ComparedProtocol, protocol_files, protocols
from tapebench.utils.io import write_parquet

SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"


def per_seed_rows(split: str, side: str, values: dict[str, list[float]], H: int = 8, metric: str = "success"):
    """Per-seed rows: values[agent][k] is seed k's value."""
    rows = []
    for agent, seeds in values.items():
        for seed, v in enumerate(seeds):
            rows.append({"split": split, "agent": agent, "L": 8, "H": H, "seed": seed, "side": side,
                         "metric": metric, "value": float(v), "k_used": 1, "checkpoint_first": 0,
                         "checkpoint_last": 0, "n_episodes": 1})
    return pd.DataFrame(rows, columns=PER_SEED_COLUMNS)


def two_protocols(ref: dict, other: dict, *, same_runs=True, side_other="train", **kwargs):
    """The reference (OOD on split main) and a second protocol: ID on main (same runs) or OOD on split other."""
    split_other = "main" if same_runs else "other"
    if same_runs:
        tables = {"f": pd.concat([per_seed_rows("main", "test", ref), per_seed_rows("main", side_other, other)])}
        protos = [ComparedProtocol("OOD", "main", 8, "test", ("f",)), ComparedProtocol("ID", "main", 8, side_other, ("f",))]
    else:
        tables = {"f": per_seed_rows("main", "test", ref), "g": per_seed_rows(split_other, "test", other)}
        protos = [ComparedProtocol("OOD", "main", 8, "test", ("f",)), ComparedProtocol("OOD other", split_other, 8, "test", ("g",))]
    return compare_protocols(tables, protos, **{"n_resamples": 400, **kwargs})


def constant(means: list[float], n_seeds: int = 3, names="abcdefgh") -> dict:
    return {names[i]: [m] * n_seeds for i, m in enumerate(means)}


# --- tau --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [3, 5, 8])
def test_tau_closed_forms(n):
    means = list(np.linspace(0.9, 0.1, n))
    assert two_protocols(constant(means), constant(means))["comparison"]["tau"].item() == pytest.approx(1.0)
    assert two_protocols(constant(means), constant(means[::-1]))["comparison"]["tau"].item() == pytest.approx(-1.0)
    swapped = means.copy()
    swapped[1], swapped[2] = swapped[2], swapped[1]
    row = two_protocols(constant(means), constant(swapped))["comparison"].iloc[0]
    assert row["tau"] == pytest.approx(1 - 4 / (n * (n - 1)))
    assert row["n_reversals"] == 1 and row["n_pairs"] == n * (n - 1) // 2


def test_ties_are_tau_b():
    # x = (1, 1, 2, 3), y = (1, 2, 2, 3) as scores: one tie in each; 4 concordant, 0 discordant of the pairs
    # untied in both; tau_b = 4 / sqrt(5 * 5) = 0.8 (tau_a would be 4/6)
    x, y = [3.0, 3.0, 2.0, 1.0], [3.0, 2.0, 2.0, 1.0]
    out = two_protocols(constant([v / 4 for v in x]), constant([v / 4 for v in y]))
    assert out["comparison"]["tau"].item() == pytest.approx(0.8)
    assert tau_b_rows(np.array([x]), np.array([y]))[0] == pytest.approx(0.8)
    ranks = out["ranks"].set_index(["protocol", "agent"])["rank"]
    assert [ranks[("OOD", a)] for a in "abcd"] == [1.5, 1.5, 3.0, 4.0]      # ties averaged
    assert [ranks[("ID", a)] for a in "abcd"] == [1.0, 2.5, 2.5, 4.0]


def test_vectorised_tau_equals_scipy():
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 4, size=(200, 6)).astype(float), rng.integers(0, 4, size=(200, 6)).astype(float)
    ours = tau_b_rows(x, y)
    theirs = np.array([sps.kendalltau(a, b).statistic for a, b in zip(x, y)])
    assert np.allclose(ours, theirs, equal_nan=True) and np.isnan(theirs).any() == np.isnan(ours).any()
    assert np.array_equal(ranks_of(np.array([0.2, 0.9, 0.2])), [2.5, 1.0, 2.5])


# --- reversals and best method ------------------------------------------------------------------------------------
def test_reversals_listed_exactly():
    # reference a > b > c > d; the other protocol b > a > d > c: exactly (a, b) and (c, d) flip
    out = two_protocols(constant([0.8, 0.6, 0.4, 0.2]), constant([0.6, 0.8, 0.2, 0.4]))
    rev = out["reversals"]
    assert len(rev) == 6 and rev["reference"].all()
    flipped = sorted(zip(rev.loc[rev["reversed"], "agent_hi"], rev.loc[rev["reversed"], "agent_lo"]))
    assert flipped == [("a", "b"), ("c", "d")]
    assert (rev.loc[rev["reversed"], "p_reversed"] == 1.0).all() and (rev.loc[~rev["reversed"], "p_reversed"] == 0).all()
    row = out["comparison"].iloc[0]
    assert row["n_reversals"] == 2 and row["tau"] == pytest.approx((4 - 2) / 6)
    assert row["best_a"] == "a" and row["best_b"] == "b" and row["best_changes"] and row["p_best_changes"] == 1.0


def test_best_method_change_probability():
    rng = np.random.default_rng(0)
    far = {"a": list(0.9 + 0.05 * rng.standard_normal(10)), "b": list(0.1 + 0.05 * rng.standard_normal(10))}
    row = two_protocols(far, far, same_runs=False, n_resamples=2000)["comparison"].iloc[0]
    assert row["p_best_changes"] == 0.0 and not row["best_changes"]
    # equal means: b's seeds are a's seeds reordered, independent runs under the two protocols -> each resample
    # picks a or b as best with probability 1/2 under each protocol, independently: P(change) = 1/2
    values = list(rng.standard_normal(20))
    equal = {"a": values, "b": values[::-1]}
    out = two_protocols(equal, equal, same_runs=False, n_resamples=4000)
    row = out["comparison"].iloc[0]
    assert row["best_a"] == "a/b" and not row["best_changes"]
    assert abs(row["p_best_changes"] - 0.5) < 0.04
    assert out["ranks"].set_index(["protocol", "agent"])["p_best"][("OOD", "a")] == pytest.approx(0.5, abs=0.04)


# --- the bootstrap ------------------------------------------------------------------------------------------------
def test_bootstrap_collapses_when_seeds_are_identical():
    out = two_protocols(constant([0.7, 0.5, 0.3], n_seeds=5), constant([0.5, 0.7, 0.3], n_seeds=5),
                        same_runs=False)
    row = out["comparison"].iloc[0]
    assert row["tau_ci_low"] == row["tau_ci_high"] == pytest.approx(row["tau"]) and row["tau"] == pytest.approx(1 / 3)
    assert row["expected_reversals"] == row["n_reversals"] == 1 and row["p_tau_defined"] == 1.0
    ranks = out["ranks"]
    assert (ranks["rank_ci_low"] == ranks["rank"]).all() and (ranks["rank_ci_high"] == ranks["rank"]).all()


def test_tau_interval_covers_the_truth():
    """Two independent protocols whose true rankings differ by one adjacent swap of five methods (true tau =
    1 - 4/20 = 0.8); seed noise large enough that the estimated tau varies between replications. The 90%
    interval covers 0.8 in at least 85% of them (38 of 40 with these draws)."""
    true_a, true_b = np.array([0.9, 0.7, 0.5, 0.3, 0.1]), np.array([0.9, 0.5, 0.7, 0.3, 0.1])
    rng = np.random.default_rng(11)
    covered, estimates = 0, []
    replications = 40
    for r in range(replications):
        a = {m: list(true_a[i] + 0.3 * rng.standard_normal(8)) for i, m in enumerate("abcde")}
        b = {m: list(true_b[i] + 0.3 * rng.standard_normal(8)) for i, m in enumerate("abcde")}
        row = two_protocols(a, b, same_runs=False, n_resamples=300, ci=0.9, seed=r)["comparison"].iloc[0]
        covered += row["tau_ci_low"] - 1e-9 <= 0.8 <= row["tau_ci_high"] + 1e-9
        estimates.append(round(row["tau"], 6))
    assert covered >= 0.85 * replications, covered
    assert len(set(estimates)) >= 3 and estimates.count(0.8) < replications / 2   # the test has teeth


def test_protocols_of_one_split_are_seed_paired():
    # ID and OOD of one run set with identical per-seed values, but the methods' seeds cross over: paired
    # resampling moves them together (tau = 1 in every resample); on other runs they resample independently
    ref = {"a": [0.2, 0.9, 0.5, 0.6], "b": [0.8, 0.1, 0.4, 0.6]}
    paired = two_protocols(ref, ref, same_runs=True)["comparison"].iloc[0]
    assert paired["tau_ci_low"] == paired["tau_ci_high"] == 1.0 and paired["p_best_changes"] == 0.0
    independent = two_protocols(ref, ref, same_runs=False)["comparison"].iloc[0]
    assert independent["tau_ci_low"] == -1.0 and independent["p_best_changes"] > 0.2


def test_deterministic_and_independent_of_other_protocols():
    rng = np.random.default_rng(5)
    tables = {"f": pd.concat([per_seed_rows("main", s, {m: list(rng.random(6)) for m in "abcd"})
                              for s in ("test", "train", "d1")])}
    protos = [ComparedProtocol("OOD", "main", 8, "test", ("f",)), ComparedProtocol("ID", "main", 8, "train", ("f",))]
    first = compare_protocols(tables, protos, n_resamples=300, seed=1)
    again = compare_protocols(tables, protos, n_resamples=300, seed=1)
    for key in first:
        pd.testing.assert_frame_equal(first[key], again[key])
    other_seed = compare_protocols(tables, protos, n_resamples=300, seed=2)
    assert not first["ranks"]["p_best"].equals(other_seed["ranks"]["p_best"])
    pd.testing.assert_frame_equal(first["ranks"][["agent", "mean", "rank"]], other_seed["ranks"][["agent", "mean", "rank"]])
    # a ladder level (side d1) is one more ComparedProtocol; the existing pair's numbers do not move
    more = compare_protocols(tables, [*protos, ComparedProtocol("OOD d=1", "main", 8, "d1", ("f",), family="ladder")],
                             n_resamples=300, seed=1)
    pd.testing.assert_frame_equal(more["comparison"].iloc[:1], first["comparison"])
    assert list(more["comparison"][["protocol_a", "protocol_b"]].itertuples(index=False, name=None)) == [
        ("OOD", "ID"), ("OOD", "OOD d=1"), ("ID", "OOD d=1")]


def test_lower_is_better_metric_and_partial_method_sets():
    tables = {"f": per_seed_rows("main", "test", constant([0.1, 0.3, 0.5]), metric="final_dist"),
              "g": per_seed_rows("main", "train", constant([0.1, 0.3], names="ab"), metric="final_dist")}
    out = compare_protocols(tables, [ComparedProtocol("OOD", "main", 8, "test", ("f",)),
                                     ComparedProtocol("ID", "main", 8, "train", ("g",))], metric="final_dist", n_resamples=100)
    assert list(out["ranks"]["rank"][:3]) == [1.0, 2.0, 3.0]            # lowest distance ranks first
    row = out["comparison"].iloc[0]
    assert row["methods"] == "a,b" and row["n_methods"] == 2 and row["tau"] == 1.0


def test_bad_input_is_named():
    tables = {"f": per_seed_rows("main", "test", constant([0.5, 0.2]))}
    ok = ComparedProtocol("OOD", "main", 8, "test", ("f",))
    with pytest.raises(ValueError, match=r"protocol 'ID' selects no rows.*side 'train'"):
        compare_protocols(tables, [ok, ComparedProtocol("ID", "main", 8, "train", ("f",))])
    with pytest.raises(ValueError, match="repeated: \\['OOD'\\]"):
        compare_protocols(tables, [ok, ok])
    with pytest.raises(ValueError, match="metric 'succes' is not a per-seed metric"):
        compare_protocols(tables, [ok, ok], metric="succes")
    with pytest.raises(ValueError, match="at least two protocols"):
        compare_protocols(tables, [ok])
    doubled = {"f": pd.concat([tables["f"], tables["f"]])}
    with pytest.raises(ValueError, match="share a \\(method, seed\\)"):
        compare_protocols(doubled, [ok, ComparedProtocol("x", "main", 8, "test", ("f",))])


# --- the config -----------------------------------------------------------------------------------------------
def _config(*overlays):
    config = load_config([TINY])
    for overlay in overlays:
        from tapebench.pipeline.config import merge_config
        config = merge_config(config, overlay)
    return validate_config(config, SCHEMA)


def test_protocols_of_the_tiny_config():
    config = _config()
    protos = protocols(config)
    assert [(p.name, p.split, p.H, p.side, p.family, p.runs) for p in protos] == [
        ("OOD", "main", 8, "test", "reference", "main"), ("ID", "main", 8, "train", "side", "main"),
        ("OOD H=16", "main", 16, "test", "horizon", "main"), ("OOD random1", "random1", 8, "test", "split", "random1"),
        ("ladder d=1", "ladder", 8, "d1", "ladder", "ladder"), ("ladder d=2", "ladder", 8, "d2", "ladder", "ladder"),
        ("ladder d=3", "ladder", 8, "d3", "ladder", "ladder"), ("ladder d=4", "ladder", 8, "d4", "ladder", "ladder"),
        ("OOD eps=0.1", "main", 8, "test", "noise", "main")]
    methods = config["methods"]
    assert protos[2].per_seed == tuple(layout.per_seed("main", m, 16) for m in methods)
    ladder_methods = config["studies"]["ladder"]["methods"]
    assert protos[4].per_seed == tuple(layout.per_seed("ladder", m, 8) for m in ladder_methods)
    assert protos[-1].per_seed == tuple(layout.noise_per_seed("main", 0.1, m, 8) for m in methods)
    # main H=8 is shared by OOD and ID, the ladder's files by its four levels
    assert len(protocol_files(protos)) == 4 * len(methods) + len(ladder_methods)
    assert config["studies"]["protocol_comparison"] == {"metric": "success"}
    one_horizon = protocols(_config({"evaluation": {"horizons": [8]},
                                     "studies": {"robustness": {"splits": ["main", "diverse2", "random1"]},
                                                 "ladder": {"levels": [2]}, "noise": {"levels": [0.0, 0.02, 0.1]}}}))
    assert [p.name for p in one_horizon] == ["OOD", "ID", "OOD diverse2", "OOD random1", "ladder d=2",
                                             "OOD eps=0.02", "OOD eps=0.1"]
    assert ComparedProtocol.from_dict(json.loads(json.dumps(protos[3].to_dict()))) == protos[3]


def test_schema_metric_choices_are_the_per_seed_metrics():
    schema = yaml.safe_load(SCHEMA.read_text())
    enum = schema["properties"]["studies"]["properties"]["protocol_comparison"]["properties"]["metric"]["enum"]
    assert enum == list(METRICS)
    from tapebench.pipeline.config import ConfigError
    with pytest.raises(ConfigError, match="studies.protocol_comparison.metric"):
        _config({"studies": {"protocol_comparison": {"metric": "succes"}}})


# --- CLI -> table and figure ------------------------------------------------------------------------------------
def test_cli_writes_tables_that_render(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(2)
    files = {}
    for split, sides in (("main", ("test", "train")), ("other", ("test",))):
        for m, mu in zip(("dqn", "ppo", "random"), (0.6, 0.5, 0.1)):
            path = layout.per_seed(split, m, 8)
            frame = pd.concat([per_seed_rows(split, s, {m: list(mu + (0.3 if s == "train" and m == "ppo" else 0)
                                                              + 0.05 * rng.standard_normal(3))}) for s in sides])
            write_parquet(path, frame)
            files.setdefault(split, []).append(path)
    protos = [ComparedProtocol("OOD", "main", 8, "test", tuple(files["main"])),
              ComparedProtocol("ID", "main", 8, "train", tuple(files["main"])),
              ComparedProtocol("OOD other", "other", 8, "test", tuple(files["other"]))]
    out = layout.PROTOCOL_COMPARISON
    assert cli_main(["protocol-comparison", "--protocols", json.dumps([p.to_dict() for p in protos]),
                     "--n-resamples", "200", "--out", out["comparison"], "--ranks-out", out["ranks"],
                     "--reversals-out", out["reversals"]]) == 0
    comparison = pd.read_parquet(out["comparison"])
    id_row = comparison[(comparison["protocol_a"] == "OOD") & (comparison["protocol_b"] == "ID")].iloc[0]
    assert id_row["best_b"] == "ppo" and id_row["best_a"] == "dqn" and id_row["n_reversals"] == 1
    assert cli_main(["render", "protocol_comparison", "--comparison", out["comparison"], "--ranks", out["ranks"],
                     "--out", "table.tex"]) == 0
    tex = (tmp_path / "table.tex").read_text()
    assert "\\textsf{OOD} (reference)" in tex
    assert f"\\textsf{{ID}} & \\texttt{{main}} & 8 & ID & 3 & 3 & {id_row['tau']:.2f} " in tex
    assert " 1 ({\\scriptsize " in tex and "PPO" in tex
    assert cli_main(["render", "protocol_comparison_figure", "--comparison", out["comparison"], "--ranks",
                     out["ranks"], "--out", "fig"]) == 0
    assert all((tmp_path / f"fig.{e}").stat().st_size > 5000 for e in ("pdf", "png"))
