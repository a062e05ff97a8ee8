"""Every table and figure of the report, one entry each, in one list: the `tapebench render` CLI and the
Snakemake render rules (workflow/rules/report.smk) are both generated from it; what an entry is (`Output`,
`Option`, `Job`) is in report/output.py.

An entry names its builder as `"module:function"`: the builder module (matplotlib, pandas, scipy...) is
imported only when that job runs, so listing the outputs (`tapebench render --help`, the Snakefile) loads
none of them. This module therefore imports only light modules (tests/test_report_registry.py checks it);
a constant an entry needs (e.g. Figure 4's defaults) is defined here and the builder imports it from here.
Every builder is called as `builder(out=..., **options)`.

Adding a table or figure is one builder function plus one entry here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from tapebench import layout
from tapebench import reference_sets
from tapebench.reference_sets import reference_methods, shown_methods
from tapebench.registry import get_method
from tapebench.registry import registry as method_registry
from tapebench import defaults
from tapebench.report.output import FIGURE, TABLE, Job, Option, Output, elementary_only, grid_only
from tapebench.rule_family import config_family
from tapebench.settings import (budget_point_runs, budget_study, fewshot_study, noise_study, sweep_runs,
                                worldtest_study)
from tapebench.stats.protocols import protocols
from tapebench.vocabulary import GOAL_MODES, SPLIT_SIDES, ZEROS_GOAL

# Figure 4 (report/figures.py): its rules, tape, horizon and seed by default
FIGURE4_RULES = (0, 90, 30)
FIGURE4_L, FIGURE4_H, FIGURE4_SEED = 32, 64, 0
# the grid rollouts (report/grid_rollouts.py): steps after the start grid and the start grid's seed
GRID_ROLLOUT_STEPS, GRID_ROLLOUT_SEED = 7, 0


def has_curve(agent: str, curves=None) -> bool:
    """A method evaluated at every checkpoint; an unregistered id: one with at least two checkpoints in
    `curves` (a curves table)."""
    method = method_registry().get(agent)
    if method is not None:
        return method.trains and method.every_checkpoint
    if curves is None:
        return False
    return curves.loc[curves["agent"] == agent, "checkpoint"].nunique() > 1


# value options that stand for a config key: `tapebench render` checks them with the config's bounds (pipeline.params)
CONFIG_KEYS = {"L": "env.L", "H": "evaluation.horizons[]", "n": "env.grid_n", "depth": "diagnostics.model_error.depth",
               "levels": "studies.noise.levels[]", "values": "diagnostics.sweep.values[]",
               "n_resamples": "statistics.n_resamples", "ci": "statistics.ci"}


def _value(name, help, type=str, many=False, required=True, default=None, config_key=None) -> Option:
    return Option(name, help, file=False, type=type, many=many, required=required, default=default,
                  config_key=config_key or CONFIG_KEYS.get(name))


def _main(config) -> str:
    return config["main_split"]


def _statistics(config) -> dict:
    stats = config["statistics"]
    return {"n_resamples": stats["n_resamples"], "ci": stats["ci"], "seed": stats["seed"]}


_SPLIT_FILE = Option("split_file", "split JSON: the caption names its rule family", required=False)
_STATISTICS = (_value("n_resamples", f"bootstrap resamples (default {defaults.N_RESAMPLES})", int, required=False,
                      default=defaults.N_RESAMPLES),
               _value("ci", f"confidence level (default {defaults.CI})", float, required=False, default=defaults.CI),
               _value("seed", f"bootstrap seed (default {defaults.STATISTICS_SEED})", int, required=False,
                      default=defaults.STATISTICS_SEED, config_key="statistics.seed"))


# --- the paper's result tables, the oracle tables, identifiability, world models -------------------------------
def _result_table(table: str) -> Callable[[dict], list[Job]]:
    def jobs(config):
        split = _main(config)
        values = {"aggregate": layout.aggregate(split), "split": split, "split_file": layout.split_file(split)}
        if table == "table2":
            values["H"] = list(config["evaluation"]["horizons"])
        else:
            values["H"] = config["env"]["H"]
        if table == "table3":
            values["random_per_rule"] = (layout.per_rule(split, "random", config["env"]["H"])
                                         if "random" in shown_methods(config) else None)
            values["reference_set"] = config.get("reference_set")
            values["min_headroom"] = config["health"]["rule_headroom"]["warn"]
            values["goal"] = config["env"]["goal"]
        return [Job(table, f"results/{table}.tex", values)]
    return jobs


def _table1_jobs(config):
    feas = config["oracle"].get("feasibility", {"L": 16, "H": 16})
    split, H = _main(config), config["env"]["H"]
    if not config_family(config).elementary:   # exact feasibility and the fixed-z oracle rows are elementary
        return [Job("table1", "results/table1.tex", {
            "mpc": [layout.mpc_records(split, side, H) for side in SPLIT_SIDES]})]
    return [Job("table1", "results/table1.tex", {
        "mpc": [layout.mpc_records(split, side, H) for side in SPLIT_SIDES] + [layout.fixed_z(feas, "mpc")],
        "exact": [layout.fixed_z(feas, "exact")], "feasibility": layout.feasibility(feas)})]


def _table7_jobs(config):
    return [Job("table7", "results/table7.tex", {"by_type": layout.mpc_by_type(_main(config))})]


def _identifiability_jobs(config):
    return [Job(f"identifiability_{layout.rule_safe(split)}", f"results/identifiability/{split}.tex",
                {"identifiability": layout.identifiability(split)}) for split in config["splits"]]


def _model_error_jobs(config):
    if not any(get_method(m).trains and get_method(m).world_model for m in config["methods"]):
        return []
    split = _main(config)
    return [Job("model_error", "results/diagnostics/model_error.tex", {
        "model_error": layout.model_error_aggregate(split), "aggregate": layout.aggregate(split), "split": split,
        "H": config["env"]["H"], "depth": config["diagnostics"]["model_error"]["depth"],
        "figure": "results/figures/model_error"})]


def _sweep_jobs(config):
    sweep = config["diagnostics"]["sweep"]
    if not sweep_runs(config):
        return []
    split, values = _main(config), [int(v) for v in sweep["values"]]
    points = [layout.sweep_point(split, sweep["method"], sweep["hyperparameter"], v) for v in values]
    stats = config["statistics"]
    return [Job("sweep", "results/diagnostics/sweep.tex", {
        "method": sweep["method"], "hyperparameter": sweep["hyperparameter"], "values": values,
        "per_seed": [p["per_seed"] for p in points], "model_error": [p["model_error"] for p in points],
        "split": split, "H": config["env"]["H"], "n_resamples": stats["n_resamples"], "ci": stats["ci"],
        "seed": stats["seed"], "parquet": "results/diagnostics/sweep.parquet", "figure": "results/figures/sweep"})]


_AGGREGATE = Option("aggregate", "aggregate Parquet from `tapebench aggregate`")
_SPLIT = _value("split", "split name as in the aggregate table")
_AGENTS = _value("agents", "methods and their order (default: all, grouped by family)", many=True, required=False)
_L = _value("L", "tape length (needed only if the table holds several)", type=int, required=False)

_TABLES: list[Output] = [
    Output("table1", TABLE, "Table 1: planning reference (MPC, exact optimum) and feasibility",
           "tapebench.report.oracle_tables:render_table1", (
               Option("mpc", "MPC records Parquet(s), one row each", many=True),
               Option("exact", "exact-optimum records Parquet(s), one row each", many=True, required=False),
               Option("feasibility", "feasibility Parquet (tapebench feasibility)", required=False)),
           _table1_jobs),
    Output("table2", TABLE, "Table 2: holdout length, success and final distance, ID/OOD x H",
           "tapebench.report.tables:render_table2", (
               _AGGREGATE, _SPLIT, _value("H", "evaluation horizons (default: all in the table)", int, many=True,
                                          required=False), _L, _AGENTS, _SPLIT_FILE),
           _result_table("table2")),
    Output("table3", TABLE,
           "Table 3: ID vs OOD success, drop, OOD return, ON(p), floor-normalised score, with bootstrap CIs",
           "tapebench.report.tables:render_table3", (
               _AGGREGATE, _SPLIT, _value("H", f"evaluation horizon (default {defaults.H})", int, required=False, default=defaults.H),
               _L, _AGENTS,
               Option("split_file", "split JSON: the caption names its rule family and counts test rules solved by "
                                    "any action", required=False),
               Option("random_per_rule", "the random policy's per-rule Parquet: the caption counts test rules it "
                                         "solves in >= 90% of episodes", required=False),
               _value("min_headroom", "the Score column is shown only where the OOD rule-dependent headroom is at least "
                                      "this (the pipeline: health.rule_headroom.warn)", float, required=False),
               _value("goal", f"the protocol's env.goal ({' or '.join(GOAL_MODES)}): the caption's rules solved by "
                              f"any action (default {ZEROS_GOAL})", required=False, default=ZEROS_GOAL),
               _value("reference_set", "the reference set whose rows the table marks (reference/NAME/)",
                      required=False)),
           _result_table("table3")),
    Output("table4", TABLE, "Table 4: final distance, AUC, soft success@0.1 by family",
           "tapebench.report.tables:render_table4", (
               _AGGREGATE, _SPLIT, _value("H", f"evaluation horizon (default {defaults.H})", int, required=False, default=defaults.H),
               _L, _AGENTS, _SPLIT_FILE),
           _result_table("table4")),
    Output("table7", TABLE, "Table 7: true-dynamics MPC strict success by rule type",
           "tapebench.report.oracle_tables:render_table7", (
               Option("by_type", "by-type JSON (tapebench export-mpc-by-type)"),),
           _table7_jobs),
    Output("identifiability", TABLE, "Identifiability of the rule by operational type",
           "tapebench.report.identifiability:render_identifiability", (
               Option("identifiability", "Parquet from `tapebench identifiability`"),),
           elementary_only(_identifiability_jobs), category="Belief and identifiability"),
    Output("model_error", TABLE, "World models: success beside open-loop prediction error, ID / OOD",
           "tapebench.report.world_model:render_model_error", (
               Option("model_error", "aggregate from `tapebench aggregate-model-error`"),
               Option("aggregate", "aggregate Parquet from `tapebench aggregate` (the success columns)",
                      required=False),
               _SPLIT, _value("H", f"evaluation horizon of the success columns (default {defaults.H})", int,
                              required=False, default=defaults.H),
               _value("depth", f"the deep open-loop column (default {defaults.MODEL_ERROR_DEPTH})", int, required=False,
                      default=defaults.MODEL_ERROR_DEPTH),
               _value("figure", "also write the error-vs-depth figure to FIGURE.pdf and FIGURE.png",
                      required=False)),
           _model_error_jobs, category="World models",
           extra_outputs=lambda job: {"pdf": f"{job.values['figure']}.pdf", "png": f"{job.values['figure']}.png"}),
    Output("sweep", TABLE, "Sensitivity of one method to one hyperparameter (success, one-step error)",
           "tapebench.report.world_model:render_sweep", (
               _value("method", "the swept method's id"), _value("hyperparameter", "the swept field of its Config"),
               _value("values", "the swept values, in order", int, many=True),
               Option("per_seed", "one per-seed table per value (same order)", many=True),
               Option("model_error", "one model-error aggregate per value (same order)", many=True),
               _SPLIT, _value("H", f"evaluation horizon (default {defaults.H})", int, required=False, default=defaults.H),
               _value("n_resamples", f"bootstrap resamples (default {defaults.N_RESAMPLES})", int, required=False,
                      default=defaults.N_RESAMPLES),
               _value("ci", f"confidence level (default {defaults.CI})", float, required=False, default=defaults.CI),
               _value("seed", f"bootstrap seed (default {defaults.STATISTICS_SEED})", int, required=False,
                      default=defaults.STATISTICS_SEED, config_key="statistics.seed"),
               _value("parquet", "also write the summary table", required=False),
               _value("figure", "also write the figure to FIGURE.pdf and FIGURE.png", required=False)),
           _sweep_jobs, category="World models",
           extra_outputs=lambda job: {"parquet": job.values["parquet"], "pdf": f"{job.values['figure']}.pdf",
                                      "png": f"{job.values['figure']}.png"}),
]


# --- the paper's figures and the rliable-style outputs ---------------------------------------------------------
# Every job asks only for files the pipeline writes for that config: the per-rule and curves tables of the
# methods in config["methods"] at the training horizon of the main split, and the fixed-z oracle outputs.
FIGURES = "Figures"
RLIABLE = "rliable-style statistics"


def _main_runs(config) -> tuple[str, int, list[str]]:
    """The main split, the training horizon, the rows shown: the reference set's methods and those that run."""
    return config["main_split"], config["env"]["H"], shown_methods(config)


