"""Config validation (before any job runs) and the config slices that become each job's params.

A job's params are exactly the slice of the config it uses, so editing one agent's
hyperparameter changes only that agent's jobs (and what depends on them).

Validation (`validate_config`) runs when the Snakefile is parsed: the JSON schema
(`workflow/schemas/config.schema.yaml`, every number bounded), finite numbers, integers that are
integers, then the cross-field checks (docs/protocol.md#config-validation). Every error names the
config key and what is allowed.
"""
from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import jsonschema
import yaml

from tapebench.grid_rules import GridFamily
from tapebench.health.checks import CHECKS
from tapebench.methods.worldtest import supports_family
from tapebench.layout import NOISE_DECIMALS, RESULTS_DIR, RESULTS_FOLDERS, noise_label
from tapebench.pipeline import resources
from tapebench import reference_sets
from tapebench.pipeline.params import ConfigError
from tapebench.pipeline.params import validator as _validator
from tapebench.registry import (build_config, check_hyperparameters, check_rule_family, get_method, registry,
                                stated_hyperparameters)
from tapebench.rule_family import ELEMENTARY, config_family
from tapebench.rules.mirror import mirror_classes
from tapebench.rules.sampling import sample_rule_set, spec_from_config
from tapebench.settings import (MAX_CHECKPOINTS_PER_RUN, budget_schedule, checkpoints_per_run, fewshot_study,
                                sweep_runs, training_device, worldtest_study)
from tapebench.splits.ladder import LadderError, draw_training_set, ladder_levels
from tapebench.utils.artifacts import what_file_is
from tapebench.validation import parse_rule_list
from tapebench.vocabulary import DERIVED_GOAL, MAX_EXACT_L, PLANNING_TASK, ZEROS_GOAL


def _note_to_stderr(text: str) -> None:
    print(f"note: {text}", file=sys.stderr)


_INTEGER_TEXT = re.compile(r"^\s*[+-]?\d+\s*$")


class _DuplicateKey(Exception):
    def __init__(self, key: str, first: int, again: int):
        self.key, self.first, self.again = key, first, again


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error (YAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark.line + 1)
                except TypeError:        # an unhashable key: the safe loader refuses it itself
                    continue
                if first != key_node.start_mark.line + 1:
                    raise _DuplicateKey(key, first, key_node.start_mark.line + 1)
        return super().construct_mapping(node, deep=deep)


def load_config_file(path) -> dict:
    """Read one YAML (or JSON) config file; a missing or malformed file, or a key given twice in one mapping, is
    reported with its name."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)
    except _DuplicateKey as dup:
        raise ConfigError(f"config file {path}: key {dup.key!r} is given twice in one mapping (lines {dup.first} and "
                          f"{dup.again}); YAML would keep only the last silently. Give it once") from None
    except yaml.YAMLError as exc:
        _refuse_another_kind(path)
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"config file {path} is not valid YAML{where}: {problem}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not a text file (YAML expected)") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        _refuse_another_kind(path)
        raise ConfigError(f"config file {path} must hold a mapping of config keys (e.g. 'seeds: 5'), "
                          f"got a {type(data).__name__}")
    return data


CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


def _refuse_another_kind(path: Path) -> None:
    """A config file that does not load and is not named as one (README.md, the Snakefile) is named as what it is."""
    if path.suffix.lower() not in CONFIG_SUFFIXES:
        raise ConfigError(f"config file {path} is not a YAML config: it is {what_file_is(path)}; give a YAML file "
                          f"of config keys (config/*.yaml)")


def merge_config(base: dict, override: dict) -> dict:
    """Merge `override` into `base` key by key, recursing into mappings (as Snakemake merges
    --configfile and --config on top of the workflow's config file)."""
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge_config(base[key], value)
        else:
            base[key] = value
    return base


def load_config(configfiles=(), root=".") -> dict:
    """The workflow's config: `<root>/config/config.yaml` with each of `configfiles` merged on top."""
    config = load_config_file(Path(root) / "config" / "config.yaml")
    for path in configfiles:
        merge_config(config, load_config_file(path))
    return config


def stated_config(configfiles=(), command_line: dict | None = None) -> dict:
    """What the user stated on top of config/config.yaml: `configfiles` merged, then `command_line` (snakemake
    --config). Validation reads it where a key the user gave contradicts one the config derives (env.L of a grid)."""
    stated: dict = {}
    for path in configfiles:
        merge_config(stated, load_config_file(path))
    return merge_config(stated, dict(command_line or {}))


def _key_path(error: jsonschema.ValidationError) -> str:
    parts = [str(p) for p in error.absolute_path]
    return ".".join(parts) if parts else "<top level>"


def _apply_defaults(schema: dict, config: dict) -> None:
    for key, sub in schema.get("properties", {}).items():
        if key not in config and "default" in sub:
            config[key] = sub["default"]
        if isinstance(config.get(key), dict):
            _apply_defaults(sub, config[key])
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for key, value in config.items():
            if key not in schema.get("properties", {}) and isinstance(value, dict):
                _apply_defaults(extra, value)


def _coerce_text(schema: dict, value):
    """Numbers given as text where the schema wants a number become numbers.

    `snakemake --config 'training={total_steps: 20000}'` hands every value inside the mapping over
    as text; anything that does not read as a number is left alone for the schema to reject."""
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key in value:
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                value[key] = _coerce_text(sub, value[key])
        return value
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_coerce_text(schema["items"], v) for v in value]
    if isinstance(value, str):
        kind = schema.get("type")
        if kind == "integer" and _INTEGER_TEXT.match(value):
            return int(value)
        if kind == "number":
            try:
                return int(value) if _INTEGER_TEXT.match(value) else float(value)
            except ValueError:
                return value
    return value


def _check_finite(value, key: str = "") -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"config key '{key or '<top level>'}': {value} is not a finite number")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_finite(v, f"{key}.{i}")


SAMPLED_RULES = "sampled"   # a split's `rules` value naming the sampled rule set


def sampled_rule_set(config: dict) -> dict | None:
    """The sampled rule set of a tape family the config asks for (computed here as the pipeline's rule_set job
    will), or None (the grid family's: `grid_rule_set`)."""
    sample = config.get("rule_set", {}).get("sample")
    if sample is None or is_grid_config(config):
        return None
    key = dumps(config["rule_set"])
    if _SAMPLED.get("key") != key:
        _SAMPLED.update(key=key, value=sample_rule_set(config_family(config), spec_from_config(sample)))
    return _SAMPLED["value"]


_SAMPLED: dict = {}


def grid_rule_set(config: dict) -> list[int]:
    """The rule ids of the 2D grid family's rule set (docs/protocol.md#grid): `rule_set.rules`, else the sample of
    `rule_set.sample` (as `tapebench grid-features` draws it), else every rule of the (von Neumann) family."""
    family, section = config_family(config), config["rule_set"]
    if "rules" in section:
        return [family.rule(rule).id for rule in section["rules"]]
    if "sample" in section:
        key = dumps(section)
        if _SAMPLED.get("key") != key:
            # lazy: the rule-space module is loaded only for a grid config
            from tapebench.rules.grid_features import sample_grid_rules

            sample = section["sample"]
            _SAMPLED.update(key=key, value={"rules": sample_grid_rules(
                family, sample["n"], sample["lambda_bins"], sample["seed"], allow_b0=sample.get("b0", True))["rules"]})
        return list(_SAMPLED["value"]["rules"])
    return list(range(family.num_rules))


