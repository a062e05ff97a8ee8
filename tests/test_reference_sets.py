"""Reference sets (docs/protocol.md#reference-sets): the shipped set's checksums and protocol, the rule sums that
stand in for episodes, the protocol refusal, code fingerprints, a one-cell comparison, and the drift test: the
methods that do not train, recomputed, equal the shipped records exactly."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tapebench import reference_sets
from tapebench.pipeline.config import ConfigError, load_config, protocol_slice, validate_config
from tapebench.schemas import RULE_SUM_COLUMNS
from tapebench.stats.aggregate import METRICS, rule_sums, seed_tables, seed_tables_from_sums

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
SHIPPED = REPO / "reference"
SET = "tape-v2"


def _episodes(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for s in (0, 1):
        for checkpoint in (100, 200, 300):
            for side, rules in (("train", (1, 2, 3)), ("test", (30, 45))):
                for rule in rules:
                    for episode in range(4):
                        dist = float(rng.integers(0, 9)) / 8
                        rows.append({"agent": "dqn", "seed": s, "checkpoint": checkpoint, "split": "main",
                                     "side": side, "rule": rule, "type": "chaotic" if rule > 20 else "stable",
                                     "episode": episode, "L": 8, "H": 8, "success": dist == 0.0,
                                     "final_dist": dist, "auc_dist": float(rng.random()),
                                     "return": float(-rng.random() * 8), "steps": int(rng.integers(1, 9))})
    return pd.DataFrame(rows)


def test_rule_sums_hold_every_metric_and_their_ratios_are_the_episode_means():
    episodes = _episodes()
    sums = rule_sums(episodes)
    assert list(sums.columns) == list(RULE_SUM_COLUMNS)
    assert [c for c in RULE_SUM_COLUMNS if c in METRICS] == list(METRICS)
    tables = seed_tables_from_sums(sums, last_k=2)
    per_seed = tables["per_seed"]
    for (seed, side), grp in episodes[episodes["checkpoint"] >= 200].groupby(["seed", "side"]):
        by_checkpoint = grp.groupby("checkpoint")
        expected = {"success": by_checkpoint["success"].mean().mean(),
                    "final_dist": by_checkpoint["final_dist"].mean().mean(),
                    "soft_success@0.1": by_checkpoint["final_dist"].apply(lambda d: (d <= 0.1 + 1e-9).mean()).mean()}
        for metric, value in expected.items():
            got = per_seed[(per_seed["seed"] == seed) & (per_seed["side"] == side) & (per_seed["metric"] == metric)]
            assert got["value"].item() == pytest.approx(value, abs=1e-12)
    # aggregate-seed goes through the sums: the same tables bit for bit
    direct = seed_tables(episodes, last_k=2)
    for key in ("per_seed", "curves", "per_rule"):
        pd.testing.assert_frame_equal(direct[key], tables[key])


def test_rule_sums_refuse_duplicates_and_bad_counts():
    sums = rule_sums(_episodes())
    with pytest.raises(ValueError, match="duplicated rule-sums rows"):
        seed_tables_from_sums(pd.concat([sums, sums.iloc[:1]]))
    bad = sums.copy()
    bad.loc[0, "n_episodes"] = 0
    with pytest.raises(ValueError, match="n_episodes < 1"):
        seed_tables_from_sums(bad)


# --- the shipped set ---------------------------------------------------------------------------------------------
def test_the_shipped_set_is_intact_and_holds_the_default_protocol():
    assert reference_sets.verify(SET, SHIPPED) == []
    manifest = reference_sets.read_manifest(SET, SHIPPED)
    config = validate_config(load_config([], root=REPO), SCHEMA)
    assert manifest["protocol"] == protocol_slice(config)
    assert manifest["protocol_sha256"] == reference_sets.protocol_hash(protocol_slice(config))
    assert manifest["seeds"] == list(range(20))
    assert manifest["default_methods"] == config["methods"] and reference_sets.lacking_methods(manifest) == [], (
        "the set should hold every method of config/config.yaml")
    size = sum(p.stat().st_size for p in (SHIPPED / SET).rglob("*") if p.is_file())
    assert size <= 25e6, f"the set is {size / 1e6:.1f} MB, over its 25 MB budget"
    for method, entry in manifest["methods"].items():
        assert entry["seeds"] == ([0] if entry.get("deterministic") else list(range(20))), method
        assert entry["horizons"] == [32, 64], method
        records = reference_sets.load_records(SET, method, SHIPPED)
        assert set(records["agent"]) == {method}
        assert sorted(records["seed"].unique()) == entry["seeds"]
        assert len(records) == entry["rows"]
        assert not (SHIPPED / SET / entry["records"]).suffix == ".pkl"


@pytest.fixture
def copied_set(tmp_path):
    root = tmp_path / "reference"
    shutil.copytree(SHIPPED / SET, root / SET)
    return root


def _cli(*args, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tapebench", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_verify_fails_on_one_changed_byte_and_on_a_missing_file(copied_set):
    assert _cli("reference", "--root", str(copied_set), "verify", SET).returncode == 0
    records = sorted((copied_set / SET / "records").glob("*.parquet"))
    data = bytearray(records[0].read_bytes())
    data[len(data) // 2] ^= 0x01
    records[0].write_bytes(bytes(data))
    proc = _cli("reference", "--root", str(copied_set), "verify", SET)
    assert proc.returncode == 1 and f"{records[0]}: changed" in proc.stdout
    with pytest.raises(reference_sets.ReferenceSetError, match="does not match its SHA-256"):
        reference_sets.load_records(SET, records[0].stem, copied_set)
    records[1].unlink()
    proc = _cli("reference", "--root", str(copied_set), "verify", SET)
    assert proc.returncode == 1 and f"{records[1]}: missing" in proc.stdout
    (copied_set / SET / "extra.txt").write_text("x")
    assert "extra.txt: not listed" in _cli("reference", "--root", str(copied_set), "verify", SET).stdout


def test_a_method_whose_code_changed_is_flagged(copied_set):
    path = copied_set / SET / reference_sets.MANIFEST
    manifest = json.loads(path.read_text())
    method = sorted(manifest["methods"])[0]
    assert reference_sets.changed_methods(manifest) == {}
    manifest["methods"][method]["method_code_sha256"] = "0" * 64
    assert list(reference_sets.changed_methods(manifest)) == [method]
    path.write_text(json.dumps(manifest))
    reference_sets.write_checksums(copied_set / SET)
    proc = _cli("reference", "--root", str(copied_set), "verify", SET)
    assert proc.returncode == 0 and f"FLAG {method}: its code differs" in proc.stdout


@pytest.mark.parametrize("override, key", [
    ({"evaluation": {"episodes_per_rule": 10}}, "evaluation.episodes_per_rule: the set has 20, this config 10"),
    ({"training": {"total_steps": 100000}}, "training.total_steps: the set has 200000, this config 100000"),
    ({"env": {"L": 16}}, "env.L: the set has 32, this config 16"),
])
def test_a_protocol_edit_beside_a_reference_set_is_refused_naming_the_key(override, key):
    config = load_config([], root=REPO)
    for section, values in override.items():
        config[section].update(values)
    config["reference_set"] = SET
    config["features"]["L"] = config["env"]["L"]          # features follow the tape length (their own check)
    with pytest.raises(ConfigError) as err:
        validate_config(config, SCHEMA)
    assert "config key 'reference_set'" in str(err.value) and key in str(err.value)


def test_a_reference_set_leaves_methods_holding_what_runs():
    config = load_config([], root=REPO)
    config["reference_set"] = SET
    config["methods"] = ["dqn_equivariant", *config["methods"]]
    config["studies"]["worldtest"]["methods"] = []
    config["studies"]["fewshot"]["methods"] = []
    held = reference_sets.read_manifest(SET, SHIPPED)["methods"]
    validate_config(config, SCHEMA)
    assert "dqn_equivariant" in config["methods"]
    assert not set(config["methods"]) & set(held)
    assert reference_sets.shown_methods(config) == sorted(held) + config["methods"]


def test_an_unknown_set_is_named_with_the_sets_there():
    config = load_config([], root=REPO)
    config["reference_set"] = "tape-v9"
    with pytest.raises(ConfigError, match=r"reference set 'tape-v9' not found.*tape-v2"):
        validate_config(config, SCHEMA)


def test_compare_cell_reports_identity_and_differences():
    sums = rule_sums(_episodes())
    assert reference_sets.compare_cell(sums, sums[sums["seed"] == 0], 0, [8]).startswith("identical")
    changed = sums[sums["seed"] == 0].copy()
    changed.loc[changed.index[0], "success"] += 1
    text = reference_sets.compare_cell(sums, changed, 0, [8])
    assert text.startswith("differs") and "success: 1 of" in text


# --- drift: the methods that do not train, recomputed, equal the shipped records --------------------------------
DRIFT_METHODS = ("random", "live_leftmost", "live_random", "mpc")
DRIFT_SEEDS = (0, 7)


@pytest.mark.slow
def test_drift_methods_that_do_not_train_equal_the_shipped_records(tmp_path):
    from pipeline_helpers import make_workdir

    work = make_workdir(tmp_path)
    held = reference_sets.read_manifest(SET, SHIPPED)["methods"]
    methods = [m for m in DRIFT_METHODS if m in held]
    assert methods, "the shipped set holds none of the drift methods"
    (work / "drift.yaml").write_text(json.dumps({
        "methods": methods, "studies": {"worldtest": {"methods": []}, "fewshot": {"methods": []}}}))
    targets = [f"results/runs/main/{m}/seed{s}/eval_H32.parquet" for m in methods for s in DRIFT_SEEDS]
    proc = subprocess.run([sys.executable, "-m", "snakemake", *targets, "--cores", "2", "--configfile",
                           "config/config.yaml", "drift.yaml"], cwd=work, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for method in methods:
        fresh = rule_sums(pd.concat([pd.read_parquet(work / t) for t in targets if f"/{method}/" in t]))
        shipped = reference_sets.load_records(SET, method, SHIPPED)
        for seed in DRIFT_SEEDS:
            text = reference_sets.compare_cell(shipped, fresh[fresh["seed"] == seed], seed, [32])
            assert text.startswith("identical"), f"{method} seed {seed}: {text}"


def test_the_reproduce_preset_of_every_shipped_method_is_a_valid_config():
    # `tapebench reference reproduce` puts this preset on config/config.yaml; a method the world test reuses
    # (DreamerV3) used to be refused there, its one seed fewer than the world test's
    from tapebench.commands.reference import reproduce_preset
    from tapebench.pipeline.config import merge_config

    manifest = reference_sets.read_manifest(SET, SHIPPED)
    for method, entry in manifest["methods"].items():
        config = load_config([], root=REPO)
        merge_config(config, reproduce_preset(manifest, method, "results/rerun"))
        validated = validate_config(config, SCHEMA, note=lambda _: None)
        assert validated["methods"] == [method] and validated["seeds"] == len(manifest["seeds"])
        assert validated["agents"][method] == entry["hyperparameters"]
        assert protocol_slice(validated) == manifest["protocol"], method


# --- the reproduction report --------------------------------------------------------------------------------------
def test_docs_reproduction_is_generated_from_the_shipped_set():
    from tapebench.report.reproduction import reproduction_markdown

    expected = reproduction_markdown(SET, SHIPPED)
    assert (REPO / "docs" / "reproduction.md").read_text() == expected, (
        "docs/reproduction.md is stale: tapebench reference reproduction tape-v2 --out docs/reproduction.md")


def test_the_readme_results_block_is_generated_from_the_shipped_set():
    from tapebench.report.reproduction import readme_results

    assert readme_results(SET, SHIPPED) in (REPO / "README.md").read_text(), (
        "README's Results block is stale: tapebench reference reproduction tape-v2 --out docs/reproduction.md "
        "--readme README.md")


def test_the_reproduction_report_holds_every_paper_cell_with_a_verdict():
    from tapebench.report.reproduction import DIFFERS, INSIDE, MISSING, OVERLAP, VALUE_IN_OURS, reproduction_frame

    frame, paper, manifest = reproduction_frame(SET, SHIPPED)
    assert len(frame) == len(paper["cells"]) == 132      # Table 3: 7 x 4, Table 2: 7 x 8, Table 4: 7 x 6, 3 + 3
    assert set(frame["table"]) == {"Table 1", "Table 2", "Table 3", "Table 4", "Section 6.2"}
    assert set(frame["verdict"]) <= {INSIDE, OVERLAP, VALUE_IN_OURS, DIFFERS, MISSING}
    held = frame[frame["method"].isin(manifest["methods"])]
    assert (held["verdict"] != MISSING).all() and held["ours"].notna().all()
    assert (held.loc[held["verdict"] == DIFFERS, "why"] != "").all()


def test_the_verdict_line_names_the_methods_a_partial_set_lacks(tmp_path):
    # the shipped set answers every paper cell; without one of its methods the report says which cells wait for it
    from tapebench.report.reproduction import readme_results, reproduction_markdown

    full = reproduction_markdown(SET, SHIPPED)
    assert "**Verdict**: all 132 paper cells answered: " in full and "wait for" not in full
    assert f"({len(reference_sets.read_manifest(SET, SHIPPED)['methods'])} methods, every method of the config that " \
           "made the set;" in full
    assert "of the 132 numbers of its Tables 1-4 and Section 6.2, all are answered;" in readme_results(SET, SHIPPED)
    shutil.copytree(SHIPPED / SET, tmp_path / SET)
    manifest_path = tmp_path / SET / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["methods"]["ppo"]
    manifest_path.write_text(json.dumps(manifest))
    partial = reproduction_markdown(SET, tmp_path)
    assert "**Verdict so far**: 114 of 132 paper cells answered: " in partial
    assert "; 18 wait for methods not yet in the set (ppo)." in partial
    assert "methods (not in the set yet: ppo);" in partial
    assert "114 are answered so far;" in readme_results(SET, tmp_path)


def test_verdicts_follow_the_paper_interval_rounded():
    from tapebench.report.reproduction import DIFFERS, INSIDE, OVERLAP, VALUE_IN_OURS, _verdict

    assert _verdict(0.073, 0.072, 0.075, 3, 0.0754, 0.07, 0.08) == INSIDE      # within half a unit of 0.075
    assert _verdict(0.073, 0.072, 0.075, 3, 0.0760, 0.074, 0.078) == OVERLAP
    assert _verdict(0.073, 0.072, 0.075, 3, 0.0800, 0.078, 0.082) == DIFFERS
    assert _verdict(0.187, None, None, 3, 0.30, 0.18, 0.40) == VALUE_IN_OURS
    assert _verdict(0.187, None, None, 3, 0.30, 0.29, 0.31) == DIFFERS


# --- a run beside a reference set (the tiny protocol) -------------------------------------------------------------
@pytest.mark.xdist_group("tiny_build_2")
def test_a_run_beside_a_reference_set_runs_only_its_own_method(tiny_build, tmp_path):
    from pipeline_helpers import make_workdir, scheduled_jobs, snakemake

    (tmp_path / "work").mkdir()
    work = make_workdir(tmp_path / "work")
    packed = _cli("reference", "pack", "tiny", "--configfile", "tiny.yaml", "--results",
                  str(tiny_build / "results"), "--methods", "dqn", "random", "mpc", "--skip-code-check", cwd=work)
    assert packed.returncode == 0, packed.stderr
    assert _cli("reference", "verify", "tiny", cwd=work).returncode == 0
    (work / "beside.yaml").write_text(json.dumps({
        "reference_set": "tiny", "methods": ["live_leftmost"],
        "studies": {"fewshot": {"methods": ["bayes_filter", "random"]}}}))
    dry = snakemake(work, "-n", "results/table3.tex", configfiles=("tiny.yaml", "beside.yaml"))
    assert dry.returncode == 0, dry.stderr[-3000:]
    jobs = scheduled_jobs(dry.stdout)
    held = {"dqn", "random", "mpc"}
    assert not [r for r, w in jobs if r.startswith("train")]
    from_set = sorted((w["agent"], w["H"]) for r, w in jobs if r == "reference_seed_tables")
    assert from_set == sorted((a, h) for a in held for h in ("8", "16"))
    evaluated = {w.get("agent") for r, w in jobs if r.startswith("evaluate")}
    assert evaluated <= {"live_leftmost", "random"}      # random: the health report's floor at the training H only
    assert {w["agent"] for r, w in jobs if r == "aggregate_seed"} == {"live_leftmost"}

    built = snakemake(work, "results/table3.tex", "results/compare.tex", configfiles=("tiny.yaml", "beside.yaml"))
    assert built.returncode == 0, built.stderr[-3000:]
    table = (work / "results" / "table3.tex").read_text()
    assert table.count("$^{\\dagger}$") == 3 and "reference set \\texttt{tiny}" in table
    assert "Flip lowest live cell & " in table          # the method this run ran: a row, not marked
    compare = pd.read_parquet(work / "results" / "compare.parquet")
    assert set(compare["method"]) == {"live_leftmost"} and set(compare["reference_method"]) == held
    assert list(dict.fromkeys(compare["reference_method"])) == ["dqn", "random", "mpc"]     # Table 3's order
    assert set(compare["side"]) == {"train", "test"} and compare["probability"].between(0, 1).all()
    assert (work / "results" / "figures" / "compare.png").is_file()
    for agent in held:      # the set's rows are the original run's, bit for bit
        for H in (8, 16):
            name = f"results/aggregate/main/{agent}_H{H}.per_seed.parquet"
            pd.testing.assert_frame_equal(pd.read_parquet(work / name), pd.read_parquet(tiny_build / name))


def test_the_code_fingerprint_ignores_docstrings_and_comments_but_not_code():
    source = '"""Module."""\nclass Config:\n    """A config."""\n    rate: float = 0.1\n    """the rate"""\n'
    reworded = '"""Module, reworded."""\n# a comment\nclass Config:\n    """Another."""\n    rate: float = 0.1\n'
    changed = '"""Module."""\nclass Config:\n    """A config."""\n    rate: float = 0.2\n    """the rate"""\n'
    assert reference_sets.code_of(source) == reference_sets.code_of(reworded)
    assert reference_sets.code_of(source) != reference_sets.code_of(changed)
    # the shipped set's fingerprints are those of the commit that made its records
    manifest = reference_sets.read_manifest(SET, SHIPPED)
    entry = manifest["methods"]["random"]
    commit = entry["code_version"][0].split("+g", 1)[1]
    assert entry["method_code_sha256"] == reference_sets.method_fingerprint("random", commit)
