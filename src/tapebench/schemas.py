"""The pipeline's tables: their column lists and kinds, defined once at the bottom of the package.

Writers build their frames with these columns; `utils.artifacts.read_table` checks a file against its
kind and names the command that writes the expected one. Column meanings: docs/protocol.md#outputs.
"""
from __future__ import annotations

from dataclasses import dataclass

# per-episode evaluation records (`tapebench evaluate`, the oracles): column -> dtype
EPISODE_COLUMNS = {
    "split": "string", "side": "string", "rule": "int64", "type": "string", "episode": "int64",
    "L": "int64", "H": "int64", "success": "bool", "final_dist": "float64", "auc_dist": "float64",
    "return": "float64", "steps": "int64",
}
AGENT_COLUMNS = {"agent": "string", "seed": "int64", "checkpoint": "int64"}   # added by learned agents' evaluations

# aggregates (`tapebench aggregate-seed`, `tapebench aggregate`)
GROUP = ["split", "agent", "L", "H", "seed", "side"]
SUMMARY_GROUP = ["split", "agent", "L", "H"]
PER_SEED_COLUMNS = [*GROUP, "metric", "value", "k_used", "checkpoint_first", "checkpoint_last", "n_episodes"]
PER_RULE_COLUMNS = [*GROUP, "rule", "type", "metric", "value", "k_used", "n_episodes"]
CURVE_COLUMNS = [*GROUP, "checkpoint", "metric", "value", "n_episodes"]
# per (seed, checkpoint, side, rule): the episode count and each metric's sum over those episodes; every per-seed
# value, curve and per-rule value is a ratio of these (`stats.aggregate.rule_sums`; the reference sets' records)
RULE_SUM_COLUMNS = {
    "split": "string", "agent": "string", "L": "int64", "H": "int64", "seed": "int64", "side": "string",
    "checkpoint": "int64", "rule": "int64", "type": "string", "n_episodes": "int64",
    "success": "float64", "soft_success@0.03125": "float64", "soft_success@0.0625": "float64",
    "soft_success@0.1": "float64", "final_dist": "float64", "auc_dist": "float64", "return": "float64",
    "steps": "float64",
}
AGGREGATE_COLUMNS = [*SUMMARY_GROUP, "side", "metric", "n", "mean", "sd", "ci_low", "ci_high", "ci",
                     "n_resamples"]
TESTS_COLUMNS = ["agent_a", "agent_b", "metric", "p", "p_holm"]

# world-model prediction error (`tapebench model-error`, `tapebench aggregate-model-error`)
MODEL_ERROR_PROBE_COLUMNS = ["side", "rule", "type", "depth", "error", "n"]
MODEL_ERROR_RUN_COLUMNS = ["agent", "seed", "checkpoint", *MODEL_ERROR_PROBE_COLUMNS]
MODEL_ERROR_COLUMNS = ["agent", "side", "type", "depth", "mean", "ci_low", "ci_high", "n_seeds", "episodes"]

# protocol comparison (`tapebench protocol-comparison`)
PROTOCOL_COMPARISON_COLUMNS = ["protocol_a", "protocol_b", "reference", "methods", "n_methods", "tau", "tau_ci_low",
                               "tau_ci_high", "p_tau_defined", "n_pairs", "n_reversals", "expected_reversals",
                               "best_a", "best_b", "best_changes", "p_best_changes", "ci", "n_resamples"]
PROTOCOL_RANK_COLUMNS = ["protocol", "agent", "mean", "rank", "rank_ci_low", "rank_ci_high", "p_best"]
PROTOCOL_REVERSAL_COLUMNS = ["protocol_a", "protocol_b", "reference", "agent_hi", "agent_lo", "tied_a", "mean_a_hi",
                             "mean_a_lo", "mean_b_hi", "mean_b_lo", "reversed", "p_reversed"]

# the world test (`tapebench worldtest`, `tapebench aggregate-worldtest`; docs/protocol.md#world-test): one row per
# problem; success and final_dist only for planning, delay (report step - earliest detectable step) only for a
# detection that reported, NaN elsewhere; family is the rules' family name (`RuleFamily.name`: eca, k3r1, ...)
WORLDTEST_COLUMNS = {
    "agent": "string", "seed": "int64", "budget": "int64", "split": "string", "family": "string", "side": "string",
    "rule": "int64",
    "problem": "int64", "task": "string", "length": "int64", "score": "float64", "success": "float64",
    "final_dist": "float64", "delay": "float64",
}
WORLDTEST_AGGREGATE_COLUMNS = ["agent", "family", "task", "side", "budget", "n_seeds", "problems", "mean", "ci_low", "ci_high",
                               "ci", "n_resamples", "chance"]

