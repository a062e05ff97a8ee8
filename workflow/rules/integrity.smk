# Before any job: every artifact already in results/ must be whole (tapebench.utils.artifacts).
# A damaged file would otherwise count as up to date and fail the jobs that read it; instead the
# run stops here, naming each file and the `rm` that lets Snakemake regenerate it.
from tapebench.pipeline.integrity import CorruptResults, scan_results

if workflow.is_main_process:
    _problems = scan_results("results")
    if _problems:
        raise CorruptResults(_problems)
