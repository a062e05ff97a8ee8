"""`tapebench methods`: list every registered method (built-in and plug-ins) and its hyperparameters."""
from __future__ import annotations

import dataclasses


def register(sub) -> None:
    p = sub.add_parser("methods", description="List every method the pipeline can run: its id (the key under `agents:` in "
                                   "the config), table name, family, whether it trains, and its hyperparameters "
                                   "with defaults.")
    p.add_argument("--verbose", "-v", action="store_true", help="also list each method's hyperparameters, each with "
                   "what it means")
    p.add_argument("--write-docs", metavar="DIR",
                   help="instead of listing, rewrite the generated parts of the method pages in DIR (docs/methods: "
                        "each page's registry entry and hyperparameter table, the index in README.md), start a page "
                        "for a method that has none, and list what remains to fix")
    p.set_defaults(func=_run)


def _run(args) -> int:
    return _write_docs(args.write_docs) if args.write_docs else _list(args)


def _write_docs(folder: str) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.method_pages import problems, write_pages

    try:
        written = write_pages(folder)
    except (OSError, ValueError) as exc:
        print(f"tapebench methods --write-docs: {exc}")
        return 1
    for path in written:
        print(f"wrote {path}")
    remaining = problems(folder)
    for problem in remaining:
        print(problem)
    if not written and not remaining:
        print(f"{folder}: every method page is current")
    return 1 if remaining else 0


def _list(args) -> int:
    # lazy: a command loads only the modules it runs
    from tapebench.registry import FAMILIES, field_docs, registry

    methods = sorted(registry().values(), key=lambda m: (list(FAMILIES).index(m.family), m.id))
    width = max([14, *(len(m.id) for m in methods)])
    name_width = max([22, *(len(m.display_name) for m in methods)])
    print(f"{'id':<{width}} {'table name':<{name_width}} {'family':<24} {'trains':<6}  summary")
    for m in methods:
        print(f"{m.id:<{width}} {m.display_name:<{name_width}} {m.family_name.replace('--', '-'):<24} "
              f"{'yes' if m.trains else 'no':<6}  {m.summary}")
        if args.verbose:
            notes = [text for flag, text in ((m.sees_true_rule, "sees the true rule (reference)"),
                                             (m.world_model, "world model: its prediction error is measured"),
                                             (m.trains and not m.every_checkpoint,
                                              "evaluates only the last K checkpoints (planner)"),
                                             (m.deterministic, "deterministic: one seed is evaluated"),
                                             (m.worldtest is not None, "takes part in the world test"),
                                             (m.goal_conditioned, "takes each episode's goal (env.goal: derived)"),
                                             (m.needs_derived_goal, "derived goals only: refused with the fixed goal"),
                                             (not m.plays_episodes, "world test only: no TAPE episodes"))
                     if flag]
            if notes:
                print(f"{'':<{width + 2}}[{'; '.join(notes)}]")
            meanings = field_docs(m.Config)
            for f in dataclasses.fields(m.Config):
                default = f.default if f.default is not dataclasses.MISSING else "(required)"
                meaning = f"  # {meanings[f.name]}" if meanings[f.name] else ""
                print(f"{'':<{width + 2}}{f.name} = {default!r}{meaning}")
    return 0