def _per_rule_values(config) -> dict:
    split, H, agents = _main_runs(config)
    return {"per_rule": [layout.per_rule(split, a, H) for a in agents], "split": split, "H": H}


def _figure1_jobs(config):
    return [Job("figure1", layout.figure("figure1_rollout"), {})]


def _figure4_jobs(config):
    return [Job("figure4", layout.figure("figure4_spacetime"),
                {"rules": list(FIGURE4_RULES), "L": FIGURE4_L, "H": FIGURE4_H, "seed": FIGURE4_SEED})]


def _grid_rollout_jobs(config):
    return [Job("grid_rollouts", layout.figure("grid_rollouts"), {
        "features": layout.rule_features(), "n": config["env"]["grid_n"], "steps": GRID_ROLLOUT_STEPS,
        "seed": GRID_ROLLOUT_SEED})]


def _figure3_jobs(config):
    return [Job("figure3", layout.figure("figure3_per_rule"), _per_rule_values(config))]


def _curves_jobs(config):
    split, H, agents = _main_runs(config)
    if not any(has_curve(a) for a in agents):
        return []
    return [Job("learning_curves", layout.figure("learning_curves"), {
        "curves": [layout.curves(split, a, H) for a in agents], "split": split, "H": H, **_statistics(config)})]