def is_grid_config(config: dict) -> bool:
    """Whether the config runs the 2D grid family (rule_set.family: {neighbourhood: ...})."""
    return isinstance(config_family(config), GridFamily)


def _check_grid(config: dict, stated: dict | None = None) -> None:
    """The 2D grid family (docs/protocol.md#grid): its family key, the torus side (env.L becomes n * n), the rule set
    (every rule in Golly notation or an id of the neighbourhood, refused here naming its key), splits over it."""
    section = config["rule_set"]
    try:
        family = config_family(config)
    except ValueError as exc:
        raise ConfigError(f"config key 'rule_set.family': {exc}") from None
    env = config["env"]
    if "grid_n" not in env:
        raise ConfigError(f"config key 'env.grid_n': the {family.name} grid family needs the torus side n "
                          f"(3..8: one 64-bit word per grid)")
    n = int(env["grid_n"])
    given = ((stated or {}).get("env") or {}).get("L") if isinstance((stated or {}).get("env"), dict) else None
    if given is not None and str(given).strip() != str(n * n):
        raise ConfigError(f"config keys 'env.L' and 'env.grid_n' contradict each other: env.L = {given}, but the grid "
                          f"family plays env.grid_n x env.grid_n = {n} x {n} = {n * n} cells; leave env.L out (the "
                          f"grid sets it) or give env.L: {n * n}")
    env["L"] = n ** 2
    if env["goal"] != ZEROS_GOAL:
        raise ConfigError(f"config key 'env.goal': the grid family's goal is the all-zero grid; use env.goal: "
                          f"{ZEROS_GOAL}, got {env['goal']!r}")
    sample = section.get("sample")
    if "rules" in section and sample is not None:
        raise ConfigError("config key 'rule_set.rules': give the grid rule set as rule_set.rules or "
                          "rule_set.sample, not both")
    if "rules" in section:
        ids = []
        for i, rule in enumerate(section["rules"]):
            try:
                ids.append(family.rule(rule).id)
            except ValueError as exc:
                raise ConfigError(f"config key 'rule_set.rules[{i}]': {exc}") from None
        repeated = sorted({str(family.rule(z)) for z in ids if ids.count(z) > 1})
        if repeated:
            raise ConfigError(f"config key 'rule_set.rules': lists {repeated} more than once")
    elif sample is None and family.num_rules > 1024:
        raise ConfigError(f"config key 'rule_set.sample': the {family.describe()} is too large to enumerate; give "
                          f"rule_set.sample: {{n: ..., lambda_bins: ...}} or rule_set.rules")
    if sample is not None:
        if "subfamily" in sample:
            raise ConfigError(f"config key 'rule_set.sample.subfamily': a tape option (every grid rule is outer "
                              f"totalistic); leave it out for the {family.name} grid family")
        try:
            grid_rule_set(config)
        except ValueError as exc:
            raise ConfigError(f"config key 'rule_set.sample': {exc}") from None
    for name, split in config["splits"].items():
        split.setdefault("rules", SAMPLED_RULES)
        if split["rules"] != SAMPLED_RULES:
            raise ConfigError(f"config key 'splits.{name}.rules': a split of the grid family divides its rule set "
                              f"(rule_set); use rules: {SAMPLED_RULES} (or leave it out), got {split['rules']!r}")


def _check_rule_set(config: dict, stated: dict | None = None) -> None:
    if is_grid_config(config):
        _check_grid(config, stated)
        return
    for key in ("rules", "sample.b0"):
        head, _, tail = key.partition(".")
        if head in config["rule_set"] and (not tail or tail in (config["rule_set"][head] or {})):
            raise ConfigError(f"config key 'rule_set.{key}': a key of the 2D grid family (rule_set.family: "
                              f"{{neighbourhood: moore | von_neumann}}); tapes take splits.<name>.rules")
    if "grid_n" in config["env"]:
        raise ConfigError("config key 'env.grid_n': the torus side of the 2D grid family; this config's family is "
                          f"{config_family(config).describe()} (rule_set.family), whose tapes have env.L cells")
    family = config_family(config)
    sample = config["rule_set"].get("sample")
    if not family.fits_int64:
        raise ConfigError(f"config key 'rule_set.family': {family.describe()} has rule numbers beyond 64 bits; the "
                          f"pipeline stores rules as int64 and supports k = 2 (r = 1, 2) and k = 3, r = 1")
    if not family.elementary and sample is None:
        raise ConfigError(f"config key 'rule_set.sample': {family.describe()} has {family.num_rules} rules, so its "
                          f"benchmark runs on a sampled rule set; give rule_set.sample: {{n: ..., lambda_bins: ...}}")
    if sample is not None:
        try:
            sampled_rule_set(config)
        except ValueError as exc:
            raise ConfigError(f"config key 'rule_set.sample': {exc}") from None
    for name, split in config["splits"].items():
        split.setdefault("rules", SAMPLED_RULES if sample is not None else "0-255")
        if sample is not None and split["rules"] != SAMPLED_RULES:
            raise ConfigError(f"config key 'splits.{name}.rules': with rule_set.sample every split divides the "
                              f"sampled rule set; use rules: {SAMPLED_RULES} (or leave it out), got {split['rules']!r}")
        if sample is None and split["rules"] == SAMPLED_RULES:
            raise ConfigError(f"config key 'splits.{name}.rules': {SAMPLED_RULES!r} needs rule_set.sample")


def split_rule_space(config: dict, name: str) -> list[int]:
    """The rules a configured split divides."""
    rules = config["splits"][name]["rules"]
    if is_grid_config(config):
        return grid_rule_set(config)
    if rules == SAMPLED_RULES:
        return list(sampled_rule_set(config)["rules"])
    return parse_rule_list(rules)


def _check_splits(config: dict) -> None:
    family = config_family(config)
    for name, split in config["splits"].items():
        try:
            rules = split_rule_space(config, name)
        except ValueError as exc:
            raise ConfigError(f"config key 'splits.{name}.rules': {exc}") from None
        if len(rules) < 2:
            raise ConfigError(f"config key 'splits.{name}.rules': a split needs at least 2 rules, "
                              f"got {split['rules']!r}")
        if split["unit"] == "rule":
            limit, why = len(rules) - 1, "the training side keeps at least one rule"
        else:
            classes = mirror_classes(rules, family)
            if len(classes) < 2:
                raise ConfigError(f"config key 'splits.{name}.rules': {split['rules']!r} is a single mirror "
                                  f"class, so a mirror-class split has nothing to put on one side; "
                                  f"add rules or use unit: rule")
            whole = max(len(c) for c in classes) > 1
            limit = len(rules) - (2 if whole else 1)
            why = ("the split moves whole mirror classes (a two-rule class may overshoot by one) and "
                   "keeps at least one rule for training")
        if split["test_size"] > limit:
            raise ConfigError(f"config key 'splits.{name}.test_size': {split['test_size']} is too large for "
                              f"rules {split['rules']!r} ({len(rules)} rules); at most {limit}, because {why}")


