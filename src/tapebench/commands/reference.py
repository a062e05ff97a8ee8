"""`tapebench reference`: the shipped reference sets (docs/protocol.md#reference-sets) — list, show, verify,
pack a finished run into a set, the tables the pipeline takes from a set, one cell rerun end to end, the
reproduction report and the results page."""
from __future__ import annotations

import datetime
import json
import platform
import sys
from pathlib import Path

from tapebench import layout
from tapebench.commands import write_generated
from tapebench.reference_sets import ROOT

SCHEMA = Path("workflow/schemas/config.schema.yaml")   # commands that read the config run from the pipeline folder


def _verb(verbs, name: str, text: str):
    return verbs.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")


def _name(v) -> None:
    v.add_argument("name", help="the set's name, a folder under the root (e.g. tape-v2)")


def register(sub) -> None:
    p = sub.add_parser("reference", description="Reference sets: a protocol run once, its per-seed, per-checkpoint, "
                                                "per-rule records shipped under reference/NAME/ with a manifest and "
                                                "SHA256SUMS (docs/protocol.md#reference-sets).")
    p.add_argument("--root", default=ROOT, help=f"folder of the reference sets (default {ROOT}/)")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    v = _verb(verbs, "list", "the sets under the root, one line each: methods, seeds per method, protocol hash")
    v.set_defaults(func=_list)

    v = _verb(verbs, "show", "what a set holds: its protocol, and per method seeds, horizons, checkpoints, rows, "
                             "size, CPU-hours and code version")
    _name(v)
    v.set_defaults(func=_show)

    v = _verb(verbs, "verify", "check every file of a set against its SHA256SUMS (exit 1 on a damaged set) and flag "
                               "each method whose code differs from the code that made its records")
    _name(v)
    v.set_defaults(func=_verify)

    v = _verb(verbs, "pack", "write or extend a set from a finished run's evaluation records (every seed and horizon "
                             "of each method), with its manifest entry and the set's SHA256SUMS")
    _name(v)
    v.add_argument("--configfile", nargs="*", default=[], metavar="YAML",
                   help="the presets the run used, merged on top of config/config.yaml")
    v.add_argument("--results", default="results", help="the run's results folder (default results/)")
    v.add_argument("--methods", nargs="+", required=True, help="methods to add (each needs every seed and horizon)")
    v.add_argument("--command", dest="run_command", default="",
                   help="the command that ran them, recorded in the manifest")
    v.add_argument("--where", default="", help="where they ran (machine, session), recorded in the manifest")
    v.add_argument("--skip-code-check", action="store_true",
                   help="pack records even where their method code cannot be tied to this checkout (uncommitted "
                        "changes, another commit): for scratch sets; the manifest records code_checked: false")
    v.set_defaults(func=_pack)

    v = _verb(verbs, "seed-tables", "a method's per-seed, learning-curve and per-rule tables from a set at one "
                                    "horizon (what the pipeline runs instead of aggregate-seed for the set's methods)")
    _name(v)
    v.add_argument("--method", required=True, help="a method the set holds")
    v.add_argument("--H", type=int, required=True, help="evaluation horizon")
    v.add_argument("--last-k", type=int, required=True, help="checkpoints averaged into a seed's value")
    v.add_argument("--out", required=True, help="per-seed Parquet")
    v.add_argument("--curves-out", required=True, help="learning-curve Parquet")
    v.add_argument("--per-rule-out", required=True, help="per-rule Parquet")
    v.set_defaults(func=_seed_tables)

    v = _verb(verbs, "reproduce", "rerun one cell of a set (a method and a seed) end to end through Snakemake in this "
                                  "clone and print its difference to the shipped records (exit 0 when identical)")
    _name(v)
    v.add_argument("--method", required=True, help="a method the set holds")
    v.add_argument("--seed", type=int, required=True, help="one of its seeds")
    v.add_argument("--H", type=int, nargs="*", help="horizons (default: the set's)")
    v.add_argument("--configfile", nargs="*", default=[], metavar="YAML",
                   help="presets on top of config/config.yaml whose protocol equals the set's (default: none)")
    v.add_argument("--cores", type=int, default=1, help="Snakemake cores for the rerun (default 1)")
    v.add_argument("--work", default="results/reproduce", help="folder for the rerun's preset file")
    v.add_argument("--accept", action="store_true",
                   help="when the rerun is identical, record the installed code of the method as verified (its "
                        "fingerprint joins the manifest's verified_code), so `verify` stops flagging it")
    v.set_defaults(func=_reproduce)

    v = _verb(verbs, "reproduction", "the reproduction report: the paper's numbers beside the set's with CIs, "
                                     "differences, verdicts and causes (Markdown; README's Results block)")
    _name(v)
    v.add_argument("--out", required=True, help="Markdown file (docs/reproduction.md)")
    v.add_argument("--tex", help="also the LaTeX section for the compiled report")
    v.add_argument("--readme", help="also the Results block of this README (between its reference-results markers)")
    v.add_argument("--check", action="store_true", help="do not write: exit 1 if a file is not what it would be")
    v.set_defaults(func=_reproduction)

    v = _verb(verbs, "results", "the results page: the paper-protocol tables of the set (Tables 3, 2, 4 and 1) with "
                                "CIs and the set's provenance (Markdown, docs/results.md)")
    _name(v)
    v.add_argument("--out", required=True, help="Markdown file (docs/results.md)")
    v.add_argument("--check", action="store_true", help="do not write: exit 1 if the file is not what it would be")
    v.set_defaults(func=_results)


