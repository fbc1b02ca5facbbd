#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, to try profiles/slurm by hand and to run
# tests/test_slurm.py (CI). Not a way to run a real cluster.
#
#   workflow/scripts/slurm_local.sh start [--install] [options]   configure + start, wait for the node
#   workflow/scripts/slurm_local.sh status                        exit 0 when up, 3 when not running
#   workflow/scripts/slurm_local.sh stop                          cancel jobs, stop what start started
#
# Options (or the environment variable in brackets):
#   --install          apt-get install slurmctld slurmd slurm-client munge when missing (nothing
#                      is installed without it)
#   --dir DIR          config, state, logs and pid files      [FEDFACTOR_SLURM_DIR, /tmp/fedfactor-slurm]
#   --partition NAME   the one (default) partition            [FEDFACTOR_SLURM_PARTITION, local]
#   --gpus N|auto      GPUs on the node: auto = the /dev/nvidiaN devices if there are any, else one
#                      fake GPU (/dev/fakegpuN, a copy of /dev/null) so GPU requests are accepted
#                      and can be checked; 0 = none                         [FEDFACTOR_SLURM_GPUS, auto]
#   --cpus N           CPUs advertised                        [FEDFACTOR_SLURM_CPUS, nproc]
#   --mem-mb M         RealMemory advertised                  [FEDFACTOR_SLURM_MEM_MB, 75% of MemTotal]
#   --port P           slurmctld port, slurmd uses P+1        [FEDFACTOR_SLURM_PORT, 6817]
# More CPUs or memory than the machine has lets a profile's real requests be accepted on a small
# CI runner (nothing enforces them here: no cgroups); that needs SlurmdParameters=config_overrides
# and task/none instead of task/affinity, which would bind to CPUs that do not exist.
#
# Needs root: it starts munged (as the munge user) and the daemons directly, without systemd.
# /etc/slurm/slurm.conf becomes a symbolic link to DIR/etc/slurm.conf while the cluster runs:
# every client finds it there, including the `srun` the Snakemake job step runs inside a job with
# SLURM_CONF removed from its environment. An existing slurm.conf not written by this script is
# never replaced.
# No slurmdbd: `sacct` fails here, so Snakemake needs `--slurm-status-command squeue` (MinJobAge is
# 600 s, well above the plugin's 3 x init-delay threshold).
set -euo pipefail

PROG=workflow/scripts/slurm_local.sh
MARKER="# written by fedfactor $PROG"
ETC_CONF=/etc/slurm/slurm.conf

die() {
    echo "slurm_local.sh: error: $*" >&2
    exit 1
}
say() { echo "slurm_local.sh: $*"; }

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
}

# ---------------------------------------------------------------- arguments
cmd=""
install=0
DIR=${FEDFACTOR_SLURM_DIR:-/tmp/fedfactor-slurm}
PARTITION=${FEDFACTOR_SLURM_PARTITION:-local}
GPUS=${FEDFACTOR_SLURM_GPUS:-auto}
CPUS=${FEDFACTOR_SLURM_CPUS:-}
MEM_MB=${FEDFACTOR_SLURM_MEM_MB:-}
PORT=${FEDFACTOR_SLURM_PORT:-6817}
while (($#)); do
    case $1 in
        start | stop | status)
            [[ -z $cmd ]] || die "one command at a time (got '$cmd' and '$1')"
            cmd=$1
            ;;
        --install) install=1 ;;
        --dir | --partition | --gpus | --cpus | --mem-mb | --port)
            (($# >= 2)) || die "$1 needs a value"
            case $1 in
                --dir) DIR=$2 ;;
                --partition) PARTITION=$2 ;;
                --gpus) GPUS=$2 ;;
                --cpus) CPUS=$2 ;;
                --mem-mb) MEM_MB=$2 ;;
                --port) PORT=$2 ;;
            esac
            shift
            ;;
        -h | --help)
            usage
            exit 0
            ;;
        *) die "unknown argument '$1' (try --help)" ;;
    esac
    shift
