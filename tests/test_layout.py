"""Every path pattern under results/ is written once, in tapebench.layout: the rules name theirs by calling the
layout functions with wildcard placeholders, so no results/ literal is left in the .smk files."""
from __future__ import annotations

import re

from pipeline_helpers import REPO

from tapebench import layout


def test_rules_hold_no_results_path_literal():
    literal = re.compile(r"""["']results/""")
    found = [f"{p.relative_to(REPO)}:{i}" for p in [REPO / "Snakefile", *REPO.glob("workflow/**/*.smk")]
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if literal.search(line.split("#", 1)[0])]
    assert found == []


def test_wildcard_placeholders_give_the_rule_patterns():
    run = layout.run_dir("{split}", "{agent}", "{seed}")
    assert layout.evaluation(run, "{H}") == "results/runs/{split}/{agent}/seed{seed}/eval_H{H}.parquet"
    assert layout.manifest(run) == "results/runs/{split}/{agent}/seed{seed}/train.json"
    assert layout.noise_eval("{split}", "{eps}", "{agent}", "{seed}", "{H}") == \
        "results/noise/{split}/eps{eps}/{agent}/seed{seed}_H{H}.parquet"
    assert layout.noise_eval("main", 0.050, "dqn", 3, 8) == "results/noise/main/eps0.05/dqn/seed3_H8.parquet"
    assert layout.fixed_z({"L": "{L}", "H": "{H}"}, "gap") == "results/oracle/fixed_z_L{L}_H{H}/gap.parquet"
    assert layout.evaluation(layout.fixed_z_run_dir("{L}", "{H}", "{agent}", "{rule}", "{seed}")) == \
        "results/fixed_z/L{L}_H{H}/{agent}/rule{rule}/seed{seed}/eval.parquet"


def test_a_results_folder_moves_every_path_and_its_logs():
    """A preset's results_dir (results/<name>) takes every path of the layout, constants and the values of dicts
    included, and its logs go to logs/<name>; results/ itself is the identity."""
    quick = layout.ResultsFolder("results/quick")
    assert quick.run_dir("main", "dqn", 0) == "results/quick/runs/main/dqn/seed0"
    assert quick.health("main")["verdict"] == "results/quick/health/main.verdict.json"
    assert quick.PROTOCOL_COMPARISON["ranks"] == "results/quick/protocols/ranks.parquet"
    assert quick.REPORT_PDF == "results/quick/report.pdf"
    assert quick.WORLDTEST_AGGREGATE == "results/quick/worldtest.parquet"
    assert quick.block_of(4, 5, 3) == (3, 4) and quick.block_rule("evaluate", 0, 2) == "evaluate_seeds0_2"
    assert (quick.folder, quick.logs, quick.RESULTS_DIR) == ("results/quick", "logs/quick", "results")
    assert layout.rebase(quick.run_dir("main", "dqn", 0), "results/quick") == "results/quick/runs/main/dqn/seed0"
    paper = layout.ResultsFolder("results")
    assert paper.run_dir("main", "dqn", 0) == layout.run_dir("main", "dqn", 0) and paper.logs == "logs"


def test_records_in_a_presets_folder_state_their_provenance():
    assert layout.path_fields("results/quick/runs/main/dqn/seed1/eval_H8.parquet") == \
        layout.path_fields("results/runs/main/dqn/seed1/eval_H8.parquet") == \
        {"split": "main", "agent": "dqn", "seed": 1, "H": 8}
    assert layout.path_fields("results/grid_quick/fewshot/main/ppo/seed0.parquet") == \
        {"split": "main", "agent": "ppo", "seed": 0}


def test_every_folder_the_pipeline_writes_in_a_results_folder_is_known():
    """A preset's folder results/<name> cannot take a name the layout writes in results/ (RESULTS_FOLDERS): every
    results/<folder>/ the package names is listed there, or is a shipped preset's own folder."""
    presets = {re.search(r"^results_dir: results/(\w+)", p.read_text(), re.M) for p in REPO.glob("config/*.yaml")}
    named = {m.group(1) for p in REPO.glob("src/tapebench/**/*.py")
             for m in re.finditer(r"(?<![\w/.-])results/(\w+)/", p.read_text())}
    unknown = named - layout.RESULTS_FOLDERS - {m.group(1) for m in presets if m}
    assert {"runs", "splits", "figures"} <= named and unknown == set()