# the few-shot study (`tapebench fewshot`, `tapebench aggregate-fewshot`; docs/protocol.md#few-shot): one row per test
# episode and shot count k (`shots`), the evaluation's episode columns beside the method's adaptation mode
# (gradient / context / none); the aggregate: one row per (agent, side, k), the mean over seeds of each seed's success
# over its test episodes, with its percentile-bootstrap CI over seeds
FEWSHOT_COLUMNS = {**AGENT_COLUMNS, "shots": "int64", "adaptation": "string", **EPISODE_COLUMNS}
FEWSHOT_AGGREGATE_COLUMNS = ["split", "agent", "adaptation", "L", "H", "side", "shots", "n_seeds", "n_rules",
                             "episodes", "mean", "ci_low", "ci_high", "ci", "n_resamples"]

# what the runs cost (`tapebench render compute`; docs/protocol.md#compute): one row per method
COMPUTE_COLUMNS = ["agent", "runs", "env_steps_per_s", "wall_per_run_s", "train_cpu_hours", "eval_jobs",
                   "eval_cpu_hours", "cpu_hours", "device"]

# oracle and rule-space tables
FEASIBILITY_COLUMNS = ["rule", "L", "H", "solvable_fraction", "any_solvable"]
IDENTIFIABILITY_COLUMNS = ("split", "side", "rule", "type", "episode", "L", "H", "steps", "identified", "episode_steps")
FEATURE_KEY_COLUMNS = ["rule", "type", "mirror_rule"]
# the 2D grid family's rule features (`rules/grid_features.py`, docs/protocol.md#grid-rule-space)
GRID_FEATURE_COLUMNS = ("rule", "notation", "mirror_rule", "mirror_class", "type", "density", "density_std",
                        "activity", "activity_2step", "entropy", "lambda", "lambda_table", "b0", "fertile", "mortal",
                        "sterile",
                        "extinct_fraction", "fixed_fraction", "periodic_fraction", "long_fraction", "attractor",
                        "median_transient", "max_period", "complement_rule")


@dataclass(frozen=True)
class TableKind:
    name: str
    label: str
    writer: str
    columns: tuple[str, ...]


EPISODE_TABLE = tuple(EPISODE_COLUMNS)

# The pipeline's Parquet tables, most specific first (the first match names an unknown file).
TABLE_KINDS = (
    TableKind("per_seed", "a per-seed table", "tapebench aggregate-seed --out", tuple(PER_SEED_COLUMNS)),
    TableKind("per_rule", "a per-rule table", "tapebench aggregate-seed --per-rule-out", tuple(PER_RULE_COLUMNS)),
    TableKind("rule_sums", "a rule-sums table (per seed, checkpoint and rule)", "tapebench reference pack",
              tuple(RULE_SUM_COLUMNS)),
    TableKind("curves", "a learning-curve table", "tapebench aggregate-seed --curves-out", tuple(CURVE_COLUMNS)),
    TableKind("aggregate", "an aggregate table", "tapebench aggregate --out", tuple(AGGREGATE_COLUMNS)),
    TableKind("tests", "a Welch-tests table", "tapebench aggregate --tests-out", tuple(TESTS_COLUMNS)),
    TableKind("model_error", "a world model's prediction-error table", "tapebench model-error",
              tuple(MODEL_ERROR_RUN_COLUMNS)),
    TableKind("model_error_aggregate", "a model-error aggregate", "tapebench aggregate-model-error",
              tuple(MODEL_ERROR_COLUMNS)),
    TableKind("fewshot", "few-shot records of one method and seed", "tapebench fewshot", tuple(FEWSHOT_COLUMNS)),
    TableKind("fewshot_aggregate", "a few-shot aggregate", "tapebench aggregate-fewshot",
              tuple(FEWSHOT_AGGREGATE_COLUMNS)),
    TableKind("episodes", "per-episode evaluation records of an agent", "tapebench evaluate",
              (*AGENT_COLUMNS, *EPISODE_TABLE)),
    TableKind("records", "per-episode records", "tapebench mpc / tapebench exact", EPISODE_TABLE),
    TableKind("feasibility", "a feasibility table", "tapebench feasibility", tuple(FEASIBILITY_COLUMNS)),
    TableKind("identifiability", "an identifiability table", "tapebench identifiability",
              ("split", "side", "rule", "type", "episode", "steps", "identified")),
    TableKind("protocol_comparison", "a protocol-comparison table", "tapebench protocol-comparison --out",
              tuple(PROTOCOL_COMPARISON_COLUMNS)),
    TableKind("protocol_ranks", "a protocol-ranks table", "tapebench protocol-comparison --ranks-out",
              tuple(PROTOCOL_RANK_COLUMNS)),
    TableKind("protocol_reversals", "a protocol-reversals table", "tapebench protocol-comparison --reversals-out",
              tuple(PROTOCOL_REVERSAL_COLUMNS)),
    TableKind("worldtest", "a world-test table of one method, seed and budget", "tapebench worldtest",
              tuple(WORLDTEST_COLUMNS)),
    TableKind("worldtest_aggregate", "a world-test aggregate", "tapebench aggregate-worldtest",
              tuple(WORLDTEST_AGGREGATE_COLUMNS)),
    TableKind("compute", "a compute table", "tapebench render compute", tuple(COMPUTE_COLUMNS)),
    TableKind("features", "a rule-features table", "tapebench features", tuple(FEATURE_KEY_COLUMNS)),
)
