#!/usr/bin/env bash
# Single-node Slurm cluster for tapebench CI and local testing.
#
#   .ci/slurm_cluster.sh install      apt packages (munge, slurmctld, slurmd, slurm-client) + slurm executor plugin
#   .ci/slurm_cluster.sh start        write slurm.conf, start munged/slurmctld/slurmd, wait until the node is idle
#   .ci/slurm_cluster.sh stop         cancel this cluster's jobs, kill processes they left behind, stop exactly
#                                     the daemons recorded by `start`
#   .ci/slurm_cluster.sh status       daemons, node state, queue (exit 0 only when all daemons run and node is usable)
#   .ci/slurm_cluster.sh cpu-profile [DIR]
#                                     write a CPU-only copy of the repo's slurm/ profile (no GPU requests,
#                                     requests capped to this node, fast status checks); print its directory
#
# Works as root on Debian bookworm where PID 1 is not systemd (apt does not start the daemons; we do).
# All state (pids, logs, spool, controller state, munge pid/log/seed) lives under $TAPEBENCH_SLURM_DIR
# (default /tmp/tapebench-slurm). The only files written outside it are /etc/slurm/slurm.conf (so that sbatch,
# squeue, srun, ... find it without SLURM_CONF; a copy is kept in the state dir) and the munge socket in /run/munge.
#
# Environment:
#   TAPEBENCH_SLURM_DIR            state directory (default /tmp/tapebench-slurm)
#   TAPEBENCH_SLURM_START_TIMEOUT  seconds to wait for the node to become idle (default 60)
#   TAPEBENCH_SLURM_STOP_TIMEOUT   seconds to wait for each daemon to exit after SIGTERM (default 20)
#   TAPEBENCH_SLURM_FORCE_CONF=1   overwrite an /etc/slurm/slurm.conf that this script did not write
#   TAPEBENCH_SLURM_CPU_FACTOR     the node advertises this many CPUs per core (default 2; see write_conf)
#   TAPEBENCH_SLURM_GPU_RULES      cpu-profile: rules forced to gpu=0 (default "train train_block")
#   PYTHON                         interpreter for the pip check and cpu-profile (default python3)
set -euo pipefail

DIR="${TAPEBENCH_SLURM_DIR:-/tmp/tapebench-slurm}"
START_TIMEOUT="${TAPEBENCH_SLURM_START_TIMEOUT:-60}"
STOP_TIMEOUT="${TAPEBENCH_SLURM_STOP_TIMEOUT:-20}"
CPU_FACTOR="${TAPEBENCH_SLURM_CPU_FACTOR:-2}"
PYTHON="${PYTHON:-python3}"
ETC_CONF=/etc/slurm/slurm.conf
MARKER="# Managed by tapebench .ci/slurm_cluster.sh"
CLUSTER_NAME=tapebench
PKGS=(munge slurmctld slurmd slurm-client)
PLUGIN_REQ="snakemake-executor-plugin-slurm>=2"
# Daemons in start order; stop goes in reverse.
DAEMONS=(munged slurmctld slurmd)
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

