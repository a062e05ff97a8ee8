# Before any job: every artifact already in this config's results folder must be whole (tapebench.utils.artifacts).
# A damaged file would otherwise count as up to date and fail the jobs that read it; instead the
# run stops here, naming each file and the `rm` that lets Snakemake regenerate it.
from tapebench.pipeline.integrity import CorruptResults, scan_results

if workflow.is_main_process:
    _problems = scan_results(layout.folder)
    if _problems:
        raise CorruptResults(_problems)


# A target in results/ outside this config's results folder (another preset's): no job writes it; this rule matches
# it only to say so (refuse_foreign_target, common.smk), naming the file to ask for, while the DAG is built.
rule foreign_target:
    input:
        refuse_foreign_target,
    output:
        f"{layout.RESULTS_DIR}/{{foreign}}",
    wildcard_constraints:
        foreign=foreign_target_regex(layout.folder),