def _oracle_gap_jobs(config):
    feas = config["oracle"].get("feasibility", {"L": 16, "H": 16})
    return [Job("oracle_gap", layout.figure("oracle_gap"), {"gap": layout.fixed_z(feas, "gap")})]


def _rliable_jobs(config):
    return [Job("rliable", "results/rliable.tex",
                {**_per_rule_values(config), **_statistics(config), "parquet": "results/rliable.parquet"})]


def _improvement_jobs(config):
    if len(shown_methods(config)) < 2:
        return []
    return [Job("probability_of_improvement", layout.figure("probability_of_improvement"),
                {**_per_rule_values(config), "side": "test", **_statistics(config),
                 "parquet": "results/probability_of_improvement.parquet"})]


def _compare_jobs(config):
    """Only beside a reference set, and only when this run ran a method of its own."""
    held = reference_methods(config)
    if not held or not config["methods"]:
        return []
    split, H, agents = _main_runs(config)
    return [Job("compare", "results/compare.tex", {
        **_per_rule_values(config), "aggregate": layout.aggregate(split), "methods": list(config["methods"]),
        "reference_methods": held, "reference_set": config["reference_set"], **_statistics(config),
        "parquet": "results/compare.parquet", "figure": layout.figure("compare")})]


def _reproduction_jobs(config):
    """Beside a reference set that holds the paper's numbers."""
    name = config.get("reference_set")
    if not name or not (Path(reference_sets.ROOT) / name / reference_sets.PAPER).is_file():
        return []
    return [Job("reproduction", "results/reproduction.tex", {
        "checksums": f"{reference_sets.ROOT}/{name}/{reference_sets.SUMS}", "reference_set": name})]


