"""Every job is checked for reruns, including the jobs behind a training job's `ancient()` health verdict.

Snakemake 9 decides what to rerun in `DAG.update_needrun`: it walks the jobs in topological order and, as soon as
one job must run, *masks* all of its descendants (they are skipped there and reached later by following the
dependency edges from the jobs that run). That later walk deliberately does not cross an `ancient()` edge whose
file exists. A job that sits behind such an edge is then never looked at at all: neither its own changed params
nor its changed input set nor its changed code make it rerun.

The pipeline has exactly that shape: every training job takes its split's health verdict as an `ancient()` input
(the gate must pass before training starts, and a recomputed health report must not retrain anything), and the
health report reads the random policy's evaluation. Editing `evaluation.episodes_per_rule` reran the random
policy's evaluation, which masked every training job and with it every evaluation of a trained run, so the run
ended with evaluations of two protocols side by side (and only the next run evaluated the trained runs again).

Second, `snakemake --list-changes params` listed an output of every job with recorded params, changed or not: a
`ParamsChange` without a change still iterates over the files it looked at. `check_every_job()` makes an unchanged
one iterate over nothing, so the command lists the outputs whose params really changed.

`check_every_job()` turns the masking off: each job is checked on its own, as it would be without the
optimisation; the rest of Snakemake's decision (the walk along the edges, `ancient()` included) is unchanged.
The cost is one metadata look-up per job that the masking would have skipped. tests/test_rerun_after_edit.py
checks the effect on the tiny protocol, so a Snakemake release that decides reruns differently is caught there.
"""
from __future__ import annotations

from snakemake.dag import DAG
from snakemake.persistence import ParamsChange

_PATCHED = "_tapebench_checks_every_job"


def check_every_job() -> None:
    """Make Snakemake's `DAG.update_needrun` check every job for reruns (idempotent)."""
    if getattr(DAG, _PATCHED, False):
        return
    files_of = ParamsChange.__iter__
    ParamsChange.__iter__ = lambda change: files_of(change) if change else iter(())
    original = DAG.update_needrun

    async def update_needrun(self, *args, **kwargs):
        # the masking is `masked.update(self.bfs(self.depending, job))`; during this call it is the only
        # traversal of `depending`, so it alone sees an empty walk
        if "bfs" in vars(self):                      # a nested call: the walk is already replaced
            return await original(self, *args, **kwargs)
        walk = self.bfs

        def bfs(direction, *jobs, **options):
            return iter(()) if direction is self.depending else walk(direction, *jobs, **options)

        self.bfs = bfs
        try:
            return await original(self, *args, **kwargs)
        finally:
            del self.bfs

    update_needrun.__doc__ = original.__doc__
    DAG.update_needrun = update_needrun
    setattr(DAG, _PATCHED, True)
