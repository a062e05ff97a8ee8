"""`tapebench render ID` (one table or figure, generated from the output registry) and `tapebench report`
(the compiled document)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tapebench import layout
from tapebench.report import registry
from tapebench.report.document import REQUIRED_PACKAGES, LatexMissing, compile_pdf, latex_command, render_tex
from tapebench.report.output import TABLE
from tapebench.utils.io import write_text


def register(sub) -> None:
    register_render(sub)
    register_report(sub)


def register_render(sub) -> None:
    """`tapebench render ID ...`, one subcommand per registry entry."""
    parser = sub.add_parser("render", description="Write one of the tables or figures (LaTeX tables; figures as PDF and PNG) "
                                        "from the pipeline's outputs; `tapebench render ID --help` names the inputs.")
    entries = parser.add_subparsers(dest="table", required=True, metavar="ID")
    for entry in registry.OUTPUTS.values():
        p = entries.add_parser(entry.id, help=entry.title, description=f"{entry.title}.")
        for o in entry.options:
            kwargs = {"help": o.help.replace("%", "%%"), "type": o.type}
            if o.many:
                kwargs["nargs"] = "+"
            if o.required:
                kwargs["required"] = True
            else:
                kwargs["default"] = o.default
            p.add_argument(o.flag, dest=o.name, **kwargs)
        p.add_argument("--out", required=True,
                       help="output .tex" if entry.kind == TABLE else "output path stem: writes STEM.pdf and STEM.png")
        p.set_defaults(func=run_render, entry=entry.id)


def run_render(args) -> int:
    # lazy: `render --help` loads no numerical library
    from tapebench.pipeline.params import check_value
    from tapebench.validation import check_output_file

    entry = registry.OUTPUTS[args.entry]
    for option in entry.options:    # a value that stands for a config key keeps that key's bounds
        value = getattr(args, option.name)
        if option.config_key is not None and value is not None:
            for v in (value if option.many else [value]):
                check_value(v, option.config_key, option.flag)
    if entry.kind == TABLE:
        check_output_file(args.out, "--out")
    else:   # a stem: STEM.pdf and STEM.png
        check_output_file(f"{args.out}.pdf", "--out")
        if Path(args.out).is_dir():
            raise ValueError(f"--out {args.out} is a folder; give a path stem inside it (writes STEM.pdf, STEM.png)")
    entry.run(args)
    print(f"render {entry.id}: {args.out}")
    return 0


def register_report(sub) -> None:
    p = sub.add_parser(
        "report", description="Write the report's LaTeX source (every table and figure the config produces, grouped by "
                    "category, with the protocol in each caption and a summary of the config on the first page) "
                    "and compile it to PDF with latexmk or pdflatex. The tables and figures must exist (Snakemake "
                    "builds them: `snakemake --cores 2 results/report.pdf`). Without LaTeX use --tex-only.")
    p.add_argument("--configfile", nargs="+", default=[], metavar="FILE",
                   help="presets merged on top of config/config.yaml, in order (as snakemake --configfile)")
    p.add_argument("--config-json", metavar="JSON",
                   help="the whole, already checked config as JSON (what the Snakemake rule passes)")
    p.add_argument("--presets-json", metavar="JSON", default="[]",
                   help="names of the presets behind --config-json, as a JSON list (shown on the first page)")
    p.add_argument("--tex", help=f"LaTeX source to write (default {layout.REPORT_TEX}, in the config's results_dir)")
    p.add_argument("--pdf", help=f"PDF to write (default {layout.REPORT_PDF}, in the config's results_dir)")
    p.add_argument("--tex-only", action="store_true", help="write the LaTeX source only (no LaTeX needed)")
    p.add_argument("--check-latex", action="store_true",
                   help="only check that LaTeX and the packages the report needs are installed")
    p.add_argument("--workflow", default=".", metavar="DIR",
                   help="the pipeline folder holding config/, workflow/ and results/ (default: the current folder)")
    p.set_defaults(func=run_report)


def run_report(args) -> int:
    if args.check_latex or not args.tex_only:
        try:
            command = latex_command()
        except LatexMissing as exc:
            print(f"tapebench report: {exc}", file=sys.stderr)
            return 3
        if args.check_latex:
            print(f"tapebench report: LaTeX found ({command[0]}), packages {', '.join(REQUIRED_PACKAGES)} present")
            return 0
    root = Path(args.workflow)
    config, presets = _config(args, root)
    folder = config.get("results_dir", layout.RESULTS_DIR)   # the defaults: in the folder the config writes
    args.tex = args.tex or layout.rebase(layout.REPORT_TEX, folder)
    args.pdf = args.pdf or layout.rebase(layout.REPORT_PDF, folder)
    missing = [path for path in registry.targets(config) if not (root / path).is_file()]
    if missing:
        raise FileNotFoundError(f"the report needs every table and figure of the config; missing: "
                                f"{', '.join(missing)}. Build them first, e.g. `snakemake --cores 2 "
                                f"{' '.join(missing[:3])}`")
    tex = render_tex(config, presets)
    write_text(root / args.tex, tex)
    print(f"report: {args.tex}")
    if not args.tex_only:
        try:
            print(compile_pdf(tex, root / args.pdf, root=root))
        except RuntimeError as exc:
            print(f"tapebench report: {exc}", file=sys.stderr)
            return 1
        print(f"report: {args.pdf}")
    return 0


def _config(args, root: Path) -> tuple[dict, list]:
    # lazy: config validation loads the registry and the health checks; only --configfile needs it
    from tapebench.pipeline.config import load_config, stated_config, validate_config

    if args.config_json is not None:
        if args.configfile:
            raise ValueError("give either --config-json or --configfile, not both")
        return json.loads(args.config_json), list(json.loads(args.presets_json))
    schema = root / "workflow" / "schemas" / "config.schema.yaml"
    if not schema.is_file():
        raise FileNotFoundError(f"{schema} not found; run from the pipeline folder or give --workflow DIR")
    return (validate_config(load_config(args.configfile, root=root), schema, stated=stated_config(args.configfile)),
            list(args.configfile))