def _profile_jobs(config):
    return [Job("performance_profile", layout.figure("performance_profile"),
                {**_per_rule_values(config), **_statistics(config)})]


_PER_RULE = Option("per_rule", "per-rule Parquet(s) (tapebench aggregate-seed --per-rule-out)", many=True)
_SPLIT_IF_SEVERAL = _value("split", "split name (needed only if the tables hold several)", required=False)
_H_IF_SEVERAL = _value("H", "evaluation horizon (needed only if the tables hold several)", int, required=False)


def _parquet(job: Job) -> dict:
    return {"parquet": job.values["parquet"]}


_FIGURES: list[Output] = [
    Output("figure1", FIGURE, "Figure 1: a rollout of rule 30 at L = 8 (flip, update, flip, update)",
           "tapebench.report.figures:render_figure1", (), elementary_only(_figure1_jobs), category=FIGURES),
    Output("figure4", FIGURE, "Figure 4: space-time diagrams of rules 0, 90, 30 (same tape, same actions)",
           "tapebench.report.figures:render_figure4", (
               _value("rules", "rules, one panel each (default 0 90 30)", int, many=True, required=False,
                      default=list(FIGURE4_RULES)),
               _value("L", f"tape length (default {FIGURE4_L})", int, required=False, default=FIGURE4_L),
               _value("H", f"steps (default {FIGURE4_H})", int, required=False, default=FIGURE4_H),
               _value("seed", f"seed of the initial tape and the actions (default {FIGURE4_SEED})", int,
                      required=False, default=FIGURE4_SEED)),
           elementary_only(_figure4_jobs), category=FIGURES),
    Output("grid_rollouts", FIGURE, "Grid rollouts: one rule of each operational type, free evolution from one "
                                    "random grid",
           "tapebench.report.grid_rollouts:render_grid_rollouts", (
               Option("features", "grid rule-features Parquet (`tapebench grid-features`): the rules and their types"),
               _value("n", "grid side (the config's env.grid_n)", int),
               _value("steps", f"updates after the start grid (default {GRID_ROLLOUT_STEPS})", int, required=False,
                      default=GRID_ROLLOUT_STEPS),
               _value("seed", f"seed of the start grid (default {GRID_ROLLOUT_SEED})", int, required=False,
                      default=GRID_ROLLOUT_SEED),
               _value("rules", "rules to draw, Golly notation or ids (default: each type's median-activity rule)",
                      many=True, required=False)),
           grid_only(_grid_rollout_jobs), category=FIGURES),
    Output("figure3", FIGURE, "Figure 3: per-rule strict success by rule type, ID and OOD rules, per method",
           "tapebench.report.figures:render_figure3", (
               _PER_RULE, _SPLIT_IF_SEVERAL, _H_IF_SEVERAL,
               _value("metric", "metric (default success)", required=False, default="success")),
           _figure3_jobs, category=FIGURES),
    Output("learning_curves", FIGURE, "Learning curves: ID and OOD strict success vs environment steps",
           "tapebench.report.figures:render_learning_curves", (
               Option("curves", "curves Parquet(s) (tapebench aggregate-seed --curves-out)", many=True),
               _SPLIT_IF_SEVERAL, _H_IF_SEVERAL,
               _value("metric", "metric (default success)", required=False, default="success"), *_STATISTICS),
           _curves_jobs, category=FIGURES),
    Output("oracle_gap", FIGURE, "Oracle gap: true-dynamics MPC vs the exact optimum per rule",
           "tapebench.report.figures:render_oracle_gap", (
               Option("gap", "oracle-gap Parquet (tapebench oracle-gap)"),),
           elementary_only(_oracle_gap_jobs), category=FIGURES),
    Output("rliable", TABLE, "rliable-style aggregates: mean, median, IQM, optimality gap with stratified CIs",
           "tapebench.report.rliable_outputs:render_rliable", (
               _PER_RULE, _SPLIT_IF_SEVERAL, _H_IF_SEVERAL, *_STATISTICS,
               _value("parquet", "also write the summary table", required=False)),
           _rliable_jobs, category=RLIABLE, extra_outputs=_parquet),
    Output("probability_of_improvement", FIGURE, "Probability of improvement between methods (OOD rules)",
           "tapebench.report.rliable_outputs:render_probability_of_improvement", (
               _PER_RULE, _SPLIT_IF_SEVERAL, _H_IF_SEVERAL,
               _value("side", "train (ID) or test (OOD, default)", required=False, default="test"), *_STATISTICS,
               _value("parquet", "also write the pairwise table", required=False)),
           _improvement_jobs, category=RLIABLE, extra_outputs=_parquet),
    Output("performance_profile", FIGURE, "Performance profiles: fraction of (seed, rule) scores above a threshold",
           "tapebench.report.rliable_outputs:render_performance_profile",
           (_PER_RULE, _SPLIT_IF_SEVERAL, _H_IF_SEVERAL, *_STATISTICS),
           _profile_jobs, category=RLIABLE),
    Output("reproduction", TABLE, "The paper's Table 3 beside the reference set, with the verdicts of Tables 1-4",
           "tapebench.report.reproduction:render_reproduction", (
               Option("checksums", "the reference set's SHA256SUMS"),
               _value("reference_set", "the reference set's name")),
           _reproduction_jobs, category=RLIABLE),
    Output("compare", TABLE, "A method beside the reference set: its place in Table 3 and P(X > row) per reference row",
           "tapebench.report.compare:render_compare", (
               _PER_RULE, _AGGREGATE,
               _value("methods", "the methods this run ran", many=True),
               _value("reference_methods", "the reference set's rows", many=True),
               _SPLIT, _value("H", "evaluation horizon", int),
               _value("reference_set", "the reference set's name (the caption names it)", required=False),
               *_STATISTICS,
               _value("parquet", "also write the comparison table", required=False),
               _value("figure", "also write the figure to FIGURE.pdf and FIGURE.png", required=False)),
           _compare_jobs, category=RLIABLE,
           extra_outputs=lambda job: {"parquet": job.values["parquet"], "pdf": f"{job.values['figure']}.pdf",
                                      "png": f"{job.values['figure']}.png"}),
]


