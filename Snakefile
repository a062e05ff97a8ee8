# TAPE reproduction pipeline. Main job: snakemake --cores 8 results/table3.tex
# Reduced preset:  snakemake --cores 2 results/quick/table3.tex --configfile config/quick.yaml
# Cluster:         snakemake --profile slurm results/table3.tex

from pathlib import Path

from tapebench.pipeline.config import load_config_file

if Path("config/config.yaml").is_file():
    load_config_file("config/config.yaml")  # Snakemake's own YAML error does not name the file


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


# What many stages share, then each stage's and study's helpers (constants and functions, no rules), then the rules:
# every helper is defined before any rule names it.
include: "workflow/rules/common.smk"
include: "workflow/rules/helpers/splits.smk"
include: "workflow/rules/helpers/health.smk"
include: "workflow/rules/helpers/oracle.smk"
include: "workflow/rules/helpers/diagnostics.smk"
include: "workflow/rules/helpers/ladder.smk"
include: "workflow/rules/helpers/fixed_z.smk"
include: "workflow/rules/helpers/noise.smk"
include: "workflow/rules/helpers/protocols.smk"
include: "workflow/rules/helpers/worldtest.smk"
include: "workflow/rules/helpers/fewshot.smk"
include: "workflow/rules/helpers/budget.smk"
include: "workflow/rules/integrity.smk"
include: "workflow/rules/splits.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/oracle.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/diagnostics.smk"
include: "workflow/rules/identifiability.smk"
include: "workflow/rules/health.smk"
include: "workflow/rules/document.smk"
include: "workflow/rules/ladder.smk"
include: "workflow/rules/fixed_z.smk"
include: "workflow/rules/noise.smk"
include: "workflow/rules/protocols.smk"
include: "workflow/rules/worldtest.smk"
include: "workflow/rules/fewshot.smk"
include: "workflow/rules/budget.smk"


onstart:
    start_job_server()


onsuccess:
    stop_job_server()


onerror:
    stop_job_server()


rule all:
    default_target: True
    input:
        REPORT_TARGETS,
        DOCUMENT_TARGETS,
