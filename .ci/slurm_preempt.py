#!/usr/bin/env python3
"""Simulate preemption of a Snakemake-submitted Slurm job (test helper, stdlib only).

The snakemake slurm executor names every job of a run after the run UUID (`%j`) and puts the rule in the
comment (`%k`): `rule_<rule>` or `rule_<rule>_wildcards_<wildcard values in the order of the rule's output
pattern, joined by _>`, e.g. `rule_train_wildcards_main_dqn_0` for the pipeline's train job of split main,
agent dqn, seed 0; group jobs get `rule_<group>_<its rules joined by _>` (not matched by --rule). This script
waits until a RUNNING job whose comment matches is found (optionally until a file, e.g. the job's resume
state, exists), then preempts it and prints its job id.

  .ci/slurm_preempt.py --list
  .ci/slurm_preempt.py --rule train --wildcards main_dqn_0 --wait-file results/runs/main/dqn/seed0/resume.pt

Modes:
  cancel   `scancel ID`: the job ends CANCELLED; a running Snakemake (profile `retries: 2`) resubmits it as a
           new Slurm job; if Snakemake itself is gone, rerunning it (profile `rerun-incomplete: true`) does.
  requeue  `scontrol requeue ID`: what Slurm does on preemption with PreemptMode=REQUEUE; the same job id
           goes back to PENDING and runs again; Snakemake just keeps waiting for it.
Either way the job must resume from a checkpoint that is not a declared Snakemake output (declared
outputs of failed jobs are deleted).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def queue() -> list[dict]:
    out = subprocess.run(
        ["squeue", "-h", "--states=all", "-o", "%i|%T|%j|%k"],
        check=True, capture_output=True, text=True,
    ).stdout
    jobs = []
    for line in out.splitlines():
        parts = line.split("|", 3)
        if len(parts) == 4:
            jobs.append(dict(zip(("id", "state", "name", "comment"), (p.strip() for p in parts))))
    return jobs


def matches(job: dict, rule: str, wildcards: str | None) -> bool:
    c = job["comment"]
    if wildcards is None:
        return c == f"rule_{rule}" or c.startswith(f"rule_{rule}_wildcards_")
    return c == f"rule_{rule}_wildcards_{wildcards}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="print id, state, name, comment of all known jobs")
    ap.add_argument("--rule", help="rule (or group) name as in the job comment")
    ap.add_argument("--wildcards", help="wildcard values joined by '_' as in the comment (e.g. main_dqn_0)")
    ap.add_argument("--name", help="only jobs of this Snakemake run (job name = run UUID)")
    ap.add_argument("--exclude", default="", help="comma-separated job ids to ignore (e.g. already preempted)")
    ap.add_argument("--wait-file", help="preempt only once this file exists (e.g. the first checkpoint)")
    ap.add_argument("--delay", type=float, default=0.0, help="extra seconds to wait before preempting")
    ap.add_argument("--mode", choices=("cancel", "requeue"), default="cancel")
    ap.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds")
    ap.add_argument("--wait-ended", action="store_true", help="return only after the job left RUNNING")
    args = ap.parse_args(argv)

    if args.list:
        for j in queue():
            print(j["id"], j["state"], j["name"], j["comment"])
        return 0
    if not args.rule:
        ap.error("--rule is required (or --list)")

    exclude = {x for x in args.exclude.split(",") if x}
    deadline = time.monotonic() + args.timeout
    target = None
    while time.monotonic() < deadline:
        if args.wait_file is not None and not os.path.exists(args.wait_file):
            time.sleep(0.1)  # a stat is cheap: catch the job soon after the file appears
            continue
        running = [
            j for j in queue()
            if j["state"] == "RUNNING" and j["id"] not in exclude and matches(j, args.rule, args.wildcards)
            and (args.name is None or j["name"] == args.name)
        ]
        if running:
            target = running[0]
            break
        time.sleep(0.5)
    if target is None:
        print(f"slurm_preempt: no RUNNING job for rule {args.rule!r} within {args.timeout}s", file=sys.stderr)
        return 1
    if args.delay:
        time.sleep(args.delay)

    jid = target["id"]
    cmd = ["scancel", jid] if args.mode == "cancel" else ["scontrol", "requeue", jid]
    subprocess.run(cmd, check=True)
    print(f"slurm_preempt: {' '.join(cmd)} ({target['comment']})", file=sys.stderr)
    if args.wait_ended:
        while time.monotonic() < deadline:
            states = [j["state"] for j in queue() if j["id"] == jid]
            if not states or states[0] != "RUNNING":
                break
            time.sleep(0.5)
    print(jid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
