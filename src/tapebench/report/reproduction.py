"""The reproduction report: every number of the paper that a reference set can answer (Tables 1-4, the Bayes filter
of Section 6.2), the paper's value beside ours with CIs, the difference, a verdict and, where they differ, the
protocol decision or cause that explains it. Generated from the set's records and its `paper.json` alone
(`tapebench reference reproduction NAME --out docs/reproduction.md`); never typed by hand.

Ours: the set's rule sums -> per-seed values (last K checkpoints, `stats.aggregate.seed_tables_from_sums`) ->
bootstrap means and percentile CIs over seeds (`stats.aggregate.aggregate_seeds`, the statistics of Table 3).
Verdicts, the paper's numbers widened by half a unit of their last printed digit (they are rounded):
  inside the paper's CI   our mean lies in the paper's CI
  CIs overlap             our CI and the paper's overlap
  paper value in our CI   the paper gives no CI and its value lies in ours
  differs                 none of these
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from tapebench.defaults import CI, N_RESAMPLES, REFERENCE, STATISTICS_SEED
from tapebench.reference_sets import (PAPER, ROOT, SUMS, lacking_methods, load_records, read_manifest, require_intact,
                                      set_dir)
from tapebench.report.tables import display_name, table_order
from tapebench.stats.aggregate import aggregate_seeds, group_generator, seed_tables_from_sums
from tapebench.stats.bootstrap import percentile_ci
from tapebench.utils.artifacts import WrongKind, what_file_is
from tapebench.utils.io import atomic_path

INSIDE, OVERLAP, VALUE_IN_OURS, DIFFERS, MISSING = ("inside the paper's CI", "CIs overlap", "paper value in our CI",
                                                    "differs", "not in the set yet")
COLUMN_NAMES = {("train", "success"): "ID success", ("test", "success"): "OOD success",
                ("drop", "success"): "drop (ID - OOD)", ("test", "return"): "OOD return",
                ("train", "final_dist"): "ID final dist.", ("test", "final_dist"): "OOD final dist.",
                ("train", "auc_dist"): "ID AUC dist.", ("test", "auc_dist"): "OOD AUC dist.",
                ("train", "soft_success@0.1"): "ID soft success@0.1", ("test", "soft_success@0.1"): "OOD soft success@0.1",
                ("rules", "success"): "success (all rules)", ("rules", "final_dist"): "final dist. (all rules)",
                ("rules", "auc_dist"): "AUC dist. (all rules)"}
REPORT_COLUMNS = ["table", "method", "H", "side", "metric", "column", "paper", "paper_low", "paper_high", "digits",
                  "ours", "ours_low", "ours_high", "n", "difference", "verdict", "why"]


def read_paper(name: str, root) -> dict:
    require_intact(name, root, [PAPER])
    return json.loads((set_dir(name, root) / PAPER).read_text())


def set_aggregate(name: str, root, manifest: dict) -> tuple[pd.DataFrame, dict]:
    """(aggregate of every method of the set, the columns of `tapebench aggregate`'s table, {(method, H, metric):
    (mean, low, high, n)} pooled over all rules). The results page (`report.results_page`) reads the same frame."""
    last_k = int(manifest["protocol"]["evaluation"]["last_k"])
    per_seed, pooled = [], {}
    for method in sorted(manifest["methods"]):
        sums = load_records(name, method, root)
        for H, part in sums.groupby("H"):
            per_seed.append(seed_tables_from_sums(part, last_k=last_k)["per_seed"])
            last = part[part.groupby("seed")["checkpoint"].rank(method="dense", ascending=False) <= last_k]
            per_checkpoint = last.groupby(["seed", "checkpoint"])[["n_episodes", "success", "final_dist",
                                                                   "auc_dist"]].sum()
            for metric in ("success", "final_dist", "auc_dist"):
                rates = (per_checkpoint[metric] / per_checkpoint["n_episodes"]).groupby("seed").mean().to_numpy()
                interval = percentile_ci(rates, N_RESAMPLES, CI, rng=group_generator(
                    STATISTICS_SEED, (method, int(H), "rules", metric)))
                pooled[(method, int(H), metric)] = (float(rates.mean()), float(interval.low), float(interval.high),
                                                    len(rates))
    agg = aggregate_seeds(pd.concat(per_seed, ignore_index=True), N_RESAMPLES, CI, STATISTICS_SEED)
    return agg, pooled


def _verdict(paper: float, low, high, digits: int, ours: float, ours_low: float, ours_high: float) -> str:
    half = 0.5 * 10.0 ** -digits
    if low is not None:
        if low - half <= ours <= high + half:
            return INSIDE
        return OVERLAP if ours_low <= high + half and low - half <= ours_high else DIFFERS
    return VALUE_IN_OURS if ours_low - half <= paper <= ours_high + half else DIFFERS


def _why(cell: dict, trains: bool, explanations: dict) -> str:
    for key in (cell["method"], cell["metric"]):
        if key in explanations:
            return key
    return "learned" if trains and "learned" in explanations else ""


def reproduction_frame(name: str, root) -> tuple[pd.DataFrame, dict, dict]:
    """(one row per paper cell, the paper's metadata and explanations, the set's manifest)."""
    manifest = read_manifest(name, root)
    paper = read_paper(name, root)
    agg, pooled = set_aggregate(name, root, manifest)
    rows = []
    for cell in paper["cells"]:
        method, H, side, metric = cell["method"], int(cell["H"]), cell["side"], cell["metric"]
        low, high = (cell["ci"] or (None, None))
        row = {"table": cell["table"], "method": method, "H": H, "side": side, "metric": metric,
               "column": COLUMN_NAMES.get((side, metric), f"{side} {metric}"), "paper": float(cell["value"]),
               "paper_low": low, "paper_high": high, "digits": int(cell["digits"]), "ours": np.nan,
               "ours_low": np.nan, "ours_high": np.nan, "n": 0, "difference": np.nan, "verdict": MISSING, "why": ""}
        found = None
        if side == "rules":
            found = pooled.get((method, H, metric))
        else:
            hit = agg[(agg["agent"] == method) & (agg["H"] == H) & (agg["side"] == side) & (agg["metric"] == metric)]
            if len(hit):
                r = hit.iloc[0]
                found = (float(r["mean"]), float(r["ci_low"]), float(r["ci_high"]), int(r["n"]))
        if found is not None:
            ours, ours_low, ours_high, n = found
            verdict = _verdict(row["paper"], low, high, row["digits"], ours, ours_low, ours_high)
            entry = manifest["methods"][method]
            row.update(ours=ours, ours_low=ours_low, ours_high=ours_high, n=n, difference=ours - row["paper"],
                       verdict=verdict,
                       why=_why(cell, entry.get("trains", False), paper["explanations"]) if verdict == DIFFERS else "")
        rows.append(row)
    return pd.DataFrame(rows, columns=REPORT_COLUMNS), paper, manifest


def _num(x: float, digits: int) -> str:
    return "--" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.{digits}f}"


def _answered(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.Series, bool]:
    """(the cells the set answers, their verdict counts, whether it answers every cell)."""
    present = frame[frame["verdict"] != MISSING]
    return present, present["verdict"].value_counts(), len(present) == len(frame)


def methods_held(manifest: dict) -> str:
    """"16 methods, every method of the config that made the set", or which of its methods the set lacks."""
    held = f"{len(manifest['methods'])} methods"
    lacking = lacking_methods(manifest)
    if lacking is None:
        return held
    return held + (f" (not in the set yet: {', '.join(lacking)})" if lacking
                   else ", every method of the config that made the set")


def reproduction_markdown(name: str, root) -> str:
    frame, paper, manifest = reproduction_frame(name, root)
    meta = paper["paper"]
    present, counts, complete = _answered(frame)
    lines = [
        f"# Reproduction of {meta['title']} (arXiv:{meta['arxiv']})",
        "",
        f"<!-- generated by `tapebench reference reproduction {name} --out docs/reproduction.md` from "
        f"reference/{name}/; do not edit by hand -->",
        "",
        f"Every number of the paper's {meta['where']} beside the reference set `{name}`: the paper protocol run "
        f"once at {len(manifest['seeds'])} seeds ({methods_held(manifest)}; the protocol and the code "
        f"that made each method's records are in `reference/{name}/manifest.json`). Ours are means over seeds "
        f"with bootstrap {100 * CI:g}% CIs ({N_RESAMPLES} resamples), the statistics of Table 3. "
        "Verdicts: *inside the paper's CI* (our mean), *CIs overlap*, *paper value in our CI* (where the paper "
        "gives no CI), *differs*; the paper's values are widened by half a unit of their last digit, as they are "
        "rounded. The cause of each difference is below the tables.",
        "",
        (f"**Verdict**: all {len(frame)} paper cells answered: " if complete
         else f"**Verdict so far**: {len(present)} of {len(frame)} paper cells answered: ")
        + ", ".join(f"{counts.get(v, 0)} {v}" for v in (INSIDE, OVERLAP, VALUE_IN_OURS, DIFFERS))
        + ("." if complete else f"; {len(frame) - len(present)} wait for methods not yet in the set "
           f"({', '.join(sorted(set(frame.loc[frame['verdict'] == MISSING, 'method'])))})."),
        "",
    ]
    for table, part in frame.groupby("table", sort=False):
        lines += [f"## {table}", "", "| Method | H | Column | Paper | Ours [95% CI] | n | Ours - paper | Verdict |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in part.itertuples(index=False):
            d = r.digits
            paper_text = _num(r.paper, d) + (f" [{_num(r.paper_low, d)}, {_num(r.paper_high, d)}]"
                                             if r.paper_low is not None and not pd.isna(r.paper_low) else "")
            ours_text = ("--" if r.verdict == MISSING else
                         f"{_num(r.ours, d + 1)} [{_num(r.ours_low, d + 1)}, {_num(r.ours_high, d + 1)}]")
            verdict = r.verdict + (f" ([why](#why-{r.why.replace('_', '-')}))" if r.why else "")
            diff = "--" if r.verdict == MISSING else f"{r.difference:+.{d + 1}f}"
            lines.append(f"| {display_name(r.method)} | {r.H} | {r.column} | {paper_text} | {ours_text} | "
                         f"{r.n or '--'} | {diff} | {verdict} |")
        lines.append("")
    used = [k for k in paper["explanations"] if k in set(frame["why"])]
    if used:
        lines += ["## Why cells differ", ""]
        for key in used:
            lines += [f'<a id="why-{key.replace("_", "-")}"></a>**{key}**: {paper["explanations"][key]}', ""]
    return "\n".join(lines).rstrip() + "\n"


README_BEGIN = "<!-- reference-results:begin (generated by `tapebench reference reproduction`; do not edit) -->"
README_END = "<!-- reference-results:end -->"


def readme_results(name: str, root) -> str:
    """README's Results block: the set's Table 3 at the training horizon (ID and OOD strict success, ON(p), with CIs;
    the rest of the table is in docs/results.md) and the reproduction verdict in one line."""
    frame, paper, manifest = reproduction_frame(name, root)
    agg, _ = set_aggregate(name, root, manifest)
    H = int(manifest["protocol"]["env"]["H"])
    order = table_order(manifest["methods"])

    def cell(agent, side, metric, digits):
        if metric == "on_success" and agent == REFERENCE:
            return "100 (ref.)"
        hit = agg[(agg["agent"] == agent) & (agg["H"] == H) & (agg["side"] == side) & (agg["metric"] == metric)]
        if hit.empty:
            return "--"
        r = hit.iloc[0]
        return f"{r['mean']:.{digits}f} [{r['ci_low']:.{digits}f}, {r['ci_high']:.{digits}f}]"

    present, counts, complete = _answered(frame)
    agreeing = sum(counts.get(v, 0) for v in (INSIDE, OVERLAP, VALUE_IN_OURS))
    lines = [README_BEGIN,
             f"| Method (reference set `{name}`, H = {H}, {len(manifest['seeds'])} seeds) | ID success | OOD success | ON(p) |",
             "|---|---|---|---|"]
    for agent in order:
        lines.append(f"| {display_name(agent)} | {cell(agent, 'train', 'success', 3)} | "
                     f"{cell(agent, 'test', 'success', 3)} | "
                     f"{cell(agent, 'test', 'on_success', 1)} |")
    lines += ["", f"**Against the paper** ([docs/reproduction.md](docs/reproduction.md)): of the {len(frame)} numbers of "
              f"its Tables 1-4 and Section 6.2, "
              + ("all are answered" if complete else f"{len(present)} are answered so far")
              + f"; {agreeing} agree (inside its CI, "
              f"CIs overlapping, or its value inside ours) and {counts.get(DIFFERS, 0)} differ, each with its cause.",
              README_END]
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    """`text` with its README_BEGIN ... README_END block replaced by `block`."""
    start, end = text.find(README_BEGIN), text.find(README_END)
    if start < 0 or end < start:
        raise ValueError(f"no block between {README_BEGIN!r} and {README_END!r}")
    return text[:start] + block + text[end + len(README_END):]


def reproduction_tex(name: str, root) -> str:
    """The report's section: the paper's Table 3 beside the set's, cell by cell, and the verdicts of every table
    (the whole comparison is docs/reproduction.md)."""
    frame, paper, manifest = reproduction_frame(name, root)
    t3 = frame[frame["table"] == "Table 3"]
    rows = []
    for method, part in t3.groupby("method", sort=False):
        cells = []
        for column in ("ID success", "OOD success", "drop (ID - OOD)", "OOD return"):
            r = part[part["column"] == column].iloc[0]
            ours = "--" if r.verdict == MISSING else f"{_num(r.ours, r.digits)}"
            mark = {INSIDE: "", OVERLAP: "$^{\\circ}$", VALUE_IN_OURS: "", DIFFERS: "$^{*}$", MISSING: ""}[r.verdict]
            cells.append(f"{_num(r.paper, r.digits)} & {ours}{mark}")
        rows.append(f"{display_name(method)} & " + " & ".join(cells) + " \\\\")
    verdicts = []
    for table, part in frame.groupby("table", sort=False):
        present = part[part["verdict"] != MISSING]
        counts = present["verdict"].value_counts()
        verdicts.append(f"{table}: {len(present)} of {len(part)} answered, {counts.get(INSIDE, 0)} inside the "
                        f"paper's CI, {counts.get(OVERLAP, 0)} CIs overlap, {counts.get(VALUE_IN_OURS, 0)} paper "
                        f"value in ours, {counts.get(DIFFERS, 0)} differ")
    caption = (f"The paper's Table 3 (arXiv:{paper['paper']['arxiv']}) beside reference set \\texttt{{{name}}} "
               f"({len(manifest['seeds'])} seeds, H = 32; our means, CIs in docs/reproduction.md): $^{{*}}$ differs "
               f"(outside the paper's CI and no overlap), $^{{\\circ}}$ CIs overlap, unmarked: inside the paper's "
               f"CI; -- not in the set yet. " + "; ".join(verdicts) + ".")
    return "\n".join([
        "% Generated by tapebench (render reproduction); requires \\usepackage{booktabs}.",
        "\\begin{table}[t]", "\\centering", "\\footnotesize", f"\\caption{{{caption}}}",
        "\\label{tab:reproduction}", "\\begin{tabular}{lcccccccc}", "\\toprule",
        " & \\multicolumn{2}{c}{ID success} & \\multicolumn{2}{c}{OOD success} & \\multicolumn{2}{c}{Drop} & "
        "\\multicolumn{2}{c}{OOD return} \\\\",
        "Method & paper & ours & paper & ours & paper & ours & paper & ours \\\\", "\\midrule", *rows,
        "\\bottomrule", "\\end{tabular}", "\\end{table}", ""])


def render_reproduction(out, *, checksums, reference_set) -> str:
    """The report entry: `checksums` is the set's SHA256SUMS (its folder names the root)."""
    checksums = Path(checksums)
    if checksums.name != SUMS or checksums.parent.name != reference_set:
        raise WrongKind(f"{checksums} is not reference set {reference_set!r}'s {SUMS}: it is "
                        f"{what_file_is(checksums)}; give {ROOT}/{reference_set}/{SUMS}")
    text = reproduction_tex(reference_set, Path(checksums).parent.parent)
    with atomic_path(out) as tmp:
        Path(tmp).write_text(text)
    return text