# --- the studies (docs/protocol.md#studies): Tables 5 and 6 (fixed z), success by rule type, Figure 5 -----------
_FIXED_Z = (Option("per_rule", "per-rule tables of the fixed-z runs (`tapebench aggregate-seed --per-rule-out`)",
                   many=True),
            Option("features", "rule features Parquet (the rule types)"),
            _value("rules", "the representative rules, in table order", int, many=True),
            _value("agents", "the fixed-z methods, in table order", many=True),
            _value("total_steps", "training budget of the runs (for the caption)", int, required=False))


def _table5_jobs(config):
    fixed = config["studies"]["fixed_z"]
    level = fixed["table5"]
    rules, agents = list(fixed["rules"]), list(level["methods"])
    return [Job("table5", "results/table5.tex", {
        "per_rule": [layout.fixed_z_per_rule(level["L"], level["H"], a, z) for a in agents for z in rules],
        "features": layout.rule_features(), "rules": rules, "agents": agents, "total_steps": fixed["total_steps"],
        **_statistics(config)})]


def _table6_jobs(config):
    fixed = config["studies"]["fixed_z"]
    level = fixed["table6"]
    L, H, split = level["L"], level["H"], config["main_split"]
    rules, agents, multi = list(fixed["rules"]), list(level["methods"]), list(level["multi_rule"])
    sides = SPLIT_SIDES
    return [Job("table6", "results/table6.tex", {
        "per_rule": [layout.fixed_z_per_rule(L, H, a, z) for a in agents for z in rules],
        "features": layout.rule_features(), "rules": rules, "agents": agents, "total_steps": fixed["total_steps"],
        "mpc": layout.fixed_z({"L": L, "H": H}, "mpc"), "exact": layout.fixed_z({"L": L, "H": H}, "exact"),
        "multi_agents": multi, "multi_aggregate": layout.multi_rule_aggregate(L, H, split) if multi else None,
        "multi_mpc": [layout.multi_rule_oracle(L, H, split, "mpc", s) for s in sides],
        "multi_exact": [layout.multi_rule_oracle(L, H, split, "exact", s) for s in sides], "split": split,
        **_statistics(config)})]


def _types_jobs(config):
    split, H = config["main_split"], config["env"]["H"]
    methods = list(config["methods"])
    return [Job("table_types", "results/table_types.tex", {
        "per_rule": [layout.per_rule(split, m, H) for m in methods], "split": split, "H": H, "agents": methods,
        "parquet": "results/table_types.parquet", "split_file": layout.split_file(split), **_statistics(config)})]


def _figure5_jobs(config):
    splits = list(config["studies"]["robustness"]["splits"])
    return [Job("figure5", "results/figures/figure5", {
        "aggregate": [layout.aggregate(s) for s in splits], "splits": splits,
        "kinds": [config["splits"][s]["method"] for s in splits], "L": config["env"]["L"], "H": config["env"]["H"],
        "agents": list(config["methods"]), "table": "results/robustness.tex",
        "parquet": "results/robustness.parquet"})]


