"""Where the pipeline writes its artifacts under `results/`: every path pattern is written here once, for the paper
protocol's folder; a preset's own folder (config key `results_dir`, results/<name>) takes the same paths through
`ResultsFolder`. The Snakemake rules name their inputs and outputs by calling these functions with wildcard
placeholders (`layout.evaluation(layout.run_dir("{split}", "{agent}", "{seed}"), "{H}")`), the report registry and
the statistics with values (docs/protocol.md#outputs)."""
from __future__ import annotations

import re

# the files of one training run's folder (`run_dir`)
CHECKPOINT_DIR = "checkpoints"
RESUME_FILE = "resume.pt"
MANIFEST_FILE = "train.json"
LOG_FILE = "train.log"
TENSORBOARD_DIR = "tensorboard"   # TensorBoard event files, when the config turns them on (logging.tensorboard)

RESULTS_DIR = "results"   # the folder every artifact below lives in, by default (`ResultsFolder` for another)
LOGS_DIR = "logs"         # the Snakemake job logs of the pipeline run that writes RESULTS_DIR
# the folders the layout writes in a results folder: a preset's own folder, results/<name> (config key `results_dir`),
# takes none of these names, and the paper protocol's run leaves every other folder of results/ alone
RESULTS_FOLDERS = frozenset({"runs", "splits", "aggregate", "figures", "oracle", "health", "identifiability", "sweeps",
                             "fixed_z", "rules", "noise", "protocols", "worldtest", "fewshot", "diagnostics",
                             "reproduce", "budgets"})
# the kinds of file the pipeline writes there (a damaged one of these, and only these, is advised deleted)
ARTIFACT_SUFFIXES = (".parquet", ".json", ".pt")

REPORT_TEX = "results/report.tex"
REPORT_PDF = "results/report.pdf"
LATEX_CHECK = "results/.latex_check"  # the marker of the LaTeX check before the compiled report


def _is_wildcard(value) -> bool:
    """A Snakemake wildcard placeholder such as "{eps}", passed where a value goes to name a pattern."""
    return isinstance(value, str) and re.fullmatch(r"\{\w+\}", value) is not None


SPLITS_DIR = "results/splits"  # where split names are looked up


def split_file(split: str) -> str:
    return f"{SPLITS_DIR}/{split}.json"


def split_health(split: str) -> str:
    """The split gate's report (distances, mirror safety) beside the split file."""
    return f"{SPLITS_DIR}/{split}.health.json"


def run_dir(split: str, agent: str, seed) -> str:
    return f"results/runs/{split}/{agent}/seed{seed}"


def seed_block(split: str, agent: str, first, last) -> str:
    """The record of a seed block (seeds first..last trained in one job, each in its own `run_dir`)."""
    return f"results/runs/{split}/{agent}/seeds{first}-{last}.json"


SEED_BLOCK_RECORD = re.compile(r"seeds(\d+)-(\d+)\.json$")


def block_rule(rule: str, first, last) -> str:
    """The name of the rule whose one job evaluates seeds first..last (training.seeds_per_job > 1): `rule`'s jobs in
    blocks, one rule per block because each job names every seed's own file among its outputs."""
    return f"{rule}_seeds{first}_{last}"


BLOCK_RULE = re.compile(r"(\w+?)_seeds(\d+)_(\d+)$")


def block_of(seed: int, seeds: int, seeds_per_job: int) -> tuple[int, int]:
    """(first, last) of the block that trains `seed` of `seeds` seeds (0..seeds-1) in blocks of `seeds_per_job`
    consecutive seeds from 0; the last block may be shorter (docs/protocol.md#seed-blocks)."""
    first = int(seed) // seeds_per_job * seeds_per_job
    return first, min(first + seeds_per_job, max(int(seeds), int(seed) + 1)) - 1


# --- the files in a run folder: `run_dir`, `sweep_run_dir`, `fixed_z_run_dir`, `multi_rule_run_dir` ----------
def manifest(run: str) -> str:
    """A finished training run's manifest."""
    return f"{run}/{MANIFEST_FILE}"


def evaluation(run: str, H=None) -> str:
    """Per-episode evaluation records of a run at horizon H; the fixed-z runs (one horizon) have no H in the name."""
    return f"{run}/eval.parquet" if H is None else f"{run}/eval_H{H}.parquet"


