"""`tapebench config`: the configuration a set of config files gives, checked as the workflow checks it."""
from __future__ import annotations

from pathlib import Path

import yaml


def register(sub) -> None:
    p = sub.add_parser(
        "config", description="Merge config/config.yaml with the given presets exactly as `snakemake --configfile` "
                    "does, check the result as the pipeline does before any job (every error names the file "
                    "or the config key), and print the configuration with its defaults filled in, followed "
                    "by the size of the run it describes.")
    p.add_argument("--configfile", nargs="+", default=[], metavar="FILE",
                   help="presets merged on top of config/config.yaml, in order (e.g. config/quick.yaml)")
    p.add_argument("--workflow", default=".", metavar="DIR",
                   help="the pipeline folder holding config/ and workflow/ (default: the current folder)")
    p.set_defaults(func=run)


def run(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.pipeline.config import load_config, stated_config, validate_config
    from tapebench.settings import checkpoints_per_run

    root = Path(args.workflow)
    schema = root / "workflow" / "schemas" / "config.schema.yaml"
    if not schema.is_file():
        raise FileNotFoundError(f"{schema} not found; run from the pipeline folder or give --workflow DIR")
    config = validate_config(load_config(args.configfile, root=root), schema, stated=stated_config(args.configfile))
    print(yaml.safe_dump(config, sort_keys=False).rstrip())
    training, evaluation = config["training"], config["evaluation"]
    # lazy: a command loads only the modules it runs
    from tapebench.registry import get_method

    trained = [m for m in config["methods"] if get_method(m).trains]
    seeds = config["seeds"]
    blocks = -(-seeds // training["seeds_per_job"])   # jobs per method: one per seed block
    runs = len(trained) * seeds
    seeded = [m for m in config["methods"] if m not in trained and not get_method(m).deterministic]
    one_seed = [m for m in config["methods"] if m not in trained and get_method(m).deterministic]
    evaluations = runs + len(seeded) * seeds + len(one_seed)
    eval_jobs = (len(trained) + len(seeded)) * blocks + len(one_seed)
    horizons = len(evaluation["horizons"])
    print(f"\n# {runs} training runs (split {config['main_split']}: {len(trained)} methods that train x "
          f"{seeds} seeds, in {len(trained) * blocks} jobs) of {training['total_steps']} steps with "
          f"{checkpoints_per_run(training['total_steps'], training['eval_every'])} checkpoints each; "
          f"{evaluations * horizons} evaluations in {eval_jobs * horizons} jobs (H = "
          f"{', '.join(map(str, evaluation['horizons']))}) for {len(config['methods'])} methods")
    return 0
