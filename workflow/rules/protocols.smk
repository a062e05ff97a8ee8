# Protocol comparison (docs/protocol.md#protocol-comparison): the methods' rankings under each protocol (a
# selection of per-seed rows: ID, OOD, other horizons, other splits), Kendall's tau-b between them, rank
# reversals and best-method changes, with a seed bootstrap. Rendered by the registry's protocol_comparison
# table and figure (report.smk).
# Constants and helper functions: helpers/protocols.smk.


rule protocol_comparison:
    input:
        protocol_comparison_inputs,
    output:
        comparison=layout.PROTOCOL_COMPARISON["comparison"],
        ranks=layout.PROTOCOL_COMPARISON["ranks"],
        reversals=layout.PROTOCOL_COMPARISON["reversals"],
    log:
        f"{LOGS}/protocols/comparison.log",
    conda:
        CONDA_ENV
    params:
        protocols=protocol_comparison_params,
        metric=config["studies"]["protocol_comparison"]["metric"],
        n_resamples=config["statistics"]["n_resamples"],
        ci=config["statistics"]["ci"],
        seed=config["statistics"]["seed"],
    shell:
        "tapebench protocol-comparison --protocols {params.protocols:q} --metric {params.metric:q}"
        " --n-resamples {params.n_resamples:q} --ci {params.ci:q} --seed {params.seed:q} --out {output.comparison:q}"
        " --ranks-out {output.ranks:q} --reversals-out {output.reversals:q} > {log:q} 2>&1"