def model_error(run: str) -> str:
    """The open-loop prediction error of a run with a world model (docs/protocol.md#model-error)."""
    return f"{run}/model_error.parquet"


def aggregate(split: str) -> str:
    return f"results/aggregate/{split}/aggregate.parquet"


def aggregate_tests(split: str) -> str:
    """The pairwise tests between the methods of a split, written beside its aggregate."""
    return f"results/aggregate/{split}/tests.parquet"


def per_seed(split: str, agent: str, H) -> str:
    return f"results/aggregate/{split}/{agent}_H{H}.per_seed.parquet"


def per_rule(split: str, agent: str, H) -> str:
    return f"results/aggregate/{split}/{agent}_H{H}.per_rule.parquet"


def curves(split: str, agent: str, H) -> str:
    return f"results/aggregate/{split}/{agent}_H{H}.curves.parquet"


def figure(name: str) -> str:
    """A figure's path stem: the render job writes <stem>.pdf and <stem>.png."""
    return f"results/figures/{name}"


def mpc_records(split: str, side: str, H) -> str:
    return f"results/oracle/{split}/mpc_{side}_H{H}.parquet"


def fixed_z(feasibility: dict, oracle: str) -> str:
    """MPC (`mpc`), the exact optimum (`exact`) or their gap (`gap`) on the representative rules at L, H."""
    return f"results/oracle/fixed_z_L{feasibility['L']}_H{feasibility['H']}/{oracle}.parquet"


def feasibility(feasibility: dict) -> str:
    return f"results/oracle/feasibility_L{feasibility['L']}_H{feasibility['H']}.parquet"


def mpc_by_type(split: str) -> str:
    return f"results/oracle/{split}/mpc_by_type_eval.json"


def exact_records(split: str, side: str, H) -> str:
    """The exact optimum on one side of a split's evaluation episodes (L <= 20; the health report's reference)."""
    return f"results/oracle/{split}/exact_{side}_H{H}.parquet"


def health(split: str) -> dict:
    """The benchmark health report of a split, its per-rule numbers, and the gate's verdict (training waits on it)."""
    stem = f"results/health/{split}"
    return {"report": f"{stem}.json", "per_rule": f"{stem}.per_rule.parquet", "verdict": f"{stem}.verdict.json"}


def identifiability(split: str) -> str:
    return f"results/identifiability/{split}.parquet"


def model_error_aggregate(split: str) -> str:
    return f"results/aggregate/{split}/model_error.parquet"


def sweep_run_dir(split: str, method: str, field: str, value, seed) -> str:
    """A run of the sensitivity sweep with hyperparameter `field` = `value`."""
    return f"results/sweeps/{split}/{method}/{field}{value}/seed{seed}"


def sweep_point(split: str, method: str, field: str, value) -> dict:
    stem = f"results/sweeps/{split}/{method}_{field}{value}"
    return {"per_seed": f"{stem}.per_seed.parquet", "model_error": f"{stem}.model_error.parquet"}


# --- the budget study (docs/protocol.md#budget-study): a run per method, budget and seed ------------------------
def budget_run_dir(split: str, method: str, steps, seed) -> str:
    """A run of the budget study trained for `steps` environment steps."""
    return f"results/budgets/{split}/{method}/steps{steps}/seed{seed}"


def budget_run(split: str, method: str, steps, seed, *, reuses_main_run: bool) -> str:
    """The run folder of one seed of a budget point: the main study's run where it is that run
    (`settings.budget_reuses_main_run`), else its own."""
    return run_dir(split, method, seed) if reuses_main_run else budget_run_dir(split, method, steps, seed)


def budget_point(split: str, method: str, steps) -> str:
    """The per-seed table of one method at one budget."""
    return f"results/budgets/{split}/{method}_steps{steps}.per_seed.parquet"


# --- the fixed-z study (Tables 5-6): runs and tables under results/fixed_z/L{L}_H{H}/ ------------------------
def fixed_z_dir(L, H) -> str:
    return f"results/fixed_z/L{L}_H{H}"


def fixed_z_run_dir(L, H, agent: str, rule, seed) -> str:
    """A run trained on one rule (no rule randomisation)."""
    return f"{fixed_z_dir(L, H)}/{agent}/rule{rule}/seed{seed}"


def fixed_z_per_seed(L, H, agent: str, rule) -> str:
    return f"{fixed_z_dir(L, H)}/{agent}/rule{rule}.per_seed.parquet"


