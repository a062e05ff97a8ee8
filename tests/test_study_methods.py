"""A preset that narrows `methods` needs no edit of the studies (docs/protocol.md#study-methods): the world test, the
few-shot study and the noise study leave out the methods they would reuse runs of that the config does not run, with
one note per study; a study left with no method is off; an unknown name is still an error."""
from __future__ import annotations

import pytest
from pipeline_helpers import REPO, make_workdir, scheduled_jobs, snakemake

from tapebench.pipeline.config import ConfigError, load_config, merge_config, validate_config
from tapebench.report import registry

SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
QUICK = str(REPO / "config" / "quick.yaml")


def _validated(files, **override):
    config = merge_config(load_config(files, root=REPO), override)
    notes = []
    return validate_config(config, SCHEMA, note=notes.append), notes


def test_narrowed_methods_over_the_quick_preset_keep_what_the_studies_can_use():
    config, notes = _validated([QUICK], methods=["dqn", "random", "mpc"])
    studies = config["studies"]
    assert studies["worldtest"]["methods"] == ["random", "mpc", "identify_then_plan", "active_identify"]
    assert studies["fewshot"]["methods"] == ["bayes_filter", "mpc"]      # bayes_filter does not train: it stays
    assert studies["noise"]["methods"] == [] and studies["noise"]["levels"] == [0.0, 0.05]   # [] = every method
    assert studies["ladder"]["methods"] == ["dqn", "ppo", "bayes_filter", "random", "mpc"]  # its own runs
    assert len(notes) == 2, notes
    assert notes[0].startswith("studies.worldtest.methods leaves out dreamer, context_mpc: they train")
    assert notes[1].startswith("studies.fewshot.methods leaves out ppo, rl2_a2c: they train")
    assert all("(dqn, random, mpc)" in n for n in notes)


@pytest.mark.parametrize("files", [[], [QUICK], [str(REPO / "config" / "extended.yaml")],
                                   [str(REPO / "config" / "equivariant.yaml")]])
def test_the_shipped_presets_leave_nothing_out(files):
    config, notes = _validated(files)
    assert notes == []


def test_one_equivariant_method_over_the_default_config_validates():
    config, notes = _validated([], methods=["dqn_equivariant"])
    assert [n.split(" leaves out ")[0] for n in notes] == ["studies.worldtest.methods", "studies.fewshot.methods"]
    assert "ppo" not in config["studies"]["fewshot"]["methods"]
    assert "dreamer" not in config["studies"]["worldtest"]["methods"]


def test_a_study_left_without_methods_is_off_and_leaves_the_default_target():
    on, _ = _validated([QUICK])
    off, notes = _validated([QUICK], methods=["dqn", "random", "mpc"],
                            studies={"fewshot": {"methods": ["ppo", "rl2_a2c"], "adapt": {"ppo": {"num_steps": 16}}},
                                     "noise": {"methods": ["ppo"]}})
    assert off["studies"]["fewshot"]["methods"] == [] and off["studies"]["fewshot"]["adapt"] == {}
    assert off["studies"]["noise"]["levels"] == []                 # not methods: [], which would mean every method
    assert any("the few-shot study is off" in n for n in notes) and any("the noise study is off" in n for n in notes)
    gone = set(registry.targets(on)) - set(registry.targets(off))
    assert {f"{on['results_dir']}/fewshot.tex", f"{on['results_dir']}/noise.tex"} <= gone, sorted(gone)


def test_the_noise_study_keeps_only_methods_that_run():
    """The noise study reuses each method's noise-free evaluation at epsilon = 0: a method that does not train is left
    out too when it is not in `methods`."""
    config, notes = _validated([QUICK], methods=["dqn", "random", "mpc"],
                               studies={"noise": {"methods": ["dqn", "bayes_filter", "ppo"]}})
    assert config["studies"]["noise"]["methods"] == ["dqn"]
    assert notes[0].startswith("studies.noise.methods leaves out bayes_filter, ppo: the noise study evaluates")


@pytest.mark.parametrize("study", ["worldtest", "fewshot", "noise"])
def test_an_unknown_study_method_is_still_an_error(study):
    with pytest.raises(ConfigError, match=rf"'studies\.{study}\.methods\[1\]': unknown method 'nope'"):
        _validated([QUICK], studies={study: {"methods": ["mpc", "nope"]}})


def test_errors_name_the_configured_index_after_narrowing():
    """A kept method's error names its place in the list as written, not in the narrowed list."""
    with pytest.raises(ConfigError, match=r"'studies\.fewshot\.methods\[1\]': 'bayes_filter' supports only the elem"):
        _validated([str(REPO / "config" / "family_k3r1.yaml")], methods=["random", "mpc"],
                   studies={"fewshot": {"methods": ["ppo", "bayes_filter"]}})


@pytest.mark.parametrize("presets, methods, targets", [
    (["config/quick.yaml"], "[dqn_equivariant, random, mpc]", []),           # every output of the quick preset
    ([], "[dqn_equivariant]", ["results/table3.tex"]),                        # the paper protocol's Table 3
])
def test_narrowed_methods_pass_a_dry_run(tmp_path, presets, methods, targets):
    workdir = make_workdir(tmp_path)
    (workdir / "narrow.yaml").write_text(f"methods: {methods}\n")
    proc = snakemake(workdir, "-n", *targets, configfiles=(*presets, "narrow.yaml"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert out.count("studies.worldtest.methods leaves out dreamer, context_mpc") == 1, out[-3000:]
    rules = {rule for rule, _ in scheduled_jobs(out)}
    assert "render_table3" in rules
    if not targets:
        assert {"aggregate_worldtest", "aggregate_fewshot", "render_figure_noise"} <= rules