def _check_results_dir(config: dict) -> None:
    folder = config["results_dir"].partition("/")[2]
    if folder in RESULTS_FOLDERS:
        raise ConfigError(f"config key 'results_dir': {config['results_dir']!r} is a folder the pipeline writes in "
                          f"results/; give results or results/<name> with a name other than "
                          f"{', '.join(sorted(RESULTS_FOLDERS))}")


def check_targets(targets, results_dir: str) -> None:
    """Refuse a target file in results/ outside `results_dir`, the config's results folder (one in another preset's
    folder results/<name>/, or in the paper protocol's results/): no job of this config writes it."""
    own = Path(results_dir).parts
    for target in map(str, targets):
        parts = Path(target).parts
        if len(parts) < 2 or parts[0] != RESULTS_DIR:
            continue
        folder = parts[:2] if len(parts) > 2 and parts[1] not in RESULTS_FOLDERS else parts[:1]  # results/<name>/...
        if folder != own:
            raise ConfigError(f"target {target} is in {'/'.join(folder)}/, not in this config's results folder "
                              f"{results_dir}/ (config key 'results_dir': each preset writes its own folder): ask "
                              f"for {'/'.join(own + parts[len(folder):])}, or " + (
                                  "leave out the presets that move it (config/config.yaml writes results/)"
                                  if folder == (RESULTS_DIR,) else
                                  f"give --configfile the preset whose results_dir is {'/'.join(folder)}"))


def foreign_target_regex(results_dir: str) -> str:
    """The paths after results/ that `check_targets` refuses, as a Snakemake wildcard constraint."""
    if results_dir == RESULTS_DIR:
        return rf"(?!(?:{'|'.join(sorted(RESULTS_FOLDERS))})/)[^/]+/.+"
    return rf"(?!{re.escape(results_dir[len(RESULTS_DIR) + 1:])}/).+"


def _check_schedule(config: dict) -> None:
    training, evaluation = config["training"], config["evaluation"]
    if training["eval_every"] > training["total_steps"]:
        raise ConfigError(f"config key 'training.eval_every': {training['eval_every']} exceeds "
                          f"training.total_steps = {training['total_steps']}")
    n = checkpoints_per_run(training["total_steps"], training["eval_every"])
    if n > MAX_CHECKPOINTS_PER_RUN:
        least = math.ceil(training["total_steps"] / MAX_CHECKPOINTS_PER_RUN)
        raise ConfigError(f"config key 'training.eval_every': {training['eval_every']} gives {n} checkpoints "
                          f"per run for training.total_steps = {training['total_steps']}; at most "
                          f"{MAX_CHECKPOINTS_PER_RUN} are allowed (eval_every >= {least})")
    if evaluation["last_k"] > n:
        raise ConfigError(f"config key 'evaluation.last_k': {evaluation['last_k']} is more than the {n} "
                          f"checkpoint(s) of a run (training.total_steps = {training['total_steps']}, "
                          f"eval_every = {training['eval_every']}); use last_k <= {n}")


def _check_sweep(config: dict) -> None:
    sweep = config["diagnostics"]["sweep"]
    method, field = sweep["method"], sweep["hyperparameter"]
    if method not in registry():
        raise ConfigError(f"config key 'diagnostics.sweep.method': unknown method {method!r}; registered methods: "
                          f"{sorted(registry())}")
    if not registry()[method].world_model:
        raise ConfigError(f"config key 'diagnostics.sweep.method': {method!r} has no world model; the sweep "
                          f"measures success and prediction error per value, so it needs a method with one "
                          f"(`tapebench methods -v` lists them)")
    base = dict(config["agents"].get(method, {}) or {})
    for i, value in enumerate(sweep["values"]):
        try:
            check_hyperparameters(method, {**base, field: value})
        except ValueError as exc:
            raise ConfigError(f"config key 'diagnostics.sweep.values[{i}]': {exc}") from None


def _check_studies(config: dict) -> None:
    studies = config["studies"]
    fixed = studies["fixed_z"]
    n = checkpoints_per_run(fixed["total_steps"], fixed["eval_every"])
    if fixed["eval_every"] > fixed["total_steps"] or n > MAX_CHECKPOINTS_PER_RUN:
        raise ConfigError(f"config key 'studies.fixed_z.eval_every': {fixed['eval_every']} must be at most "
                          f"studies.fixed_z.total_steps = {fixed['total_steps']} and give at most "
                          f"{MAX_CHECKPOINTS_PER_RUN} checkpoints per run (it gives {n})")
    last_k = config["evaluation"]["last_k"]
    if last_k > n:
        raise ConfigError(f"config key 'evaluation.last_k': {last_k} is more than the {n} checkpoint(s) of a fixed-z "
                          f"run (studies.fixed_z.total_steps = {fixed['total_steps']}, eval_every = "
                          f"{fixed['eval_every']}); use last_k <= {n}")
    methods = registry()
    for table, keys in (("table5", ("methods",)), ("table6", ("methods", "multi_rule"))):
        for key in keys:
            for i, method in enumerate(fixed[table][key]):
                where = f"config key 'studies.fixed_z.{table}.{key}[{i}]'"
                if method not in methods:
                    raise ConfigError(f"{where}: unknown method {method!r}; registered methods: {sorted(methods)}")
                if not methods[method].trains:
                    raise ConfigError(f"{where}: {method!r} does not train, and the fixed-z study trains one run "
                                      f"per rule; give a method that trains (`tapebench methods` lists them)")
    robustness = studies["robustness"]
    for i, split in enumerate(robustness["splits"]):
        if split not in config["splits"]:
            raise ConfigError(f"config key 'studies.robustness.splits[{i}]': {split!r} is not one of the configured "
                              f"splits {sorted(config['splits'])}")


# The studies that reuse the main split's runs (docs/protocol.md#studies), and whether a method that does not train
# takes part in one without being in `methods`: it needs no run, so the study's own jobs run it (the world test and
# the few-shot study); the noise study reuses every method's noise-free evaluations at epsilon = 0, which only the
# methods of `methods` have. The ladder, the fixed-z study and the sweep train runs of their own: not narrowed.
REUSING_STUDIES = {"worldtest": ("the world test", True), "fewshot": ("the few-shot study", True),
                   "noise": ("the noise study", False)}


