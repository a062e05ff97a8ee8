"""The grid's report outputs (docs/protocol.md#grid-pipeline): the grid-rollout figure on a hand-made features table
(one rule per type, the true dynamics from one start grid), the registry's grid jobs, the family in the captions."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_grid_config import SCHEMA, grid_config

from tapebench.ca.grid_reference import ca_step
from tapebench.grid_rules import MOORE, VON_NEUMANN
from tapebench.pipeline.config import validate_config
from tapebench.report import document, registry
from tapebench.report.grid_rollouts import grid_rollouts, render_grid_rollouts, representatives, start_grid
from tapebench.report.per_type import per_type_context
from tapebench.report.render import environment
from tapebench.utils.io import write_parquet

# von Neumann rules: (notation, type, activity); per type the lower median of activity is the representative
RULES = [("B1/S12V", "chaotic", 0.50), ("B13/S1V", "chaotic", 0.40), ("B14/S2V", "chaotic", 0.45),
         ("B23/SV", "periodic", 0.20), ("B2/S012V", "periodic", 0.10),
         ("B12/S0V", "stable", 0.01)]


def features_file(tmp_path, family=VON_NEUMANN, rules=RULES) -> Path:
    ids = [family.rule(r).id for r, _, _ in rules]
    frame = pd.DataFrame({"rule": ids, "notation": [r for r, _, _ in rules], "mirror_rule": ids,
                          "type": [t for _, t, _ in rules], "activity": [a for _, _, a in rules]})
    path = tmp_path / "features.parquet"
    write_parquet(path, frame, meta={"config": {"family": family.as_dict()}})
    return path


def test_one_rule_per_type_at_the_median_activity_in_type_order(tmp_path):
    frame = pd.read_parquet(features_file(tmp_path))
    chosen = representatives(frame)
    assert list(chosen["type"]) == ["stable", "periodic", "chaotic"]
    assert list(chosen["notation"]) == ["B12/S0V", "B2/S012V", "B14/S2V"]


def test_rows_are_the_true_dynamics_from_one_start_grid(tmp_path):
    frame = pd.read_parquet(features_file(tmp_path))
    items = grid_rollouts(frame, VON_NEUMANN, n=5, steps=4, seed=3)
    start = start_grid(5, 3)
    assert start.any() and np.array_equal(start, start_grid(5, 3))
    for item in items:
        rule = VON_NEUMANN.rule(item["notation"])
        assert item["grids"].shape == (5, 5, 5) and np.array_equal(item["grids"][0], start)
        for t in range(4):
            assert np.array_equal(item["grids"][t + 1], ca_step(item["grids"][t], rule))
    picked = grid_rollouts(frame, VON_NEUMANN, n=5, steps=2, seed=3, rules=["B23/SV", 194])
    assert [(i["notation"], i["type"]) for i in picked] == [("B23/SV", "periodic"), ("B1/S12V", "chaotic")]


def test_the_builder_writes_pdf_and_png_and_refuses_what_it_cannot_draw(tmp_path):
    features = features_file(tmp_path)
    written = render_grid_rollouts(tmp_path / "rollouts", features=features, n=4, steps=3, seed=0)
    assert written == [f"{tmp_path / 'rollouts'}.pdf", f"{tmp_path / 'rollouts'}.png"]
    assert all(Path(p).stat().st_size > 5000 for p in written)
    with pytest.raises(ValueError, match=r"rules \['B3/SV'\] are not in the features table"):
        render_grid_rollouts(tmp_path / "x", features=features, n=4, steps=3, seed=0, rules=["B3/SV"])
    with pytest.raises(ValueError, match="grid rollout steps"):
        render_grid_rollouts(tmp_path / "x", features=features, n=4, steps=40, seed=0)
    tape = tmp_path / "tape"
    tape.mkdir()
    write_parquet(tape / "features.parquet", pd.read_parquet(features), meta={"config": {"family": {"k": 3, "r": 1}}})
    with pytest.raises(ValueError, match="need a features table of the 2D grid family"):
        render_grid_rollouts(tmp_path / "x", features=tape / "features.parquet", n=4, steps=3, seed=0)


def test_a_grid_config_builds_the_rollouts_and_names_its_family_in_every_caption():
    config = validate_config(grid_config(), SCHEMA)
    jobs = {entry.id: job for entry, job in registry.jobs(config)}
    assert jobs["grid_rollouts"].values == {"features": "results/rules/features.parquet", "n": 4,
                                            "steps": registry.GRID_ROLLOUT_STEPS, "seed": registry.GRID_ROLLOUT_SEED}
    assert jobs["table_types"].values["split_file"] == "results/splits/main.json"
    assert {"figure3", "table_types", "table3"} <= set(jobs)
    assert not {"figure1", "figure4", "oracle_gap", "table5", "table6", "figure_ladder", "identifiability",
                "worldtest", "figure_fewshot"} & set(jobs)
    phrase = "outer-totalistic von Neumann rules on a 4 × 4 torus"
    captions = {item["id"]: item["protocol"] for item in document.items(config)}
    assert captions["figure3"].startswith(f"Protocol: split main; {phrase}, training horizon H = 8")
    assert captions["grid_rollouts"] == (f"Illustration: drawn from the rules alone ({phrase}), no training or "
                                         f"evaluation.")


def test_tape_configs_build_no_grid_rollouts():
    from test_figures import _tiny_config
    config = _tiny_config()
    assert "grid_rollouts" not in {entry.id for entry, _ in registry.jobs(config)}
    assert "torus" not in " ".join(item["protocol"] for item in document.items(config))


def test_the_per_type_caption_names_the_grid_family():
    summary = pd.DataFrame([{"agent": "mpc", "side": side, "stratum": s, "n_rules": 1, "n_seeds": 2, "mean": 0.5,
                             "ci_low": 0.4, "ci_high": 0.6} for side in ("train", "test")
                            for s in ("stable", "micro", "macro")])
    template = environment().get_template("table_types.tex.j2")
    grid = template.render(**per_type_context(summary, split="main", H=32, family=MOORE, L=64))
    assert "on split \\texttt{main} (outer-totalistic Moore rules on an 8 $\\times$ 8 torus) at $H=32$" in grid
    assert "torus" not in template.render(**per_type_context(summary, split="main", H=32))