_STUDIES: list[Output] = [
    Output("table5", TABLE, "Table 5: fixed-z training (strict, soft@0.1, final distance)",
           "tapebench.report.fixed_z:render_table5", (*_FIXED_Z, *_STATISTICS), elementary_only(_table5_jobs),
           category="Fixed-z study"),
    Output("table6", TABLE, "Table 6: oracle and exact optimum vs multi-rule and fixed-z training",
           "tapebench.report.fixed_z:render_table6", (
               *_FIXED_Z,
               Option("mpc", "true-dynamics MPC records on the representative rules (tapebench mpc --rules)"),
               Option("exact", "exact-optimum records on the same episodes (tapebench exact --rules)",
                      required=False),
               _value("multi_agents", "methods trained on the split's training rules", many=True, required=False),
               Option("multi_aggregate", "aggregate of the multi-rule runs", required=False),
               Option("multi_mpc", "MPC records on the split's train and test sides, in that order", many=True,
                      required=False),
               Option("multi_exact", "exact-optimum records on the train and test sides, in that order", many=True,
                      required=False),
               _value("split", "the multi-rule runs' split (for the caption)", required=False),
               *_STATISTICS),
           elementary_only(_table6_jobs), category="Fixed-z study"),
    Output("table_types", TABLE, "Strict success by rule type (stable / periodic / chaotic, micro / macro), ID / OOD",
           "tapebench.report.per_type:render_per_type", (
               Option("per_rule", "per-rule tables (`tapebench aggregate-seed --per-rule-out`)", many=True),
               _value("split", "split name"), _value("H", "evaluation horizon", int),
               _value("agents", "methods and their order (default: as in the tables)", many=True, required=False),
               _value("parquet", "also write the summary table", required=False),
               Option("split_file", "split JSON: the caption names its rule family (other than the elementary one)",
                      required=False),
               *_STATISTICS),
           _types_jobs, extra_outputs=lambda job: {"parquet": job.values["parquet"]}),
    Output("figure5", FIGURE, "Figure 5: split robustness, OOD success per method across partitions",
           "tapebench.report.robustness:render_figure5", (
               Option("aggregate", "one aggregate table per split (`tapebench aggregate`), same order", many=True),
               _value("splits", "split names", many=True), _value("kinds", "diverse | random per split", many=True),
               _value("L", "tape length", int), _value("H", "evaluation horizon", int),
               _value("agents", "methods and their order (default: all)", many=True, required=False),
               _value("table", "also write the summary table (LaTeX)", required=False),
               _value("parquet", "also write the per-partition Parquet", required=False)),
           _figure5_jobs, category="Split robustness",
           extra_outputs=lambda job: {"tex": job.values["table"], "parquet": job.values["parquet"]}),
]


# --- the noise study (docs/protocol.md#noise): success vs cell-update noise epsilon ------------------------------
_NOISE_OPTIONS = (
    Option("aggregate", "one aggregate table per noise level (`tapebench aggregate`), same order as --levels",
           many=True),
    _value("levels", "the noise levels epsilon", float, many=True),
    _value("split", "split name"), _value("H", "evaluation horizon", int),
    _value("agents", "methods and their order (default: all, grouped by family)", many=True, required=False))


def _noise_values(config) -> dict | None:
    study = noise_study(config)
    if not study["levels"]:
        return None
    split, H = study["split"], study["H"]
    return {"aggregate": [layout.noise_aggregate(split, x, H) for x in study["levels"]], "levels": study["levels"],
            "split": split, "H": H, "agents": study["methods"]}


def _noise_table_jobs(config):
    values = _noise_values(config)
    return [] if values is None else [Job("noise", "results/noise.tex", {**values, "parquet": "results/noise.parquet"})]


def _noise_figure_jobs(config):
    values = _noise_values(config)
    return [] if values is None else [Job("figure_noise", layout.figure("noise"), values)]


_NOISE: list[Output] = [
    Output("noise", TABLE, "Strict success vs cell-update noise epsilon, ID / OOD, with bootstrap CIs",
           "tapebench.report.noise:render_noise_table",
           (*_NOISE_OPTIONS, _value("parquet", "also write the summary table", required=False)), _noise_table_jobs,
           category="Noise study", extra_outputs=lambda job: {"parquet": job.values["parquet"]}),
    Output("figure_noise", FIGURE, "Strict success vs cell-update noise epsilon per method, ID and OOD panels",
           "tapebench.report.noise:render_noise_figure", _NOISE_OPTIONS, _noise_figure_jobs, category="Noise study"),
]


# --- the budget study (docs/protocol.md#budget-study) ------------------------------------------------------------
_BUDGET_OPTIONS = (
    _value("methods", "the study's methods, in order", many=True),
    _value("budgets", "the training budgets in environment steps, in order", int, many=True),
    Option("per_seed", "one per-seed table per method and budget (methods outer, budgets inner)", many=True),
    _value("runs", "the run folders, per method and budget its seeds (same order); their train.json gives the CPU "
                   "time", many=True),
    Option("references", "per-seed tables of the main study's rule-agnostic rows and true-dynamics MPC (the best "
                         "rule-agnostic row on OOD rules and the MPC are drawn)", many=True, required=False),
    _value("split", "split name"), _value("H", "evaluation horizon", int), *_STATISTICS)


def _budget_values(config) -> dict | None:
    study = budget_study(config)
    if not study["methods"]:
        return None
    split, points = study["split"], [(m, b) for m in study["methods"] for b in study["budgets"]]
    runs = [run for m, b in points for run in budget_point_runs(config, m, b)]
    return {"methods": study["methods"], "budgets": study["budgets"],
            "per_seed": [layout.budget_point(split, m, b) for m, b in points], "runs": runs,
            "references": [layout.per_seed(split, m, study["H"]) for m in config["methods"]
                           if get_method(m).rule_agnostic or m == defaults.REFERENCE],
            "split": split, "H": study["H"], **_statistics(config)}