def _narrow_study(config: dict, study: str, note) -> list[tuple[int, str]]:
    """Keep the methods of `studies.<study>.methods` this config can give the study (REUSING_STUDIES), dropping the
    others with a note (a preset that narrows `methods` needs no edit of the studies); write the kept list back and
    return it as (index in the configured list, method). A study left with no method is off."""
    what, untrained_run_anyway = REUSING_STUDIES[study]
    listed = list(config["studies"][study]["methods"])
    kept = [(i, m) for i, m in enumerate(listed)
            if m in config["methods"] or (untrained_run_anyway and not get_method(m).trains)]
    dropped = [m for m in listed if m not in dict(kept).values()]
    if dropped:
        why = (f"they train, and {what} reuses their main-split runs" if untrained_run_anyway
               else f"{what} evaluates their main-split runs and reuses their noise-free evaluations")
        names = ", ".join
        left = f"{what} runs {names(m for _, m in kept)}" if kept else f"{what} is off (no method left)"
        note(f"studies.{study}.methods leaves out {names(dropped)}: {why}, but they are not in `methods` "
             f"({names(config['methods'])}); {left}. Add them to `methods` to include them.")
        config["studies"][study]["methods"] = [m for _, m in kept]
    return kept


def _check_noise_study(config: dict, note) -> None:
    study = config["studies"]["noise"]
    for i, level in enumerate(study["levels"]):
        if float(noise_label(level)) != float(level):
            raise ConfigError(f"config key 'studies.noise.levels[{i}]': {level!r} has more than {NOISE_DECIMALS} "
                              f"decimals; give the level with at most {NOISE_DECIMALS} (its results folder is "
                              f"named after it)")
    methods = registry()
    for i, method in enumerate(study["methods"]):
        if method not in methods:
            raise ConfigError(f"config key 'studies.noise.methods[{i}]': unknown method {method!r}; registered "
                              f"methods: {sorted(methods)}")
    if study["methods"] and not _narrow_study(config, "noise", note) and study["levels"]:
        study["levels"] = []     # [] methods would mean every method of `methods`: the study is off instead


def _refuse_tape_study_on_grid(config: dict, study: str, what: str) -> None:
    """A study that plays tapes only, asked for on the 2D grid family: refused naming its methods key."""
    methods = config["studies"][study]["methods"]
    if methods and is_grid_config(config):
        raise ConfigError(f"config key 'studies.{study}.methods': {what} runs on tape families only, not on the 2D "
                          f"grid family ({config_family(config).name_in_text} neighbourhood); got {list(methods)}: set "
                          f"studies.{study}.methods: [] (docs/protocol.md#grid-pipeline)")


def _check_worldtest(config: dict, note) -> None:
    """The world test (docs/protocol.md#world-test): methods that take part, runs that exist, consistent tasks."""
    study = config["studies"]["worldtest"]
    where = "config key 'studies.worldtest"
    methods = registry()
    for i, method in enumerate(study["methods"]):
        if method not in methods:
            raise ConfigError(f"{where}.methods[{i}]': unknown method {method!r}; registered methods: {sorted(methods)}")
        if methods[method].worldtest is None:
            able = sorted(m for m, entry in methods.items() if entry.worldtest is not None)
            raise ConfigError(f"{where}.methods[{i}]': {method!r} does not take part in the world test (its registry "
                              f"entry has no worldtest); methods that do: {able}")
    kept = _narrow_study(config, "worldtest", note)
    if not kept:
        return
    _refuse_tape_study_on_grid(config, "worldtest", "the world test (docs/protocol.md#world-test)")
    family = config_family(config)
    if not family.elementary:
        if PLANNING_TASK in study["tasks"]:
            raise ConfigError(f"{where}.tasks': world-test planning is defined for the elementary family (exact "
                              f"reasoning plans over the enumerated consistent rules), not {family.describe()}; "
                              f"use tasks {[t for t in study['tasks'] if t != PLANNING_TASK]}")
        for i, method in kept:
            if not supports_family(methods[method].worldtest, family):
                able = sorted(m for m, entry in methods.items()
                              if entry.worldtest is not None and supports_family(entry.worldtest, family))
                raise ConfigError(f"{where}.methods[{i}]': {method!r} answers the world test of the elementary "
                                  f"family only, not {family.describe()}; methods that answer it: {able}")
    if any(methods[m].trains for m in study["methods"]) and study["seeds"] > config["seeds"]:
        raise ConfigError(f"{where}.seeds': {study['seeds']} seeds, but methods that train have runs of seeds "
                          f"0..{config['seeds'] - 1} only (`seeds` = {config['seeds']})")
    if study["planning"]["goal_steps"] > study["planning"]["horizon"]:
        raise ConfigError(f"{where}.planning.goal_steps': {study['planning']['goal_steps']} is more than the "
                          f"planning horizon {study['planning']['horizon']}; every goal must be reachable within it")
    planner = study["planner"]
    if planner["horizon"] * planner["candidates"] > resources.MAX_PLANNER_ROLLOUTS:
        raise ConfigError(f"{where}.planner': horizon x candidates = {planner['horizon']} x {planner['candidates']} = "
                          f"{planner['horizon'] * planner['candidates']:,} simulated steps per planned step and "
                          f"problem; at most {resources.MAX_PLANNER_ROLLOUTS:,} (the default is 8 x 128 = 1,024), "
                          f"because beyond it one world-test job plans for hours")
    if study["prediction"]["masked_cells"] > config["env"]["L"]:
        raise ConfigError(f"{where}.prediction.masked_cells': {study['prediction']['masked_cells']} is more than "
                          f"env.L = {config['env']['L']}")


def _check_fewshot(config: dict, note) -> None:
    """The few-shot study (docs/protocol.md#few-shot): methods with runs or policies, recipes only for those listed."""
    study = config["studies"]["fewshot"]
    where = "config key 'studies.fewshot"
    methods = registry()
    for i, method in enumerate(study["methods"]):
        if method not in methods:
            raise ConfigError(f"{where}.methods[{i}]': unknown method {method!r}; registered methods: {sorted(methods)}")
        if not methods[method].plays_episodes:
            raise ConfigError(f"{where}.methods[{i}]': {method!r} takes part in the world test only; it plays no TAPE "
                              f"episodes")
    for method in (study.get("adapt") or {}):
        if method not in study["methods"]:
            raise ConfigError(f"{where}.adapt.{method}': {method!r} is not one of studies.fewshot.methods "
                              f"{list(study['methods'])}")
    kept = _narrow_study(config, "fewshot", note)
    study["adapt"] = {m: v for m, v in (study.get("adapt") or {}).items() if m in study["methods"]}
    _refuse_tape_study_on_grid(config, "fewshot", "the few-shot study (docs/protocol.md#few-shot)")
    for i, method in kept:
        if not config_family(config).elementary and not methods[method].any_rule_family:
            raise ConfigError(f"{where}.methods[{i}]': {method!r} supports only the elementary family, not "
                              f"{config_family(config).describe()} (rule_set.family)")
        if config["env"]["goal"] == DERIVED_GOAL and not methods[method].goal_conditioned:
            raise ConfigError(f"{where}.methods[{i}]': {method!r} does not take an episode's goal, so it cannot run "
                              f"with env.goal: {DERIVED_GOAL}")
    if any(methods[m].trains for m in study["methods"]) and study["seeds"] > config["seeds"]:
        raise ConfigError(f"{where}.seeds': {study['seeds']} seeds, but methods that train have runs of seeds "
                          f"0..{config['seeds'] - 1} only (`seeds` = {config['seeds']})")
    for method, overrides in study["adapt"].items():
        if not methods[method].trains:
            raise ConfigError(f"{where}.adapt.{method}': {method!r} does not train; adapt overrides the gradient "
                              f"adaptation of a method that trains")
        try:
            check_hyperparameters(method, {**(config["agents"].get(method) or {}), **(overrides or {})})
        except ValueError as exc:
            raise ConfigError(f"{where}.adapt.{method}': {exc}") from None


