"""The paper protocol's defaults, defined once at the bottom of the package (this module imports nothing).

Every Python default of a protocol setting is one of these constants: a CLI flag's default, a function's or a
dataclass's keyword default, and the value a command takes for a key its `--params` leaves out. The paper protocol
(docs/protocol.md#schedule) is also written where users read it: `config/config.yaml`, onto which every preset is
merged, and the `default:` entries of `workflow/schemas/config.schema.yaml`. `tests/test_defaults.py` checks the
three key by key: for each key of `CONFIG_KEYS`, config.yaml's value == the schema default (where the schema has one)
== the constant here; for every other key with a schema default, the schema default == config.yaml's value.

How config.yaml and the schema relate:

* a key the schema requires (env.L, training.total_steps, ...) has no schema default; config.yaml states it;
* a key config.yaml states has the same schema default, except a default that means "off" or "none": a study's
  method or level list (`[]` = study off), `studies.ladder.train_types` (`[]` = any type), `training.gpus`
  (`0` = CPU only); config.yaml turns these on for the paper run (the list is in tests/test_defaults.py);
* a key config.yaml leaves out (health thresholds, resources, rule_set, training.seeds_per_job) is defined by its
  schema default alone;
* the settings below without a config key (REFERENCE, INIT_DENSITY, NOISE) are defined here alone.

Method hyperparameters are the defaults of each method's Config dataclass; config.yaml's `agents:` overrides
nothing, and the test checks that any entry it gains repeats the dataclass default.
"""
from __future__ import annotations

# env: the task (docs/protocol.md#schedule)
L = 32                       # tape length
H = 32                       # training horizon
SUCCESS_BONUS = 1.0          # b in r = -dist + b * 1[dist = 0]
GOAL = "zeros"               # the episodes' goal: the all-zero tape, or "derived" (docs/protocol.md#multi-goal)
GOAL_STEPS = 8               # derived goals: reached from the start in k in 1..GOAL_STEPS random steps

# training: the schedule of one run
TOTAL_STEPS = 200_000        # environment steps per run
EVAL_EVERY = 10_000          # a checkpoint every this many environment steps
SEEDS = 20                   # training seeds 0..SEEDS-1 per method

# evaluation: the common-random-number episodes every method plays
EPISODES_PER_RULE = 20
EVAL_SEED = 20260101
LAST_K = 3                   # a seed's final value averages its last K checkpoints

# statistics: percentile-bootstrap intervals
N_RESAMPLES = 2000
CI = 0.95
STATISTICS_SEED = 0

# diagnostics.model_error: the world-model probe
MODEL_ERROR_CONTEXT = 4      # observed transitions before the open-loop prediction
MODEL_ERROR_DEPTH = 16       # steps predicted open loop

# oracle: the exact-optimum feasibility table and the per-type MPC export
FEASIBILITY_L = 16
FEASIBILITY_H = 16
BY_TYPE_EPISODES_PER_RULE = 1

# features: the rollouts behind the rule features (at the benchmark's tape length L)
FEATURE_TRIALS = 64
FEATURE_STEPS = 64
FEATURE_SEED = 0

# studies.ladder: the severity ladder (docs/protocol.md#severity-ladders)
LADDER_TRAIN_CLASSES = 3     # mirror classes drawn for training
LADDER_LEVELS = (1, 2, 3, 4)  # the rule-table distances d
LADDER_LEVEL_SIZE = 10       # test rules per level

# studies.fewshot: the few-shot adaptation study (docs/protocol.md#few-shot)
FEWSHOT_SHOTS = (0, 1, 2, 4, 8)   # reward-bearing adaptation episodes k before the test episodes
FEWSHOT_SEEDS = 5                 # seeds 0..FEWSHOT_SEEDS-1 per method
FEWSHOT_RULES_PER_SIDE = 10       # study rules per side, evenly spaced over its sorted rules (null: every rule)

# settings without a config key
REFERENCE = "mpc"            # the reference method of oracle-normalised scores and of Table 3's "on reference"
INIT_DENSITY = 0.5           # initial tapes: each cell 1 with this probability
NOISE = 0.0                  # cell-update noise epsilon of the dynamics (docs/protocol.md#noise)

# the sections of a job's --params, as dicts
ENV = {"L": L, "H": H, "success_bonus": SUCCESS_BONUS}
TRAINING = {"total_steps": TOTAL_STEPS, "eval_every": EVAL_EVERY}

# config key (dotted path in config/config.yaml) -> its constant here; tests/test_defaults.py checks each
CONFIG_KEYS = {
    "env.L": L,
    "env.H": H,
    "env.success_bonus": SUCCESS_BONUS,
    "env.goal": GOAL,
    "env.goal_steps": GOAL_STEPS,
    "features.L": L,
    "features.trials": FEATURE_TRIALS,
    "features.steps": FEATURE_STEPS,
    "features.seed": FEATURE_SEED,
    "training.total_steps": TOTAL_STEPS,
    "training.eval_every": EVAL_EVERY,
    "seeds": SEEDS,
    "evaluation.episodes_per_rule": EPISODES_PER_RULE,
    "evaluation.eval_seed": EVAL_SEED,
    "evaluation.last_k": LAST_K,
    "statistics.n_resamples": N_RESAMPLES,
    "statistics.ci": CI,
    "statistics.seed": STATISTICS_SEED,
    "diagnostics.model_error.context": MODEL_ERROR_CONTEXT,
    "diagnostics.model_error.depth": MODEL_ERROR_DEPTH,
    "oracle.feasibility.L": FEASIBILITY_L,
    "oracle.feasibility.H": FEASIBILITY_H,
    "oracle.by_type_episodes_per_rule": BY_TYPE_EPISODES_PER_RULE,
    "studies.fixed_z.total_steps": TOTAL_STEPS,
    "studies.fixed_z.eval_every": EVAL_EVERY,
    "studies.ladder.train_classes": LADDER_TRAIN_CLASSES,
    "studies.ladder.levels": LADDER_LEVELS,
    "studies.ladder.level_size": LADDER_LEVEL_SIZE,
    "studies.fewshot.shots": FEWSHOT_SHOTS,
    "studies.fewshot.seeds": FEWSHOT_SEEDS,
    "studies.fewshot.rules_per_side": FEWSHOT_RULES_PER_SIDE,
}