def fixed_z_curves(L, H, agent: str, rule) -> str:
    return f"{fixed_z_dir(L, H)}/{agent}/rule{rule}.curves.parquet"


def fixed_z_per_rule(L, H, agent: str, rule) -> str:
    return f"{fixed_z_dir(L, H)}/{agent}/rule{rule}.per_rule.parquet"


def multi_rule_dir(L, H, split: str) -> str:
    return f"{fixed_z_dir(L, H)}/multi_{split}"


def multi_rule_run_dir(L, H, split: str, agent: str, seed) -> str:
    """A run trained with z ~ Unif(training rules of `split`) at the study's L, H."""
    return f"{multi_rule_dir(L, H, split)}/{agent}/seed{seed}"


def multi_rule_per_seed(L, H, split: str, agent: str) -> str:
    return f"{multi_rule_dir(L, H, split)}/{agent}.per_seed.parquet"


def multi_rule_curves(L, H, split: str, agent: str) -> str:
    return f"{multi_rule_dir(L, H, split)}/{agent}.curves.parquet"


def multi_rule_per_rule(L, H, split: str, agent: str) -> str:
    return f"{multi_rule_dir(L, H, split)}/{agent}.per_rule.parquet"


def multi_rule_aggregate(L, H, split: str) -> str:
    return f"{multi_rule_dir(L, H, split)}/aggregate.parquet"


def multi_rule_tests(L, H, split: str) -> str:
    return f"{multi_rule_dir(L, H, split)}/tests.parquet"


def multi_rule_oracle(L, H, split: str, oracle: str, side: str) -> str:
    """MPC (`mpc`) or exact-optimum (`exact`) records on one side of `split` at the study's L, H."""
    return f"{multi_rule_dir(L, H, split)}/{oracle}_{side}.parquet"


def rule_set() -> str:
    """The sampled rule set of a large family (docs/protocol.md#rule-sets)."""
    return "results/rules/rule_set.json"


# --- the noise study (docs/protocol.md#noise): results/noise/<split>/eps<level>/ ---------------------------------
NOISE_DECIMALS = 6


def noise_label(noise) -> str:
    """A noise level as it appears in paths: at most 6 decimals, no trailing zeros (0.05 -> '0.05', 0 -> '0')."""
    return f"{float(noise):.{NOISE_DECIMALS}f}".rstrip("0").rstrip(".")


def noise_dir(split: str, noise) -> str:
    """A noise level's folder; a wildcard placeholder ("{eps}") stands for the level's label."""
    return f"results/noise/{split}/eps{noise if _is_wildcard(noise) else noise_label(noise)}"


def noise_eval(split: str, noise, agent: str, seed, H) -> str:
    """Per-episode records of one seed of a method at noise level > 0 (both sides, the last K checkpoints)."""
    return f"{noise_dir(split, noise)}/{agent}/seed{seed}_H{H}.parquet"


def noise_level_per_seed(split: str, noise, agent: str, H) -> str:
    """Per-seed values at a noise level > 0, in the level's folder."""
    return f"{noise_dir(split, noise)}/{agent}_H{H}.per_seed.parquet"


def noise_per_seed(split: str, noise, agent: str, H) -> str:
    """Per-seed values at a noise level; at 0 the noise-free evaluation's own per-seed table."""
    if float(noise) == 0.0:
        return per_seed(split, agent, H)
    return noise_level_per_seed(split, noise, agent, H)


def noise_aggregate(split: str, noise, H) -> str:
    """Bootstrap over seeds of the noise study's methods at one noise level."""
    return f"{noise_dir(split, noise)}/aggregate_H{H}.parquet"


# --- protocol comparison (docs/protocol.md#protocol-comparison) ---------------------------------------------
PROTOCOL_COMPARISON = {"comparison": "results/protocols/comparison.parquet",
                       "ranks": "results/protocols/ranks.parquet",
                       "reversals": "results/protocols/reversals.parquet"}


def rule_features() -> str:
    return "results/rules/features.parquet"