def fewshot_slice(config: dict, method: str) -> dict:
    """A few-shot job's params (`tapebench fewshot --params`): the env, the evaluation's episodes, the study's shots
    and rules (and the method's recipe overrides, when it has any), the method's hyperparameters."""
    study = fewshot_study(config)
    fewshot = dict(study["fewshot"])
    if study["adapt"].get(method):
        fewshot["adapt"] = study["adapt"][method]
    return {"env": env_params(config), "evaluation": eval_slice(config)["evaluation"], "fewshot": fewshot,
            "agent": agent_params(config, method)}


def worldtest_slice(config: dict, method: str) -> dict:
    """A world-test job's params (`tapebench worldtest --params`): the env, the task settings, the method's
    hyperparameters. Methods, seeds and budgets are wildcards or the DAG's, not params."""
    return {"env": {k: config["env"][k] for k in ("L", "H", "success_bonus")},
            "worldtest": worldtest_study(config)["worldtest"], "agent": agent_params(config, method)}


def _check_ladder(config: dict) -> None:
    """The severity ladder (docs/protocol.md#severity-ladders): its name, methods and, when the training set does not
    depend on the rule features, that every level can be filled."""

    ladder = config["studies"]["ladder"]
    where = "config key 'studies.ladder"
    if ladder["name"] in config["splits"]:
        raise ConfigError(f"{where}.name': {ladder['name']!r} is also a configured split (splits.{ladder['name']}); "
                          f"give the ladder its own name")
    methods = registry()
    for i, method in enumerate(ladder["methods"]):
        if method not in methods:
            raise ConfigError(f"{where}.methods[{i}]': unknown method {method!r}; registered methods: {sorted(methods)}")
        if method == "exact" and config["env"]["L"] > MAX_EXACT_L:
            raise ConfigError(f"{where}.methods[{i}]': the exact optimum needs env.L <= {MAX_EXACT_L}, but env.L = "
                              f"{config['env']['L']}")
    if ladder["train"] and ladder["train_types"]:
        raise ConfigError(f"{where}.train_types': {ladder['train_types']} applies to a drawn training set, but "
                          f"studies.ladder.train lists the rules {ladder['train']}; give one of the two")
    if ladder["train_types"]:
        return      # the draw needs the rule types: the ladder_split job checks the levels
    try:
        train = (ladder["train"] or draw_training_set(ELEMENTARY, ladder["train_classes"], ladder["seed"]))
        ladder_levels(ELEMENTARY, train, ladder["levels"], ladder["level_size"], ladder["seed"])
    except LadderError as exc:
        key = "train" if "mirror-closed" in str(exc) else "level_size"
        raise ConfigError(f"{where}.{key}': {exc}") from None


def _check_listed_method(config: dict, key: str, method: str) -> None:
    """A method named under config key `key`: registered, and running on the config's rule family."""
    methods = registry()
    if method not in methods:
        raise ConfigError(f"config key '{key}': unknown method {method!r}; registered methods: {sorted(methods)} "
                          f"(`tapebench methods` lists them)")
    try:
        check_rule_family(method, config_family(config))
    except ValueError as exc:
        raise ConfigError(f"config key '{key}': {exc} (rule_set.family)") from None


def _check_budget(config: dict) -> None:
    """The budget study (docs/protocol.md#budget-study): methods that train on the config's rule family, and budgets
    whose runs have the last K checkpoints the per-seed value averages."""
    where = "config key 'studies.budget"
    methods = registry()
    for i, method in enumerate(config["studies"]["budget"]["methods"]):
        _check_listed_method(config, f"studies.budget.methods[{i}]", method)
        if not methods[method].trains:
            raise ConfigError(f"{where}.methods[{i}]': {method!r} does not train, so it has no training budget; give "
                              f"a method that trains (`tapebench methods` lists them)")
    last_k = config["evaluation"]["last_k"]
    for i, steps in enumerate(config["studies"]["budget"]["budgets"]):
        n = checkpoints_per_run(*budget_schedule(config, steps))
        if 0 < n < last_k:
            raise ConfigError(f"{where}.budgets[{i}]': {steps} steps give {n} checkpoint(s), fewer than "
                              f"evaluation.last_k = {last_k}; give at least {last_k} steps")


def _check_health(config: dict) -> None:
    for check in CHECKS:
        t = config["health"][check.name]
        if check.higher_is_worse and t["warn"] > t["fail"]:
            raise ConfigError(f"config key 'health.{check.name}': warn = {t['warn']} must be at most fail = "
                              f"{t['fail']} (larger values are worse: warn first, then fail)")
        if not check.higher_is_worse and t["warn"] < t["fail"]:
            raise ConfigError(f"config key 'health.{check.name}': warn = {t['warn']} must be at least fail = "
                              f"{t['fail']} (smaller values are worse: warn first, then fail)")


def _check_logging(config: dict) -> None:
    """TensorBoard logging needs its optional package: refused here, before any training job starts."""
    if config.get("logging", {}).get("tensorboard", False):
        # lazy: the package is looked up (not imported) only when the logging is on
        from tapebench.training.tensorboard import INSTALL_HINT, tensorboard_installed

        if not tensorboard_installed():
            raise ConfigError(f"config key 'logging.tensorboard': true, but the tensorboard package is not "
                              f"installed; install it with `{INSTALL_HINT}` or set logging.tensorboard: false")


def _check_goal(config: dict) -> None:
    """env.goal: derived (docs/protocol.md#multi-goal) draws goals with elementary rules, and every method that plays
    episodes must take the episode's goal (`Method.goal_conditioned`); with the fixed goal, methods that learn from
    derived goals only (`Method.needs_derived_goal`) are refused."""
    methods = registry()
    fixed_z = config["studies"]["fixed_z"]   # its runs train with the config's env.goal too (fixed_z_train_slice)
    lists = {"methods": config["methods"], "studies.ladder.methods": config["studies"]["ladder"]["methods"],
             "studies.budget.methods": config["studies"]["budget"]["methods"],
             **{f"studies.fixed_z.{table}.{key}": fixed_z[table][key]
                for table, keys in (("table5", ("methods",)), ("table6", ("methods", "multi_rule"))) for key in keys}}
    if config["env"]["goal"] != DERIVED_GOAL:
        for key, listed in lists.items():
            for i, method in enumerate(listed):
                if method in methods and methods[method].needs_derived_goal:
                    raise ConfigError(f"config key '{key}[{i}]': {method!r} learns from the goals of the multi-goal "
                                      f"protocol, so it needs env.goal: {DERIVED_GOAL} (docs/protocol.md#multi-goal), "
                                      f"got env.goal: {config['env']['goal']}")
        return
    if not config_family(config).elementary:
        raise ConfigError(f"config key 'env.goal': derived goals are drawn with elementary rules, not "
                          f"{config_family(config).describe()} (rule_set.family); use env.goal: {ZEROS_GOAL}")
    supported = sorted(m for m, entry in methods.items() if entry.goal_conditioned)
    for key, listed in lists.items():
        for i, method in enumerate(listed):
            if method in methods and not methods[method].goal_conditioned:
                raise ConfigError(f"config key '{key}[{i}]': {method!r} does not take an episode's goal, so it cannot "
                                  f"run with env.goal: {DERIVED_GOAL}; methods that do: {supported}")


