# The compiled report (results/report.pdf): every registry target of this config in one LaTeX document
# (src/tapebench/report/document.py). Needs LaTeX; latex_check runs first (it has no inputs and a high
# priority) so a machine without LaTeX learns that at once, not after the training. Both rules run where
# snakemake runs (also under the Slurm profile): LaTeX is needed on that machine only.
import os

PRESETS = [os.path.relpath(path) for path in workflow.overwrite_configfiles]  # --configfile, for the report


rule latex_check:
    output:
        temp(layout.LATEX_CHECK),
    log:
        f"{LOGS}/report/latex_check.log",
    priority: 100
    localrule: True
    conda:
        CONDA_ENV
    shell:
        "tapebench report --check-latex > {log:q} 2>&1 || {{ cat {log:q} >&2; exit 1; }}; touch {output:q}"


rule report_pdf:
    input:
        outputs=REPORT_TARGETS,
        latex=layout.LATEX_CHECK,
    output:
        pdf=for_report(
            layout.REPORT_PDF,
            category="Compiled report",
            caption="../report/compiled.rst",
            labels={"output": layout.REPORT_PDF},
        ),
        tex=layout.REPORT_TEX,
    log:
        f"{LOGS}/report/report_pdf.log",
    localrule: True
    conda:
        CONDA_ENV
    params:
        config=dumps(config),
        presets=dumps(PRESETS),
    shell:
        "tapebench report --config-json {params.config:q} --presets-json {params.presets:q} "
        "--tex {output.tex:q} --pdf {output.pdf:q} > {log:q} 2>&1 || {{ tail -n 30 {log:q} >&2; exit 1; }}"


DOCUMENT_TARGETS = [layout.REPORT_PDF] if config["report"]["pdf"] else []