def rule_safe(name: str) -> str:
    """A name usable inside a Snakemake rule name."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


# --- the world test (docs/protocol.md#world-test): results/worldtest/<split>/ ----------------------------------------
WORLDTEST_AGGREGATE = "results/worldtest.parquet"


def worldtest_records(split: str, agent: str, seed, budget) -> str:
    """Per-problem records of one method, seed and interaction budget (`tapebench worldtest`)."""
    return f"results/worldtest/{split}/{agent}/seed{seed}_B{budget}.parquet"


# --- the few-shot study (docs/protocol.md#few-shot): results/fewshot/<split>/ ---------------------------------------
FEWSHOT_AGGREGATE = "results/fewshot.parquet"


def fewshot_records(split: str, agent: str, seed) -> str:
    """Few-shot records of one method and seed, every side, rule and k (`tapebench fewshot`)."""
    return f"results/fewshot/{split}/{agent}/seed{seed}.parquet"


# --- what the runs cost (docs/protocol.md#compute) -------------------------------------------------------------------
COMPUTE_TABLE = "results/compute.parquet"


# --- what a path states about its records: the patterns above read back --------------------------------------------
# (the kind of file, and the pattern whose wildcards name the provenance every record in it must carry)
_INT_FIELDS = ("seed", "budget", "H")


def _record_patterns() -> tuple[str, ...]:
    run = run_dir("{split}", "{agent}", "{seed}")
    return (worldtest_records("{split}", "{agent}", "{seed}", "{budget}"), evaluation(run, "{H}"), model_error(run),
            per_seed("{split}", "{agent}", "{H}"), per_rule("{split}", "{agent}", "{H}"),
            curves("{split}", "{agent}", "{H}"), noise_eval("{split}", "{eps}", "{agent}", "{seed}", "{H}"),
            noise_level_per_seed("{split}", "{eps}", "{agent}", "{H}"), fewshot_records("{split}", "{agent}", "{seed}"))


def _pattern_regex(pattern: str) -> re.Pattern:
    parts = re.split(r"\{(\w+)\}", pattern)
    body = "".join(re.escape(p) if i % 2 == 0 else (rf"(?P<{p}>\d+)" if p in _INT_FIELDS else rf"(?P<{p}>[^/]+?)")
                   for i, p in enumerate(parts))
    top = re.escape(RESULTS_DIR + "/")
    body = body.replace(top, top + "(?:[^/]+/)?", 1)   # or a preset's results/<name>/
    return re.compile(rf"(?:^|/){body}$")


def path_fields(path) -> dict:
    """The provenance a path of this layout states about every record in its file — split, agent (the method id),
    seed, budget, H, as far as its pattern names them — or {} for a path outside these patterns. Seeds, budgets
    and horizons come back as ints; a noise level's label is not a record column and is left out."""
    text = str(path).replace("\\", "/")
    for pattern in _record_patterns():
        match = _pattern_regex(pattern).search(text)
        if match:
            fields = {k: v for k, v in match.groupdict().items() if k != "eps"}
            return {k: int(v) if k in _INT_FIELDS else v for k, v in fields.items()}
    return {}


# --- a results folder other than results/ (config key `results_dir`, docs/guide.md#presets) -------------------------
def logs_dir(results_dir: str) -> str:
    """The job logs of the run that writes `results_dir`: logs/ for results/, logs/<name> for results/<name>."""
    return LOGS_DIR + str(results_dir)[len(RESULTS_DIR):]


def rebase(value, results_dir: str):
    """`value` — a path of this layout, or a dict, list or tuple holding some — with results/ replaced by
    `results_dir` (results or results/<name>); anything else, and a path already in `results_dir`, as it is."""
    if isinstance(value, str):
        moved = value.startswith(RESULTS_DIR + "/") and not value.startswith(results_dir + "/")
        return results_dir + value[len(RESULTS_DIR):] if moved else value
    if isinstance(value, dict):
        return {k: rebase(v, results_dir) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(rebase(v, results_dir) for v in value)
    return value


class ResultsFolder:
    """This module with every path inside `results_dir`: `ResultsFolder("results/quick").run_dir("main", "dqn", 0)`
    is "results/quick/runs/main/dqn/seed0". The workflow names its files through one (workflow/rules/common.smk)."""

    def __init__(self, results_dir: str):
        self.folder = str(results_dir)            # results or results/<name>
        self.logs = logs_dir(results_dir)         # logs or logs/<name>

    def __getattr__(self, name: str):
        if name not in globals():
            raise AttributeError(f"tapebench.layout has no {name!r}")
        value = globals()[name]
        if callable(value) and not isinstance(value, (type, re.Pattern)):
            return lambda *args, **kwargs: rebase(value(*args, **kwargs), self.folder)
        return rebase(value, self.folder)
