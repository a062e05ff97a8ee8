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