def env_params(config: dict) -> dict:
    """The env section of a job's params: env.goal and env.goal_steps only when the goal is derived, so the default
    protocol's jobs keep the params (and provenance) they had before the multi-goal protocol; never env.grid_n."""
    env = dict(config["env"])
    env.pop("grid_n", None)   # the grid family's side is in env.L = n * n; the family comes with the split
    if env.get("goal", ZEROS_GOAL) == ZEROS_GOAL:
        env.pop("goal", None)
        env.pop("goal_steps", None)
    return env


def validate_config(config: dict, schema_path, command_line: dict | None = None, stated: dict | None = None,
                    note=None) -> dict:
    """Validate against the JSON schema plus cross-field checks; fill defaults; raise ConfigError naming the key.

    Numeric text under numeric keys (from `snakemake --config`) is turned into numbers in place. `command_line`
    is what `snakemake --config` gave (the Snakefile passes it): an error in a value given there carries the hint
    that such values arrive as text. `stated` is what the user's config files and --config gave on top of
    config/config.yaml (`stated_config`; default: `command_line`): a key stated there that contradicts one the
    config derives is refused (env.L of a grid). A study's methods the config does not run are left out of it, each
    study's once with a line to `note` (default: standard error) naming them (`_narrow_study`)."""
    note = note or _note_to_stderr
    schema = yaml.safe_load(Path(schema_path).read_text())
    _coerce_text(schema, config)
    _check_finite(config)
    errors = sorted(_validator(schema).iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"  config key '{_key_path(e)}': {e.message}" for e in errors[:10]]
        raise ConfigError("invalid configuration:\n" + "\n".join(lines))
    _apply_defaults(schema, config)
    if config["main_split"] not in config["splits"]:
        raise ConfigError(f"config key 'main_split': {config['main_split']!r} is not one of the configured "
                          f"splits {sorted(config['splits'])}")
    _check_results_dir(config)
    _check_schedule(config)
    _check_rule_set(config, command_line if stated is None else stated)
    _check_splits(config)
    _apply_reference_set(config)

    methods = registry()
    for i, method in enumerate(config["methods"]):
        _check_listed_method(config, f"methods[{i}]", method)
        if not methods[method].plays_episodes:
            raise ConfigError(f"config key 'methods[{i}]': {method!r} takes part in the world test only; list it in "
                              f"studies.worldtest.methods, not in methods")
        if method == "exact" and config["env"]["L"] > MAX_EXACT_L:
            raise ConfigError(f"config key 'methods[{i}]': the exact optimum enumerates all 2^L tapes and needs "
                              f"env.L <= {MAX_EXACT_L}, but env.L = {config['env']['L']}")
    _check_goal(config)
    _check_sweep(config)
    _check_studies(config)
    _check_noise_study(config, note)
    _check_worldtest(config, note)
    _check_fewshot(config, note)
    _check_ladder(config)
    _check_budget(config)
    _check_health(config)
    _check_logging(config)
    _check_agents(config, command_line)
    _check_resources(config)
    return config


def protocol_slice(config: dict) -> dict:
    """What every row of Table 3 depends on besides its method: the protocol a reference set was run under and a run
    that uses it must share (docs/protocol.md#reference-sets)."""
    ev, split = config["evaluation"], config["main_split"]
    return {
        "env": env_params(config),
        "rule_set": config.get("rule_set") or {},
        "features": dict(config["features"]),
        "split": {"name": split, **config["splits"][split]},
        "training": {k: config["training"][k] for k in ("total_steps", "eval_every")},
        "evaluation": {k: ev[k] for k in ("episodes_per_rule", "eval_seed", "horizons", "last_k")},
    }


def _apply_reference_set(config: dict, root=reference_sets.ROOT) -> None:
    """With `reference_set`: refuse a protocol that differs from the set's, naming each key and both values; then
    `methods` keeps only the methods the set lacks (what this run runs)."""
    name = config.get("reference_set")
    if not name:
        if not config["methods"]:
            raise ConfigError("config key 'methods': empty; name at least one method (`tapebench methods` lists them), "
                              "or a reference_set whose rows the tables show")
        return
    try:
        manifest = reference_sets.read_manifest(name, root)
    except reference_sets.ReferenceSetError as exc:
        raise ConfigError(f"config key 'reference_set': {exc}") from None
    differences = reference_sets.protocol_differences(manifest["protocol"], protocol_slice(config))
    if differences:
        lines = [f"  {_protocol_key(key)}: the set has {shipped!r}, this config {configured!r}"
                 for key, shipped, configured in differences]
        raise ConfigError(f"config key 'reference_set': the protocol differs from reference set {name!r}'s, so its "
                          f"rows are not comparable with this run's:\n" + "\n".join(lines)
                          + f"\n(drop reference_set, or set these keys to the set's values)")
    held = set(manifest["methods"])
    config["methods"] = [m for m in config["methods"] if m not in held]


def _protocol_key(key: str) -> str:
    """A protocol slice's key as the config key a user edits."""
    section, _, rest = key.partition(".")
    if section == "split":
        return f"splits.<main_split>.{rest}" if rest != "name" else "main_split"
    return key


def _check_agents(config: dict, command_line: dict | None) -> None:
    methods = registry()
    for agent, overrides in config["agents"].items():
        if agent not in methods:
            raise ConfigError(f"config key 'agents.{agent}': unknown method; registered methods: {sorted(methods)}")
        try:
            check_hyperparameters(agent, overrides)
        except ValueError as exc:
            hint = ""
            if "agents" in (command_line or {}) and any(isinstance(v, str) for v in (overrides or {}).values()):
                hint = (" (values inside a --config mapping arrive as text; give agent hyperparameters "
                        "in a config file passed with --configfile)")
            raise ConfigError(f"config key 'agents.{agent}': {exc}{hint}") from None


# --- what each job needs (tapebench.pipeline.resources), from the config, before any job runs ---

def training_gpus(config: dict, method: str, seeds: int) -> int:
    """GPUs a training job of `seeds` seeds of `method` requests: `training.gpus` where it trains on CUDA (as
    `settings.training_device` decides: stacked blocks under "auto"), else none."""
    on_cpu = training_device(config["training"]["device"], can_stack(config, method, seeds)) == "cpu"
    return 0 if on_cpu else int(config["training"]["gpus"])


