# Every table and figure, generated from the one registry in src/tapebench/report/registry.py: one render
# job per entry (per split for split-scoped entries) that this config asks for, each calling
# `tapebench render ID` with its inputs; outputs, once built, are registered with report() for `snakemake --report`,
# under the entry's category with a caption naming the entry and its protocol (workflow/report/output.rst).

from tapebench.report import document as report_document
from tapebench.report import registry as report_registry

for _entry, _job in report_registry.jobs(config):

    rule:
        name:
            f"render_{_job.name}"
        input:
            **_job.files(_entry),
        output:
            **{
                key: for_report(
                    path,
                    category=_entry.category,
                    subcategory=_entry.title,
                    caption="../report/output.rst",
                    labels={"output": _entry.title, "file": path},
                )
                for key, path in {**_job.outputs(_entry), **_entry.extra_outputs(_job)}.items()
            },
        log:
            f"{LOGS}/report/{_job.name}.log",
        conda:
            CONDA_ENV
        params:
            args=_job.args(_entry),
            caption=report_document.caption_rst(_entry, _job, config),
        shell:
            "tapebench render {params.args:q} > {log:q} 2>&1"


REPORT_TARGETS = report_registry.targets(config)