def _list(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.reference_sets import available, read_manifest

    names = available(args.root)
    if not names:
        print(f"no reference sets under {args.root}/")
    for name in names:
        manifest = read_manifest(name, args.root)
        seeds = sorted({len(e.get("seeds", [])) for e in manifest["methods"].values()})
        print(f"{name}: {len(manifest['methods'])} methods, seeds per method {seeds}, protocol "
              f"{manifest['protocol_sha256'][:12]}, {manifest.get('title', '')}")
    return 0


def _show(args) -> int:
    # lazy: a command loads only the modules it runs
    import pandas as pd
    from tapebench.reference_sets import lacking_methods, read_manifest, set_dir, summary

    manifest = read_manifest(args.name, args.root)
    folder = set_dir(args.name, args.root)
    print(f"{args.name}: {manifest.get('title', '')}")
    print(f"protocol (sha256 {manifest['protocol_sha256'][:16]}):")
    print(json.dumps(manifest["protocol"], indent=1, sort_keys=True))
    table = summary(manifest)
    table["MB"] = [round((folder / manifest["methods"][m]["records"]).stat().st_size / 1e6, 2)
                   for m in table["method"]]
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string(index=False))
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    lacking = lacking_methods(manifest)
    print(f"{len(table)} methods, {total / 1e6:.1f} MB in {folder}/"
          + (f"; not in the set yet: {', '.join(lacking)}" if lacking else ""))
    return 0