def _budget_table_jobs(config):
    values = _budget_values(config)
    return [] if values is None else [Job("budget", "results/budget.tex", {**values, "parquet": "results/budget.parquet"})]


def _budget_figure_jobs(config):
    values = _budget_values(config)
    return [] if values is None else [Job("figure_budget", layout.figure("budget"), values)]


_BUDGET: list[Output] = [
    Output("budget", TABLE, "Strict success vs training budget per method, ID / OOD, beside the floor and the MPC",
           "tapebench.report.budget:render_budget_table",
           (*_BUDGET_OPTIONS, _value("parquet", "also write the summary table", required=False)), _budget_table_jobs,
           category="Budget study", extra_outputs=lambda job: {"parquet": job.values["parquet"]}),
    Output("figure_budget", FIGURE, "Strict success vs training steps per method, ID and OOD panels",
           "tapebench.report.budget:render_budget_figure", _BUDGET_OPTIONS, _budget_figure_jobs,
           category="Budget study"),
]


# --- the severity ladder (docs/protocol.md#severity-ladders) ---------------------------------------------------
def _ladder_jobs(config):
    ladder = config["studies"]["ladder"]
    name = ladder["name"]
    return [Job("figure_ladder", layout.figure("ladder"), {
        "aggregate": layout.aggregate(name), "split_file": layout.split_file(name), "split": name,
        "H": config["env"]["H"], "agents": list(ladder["methods"]), "table": "results/ladder.tex",
        "parquet": "results/ladder.parquet"})]


_LADDER: list[Output] = [
    Output("figure_ladder", FIGURE, "Severity ladder: success vs rule-table distance d to the training rules",
           "tapebench.report.ladder:render_ladder", (
               Option("aggregate", "aggregate table of the ladder split (`tapebench aggregate`)"),
               Option("split_file", "the ladder split JSON (`tapebench ladder-split`): levels and their sizes"),
               _value("split", "the ladder split's name (for the report caption)", required=False),
               _value("H", "evaluation horizon", int),
               _value("agents", "methods and their order (default: all in the aggregate)", many=True, required=False),
               _value("table", "also write the per-level table (LaTeX)", required=False),
               _value("parquet", "also write the per-level Parquet", required=False)),
           elementary_only(_ladder_jobs), category="Severity ladder",
           extra_outputs=lambda job: {"tex": job.values["table"], "parquet": job.values["parquet"]}),
]


# --- benchmark health (docs/protocol.md#benchmark-health) ------------------------------------------------------
def _health_jobs(config):
    return [Job("health", "results/health/health.tex",
                {"reports": [layout.health(split)["report"] for split in config["splits"]]})]


_HEALTH: list[Output] = [
    Output("health", TABLE, "Benchmark health per split: leakage, reference solvability, headroom, trivially "
                            "solved rules, identifiability",
           "tapebench.report.health:render_health", (
               Option("reports", "health reports (tapebench benchmark-health), one row each", many=True),),
           _health_jobs, category="Benchmark health"),
]


# --- the protocol comparison (docs/protocol.md#protocol-comparison) --------------------------------------------
PROTOCOL_COMPARISON = "Protocol comparison"


def _protocol_comparison_jobs(name: str, out: str):
    def jobs(config):
        if len(config["methods"]) < 2 or len(protocols(config)) < 2:
            return []
        return [Job(name, out, {"comparison": layout.PROTOCOL_COMPARISON["comparison"],
                                "ranks": layout.PROTOCOL_COMPARISON["ranks"]})]
    return jobs


_PROTOCOL_OPTIONS = (Option("comparison", "pairwise comparison Parquet (`tapebench protocol-comparison --out`)"),
                     Option("ranks", "ranks Parquet (`tapebench protocol-comparison --ranks-out`)"))

_PROTOCOLS: list[Output] = [
    Output("protocol_comparison", TABLE,
           "Protocol comparison: Kendall tau vs the reference protocol, rank reversals, best-method changes",
           "tapebench.report.protocol_comparison:render_protocol_table", _PROTOCOL_OPTIONS,
           _protocol_comparison_jobs("protocol_comparison", "results/protocols/comparison.tex"),
           category=PROTOCOL_COMPARISON),
    Output("protocol_comparison_figure", FIGURE,
           "Protocol comparison: Kendall tau between every pair of protocols; each method's rank per protocol",
           "tapebench.report.protocol_comparison:render_protocol_figure", _PROTOCOL_OPTIONS,
           _protocol_comparison_jobs("protocol_comparison_figure", layout.figure("protocol_comparison")),
           category=PROTOCOL_COMPARISON),
]


# --- the registry ------------------------------------------------------------------------------------------------
def _assemble(entries: list[Output]) -> dict[str, Output]:
    ids = [e.id for e in entries]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        raise ValueError(f"report registry: output ids registered twice: {duplicated}")
    return {e.id: e for e in entries}


# --- the world test (docs/protocol.md#world-test): score vs reward-free interaction budget -------------------------
_WORLDTEST_OPTIONS = (
    Option("aggregate", "the world-test aggregate (`tapebench aggregate-worldtest`)"),
    _value("split", "split name"),
    _value("agents", "methods and their order (default: the aggregate's)", many=True, required=False))


