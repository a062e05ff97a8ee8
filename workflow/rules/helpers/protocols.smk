# The protocol comparison's helpers (protocols.smk): the protocols come from the config in one function; each
# names the per-seed files it reads.
from tapebench.stats.protocols import protocol_files, protocols as comparison_protocols

PROTOCOLS = comparison_protocols(config)


def protocol_comparison_params(wildcards=None):
    return dumps([p.to_dict() for p in PROTOCOLS])


def protocol_comparison_inputs(wildcards=None):
    return protocol_files(PROTOCOLS)
