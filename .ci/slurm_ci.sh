#!/usr/bin/env bash
# CI stage: the Slurm tests on a real single-node cluster (called by .ci/run after the main test run).
#
#   bash .ci/slurm_ci.sh [extra pytest args]
#
# Installs and starts the cluster with .ci/slurm_cluster.sh, runs the `slurm`-marked tests
# (tests/test_slurm_cluster.py: profile lookup, --gpus, Ctrl-C + rerun on a toy workflow;
# tests/test_slurm_pipeline.py: the tiny pipeline through Slurm vs locally, with a training job cancelled
# mid-run), prints timings, and exits with pytest's exit code. A cluster this script started is stopped on
# any exit (daemons recorded by `slurm_cluster.sh start`; a munged it did not start is left alone); a cluster
# that was already running when it began is left running. Skipped tests count as a failure here: on CI the
# cluster must be there. Needs root (apt, daemons). Environment: as for .ci/slurm_cluster.sh; PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
CLUSTER=.ci/slurm_cluster.sh
STATE_DIR="${TAPEBENCH_SLURM_DIR:-/tmp/tapebench-slurm}"
T_BEGIN=$SECONDS
STARTED_BY_US=0
PYTEST_PID=

log() { printf '[slurm_ci] %s\n' "$*" >&2; }

cleanup() {
    local rc=$? i
    trap - EXIT INT TERM
    if [[ -n "$PYTEST_PID" ]] && kill -0 "$PYTEST_PID" 2>/dev/null; then
        # Ctrl-C for the tests' process group: pytest stops, each snakemake cancels its Slurm jobs.
        log "interrupting the tests (process group $PYTEST_PID)"
        kill -INT -- "-$PYTEST_PID" 2>/dev/null || true
        for ((i = 0; i < 90; i++)); do kill -0 "$PYTEST_PID" 2>/dev/null || break; sleep 1; done
        kill -KILL -- "-$PYTEST_PID" 2>/dev/null || true
    fi
    if ((STARTED_BY_US)); then
        log "stopping the cluster this script started"
        if ! bash "$CLUSTER" stop; then
            log "ERROR: could not stop the cluster cleanly"
            ((rc == 0)) && rc=1
        fi
    fi
    log "total $((SECONDS - T_BEGIN))s, exit code $rc"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

t0=$SECONDS
bash "$CLUSTER" install
T_INSTALL=$((SECONDS - t0))

if bash "$CLUSTER" status >/dev/null 2>&1; then
    log "a cluster is already running (state dir $STATE_DIR): using it, leaving it running"
    T_START=0
else
    t0=$SECONDS
    STARTED_BY_US=1  # set before start: a start that fails half-way is stopped too
    bash "$CLUSTER" start
    T_START=$((SECONDS - t0))
fi
log "cluster: install ${T_INSTALL}s, start ${T_START}s"
bash "$CLUSTER" status

junit="$(mktemp -t slurm-ci-junit.XXXXXX.xml)"
t0=$SECONDS
# pytest in the background, in its own process group (set -m): a signal to this script runs the trap at
# once (not after pytest ends), and the trap can interrupt pytest and the snakemake runs it started.
set -m
TAPEBENCH_SLURM=1 "$PYTHON" -m pytest -m slurm -n 0 -v -s --durations=0 -p no:cacheprovider --junitxml="$junit" \
    tests/test_slurm_cluster.py tests/test_slurm_pipeline.py "$@" &
PYTEST_PID=$!
set +e
wait "$PYTEST_PID"
rc=$?
set -e
PYTEST_PID=
T_TESTS=$((SECONDS - t0))

skipped="$("$PYTHON" -c 'import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
print(sum(int(s.get("skipped", 0)) for s in root.iter("testsuite")))' "$junit" 2>/dev/null || echo "?")"
rm -f "$junit"
if [[ "$skipped" != 0 ]]; then
    log "ERROR: ${skipped} Slurm test(s) skipped (or no test report): the cluster tests must run here"
    ((rc == 0)) && rc=1
fi
if ((rc != 0)); then
    log "tests failed (exit code $rc); cluster state and log tails:"
    bash "$CLUSTER" status || true
    tail -n 20 "$STATE_DIR/log/slurmctld.log" "$STATE_DIR/log/slurmd.log" >&2 || true
fi
log "timings: install ${T_INSTALL}s, cluster start ${T_START}s, tests ${T_TESTS}s (per test: --durations above)"
exit "$rc"
