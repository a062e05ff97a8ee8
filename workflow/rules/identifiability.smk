# Identifiability of the latent rule per split (docs/protocol.md#identifiability): observed transitions until the
# rule tables consistent with them are a single rule, on the evaluation episodes' initial tapes with random actions.


rule identifiability:
    input:
        split=layout.split_file("{split}"),
    output:
        layout.identifiability("{split}"),
    log:
        f"{LOGS}/identifiability/{{split}}.log",
    conda:
        CONDA_ENV
    params:
        L=config["env"]["L"],
        H=config["env"]["H"],
        episodes=config["evaluation"]["episodes_per_rule"],
        eval_seed=config["evaluation"]["eval_seed"],
    shell:
        "tapebench identifiability --split {input.split:q} --L {params.L:q} --H {params.H:q}"
        " --episodes-per-rule {params.episodes:q} --eval-seed {params.eval_seed:q} --out {output:q} > {log:q} 2>&1"