def _worldtest_values(config) -> dict | None:
    study = worldtest_study(config)
    if not study["methods"]:
        return None
    return {"aggregate": layout.WORLDTEST_AGGREGATE, "split": study["split"], "agents": study["methods"]}


def _worldtest_table_jobs(config):
    values = _worldtest_values(config)
    return [] if values is None else [Job("worldtest", "results/worldtest.tex", {**values, "L": config["env"]["L"]})]


def _worldtest_figure_jobs(config):
    values = _worldtest_values(config)
    return [] if values is None else [Job("figure_worldtest", layout.figure("worldtest"), values)]


_WORLDTEST: list[Output] = [
    Output("worldtest", TABLE, "World test: prediction, planning and change detection after reward-free interaction",
           "tapebench.report.worldtest:render_worldtest_table",
           (*_WORLDTEST_OPTIONS, _value("L", "tape length", int)), _worldtest_table_jobs, category="World test"),
    Output("figure_worldtest", FIGURE, "World test: score vs interaction budget per task, ID and OOD",
           "tapebench.report.worldtest:render_worldtest_figure", _WORLDTEST_OPTIONS, _worldtest_figure_jobs,
           category="World test"),
]

# --- the few-shot study (docs/protocol.md#few-shot): success vs reward-bearing episodes k of the rule ---------------
def _fewshot_jobs(config):
    study = fewshot_study(config)
    if not study["methods"]:
        return []
    return [Job("figure_fewshot", layout.figure("fewshot"), {
        "aggregate": layout.FEWSHOT_AGGREGATE, "split": study["split"], "agents": study["methods"],
        "table": "results/fewshot.tex"})]


_FEWSHOT: list[Output] = [
    Output("figure_fewshot", FIGURE, "Few-shot adaptation: success vs k reward-bearing episodes of the rule, ID and OOD",
           "tapebench.report.fewshot:render_fewshot", (
               Option("aggregate", "the few-shot aggregate (`tapebench aggregate-fewshot`)"),
               _value("split", "split name"),
               _value("agents", "methods and their order (default: the aggregate's)", many=True, required=False),
               _value("table", "also write the table (LaTeX)", required=False)),
           _fewshot_jobs, category="Few-shot adaptation", extra_outputs=lambda job: {"tex": job.values["table"]}),
]

# --- compute (docs/protocol.md#compute): what the main split's runs and evaluations cost -------------------------
def _compute_jobs(config):
    split = _main(config)
    manifests, evaluations = [], []
    per_job = int(config["training"].get("seeds_per_job", 1))
    for method in config["methods"]:
        seeds = [0] if get_method(method).deterministic else range(config["seeds"])
        for seed in seeds:
            run = layout.run_dir(split, method, seed)
            if get_method(method).trains and per_job == 1:
                manifests.append(layout.manifest(run))
            elif get_method(method).trains and seed % per_job == 0:   # the block's record names its runs
                manifests.append(layout.seed_block(split, method, *layout.block_of(seed, config["seeds"], per_job)))
            evaluations += [layout.evaluation(run, H) for H in config["evaluation"]["horizons"]]
    values = {"split": split, "manifests": manifests, "evaluations": evaluations, "agents": list(config["methods"]),
              "parquet": layout.COMPUTE_TABLE}
    return [Job("compute", "results/compute.tex", values)]


_COMPUTE: list[Output] = [
    Output("compute", TABLE, "Compute: steps/s, wall time per run and CPU-hours of training and evaluation per method",
           "tapebench.report.compute:render_compute_table", (
               _value("split", "split name"),
               Option("manifests", "train.json of every training run, or the records of its seed blocks", many=True,
                      required=False),
               Option("evaluations", "evaluation records (`tapebench evaluate`) of every run and method", many=True),
               _value("agents", "methods and their order (default: as found)", many=True, required=False),
               _value("parquet", "also write the table as Parquet", required=False)),
           _compute_jobs, category="Compute", extra_outputs=lambda job: {"parquet": job.values["parquet"]}),
]

OUTPUTS: dict[str, Output] = _assemble([*_TABLES, *_FIGURES, *_STUDIES, *_NOISE, *_BUDGET, *_LADDER, *_HEALTH,
                                        *_PROTOCOLS, *_WORLDTEST, *_FEWSHOT, *_COMPUTE])


def outputs() -> list[Output]:
    return list(OUTPUTS.values())


def jobs(config: dict) -> list[tuple[Output, Job]]:
    """Every render job the config asks for, in registry order, its files in the config's results folder (the
    entries name them in results/)."""
    folder = config.get("results_dir", layout.RESULTS_DIR)
    return [(entry, Job(job.name, layout.rebase(job.out, folder), layout.rebase(job.values, folder)))
            for entry in OUTPUTS.values() for job in entry.jobs(config)]


def targets(config: dict) -> list[str]:
    """The files the render jobs of this config write (the pipeline's default targets)."""
    files = []
    for entry, job in jobs(config):
        files.extend(job.outputs(entry).values())
        files.extend(entry.extra_outputs(job).values())
    return files
