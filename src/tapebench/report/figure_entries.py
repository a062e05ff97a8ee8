"""Registry entries of the paper's figures (report/figures.py) and the rliable-style outputs
(report/rliable_outputs.py); listed in `registry.ENTRY_MODULES`.

The entries live apart from their builders because the registry imports this module while it assembles
itself: a builder module that imported the registry could not then be imported on its own.
Every job asks only for files the pipeline writes for that config: the per-rule and curves tables of the
methods in config["methods"] at the training horizon of the main split, and the fixed-z oracle outputs.
"""
from __future__ import annotations

from tapebench import layout
from tapebench.report.figures import FIGURE4_H, FIGURE4_L, FIGURE4_RULES, FIGURE4_SEED, has_curve
from tapebench.report.registry import FIGURE, TABLE, Job, Option, Output, elementary_only

FIGURES = "Figures"
RLIABLE = "rliable-style statistics"


def _value(name, help, type=str, many=False, required=True, default=None) -> Option:
    return Option(name, help, file=False, type=type, many=many, required=required, default=default)


def _main(config) -> tuple[str, int, list[str]]:
    """The main split, the training horizon, the configured methods."""
    return config["main_split"], config["env"]["H"], list(config["methods"])


def _statistics(config) -> dict:
    stats = config["statistics"]
    return {"n_resamples": stats["n_resamples"], "ci": stats["ci"], "seed": stats["seed"]}


def _per_rule_values(config) -> dict:
    split, H, agents = _main(config)
    return {"per_rule": [layout.per_rule(split, a, H) for a in agents], "split": split, "H": H}


def _figure1_jobs(config):
    return [Job("figure1", layout.figure("figure1_rollout"), {})]


def _figure4_jobs(config):
    return [Job("figure4", layout.figure("figure4_spacetime"),
                {"rules": list(FIGURE4_RULES), "L": FIGURE4_L, "H": FIGURE4_H, "seed": FIGURE4_SEED})]


def _figure3_jobs(config):
    return [Job("figure3", layout.figure("figure3_per_rule"), _per_rule_values(config))]


def _curves_jobs(config):
    split, H, agents = _main(config)
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
    if len(config["methods"]) < 2:
        return []
    return [Job("probability_of_improvement", layout.figure("probability_of_improvement"),
                {**_per_rule_values(config), "side": "test", **_statistics(config),
                 "parquet": "results/probability_of_improvement.parquet"})]


def _profile_jobs(config):
    return [Job("performance_profile", layout.figure("performance_profile"),
                {**_per_rule_values(config), **_statistics(config)})]


_PER_RULE = Option("per_rule", "per-rule Parquet(s) (tapebench aggregate-seed --per-rule-out)", many=True)
_SPLIT = _value("split", "split name (needed only if the tables hold several)", required=False)
_H = _value("H", "evaluation horizon (needed only if the tables hold several)", int, required=False)
_STATS = (_value("n_resamples", "bootstrap resamples (default 2000)", int, required=False, default=2000),
          _value("ci", "confidence level (default 0.95)", float, required=False, default=0.95),
          _value("seed", "bootstrap seed (default 0)", int, required=False, default=0))


def _parquet(job: Job) -> dict:
    return {"parquet": job.values["parquet"]}


ENTRIES: list[Output] = [
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
    Output("figure3", FIGURE, "Figure 3: per-rule strict success by rule type, ID and OOD rules, per method",
           "tapebench.report.figures:render_figure3", (
               _PER_RULE, _SPLIT, _H, _value("metric", "metric (default success)", required=False, default="success")),
           _figure3_jobs, category=FIGURES),
    Output("learning_curves", FIGURE, "Learning curves: ID and OOD strict success vs environment steps",
           "tapebench.report.figures:render_learning_curves", (
               Option("curves", "curves Parquet(s) (tapebench aggregate-seed --curves-out)", many=True),
               _SPLIT, _H, _value("metric", "metric (default success)", required=False, default="success"), *_STATS),
           _curves_jobs, category=FIGURES),
    Output("oracle_gap", FIGURE, "Oracle gap: true-dynamics MPC vs the exact optimum per rule",
           "tapebench.report.figures:render_oracle_gap", (
               Option("gap", "oracle-gap Parquet (tapebench oracle-gap)"),),
           elementary_only(_oracle_gap_jobs), category=FIGURES),
    Output("rliable", TABLE, "rliable-style aggregates: mean, median, IQM, optimality gap with stratified CIs",
           "tapebench.report.rliable_outputs:render_rliable", (
               _PER_RULE, _SPLIT, _H, *_STATS, _value("parquet", "also write the summary table", required=False)),
           _rliable_jobs, category=RLIABLE, extra_outputs=_parquet),
    Output("probability_of_improvement", FIGURE, "Probability of improvement between methods (OOD rules)",
           "tapebench.report.rliable_outputs:render_probability_of_improvement", (
               _PER_RULE, _SPLIT, _H,
               _value("side", "train (ID) or test (OOD, default)", required=False, default="test"), *_STATS,
               _value("parquet", "also write the pairwise table", required=False)),
           _improvement_jobs, category=RLIABLE, extra_outputs=_parquet),
    Output("performance_profile", FIGURE, "Performance profiles: fraction of (seed, rule) scores above a threshold",
           "tapebench.report.rliable_outputs:render_performance_profile", (_PER_RULE, _SPLIT, _H, *_STATS),
           _profile_jobs, category=RLIABLE),
]