done
[[ -n $cmd ]] || die "no command: start, stop or status (try --help)"
[[ $DIR == /* ]] || DIR=$PWD/$DIR
[[ $PARTITION =~ ^[A-Za-z0-9_-]+$ ]] || die "bad partition name '$PARTITION'"
[[ $GPUS == auto || $GPUS =~ ^[0-9]+$ ]] || die "--gpus takes a number or 'auto', not '$GPUS'"
[[ -z $CPUS || $CPUS =~ ^[1-9][0-9]*$ ]] || die "--cpus takes a positive number, not '$CPUS'"
[[ -z $MEM_MB || $MEM_MB =~ ^[1-9][0-9]*$ ]] || die "--mem-mb takes a positive number, not '$MEM_MB'"
[[ $PORT =~ ^[1-9][0-9]*$ ]] || die "--port takes a number, not '$PORT'"

CONF=$DIR/etc/slurm.conf
RUN=$DIR/run
LOGS=$DIR/log
NODE=$(hostname -s)
# every SLURM command below reads our config, whatever /etc/slurm holds
export SLURM_CONF=$CONF

# ---------------------------------------------------------------- process helpers
# is_running PID NAME: PID is a live process (not a zombie: without systemd a killed daemon may
# wait a while to be reaped) whose command name is NAME
is_running() {
    local stat
    [[ $1 =~ ^[0-9]+$ ]] || return 1
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    [[ $stat == "$1 ($2) "* ]] || return 1
    stat=${stat#*) }
    [[ ${stat:0:1} != [ZX] ]]
}

# pid_alive PIDFILE NAME
pid_alive() { [[ -s $1 ]] && is_running "$(<"$1")" "$2"; }

# stop_pid PIDFILE NAME: TERM, wait up to 15 s, then KILL; only the pid in our own pid file
stop_pid() {
    local pid
    [[ -s $1 ]] || return 0
    pid=$(<"$1")
    if is_running "$pid" "$2"; then
        say "stopping $2 (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 150); do
            is_running "$pid" "$2" || break
            sleep 0.1
        done
        if is_running "$pid" "$2"; then
            say "$2 (pid $pid) ignored TERM for 15 s: KILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$1"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

ctld_up() { scontrol ping 2>/dev/null | grep -q 'is UP'; }

node_state() { sinfo -h -n "$NODE" -o %T 2>/dev/null | head -n 1; }

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

# ---------------------------------------------------------------- status
do_status() {
    local state
    if ! pid_alive "$RUN/slurmctld.pid" slurmctld || ! pid_alive "$RUN/slurmd.pid" slurmd; then
        say "not running (no live daemons with pid files under $RUN)"
        return 3
    fi
    ctld_up || {
        say "daemons alive but slurmctld does not answer; see $LOGS/slurmctld.log"
        return 1
    }
    state=$(node_state)
    say "running: $(sinfo -h -o 'partition %P, %D node %T, %c cpus, %m MB, gres %G' | head -n 1) ($CONF)"
    case $state in
        idle | mixed | allocated | completing) ;;
        *)
            say "node $NODE is '$state', not usable; see $LOGS/slurmd.log"
            return 1
            ;;
    esac
}

# ---------------------------------------------------------------- stop
do_stop() {
    local jobs
    [[ $(id -u) == 0 ]] || die "must run as root (it stops the daemons start started): sudo $PROG stop"
    if pid_alive "$RUN/slurmctld.pid" slurmctld && ctld_up; then
        jobs=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')
        if [[ -n ${jobs// /} ]]; then
            say "cancelling jobs $jobs"
            # shellcheck disable=SC2086  # one argument per job id
            scancel $jobs 2>/dev/null || true
            for _ in $(seq 50); do
                [[ -z $(squeue -h -t R,CG -o %i 2>/dev/null) ]] && break
                sleep 0.2
            done
        fi
    fi
    stop_pid "$RUN/slurmd.pid" slurmd
    stop_pid "$RUN/slurmctld.pid" slurmctld
    if [[ -s $RUN/munged.pid ]]; then # only a munged this script started
        stop_pid "$RUN/munged.pid" munged
    fi
    if [[ -L $ETC_CONF && $(readlink "$ETC_CONF") == "$CONF" ]]; then
        rm -f "$ETC_CONF"
    fi
    say "stopped (config and logs kept in $DIR)"
}

# ---------------------------------------------------------------- start
install_packages() {
    local pkgs=(slurmctld slurmd slurm-client munge) missing=() p
    for p in "${pkgs[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    command -v apt-get >/dev/null || die "no apt-get to install ${missing[*]}; install SLURM and munge yourself"
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # the package lists may be empty (fresh container) or stale: update only when install fails
    if ! apt-get install -y --no-install-recommends "${missing[@]}" >"$DIR/apt.log" 2>&1; then
        apt-get update >>"$DIR/apt.log" 2>&1 || die "apt-get update failed; see $DIR/apt.log"
        apt-get install -y --no-install-recommends "${missing[@]}" >>"$DIR/apt.log" 2>&1 ||
            die "apt-get install ${missing[*]} failed; see $DIR/apt.log"
    fi
}

start_munge() {
    local key=/etc/munge/munge.key
    if munge_ok; then
        return 0 # a running munged (ours from an earlier start, or the system's): use it
    fi
    install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
    install -d -o munge -g munge -m 0755 /run/munge
    if [[ ! -s $key ]]; then
        say "creating $key"
        dd if=/dev/urandom of="$key" bs=1024 count=1 status=none
    fi
    chown munge:munge "$key"
    chmod 0400 "$key"
    rm -f /run/munge/munged.pid
    say "starting munged"
    runuser -u munge -- /usr/sbin/munged || die "munged did not start; see /var/log/munge/munged.log"
    for _ in $(seq 50); do
        munge_ok && break
        sleep 0.1
    done
    munge_ok || die "munge -n | unmunge fails; see /var/log/munge/munged.log"
    cp /run/munge/munged.pid "$RUN/munged.pid" # stop stops it again
}

# gpu_files: sets GPU_COUNT and GPU_DEVICES (device files for gres.conf) from --gpus
gpu_files() {
    local real=() i
    for i in /dev/nvidia[0-9]*; do [[ -c $i ]] && real+=("$i"); done
    GPU_COUNT=$GPUS
    if [[ $GPUS == auto ]]; then
        GPU_COUNT=${#real[@]}
        ((GPU_COUNT)) || GPU_COUNT=1
    fi
    GPU_DEVICES=()
    ((GPU_COUNT)) || return 0
    if ((${#real[@]} >= GPU_COUNT)); then
        GPU_DEVICES=("${real[@]:0:GPU_COUNT}")
        return 0
    fi
    # fake GPUs: character devices 1,3 behave like /dev/null; slurmd only needs the files to exist
    # (without File= it registers 0 GPUs and the node goes INVAL)
    for ((i = 0; i < GPU_COUNT; i++)); do
        if [[ ! -c /dev/fakegpu$i ]] && ! mknod -m 0666 "/dev/fakegpu$i" c 1 3 2>/dev/null; then
            say "warning: cannot create /dev/fakegpu$i (mknod not allowed here): no GPUs on the node"
            GPU_COUNT=0
            GPU_DEVICES=()
            return 0
        fi
        GPU_DEVICES+=("/dev/fakegpu$i")
    done
}

write_config() {
    local nproc_ total_kb mem dev task=task/affinity gres="" grestypes=""
    local overrides="# (SlurmdParameters=config_overrides only when advertising more than there is)"
    nproc_=$(nproc)
    total_kb=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
    CPUS=${CPUS:-$nproc_}
    # 75% of MemTotal in whole GiB: below what slurmd detects (else the node drains with "Low
    # RealMemory") and stable from one start to the next
    mem=$((total_kb * 3 / 4 / 1024 / 1024 * 1024))
    ((mem >= 1024)) || mem=$((total_kb * 3 / 4 / 1024))
    MEM_MB=${MEM_MB:-$mem}
    if ((CPUS > nproc_ || MEM_MB > total_kb / 1024)); then
        overrides="SlurmdParameters=config_overrides"
        task=task/none
    fi
    gpu_files
    if ((GPU_COUNT)); then
        grestypes="GresTypes=gpu"
        gres=" Gres=gpu:$GPU_COUNT"
    fi
    NEW_CONF=$(
        cat <<EOF
$MARKER
# one node ($NODE on 127.0.0.1), one partition; see the script for why each line is here
ClusterName=fedfactor
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=$task
$overrides
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# a job without --mem gets its CPUs' share, not the whole node (jobs would run one at a time)
DefMemPerCPU=$((MEM_MB / CPUS))
# reject at submission what the node can never run (it would pend forever)
EnforcePartLimits=ALL
# finished jobs stay visible to squeue / scontrol show job for 10 minutes
MinJobAge=600
ReturnToService=2
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
$grestypes
StateSaveLocation=$DIR/state/slurmctld
SlurmdSpoolDir=$DIR/state/slurmd
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB$gres State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
    )
    NEW_GRES="# GPUs of node $NODE (none when empty)"
    for dev in "${GPU_DEVICES[@]}"; do
        NEW_GRES+=$'\n'"NodeName=$NODE Name=gpu File=$dev"
    done
}

do_start() {
    local changed=0 state="" other b t0=$SECONDS
    [[ $(id -u) == 0 ]] || die "must run as root (it starts munged and the SLURM daemons): sudo $PROG start"
    mkdir -p "$DIR"
    if ((install)); then install_packages; fi
    for b in slurmctld slurmd sinfo scontrol squeue sbatch munged munge; do
        command -v "$b" >/dev/null || [[ -x /usr/sbin/$b ]] ||
            die "'$b' not found: SLURM is not installed; run: $PROG start --install"
    done
    mkdir -p "$DIR/etc" "$RUN" "$LOGS" "$DIR/state/slurmctld" "$DIR/state/slurmd"
    chmod 0755 "$DIR" "$DIR/etc"

    # /etc/slurm/slurm.conf -> ours; never replace a config this script did not write
    if [[ -L $ETC_CONF ]]; then
        other=$(readlink -f "$ETC_CONF" || true)
        if [[ $other != "$CONF" && -e $other ]]; then
            head -n 1 "$other" | grep -qxF "$MARKER" ||
                die "$ETC_CONF links to $other, not written by this script: another SLURM is configured here"
            # left by a start with another --dir: refuse while that cluster runs
            ! pid_alive "$(dirname "$(dirname "$other")")/run/slurmctld.pid" slurmctld ||
                die "the cluster of $other is running; stop it first (with its --dir)"
        fi
    elif [[ -e $ETC_CONF ]]; then
        die "$ETC_CONF exists and was not written by this script: another SLURM is configured here"
    fi

    start_munge
    write_config
    if [[ ! -f $CONF || "$(<"$CONF")" != "$NEW_CONF" ]]; then
        printf '%s\n' "$NEW_CONF" >"$CONF"
        changed=1
    fi
    if [[ ! -f $DIR/etc/gres.conf || "$(<"$DIR/etc/gres.conf")" != "$NEW_GRES" ]]; then
        printf '%s\n' "$NEW_GRES" >"$DIR/etc/gres.conf"
        changed=1
    fi
    chmod 0644 "$CONF" "$DIR/etc/gres.conf"
    mkdir -p /etc/slurm
    ln -sfn "$CONF" "$ETC_CONF"

    if ((changed)); then # new node or GRES definition: `scontrol reconfigure` is not enough
        stop_pid "$RUN/slurmd.pid" slurmd
        stop_pid "$RUN/slurmctld.pid" slurmctld
    fi
    if ! pid_alive "$RUN/slurmctld.pid" slurmctld; then
        port_in_use "$PORT" && die "port $PORT is in use (another slurmctld?); use --port"
        port_in_use $((PORT + 1)) && die "port $((PORT + 1)) is in use (another slurmd?); use --port"
        /usr/sbin/slurmctld -f "$CONF" || die "slurmctld did not start; see $LOGS/slurmctld.log"
    fi
    for _ in $(seq 100); do
        ctld_up && break
        sleep 0.1
    done
    ctld_up || die "slurmctld is not answering after 10 s; see $LOGS/slurmctld.log"
    if ! pid_alive "$RUN/slurmd.pid" slurmd; then
        /usr/sbin/slurmd -f "$CONF" || die "slurmd did not start; see $LOGS/slurmd.log"
    fi

    # `idle*` (or `down*`, `unknown*`): slurmd has not registered yet
    for _ in $(seq 300); do
        state=$(node_state)
        case $state in
            idle | mixed | allocated | completing) break ;;
            drain* | inval* | fail*)
                die "node $NODE is $state: $(sinfo -h -R -o %E | head -n 1); see $LOGS/slurmd.log"
                ;;
        esac
        sleep 0.1
    done
    case $state in
        idle | mixed | allocated | completing) ;;
        *) die "node $NODE still '$state' after 30 s; see $LOGS/slurmd.log" ;;
    esac
    say "ready in $((SECONDS - t0)) s: $(sinfo -h -o 'partition %P, %D node %T, %c cpus, %m MB, gres %G' | head -n 1)"
    say "no accounting here: run snakemake with --slurm-status-command squeue"
}

case $cmd in
    start) do_start ;;
    stop) do_stop ;;
    status) do_status ;;
esac