def can_stack(config: dict, method: str, seeds: int) -> bool:
    """Whether a training job can train its `seeds` seeds of `method` as one stacked block: more than one seed, a
    method with a stacked block, and no TensorBoard logging (which trains the seeds one after another)."""
    tensorboard = config.get("logging", {}).get("tensorboard", False)
    return seeds > 1 and get_method(method).make_block is not None and not tensorboard


def training_stacking(config: dict, method: str, seeds: int) -> str:
    """How a training job of `seeds` seeds of `method` stacks (`tapebench train --stacking`; the pipeline passes it in
    the job's `--params` as training.stacking): `training.stacking` where the setting can change what the job does,
    else "auto", so that switching it reruns only those jobs. It cannot for one seed, under TensorBoard logging
    (seeds one after another), on CUDA (where "auto" stacks too), for a method without a stacked block, or for one
    whose stacked seeds are its one-seed runs bit for bit on the CPU."""
    if (not can_stack(config, method, seeds) or "cpu" in getattr(get_method(method).make_block, "bit_exact_devices", ())
            or config["training"]["device"] == "cuda"):
        return "auto"
    return config["training"].get("stacking", "auto")


def seeds_per_job(config: dict) -> int:
    """Training seeds one training job trains (`training.seeds_per_job`, 1 when absent)."""
    return int(config["training"].get("seeds_per_job", 1))


def max_mem_mb(config: dict) -> int:
    """`resources.max_mem_mb`, or this machine's memory."""
    return int(config.get("resources", {}).get("max_mem_mb") or resources.machine_mem_mb())


def _split_rules(config: dict, split: str) -> int:
    """Rules of a split (both sides): a configured split's, or the 256 elementary rules (the ladder)."""
    return len(split_rule_space(config, split)) if split in config["splits"] else 256


def _env_LH(config: dict, L=None, H=None) -> tuple[int, int]:
    return int(L if L is not None else config["env"]["L"]), int(H if H is not None else config["env"]["H"])


def training_job(config: dict, method: str, *, L=None, H=None, overrides: dict | None = None,
                 total_steps: int | None = None, seeds: int | None = None) -> tuple[resources.Estimate, int]:
    """(memory estimate, run-time minutes) of a training job of `method` (its `agents` entry updated by
    `overrides`) at L, H (default env.L, env.H) over `seeds` seeds (default `training.seeds_per_job`, a full
    seed block)."""
    L, H = _env_LH(config, L, H)
    built = build_config(method, {**(config["agents"].get(method) or {}), **(overrides or {})})
    steps = int(total_steps if total_steps is not None else config["training"]["total_steps"])
    seeds = seeds_per_job(config) if seeds is None else int(seeds)
    return (resources.training_memory(built, L, H, seeds), resources.training_minutes(built, L, H, steps, seeds))


def evaluation_job(config: dict, method: str, split: str, *, L=None, H=None, overrides: dict | None = None,
                   checkpoints: int = 1) -> tuple[resources.Estimate, int]:
    """(memory estimate, run-time minutes) of an evaluation job of `method` on `split` at L, H (default env.L
    and the longest evaluation horizon): every episode of the split's rules at once, `checkpoints` times."""
    L, H = _env_LH(config, L, H if H is not None else max([config["env"]["H"], *config["evaluation"]["horizons"]]))
    built = build_config(method, {**(config["agents"].get(method) or {}), **(overrides or {})})
    episodes = _split_rules(config, split) * int(config["evaluation"]["episodes_per_rule"])
    return (resources.evaluation_memory(built, L, H, episodes),
            resources.evaluation_minutes(built, L, H, episodes, checkpoints))


def worldtest_job(config: dict) -> resources.Estimate:
    """Memory of a world-test job: one side of the world test's split at most holds all of its rules."""
    study = worldtest_study(config)
    tasks = study["worldtest"]
    problems = _split_rules(config, study["split"]) * int(tasks["problems_per_rule"])
    return resources.worldtest_memory(problems, int(config["env"]["L"]), tasks["prediction"]["lengths"],
                                      int(tasks["prediction"]["masked_cells"]), int(tasks["planner"]["candidates"]),
                                      int(tasks["planner"]["horizon"]))


def _refuse(key: str, job: str, estimate: resources.Estimate, limit: int) -> None:
    if estimate.mb > limit:
        raise ConfigError(f"config key '{key}': {job} needs {estimate.describe()}; more than resources.max_mem_mb = "
                          f"{limit:,} MB. Lower {key.rsplit('.', 1)[-1]} (or the other keys named) or raise "
                          f"resources.max_mem_mb (the estimate: tapebench.pipeline.resources)")


def _refuse_largest(over: list, limit: int, config: dict) -> None:
    """Of the jobs over the limit (estimate, key thunk, job words), refuse the largest, naming the key that drives it:
    `resources.max_mem_mb` itself when even a job's fixed process (`resources.BASE_MB`) is over it."""
    if not over:
        return
    estimate, key_of, job = max(over, key=lambda o: o[0].mb)
    if resources.BASE_MB >= limit:
        given = "resources.max_mem_mb" if config.get("resources", {}).get("max_mem_mb") else "this machine's memory"
        raise ConfigError(f"config key 'resources.max_mem_mb': {limit:,} MB ({given}) is less than the "
                          f"{resources.BASE_MB:,} MB every job's process needs before what the config sizes; {job} "
                          f"needs {estimate.describe()}. Raise resources.max_mem_mb")
    _refuse(key_of(), job, estimate, limit)


def _culprit(config: dict, method: str, keys: tuple, estimate_with) -> str:
    return resources.culprit(keys, config["agents"].get(method) or {}, get_method(method).Config(), estimate_with)


