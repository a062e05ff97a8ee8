#!/usr/bin/env bash
# Continue the reference set: run each named method's 20 seeds at the paper protocol, then pack it into
# reference/tape-v2/ (docs/protocol.md#reference-sets). Run from a clean checkout (no uncommitted changes); commit
# reference/ and docs/reproduction.md after each method.
#
#   bash tools/reference_run.sh [--cores N] METHOD [METHOD ...]
#
# The methods still missing: those of `methods:` in config/config.yaml that `tapebench reference show tape-v2` does
# not list.
set -euo pipefail
cd "$(dirname "$0")/.."
cores=2
if [ "${1:-}" = "--cores" ]; then cores="$2"; shift 2; fi
[ $# -ge 1 ] || { echo "usage: bash tools/reference_run.sh [--cores N] METHOD [METHOD ...]" >&2; exit 2; }
blocks="$(mktemp --suffix=.yaml)"
printf 'training: {seeds_per_job: 4}\n' > "$blocks"
for method in "$@"; do
    targets=(results/aggregate/main/"$method"_H32.per_seed.parquet results/aggregate/main/"$method"_H64.per_seed.parquet)
    command="snakemake ${targets[*]} --cores $cores --configfile config/config.yaml blocks.yaml (blocks.yaml: training: {seeds_per_job: 4})"
    echo "== $method: $command"
    snakemake "${targets[@]}" --cores "$cores" --configfile config/config.yaml "$blocks"
    tapebench reference pack tape-v2 --methods "$method" --command "$command" \
        --where "$(uname -n), $(nproc) cores, $(date -u +%F)"
    tapebench reference reproduction tape-v2 --out docs/reproduction.md --readme README.md
done
rm -f "$blocks"
tapebench reference verify tape-v2
