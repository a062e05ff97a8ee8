"""Registry entries of the studies (docs/protocol.md#studies): Tables 5 and 6 (fixed z), success by rule type,
and Figure 5 (split robustness). Builders live in report/fixed_z.py, report/per_type.py, report/robustness.py."""
from __future__ import annotations

from tapebench import layout
from tapebench.report.registry import FIGURE, TABLE, Job, Option, Output, elementary_only


def _value(name, help, type=str, many=False, required=True, default=None) -> Option:
    return Option(name, help, file=False, type=type, many=many, required=required, default=default)


def _statistics(config) -> dict:
    stats = config["statistics"]
    return {"n_resamples": stats["n_resamples"], "ci": stats["ci"], "seed": stats["seed"]}


_STATISTICS = (_value("n_resamples", "bootstrap resamples (default 2000)", int, required=False, default=2000),
               _value("ci", "confidence level (default 0.95)", float, required=False, default=0.95),
               _value("seed", "bootstrap seed (default 0)", int, required=False, default=0))
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
    sides = ("train", "test")
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
        "parquet": "results/table_types.parquet", **_statistics(config)})]


def _figure5_jobs(config):
    splits = list(config["studies"]["robustness"]["splits"])
    return [Job("figure5", "results/figures/figure5", {
        "aggregate": [layout.aggregate(s) for s in splits], "splits": splits,
        "kinds": [config["splits"][s]["method"] for s in splits], "L": config["env"]["L"], "H": config["env"]["H"],
        "agents": list(config["methods"]), "table": "results/robustness.tex",
        "parquet": "results/robustness.parquet"})]


ENTRIES: list[Output] = [
    Output("table5", TABLE, "Table 5: fixed-z training at L = H = 32 (strict, soft@0.1, final distance)",
           "tapebench.report.fixed_z:render_table5", (*_FIXED_Z, *_STATISTICS), elementary_only(_table5_jobs),
           category="Fixed-z study"),
    Output("table6", TABLE, "Table 6: L = H = 16, oracle and exact optimum vs multi-rule and fixed-z training",
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