log() { printf '[slurm_cluster] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
need_root() { [[ "$(id -u)" == 0 ]] || die "must run as root"; }

# --------------------------------------------------------------------------------------------- process helpers
# alive PID: process exists and is not a zombie (PID 1 here may not reap, so kill -0 alone is not enough).
alive() {
    local pid="$1" state
    [[ -n "$pid" && -r "/proc/$pid/status" ]] || return 1
    state="$(awk '/^State:/ {print $2; exit}' "/proc/$pid/status" 2>/dev/null || true)"
    [[ -n "$state" && "$state" != Z && "$state" != X ]]
}
# ours NAME: the recorded PID of NAME is alive and really is NAME (guards against PID reuse). Prints the PID.
ours() {
    local name="$1" f="$DIR/pids/$1.pid" pid
    [[ -r "$f" ]] || return 1
    pid="$(tr -dc 0-9 <"$f")"
    alive "$pid" || return 1
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$name" ]] || return 1
    echo "$pid"
}
munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
# daemon_ok NAME: NAME runs as recorded by us (or, for munged only, some munged answers that we did not start).
daemon_ok() { ours "$1" >/dev/null || { [[ "$1" == munged ]] && munge_works; }; }
# wait_pidfile FILE NAME TIMEOUT: wait until a daemon's own pidfile names a live NAME process; record it.
wait_pidfile() {
    local file="$1" name="$2" timeout="$3" pid t0=$SECONDS
    while (( SECONDS - t0 < timeout )); do
        if [[ -s "$file" ]]; then
            pid="$(tr -dc 0-9 <"$file")"
            if alive "$pid" && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$name" ]]; then
                echo "$pid" >"$DIR/pids/$name.pid"
                log "$name running, pid $pid"
                return 0
            fi
        fi
        sleep 0.2
    done
    return 1
}
# stop_one NAME: SIGTERM the recorded PID, wait, SIGKILL if needed. Never touches anything not recorded.
stop_one() {
    local name="$1" pid t0
    if ! pid="$(ours "$name")"; then
        rm -f "$DIR/pids/$name.pid"
        return 0
    fi
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    t0=$SECONDS
    while alive "$pid" && (( SECONDS - t0 < STOP_TIMEOUT )); do sleep 0.2; done
    if alive "$pid"; then
        log "$name (pid $pid) ignored SIGTERM for ${STOP_TIMEOUT}s, sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        t0=$SECONDS
        while alive "$pid" && (( SECONDS - t0 < 10 )); do sleep 0.2; done
        alive "$pid" && die "$name (pid $pid) did not exit"
    fi
    # The exited daemon is a zombie until PID 1 (its parent: it daemonized) reaps it; give it a moment.
    t0=$SECONDS
    while [[ -e "/proc/$pid" ]] && (( SECONDS - t0 < 5 )); do sleep 0.2; done
    [[ -e "/proc/$pid" ]] && log "$name (pid $pid) exited; PID 1 has not reaped it yet (zombie)"
    rm -f "$DIR/pids/$name.pid"
}

# ------------------------------------------------------------------------------------------------------ install
cmd_install() {
    need_root
    local missing=() p
    for p in "${PKGS[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if ((${#missing[@]})); then
        log "apt-get install ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q
        apt-get install -y -q --no-install-recommends "${missing[@]}"
    else
        log "apt packages already installed: ${PKGS[*]}"
    fi
    # munge's postinst creates the key; make sure anyway (e.g. images that strip /etc/munge).
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "creating /etc/munge/munge.key"
        install -d -o munge -g munge -m 0700 /etc/munge
        if command -v mungekey >/dev/null; then
            runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
        fi
        chown munge:munge /etc/munge/munge.key
        chmod 0400 /etc/munge/munge.key
    fi
    if "$PYTHON" - "$PLUGIN_REQ" <<'EOF'
import sys
from importlib.metadata import version, PackageNotFoundError
try:
    major = int(version("snakemake-executor-plugin-slurm").split(".")[0])
except PackageNotFoundError:
    sys.exit(1)
sys.exit(0 if major >= 2 else 1)
EOF
    then
        log "snakemake-executor-plugin-slurm already installed"
    else
        log "pip install $PLUGIN_REQ"
        "$PYTHON" -m pip install -q "$PLUGIN_REQ"
    fi
}

# -------------------------------------------------------------------------------------------------------- start
write_conf() {
    local cpus mem_total mem conf="$DIR/etc/slurm.conf"
    [[ "$CPU_FACTOR" =~ ^[1-9][0-9]*$ ]] || die "TAPEBENCH_SLURM_CPU_FACTOR must be a positive integer, got '$CPU_FACTOR'"
    cpus=$(( $(nproc) * CPU_FACTOR ))
    mem_total="$(slurmd -C | tr ' ' '\n' | sed -n 's/^RealMemory=//p')"
    [[ "$mem_total" =~ ^[0-9]+$ ]] || die "could not read RealMemory from 'slurmd -C'"
    mem=$(( mem_total * 9 / 10 ))
    cat >"$conf" <<EOF
$MARKER (state dir: $DIR). Regenerated on every start.
ClusterName=$CLUSTER_NAME
SlurmctldHost=localhost
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/slurmd
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
MpiDefault=none
# No cgroups and no systemd on the CI machines. Job processes are tracked by process group: with
# proctrack/linuxproc (parent PIDs), a process whose parent died (e.g. the snakemake inside a cancelled
# job, stuck in its shutdown after its batch shell was killed) is reparented, escapes the job's SIGKILL
# and lives on.
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# Start batch jobs right away (default delay up to 3 s per job; matters for short CI jobs).
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Finished jobs stay visible to squeue for 300 s: the snakemake slurm executor's squeue status command needs
# MinJobAge >= 3 x slurm-init-seconds-before-status-checks, or it falls back to sacct (which needs slurmdbd).
MinJobAge=300
ReturnToService=2
JobRequeue=1
KillWait=5
InactiveLimit=0
SlurmdTimeout=120
# GRES-free node: no GPUs in CI. Jobs asking for --gpus are rejected at submission.
# The node advertises TAPEBENCH_SLURM_CPU_FACTOR x its cores (config_overrides: slurmd reports these values
# instead of the hardware's): a pipeline's Slurm jobs spend most of their time starting Python and waiting,
# so jobs allocated 2 CPUs (group jobs, numba) would otherwise leave a 2-core CI machine half idle.
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
# DefMemPerCPU: without it a job with no --mem takes the whole node's memory.
PartitionName=main Nodes=localhost Default=YES MaxTime=INFINITE State=UP DefMemPerCPU=1000
EOF
    if [[ -e "$ETC_CONF" ]] && ! grep -qF "$MARKER" "$ETC_CONF" && [[ "${TAPEBENCH_SLURM_FORCE_CONF:-0}" != 1 ]]; then
        die "$ETC_CONF exists and was not written by this script; set TAPEBENCH_SLURM_FORCE_CONF=1 to overwrite"
    fi
    install -d -m 0755 /etc/slurm
    install -m 0644 "$conf" "$ETC_CONF"
    log "wrote $ETC_CONF (CPUs=$cpus = $(nproc) cores x $CPU_FACTOR, RealMemory=$mem of $mem_total MB)"
}

start_munged() {
    if ours munged >/dev/null; then return 0; fi
    # A munged we did not start (e.g. a system one) is used as is and never stopped by us.
    if munge_works; then
        log "munged already running (not started by this script); using it"
        return 0
    fi
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 "$DIR/munge"
    rm -f "$DIR/munge/munged.pid"
    runuser -u munge -- /usr/sbin/munged \
        --pid-file="$DIR/munge/munged.pid" \
        --log-file="$DIR/munge/munged.log" \
        --seed-file="$DIR/munge/munged.seed" \
        || die "munged failed to start; see $DIR/munge/munged.log"
    wait_pidfile "$DIR/munge/munged.pid" munged 15 || die "munged did not write its pidfile"
    munge -n | unmunge >/dev/null || die "munge credential round trip failed"
}

cmd_start() {
    need_root
    command -v slurmctld >/dev/null || die "slurm not installed; run: $0 install"
    local n_ours=0 d t0 state
    for d in "${DAEMONS[@]}"; do daemon_ok "$d" && n_ours=$((n_ours + 1)); done
    if (( n_ours == ${#DAEMONS[@]} )); then
        log "cluster already running (state dir $DIR)"
    else
        if (( n_ours > 0 )); then
            log "cluster partially running; stopping what we started, then starting afresh"
            cmd_stop
        fi
        local t_start=$SECONDS
        install -d -m 0755 "$DIR" "$DIR/pids" "$DIR/etc" "$DIR/run"
        install -d -o slurm -g slurm -m 0755 "$DIR/log" "$DIR/state" "$DIR/spool" "$DIR/spool/slurmd"
        chown slurm:slurm "$DIR/run"
        rm -f "$DIR/run/slurmctld.pid" "$DIR/run/slurmd.pid"
        write_conf
        start_munged
        # -c: start from a clean controller state (no jobs/node state left over from an earlier CI run).
        slurmctld -c || die "slurmctld failed to start; see $DIR/log/slurmctld.log"
        wait_pidfile "$DIR/run/slurmctld.pid" slurmctld 30 \
            || { tail -n 30 "$DIR/log/slurmctld.log" >&2 || true; die "slurmctld did not come up"; }
        # -N localhost: node name independent of `hostname`.
        slurmd -N localhost || die "slurmd failed to start; see $DIR/log/slurmd.log"
        wait_pidfile "$DIR/run/slurmd.pid" slurmd 30 \
            || { tail -n 30 "$DIR/log/slurmd.log" >&2 || true; die "slurmd did not come up"; }
        log "daemons up after $((SECONDS - t_start))s"
    fi
    t0=$SECONDS
    local resumed=0
    while :; do
        state="$(sinfo -h -n localhost -o %T 2>/dev/null | head -n1 || true)"
        if [[ "$state" == idle || "$state" == mixed || "$state" == allocated ]]; then break; fi
        if (( resumed == 0 && SECONDS - t0 >= 5 )) && [[ "$state" =~ ^(down|drain|drained|draining) ]]; then
            log "node state '$state'; trying scontrol update state=resume"
            scontrol update nodename=localhost state=resume >/dev/null 2>&1 || true
            resumed=1
        fi
        if (( SECONDS - t0 >= START_TIMEOUT )); then
            log "slurmctld log tail:"; tail -n 20 "$DIR/log/slurmctld.log" >&2 || true
            log "slurmd log tail:"; tail -n 20 "$DIR/log/slurmd.log" >&2 || true
            die "node 'localhost' not idle after ${START_TIMEOUT}s (sinfo state: '${state:-<no answer>}')." \
                "Daemons left running for inspection; run: $0 stop"
        fi
        sleep 0.5
    done
    log "node localhost is $state (waited $((SECONDS - t0))s)"
}

# --------------------------------------------------------------------------------------------------------- stop
cmd_stop() {
    need_root
    # Cancel the jobs of *this* cluster first, so no slurmstepd/job processes outlive the daemons.
    if ours slurmctld >/dev/null; then
        local ids t0
        ids="$(squeue -h -o %i 2>/dev/null | tr '\n' ' ' || true)"
        if [[ -n "${ids// /}" ]]; then
            log "cancelling jobs: $ids"
            # shellcheck disable=SC2086
            scancel $ids 2>/dev/null || true
            t0=$SECONDS
            while (( SECONDS - t0 < 30 )) && [[ -n "$(squeue -h -t R,CG,CF,PD -o %i 2>/dev/null)" ]]; do sleep 0.5; done
        fi
    fi
    local i strays
    # Processes of this cluster's jobs that outlived them (they carry the cluster name in their environment).
    strays="$(stray_job_pids)"
    if [[ -n "$strays" ]]; then
        log "killing processes left behind by ended jobs: $strays"
        # shellcheck disable=SC2086
        kill -KILL $strays 2>/dev/null || true
    fi
    for (( i=${#DAEMONS[@]}-1; i>=0; i-- )); do stop_one "${DAEMONS[i]}"; done
    log "stopped"
}

# Live processes started by a job of this cluster (SLURM_CLUSTER_NAME in their environment), one per line.
stray_job_pids() {
    local file pid
    grep -lzx "SLURM_CLUSTER_NAME=$CLUSTER_NAME" /proc/[0-9]*/environ 2>/dev/null | while read -r file; do
        pid="${file#/proc/}"
        pid="${pid%/environ}"
        [[ "$pid" != "$$" && "$pid" != "$BASHPID" ]] && alive "$pid" && echo "$pid"
    done
    return 0
}

# ------------------------------------------------------------------------------------------------------- status
cmd_status() {
    local d pid rc=0
    echo "state dir: $DIR"
    for d in "${DAEMONS[@]}"; do
        if pid="$(ours "$d")"; then echo "$d: running (pid $pid)"
        elif [[ "$d" == munged ]] && munge_works; then echo "$d: running (not started by this script)"
        else echo "$d: not running"; rc=3; fi
    done
    if command -v sinfo >/dev/null && sinfo -h >/dev/null 2>&1; then
        echo "node: $(sinfo -h -n localhost -o '%T cpus=%c mem=%m' 2>/dev/null)"
        echo "queue:"; squeue -o '%.8i %.10T %.12M %k' 2>/dev/null || true
    else
        echo "sinfo: no answer"; rc=3
    fi
    return $rc
}

# -------------------------------------------------------------------------------------------------- cpu-profile
# A CPU-only variant of slurm/config.yaml for machines without GPUs (CI). Derived, not copied by hand, so it
# cannot drift from the real profile: `gpu` is set to 0 for every rule in set-resources and for the rules in
# $TAPEBENCH_SLURM_GPU_RULES (default: train and train_block, whose rules declare gpu=config training.gpus); gpu_model/gres
# are dropped; cores/cpus_per_task/threads are capped to this machine's cores and mem_mb to the node's memory
# per advertised CPU; status checks start after 2 s.
cmd_cpu_profile() {
    local out="${1:-$DIR/profile-cpu}"
    mkdir -p "$out"
    "$PYTHON" - "$REPO_ROOT/slurm/config.yaml" "$out/config.yaml" "$(nproc)" "${TAPEBENCH_SLURM_GPU_RULES:-train train_block}" <<'EOF'
import sys, subprocess, yaml
src, dst, ncpu = sys.argv[1], sys.argv[2], int(sys.argv[3])
gpu_rules = sys.argv[4].split()
prof = yaml.safe_load(open(src))
try:
    node_mem, node_cpus = map(int, subprocess.check_output(
        ["sinfo", "-h", "-n", "localhost", "-o", "%m %c"], text=True).split()[:2])
except Exception:
    node_mem, node_cpus = 4000, 2
# A job may ask for at most one CPU's share of the node's memory, so that memory never limits how many
# jobs run at once (the CI jobs need far less than the real profile's requests).
cap_mem = max(500, node_mem // max(2, node_cpus))
def cap(res):
    res = dict(res)
    for k in ("gpu_model", "gres"):
        res.pop(k, None)
    if "gpu" in res:
        res["gpu"] = 0
    for k in ("cpus_per_task", "threads"):
        if isinstance(res.get(k), int):
            res[k] = min(res[k], ncpu)
    if isinstance(res.get("mem_mb"), int):
        res["mem_mb"] = min(res["mem_mb"], cap_mem)
    return res
prof["default-resources"] = cap(prof.get("default-resources") or {})
prof["set-resources"] = {r: cap(v) for r, v in (prof.get("set-resources") or {}).items()}
for rule in gpu_rules:  # rules whose GPU request comes from the workflow itself (train: config training.gpus)
    prof["set-resources"].setdefault(rule, {})["gpu"] = 0
prof["set-resources"] = {r: v for r, v in prof["set-resources"].items() if v}
if not prof["set-resources"]:
    del prof["set-resources"]
prof["slurm-init-seconds-before-status-checks"] = 2
if isinstance(prof.get("cores"), int):
    prof["cores"] = min(prof["cores"], ncpu)
with open(dst, "w") as fh:
    fh.write(f"# Generated by .ci/slurm_cluster.sh cpu-profile from {src}; do not edit.\n")
    yaml.safe_dump(prof, fh, sort_keys=False)
EOF
    echo "$out"
}

case "${1:-}" in
    install) cmd_install ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    cpu-profile) shift; cmd_cpu_profile "$@" ;;
    *) echo "usage: $0 {install|start|stop|status|cpu-profile [DIR]}" >&2; exit 2 ;;
esac