def _check_resources(config: dict) -> None:
    """Refuse a config one of whose training, evaluation or world-test jobs would need more memory than
    `resources.max_mem_mb` (default: this machine's), naming the key that makes it large."""
    limit = max_mem_mb(config)     # the machine's memory is not written into the config: params stay machine-free
    seeds = seeds_per_job(config)
    ladder, fixed = config["studies"]["ladder"], config["studies"]["fixed_z"]
    L, H = _env_LH(config)
    runs = [(m, L, H) for m in dict.fromkeys([*config["methods"], *ladder["methods"]])]
    for table in ("table5", "table6"):
        for m in dict.fromkeys(fixed[table]["methods"] + fixed[table].get("multi_rule", [])):
            runs.append((m, fixed[table]["L"], fixed[table]["H"]))
    over = []    # (estimate, key thunk, job) of every job in the DAG over the limit; the largest is refused
    for method, L_run, H_run in runs:
        entry = get_method(method)
        if entry.trains:
            memory, _ = training_job(config, method, L=L_run, H=H_run)
            if memory.mb > limit:
                def key(method=method, L_run=L_run, H_run=H_run, memory=memory):
                    return f"agents.{method}." + _culprit(
                        config, method, memory.largest.keys,
                        lambda o: training_job(config, method, L=L_run, H=H_run, overrides=o)[0])
                over.append((memory, key, f"a training job of {method!r} (L = {L_run}, H = {H_run}, {seeds} seed(s) "
                                          f"per job)"))
        if entry.plays_episodes:
            memory, _ = evaluation_job(config, method, config["main_split"], L=L_run)
            if memory.mb > limit:
                def key(method=method, L_run=L_run, memory=memory):
                    keys = memory.largest.keys
                    return {"episodes_per_rule": "evaluation.episodes_per_rule", "H": "evaluation.horizons"}.get(
                        keys[0], f"agents.{method}." + _culprit(
                            config, method, keys, lambda o: evaluation_job(config, method, config["main_split"],
                                                                            L=L_run, overrides=o)[0]))
                over.append((memory, key, f"an evaluation job of {method!r} (L = {L_run})"))
    sweep = config["diagnostics"]["sweep"]
    for i, value in enumerate(sweep["values"] if sweep_runs(config) else []):
        point = {sweep["hyperparameter"]: value}
        memory, _ = training_job(config, sweep["method"], overrides=point)
        if memory.mb > limit:
            def key(i=i, point=point, memory=memory):   # the sweep's value, or a hyperparameter all its jobs share
                given = {**(config["agents"].get(sweep["method"]) or {}), **point}
                name = resources.culprit(memory.largest.keys, given, get_method(sweep["method"]).Config(),
                                         lambda o: training_job(config, sweep["method"], overrides={**point, **o})[0])
                return f"diagnostics.sweep.values[{i}]" if name == sweep["hyperparameter"] else \
                    f"agents.{sweep['method']}.{name}"
            over.append((memory, key,
                         f"a sweep training job of {sweep['method']!r} with {sweep['hyperparameter']} = {value}"))
    if config["studies"]["worldtest"]["methods"]:
        memory = worldtest_job(config)
        if memory.mb > limit:
            over.append((memory, lambda memory=memory: f"studies.worldtest.{memory.largest.keys[0]}",
                         "a world-test job"))
    _refuse_largest(over, limit, config)


def dumps(obj) -> str:
    """Canonical JSON for a params string (stable across runs, so Snakemake's params trigger is exact)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def agent_params(config: dict, method: str, overrides: dict | None = None) -> dict:
    """A method's hyperparameters in a job's params: its resolved Config (`agents.<method>`, then `overrides`, over the
    Config's defaults) in canonical form (`registry.stated_hyperparameters`), so an edit of `agents` that changes no
    value (stating a default, 5e-4 for 0.0005) changes no job (docs/protocol.md#job-params)."""
    return stated_hyperparameters(method, {**(config["agents"].get(method) or {}), **(overrides or {})})


def train_slice(config: dict, agent: str, seeds: int = 1) -> dict:
    """What a training job of `seeds` seeds of `agent` gets (`tapebench train --params`); `training.stacking` only
    where it changes what the job does (`training_stacking`), so switching it changes no other job's params."""
    stacking = training_stacking(config, agent, seeds)
    return {
        "agent": agent_params(config, agent),
        "env": env_params(config),
        "training": {**{k: config["training"][k] for k in ("total_steps", "eval_every")},
                     **({"stacking": stacking} if stacking != "auto" else {})},
        **logging_slice(config),
    }


def logging_slice(config: dict) -> dict:
    """What a training job gets of `logging`: nothing while it is off (the default), so switching it changes no
    other params of a training job; `{"logging": {"tensorboard": true}}` when on.
    Turning it on changes the training jobs' params, so Snakemake reruns them (docs/protocol.md#tensorboard)."""
    logging = config.get("logging", {})
    return {"logging": {"tensorboard": True}} if logging.get("tensorboard", False) else {}


def fixed_z_train_slice(config: dict, agent: str, L: int, H: int) -> dict:
    """A fixed-z study run: the agent's hyperparameters, the study's L, H and schedule (not env.L / training)."""
    fixed = config["studies"]["fixed_z"]
    return {"agent": agent_params(config, agent), "env": {**env_params(config), "L": int(L), "H": int(H)},
            "training": {k: fixed[k] for k in ("total_steps", "eval_every")}, **logging_slice(config)}


def fixed_z_eval_slice(config: dict, agent: str, L: int, H: int) -> dict:
    out = checkpoint_eval_slice(config, agent)
    out["env"] = {**out["env"], "L": int(L), "H": int(H)}
    return out


def eval_slice(config: dict) -> dict:
    ev = config["evaluation"]
    return {
        "env": env_params(config),
        "evaluation": {"episodes_per_rule": ev["episodes_per_rule"], "eval_seed": ev["eval_seed"]},
    }


def checkpoint_eval_slice(config: dict, method: str) -> dict:
    """The evaluation slice of a trained method: planners that evaluate only the last K checkpoints say so."""
    out = eval_slice(config)
    if not get_method(method).every_checkpoint:
        out["evaluation"]["checkpoints"] = config["evaluation"]["last_k"]
    return out


def model_error_slice(config: dict) -> dict:
    return {"env": env_params(config), "evaluation": eval_slice(config)["evaluation"],
            "model_error": dict(config["diagnostics"]["model_error"])}


def sweep_train_slice(config: dict, value: int) -> dict:
    sweep = config["diagnostics"]["sweep"]
    out = train_slice(config, sweep["method"])
    out["agent"] = agent_params(config, sweep["method"], {sweep["hyperparameter"]: int(value)})
    return out


def noise_eval_slice(config: dict, method: str, noise) -> dict:
    """A noisy evaluation (docs/protocol.md#noise): the method's noise-free evaluation slice plus the noise level;
    a trained method plays only the last K checkpoints (the ones behind its per-seed value)."""

    out = last_checkpoints_eval_slice(config, method) if get_method(method).trains else method_eval_slice(config, method)
    out["evaluation"]["noise"] = float(noise)
    return out


def last_checkpoints_eval_slice(config: dict, method: str) -> dict:
    """The evaluation of a trained method's last K checkpoints only (the ones behind its per-seed value)."""
    out = checkpoint_eval_slice(config, method)
    out["evaluation"]["checkpoints"] = config["evaluation"]["last_k"]
    return out


def budget_train_slice(config: dict, method: str, steps) -> dict:
    """A budget study run (docs/protocol.md#budget-study): the method's training slice with the budget's schedule."""
    out = train_slice(config, method)
    total_steps, eval_every = budget_schedule(config, steps)
    out["training"] = {**out["training"], "total_steps": total_steps, "eval_every": eval_every}
    return out


def ladder_split_slice(config: dict) -> dict:
    """What the ladder split depends on (not its methods or seeds, which change only the runs)."""
    ladder = config["studies"]["ladder"]
    return {k: ladder[k] for k in ("train", "train_classes", "train_types", "levels", "level_size", "seed")}


def method_eval_slice(config: dict, method: str) -> dict:
    """The evaluation job of a method that does not train also depends on its hyperparameters."""
    return {"agent": agent_params(config, method), **eval_slice(config)}