def _verify(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.reference_sets import changed_methods, read_manifest, verify

    problems = verify(args.name, args.root)
    for line in problems:
        print(f"FAIL {line}")
    if problems:
        print(f"reference set {args.name!r}: {len(problems)} problem(s); restore it with `git checkout -- "
              f"{args.root}/{args.name}`", file=sys.stderr)
        return 1
    manifest = read_manifest(args.name, args.root)
    changed = changed_methods(manifest)
    for method, why in sorted(changed.items()):
        print(f"FLAG {method}: {why}; its rows are still the shipped ones (`tapebench reference reproduce "
              f"{args.name} --method {method} --seed 0` reruns one cell)")
    print(f"reference set {args.name!r}: every file matches SHA256SUMS ({len(manifest['methods'])} methods"
          + (f", {len(changed)} flagged" if changed else "") + ")")
    return 0


def _seed_tables(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.reference_sets import load_records, read_manifest
    from tapebench.stats.aggregate import seed_tables_from_sums
    from tapebench.utils.io import provenance, write_parquet

    manifest = read_manifest(args.name, args.root)
    sums = load_records(args.name, args.method, args.root)
    sums = sums[sums["H"] == args.H]
    if sums.empty:
        raise ValueError(f"reference set {args.name!r} holds no H = {args.H} records of {args.method!r}")
    tables = seed_tables_from_sums(sums, last_k=args.last_k)
    entry = manifest["methods"][args.method]
    meta = provenance({"last_k": args.last_k, "reference_set": args.name}, None,
                      reference_set={"name": args.name, "protocol_sha256": manifest["protocol_sha256"],
                                     "method": args.method, "code_version": entry.get("code_version"),
                                     "method_code_sha256": entry.get("method_code_sha256")})
    for key, out in (("per_seed", args.out), ("curves", args.curves_out), ("per_rule", args.per_rule_out)):
        write_parquet(out, tables[key], meta=meta)
    print(f"{args.method} H = {args.H}: {tables['per_seed']['seed'].nunique()} seeds from reference set {args.name}")
    return 0


# ------------------------------------------------------------------------------------------------------------------
# pack


def _library_versions() -> dict:
    # lazy: a command loads only the modules it runs
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for package in ("torch", "numpy", "numba", "pandas", "pyarrow", "snakemake"):
        try:
            out[package] = md.version(package)
        except md.PackageNotFoundError:
            out[package] = None
    return out


def _eval_files(results: Path, split: str, method: str, seeds: list[int], horizons: list[int]) -> list[Path]:
    files, missing = [], []
    for seed in seeds:
        for H in horizons:
            path = results / Path(layout.evaluation(layout.run_dir(split, method, seed), H)).relative_to("results")
            (files if path.is_file() else missing).append(path)
    if missing:
        raise ValueError(f"{method}: {len(missing)} evaluation file(s) missing, e.g. {missing[0]}; pack a method "
                         f"once every seed and horizon is evaluated")
    return files


def _records_commit(method: str, versions: set) -> str:
    """The one commit that made a method's records: the manifest's fingerprint is that commit's code."""
    if any(v and v.endswith("-dirty") for v in versions):
        raise ValueError(f"{method}: its records were made by a checkout with uncommitted changes ({sorted(versions)});"
                         " a reference set's records name a commit (or pack with --skip-code-check)")
    commits = sorted({v.split("+g", 1)[1] for v in versions if v and "+g" in v})
    if len(commits) != 1:
        raise ValueError(f"{method}: its records name {len(commits)} commits ({', '.join(commits) or 'none'}); a set's "
                         f"method is made by one (or pack with --skip-code-check)")
    return commits[0]


def pack_method(config: dict, results: Path, method: str, check_code: bool = True) -> tuple:
    """(rule sums, manifest entry) of one method from a finished run's records."""
    # lazy: a command loads only the modules it runs
    import pandas as pd
    from tapebench.reference_sets import method_fingerprint
    from tapebench.registry import get_method
    from tapebench.report.compute import evaluation_record, run_record
    from tapebench.stats.aggregate import rule_sums
    from tapebench.stats.compute import compute_table
    from tapebench.utils.artifacts import read_json, read_table
    from tapebench.utils.io import cpu_name

    split, horizons = config["main_split"], list(config["evaluation"]["horizons"])
    info = get_method(method)
    seeds = [0] if info.deterministic else list(range(config["seeds"]))
    frames, evaluations, versions, hyper = [], [], set(), None
    for path in _eval_files(results, split, method, seeds, horizons):
        frame, meta = read_table(path, "episodes")
        if set(frame["agent"].astype(str)) != {method}:
            raise ValueError(f"{path}: records of {sorted(set(frame['agent'].astype(str)))}, not {method!r}")
        frames.append(frame)
        evaluation = meta.get("evaluation", {})
        evaluations.append(evaluation_record(meta))
        versions.add((evaluation.get("run") or {}).get("code_version") or meta.get("code_version"))
        if not info.trains:
            hyper = (evaluation.get("method") or {}).get("hyperparameters", hyper)
    runs, devices = [], set()
    if info.trains:
        for seed in seeds:
            manifest = read_json(results / Path(layout.manifest(layout.run_dir(split, method, seed))).relative_to(
                "results"), "training manifest")
            runs.append(run_record(manifest))
            versions.add(manifest["provenance"]["code_version"])
            devices.add(manifest.get("device_name") or manifest.get("device"))
            hyper = manifest["hyperparameters"]
    commit = _records_commit(method, versions) if check_code else None
    sums = rule_sums(pd.concat(frames, ignore_index=True))
    cost = compute_table(runs, evaluations, [method]).iloc[0]
    entry = {
        "display_name": info.display_name, "family": info.family, "trains": info.trains,
        "deterministic": info.deterministic,
        "seeds": seeds, "horizons": horizons, "checkpoints": sorted(int(c) for c in sums["checkpoint"].unique()),
        "rules": {side: int(sums.loc[sums["side"] == side, "rule"].nunique()) for side in sorted(sums["side"].unique())},
        "episodes": int(sums["n_episodes"].sum()), "rows": len(sums),
        "hyperparameters": hyper or {}, "code_version": sorted(v for v in versions if v),
        "method_code_sha256": method_fingerprint(method, commit),
        "cpu_hours": {"training": round(float(cost["train_cpu_hours"]), 4),
                      "evaluation": round(float(cost["eval_cpu_hours"]), 4),
                      "total": round(float(cost["cpu_hours"]), 4)},
        "machine": {"cpu": cpu_name(), "devices": sorted(d for d in devices if d) or ["cpu"],
                    "platform": platform.platform()},
        "libraries": _library_versions(),
    }
    return sums, entry


def _pack(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.pipeline.config import load_config, protocol_slice, validate_config
    from tapebench.reference_sets import (FORMAT, ReferenceSetError, protocol_differences, protocol_hash,
                                          read_manifest, set_dir, write_checksums, write_manifest, write_records)

    config = validate_config(load_config(args.configfile), SCHEMA)
    protocol = protocol_slice(config)
    folder = set_dir(args.name, args.root)
    if (folder / "manifest.json").is_file():
        manifest = read_manifest(args.name, args.root)
        differences = protocol_differences(manifest["protocol"], protocol)
        if differences:
            raise ReferenceSetError(f"the run's protocol differs from set {args.name!r}'s: "
                                    + "; ".join(f"{k}: {a!r} vs {b!r}" for k, a, b in differences))
    else:
        manifest = {"format": FORMAT, "name": args.name, "protocol": protocol, "protocol_sha256": protocol_hash(protocol),
                    "title": f"the protocol of config/config.yaml run once, every default method at {config['seeds']} "
                             "seeds", "methods": {}}
    folder.mkdir(parents=True, exist_ok=True)
    today = datetime.date.today().isoformat()
    for method in args.methods:
        sums, entry = pack_method(config, Path(args.results), method, check_code=not args.skip_code_check)
        entry["code_checked"] = not args.skip_code_check
        entry["records"] = write_records(folder, method, sums)
        entry["commands"] = [args.run_command] if args.run_command else []
        entry["where"] = args.where
        entry["packed"] = today
        manifest["methods"][method] = entry
        print(f"{method}: {entry['rows']} rows, {len(entry['seeds'])} seeds, {len(entry['checkpoints'])} checkpoints, "
              f"{entry['cpu_hours']['total']:.3f} CPU-hours, code {', '.join(entry['code_version'])}")
    manifest["seeds"] = sorted({s for e in manifest["methods"].values() for s in e["seeds"]})
    manifest["default_methods"] = list(config["methods"])
    write_manifest(folder, manifest)
    write_checksums(folder)
    print(f"the pages made from the set: tapebench reference reproduction {args.name} --out docs/reproduction.md "
          f"--readme README.md; tapebench reference results {args.name} --out docs/results.md")
    return 0


# ------------------------------------------------------------------------------------------------------------------
# reproduce one cell


def reproduce_preset(manifest: dict, method: str, results_dir: str) -> dict:
    """The preset `reproduce` puts on top of config/config.yaml: the method alone with the set's hyperparameters, one
    seed per training job, its own results folder. `seeds` stays the set's: only the rerun seed's targets are built,
    and a study that reuses the main runs (the world test) still finds the seeds it is validated for."""
    return {"reference_set": None, "methods": [method], "seeds": max(manifest["seeds"]) + 1,
            "agents": {method: manifest["methods"][method]["hyperparameters"]},
            "training": {"seeds_per_job": 1}, "results_dir": results_dir}


def _reproduce(args) -> int:
    # lazy: a command loads only the modules it runs
    import shutil
    import subprocess
    import time
    import pandas as pd
    from tapebench.reference_sets import ReferenceSetError, compare_cell, load_records, read_manifest
    from tapebench.stats.aggregate import rule_sums
    from tapebench.utils.artifacts import read_table

    manifest = read_manifest(args.name, args.root)
    entry = manifest["methods"].get(args.method)
    if entry is None:
        raise ReferenceSetError(f"reference set {args.name!r} holds no {args.method!r}; it holds "
                                f"{', '.join(sorted(manifest['methods']))}")
    if args.seed not in entry["seeds"]:
        raise ReferenceSetError(f"{args.method} in {args.name!r} has seeds {entry['seeds']}, not {args.seed}")
    horizons = args.H or entry["horizons"]
    unknown = sorted(set(horizons) - set(entry["horizons"]))
    if unknown:
        raise ReferenceSetError(f"{args.method} in {args.name!r} has horizons {entry['horizons']}, not {unknown}")
    split = manifest["protocol"]["split"]["name"]
    # A private results folder, emptied first: every step of the cell (split, oracle, training, evaluation) runs
    # with the installed code, never reusing outputs of an earlier rerun or of the user's own results/.
    cell = f"reproduce-{args.name}-{args.method}-seed{args.seed}"
    folder = f"{layout.RESULTS_DIR}/{cell}"
    for private in (Path(folder), Path(layout.logs_dir(folder))):
        shutil.rmtree(private, ignore_errors=True)
    targets = [layout.rebase(layout.evaluation(layout.run_dir(split, args.method, args.seed), H), folder)
               for H in horizons]
    preset = Path(args.work) / f"{cell}.yaml"
    preset.parent.mkdir(parents=True, exist_ok=True)
    preset.write_text(json.dumps(reproduce_preset(manifest, args.method, folder)))
    command = ["snakemake", *targets, "--cores", str(args.cores), "--configfile", "config/config.yaml",
               *args.configfile, str(preset)]
    print("rerun: " + " ".join(command), flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True)
    seconds = time.perf_counter() - start
    fresh = rule_sums(pd.concat([read_table(t, "episodes")[0] for t in targets], ignore_index=True))
    shipped = load_records(args.name, args.method, args.root)
    report = compare_cell(shipped, fresh, args.seed, horizons)
    print(report)
    print(f"rerun took {seconds:.1f} s wall ({args.method}, seed {args.seed}, H {horizons})")
    identical = report.startswith("identical")
    if identical and args.accept:
        # lazy: a command loads only the modules it runs
        from tapebench.reference_sets import accept_code
        from tapebench.utils.io import code_version

        accept_code(args.name, args.method, f"tapebench reference reproduce --seed {args.seed} --H "
                    f"{' '.join(map(str, horizons))}: identical rule sums", code_version(), args.root)
        print(f"{args.method}: the installed code is recorded as verified in {args.root}/{args.name}/manifest.json")
    return 0 if identical else 1


def _reproduction(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.report.reproduction import readme_results, replace_block, reproduction_markdown, reproduction_tex

    pages = {args.out: reproduction_markdown(args.name, args.root)}
    if args.readme:
        pages[args.readme] = replace_block(Path(args.readme).read_text(), readme_results(args.name, args.root))
    if args.tex:
        pages[args.tex] = reproduction_tex(args.name, args.root)
    regenerate = (f"tapebench reference reproduction {args.name} --out {args.out}"
                  + (f" --readme {args.readme}" if args.readme else "") + (f" --tex {args.tex}" if args.tex else ""))
    return write_generated(pages, args.check, regenerate)


def _results(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.report.results_page import results_markdown

    return write_generated({args.out: results_markdown(args.name, args.root)}, args.check,
                           f"tapebench reference results {args.name} --out {args.out}")
