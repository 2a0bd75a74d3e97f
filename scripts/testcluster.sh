#!/usr/bin/env bash
# testcluster.sh - turn this (Debian 12) machine into a real single-node Slurm
# cluster, plus a one-node Grid Engine cell (testcell-gridengine.sh), reachable
# over real SSH on loopback, for tests and `make run`.
#
# Usage: scripts/testcluster.sh {up|down|status|check|env|
#                                stop-sshd|start-sshd|stop-slurmctld|start-slurmctld|
#                                empty-slurmctld|stop-qmaster|start-qmaster}
#
# Idempotent: `up` on an already running cluster only verifies it (fast).
# Must run as root. See scripts/README.md.
set -euo pipefail

# ---------------------------------------------------------------- settings --
REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CLUSTER_DIR="$REPO_ROOT/.cluster"
ENV_FILE="$CLUSTER_DIR/cluster.env"
CLIENT_KEY="$CLUSTER_DIR/id_ed25519"
KNOWN_HOST_FILE="$CLUSTER_DIR/known_host"      # "ssh-ed25519 AAAA..."
KNOWN_HOSTS_FILE="$CLUSTER_DIR/known_hosts"    # "[127.0.0.1]:2222 ssh-ed25519 AAAA..."

SSH_HOST=127.0.0.1
SSH_PORT=2222
SSH_USER=pwtest
# Per-user cluster accounts: each logs in with a key of its own (.cluster/id_ed25519_<name>),
# so tests can prove that Slurm and the OS keep one user's jobs from another.
ACCOUNTS=(pwalice pwbob)
# The people of the identity tests: pwcarol signs in through the OpenID provider, pwdave
# through the LDAP directory (scripts/directory.sh). They reach the cluster with a
# certificate of the platform's CA; the keys they get too are only for checks.
IDENTITY_ACCOUNTS=(pwcarol pwdave)
# The CAs whose user certificates sshd accepts (one public key a line; tests append theirs).
# sshd reads it at each authentication, so a new line counts without a reload.
USER_CA_KEYS=/etc/ssh/activate_test_user_ca_keys
SSHD_CONFIG=/etc/ssh/sshd_activate_test_config
SSHD_HOST_KEY=/etc/ssh/ssh_host_ed25519_key
SSHD_PIDFILE=/run/sshd_activate_test.pid
SSHD_LOG=/var/log/sshd_activate_test.log

SLURM_CONF=/etc/slurm/slurm.conf
SLURM_CLUSTER_NAME=activatetest
SLURM_PARTITION=debug
SLURM_LOG_DIR=/var/log/slurm
SLURMCTLD_PIDFILE=/run/slurmctld.pid
SLURMD_PIDFILE=/run/slurmd.pid
SLURM_STATE_DIR=/var/lib/slurm/slurmctld
SLURMD_SPOOL_DIR=/var/lib/slurm/slurmd
# Declared CPUs (overcommitted on purpose: many tiny 1-CPU jobs at once).
SLURM_MIN_CPUS="${ACTIVATE_TEST_CLUSTER_CPUS:-64}"

LOCK_FILE=/run/activate-testcluster.lock
# tmux: kept terminals (tests/e2e/test_terminal.py) need it on the node.
# zsh: pw's zsh completion is tested too.
# nftables: a host cut off from the others in a network namespace (harness/netns.py).
# faketime: libfaketime, a clock 10 min off for one process (tests/*/test_clock_steps.py).
PACKAGES=(munge slurmctld slurmd slurm-client openssh-server tmux zsh nftables faketime)

NODE_NAME="$(uname -n)"
NODE_NAME="${NODE_NAME%%.*}"   # short host name, as slurmd/slurmctld use it

LOG_TAG=testcluster
# shellcheck source=scripts/lib.sh
. "$REPO_ROOT/scripts/lib.sh"

# The Grid Engine cell (settings and sge_* functions).
# shellcheck source=scripts/testcell-gridengine.sh
. "$REPO_ROOT/scripts/testcell-gridengine.sh"

# ----------------------------------------------------------------- helpers --
# pids whose /proc/PID/comm equals $1 (optionally cmdline contains $2)
pids_by_comm() {
    local want="$1" needle="${2:-}" d c cmd
    for d in /proc/[0-9]*; do
        read -r c 2>/dev/null <"$d/comm" || continue
        [[ $c == "$want" ]] || continue
        if [[ -n $needle ]]; then
            cmd="$(tr '\0' ' ' 2>/dev/null <"$d/cmdline")" || continue
            [[ $cmd == *"$needle"* ]] || continue
        fi
        echo "${d#/proc/}"
    done
}

ppid_of() { awk '/^PPid:/{print $2}' "/proc/$1/status" 2>/dev/null || true; }

# Kill the given pids (TERM, then KILL after $timeout s) and wait until gone.
kill_and_wait() {
    local timeout="$1"; shift
    local pids=("$@") p alive deadline
    [[ ${#pids[@]} -gt 0 ]] || return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    deadline=$((SECONDS + timeout))
    while :; do
        alive=()
        for p in "${pids[@]}"; do [[ -d /proc/$p ]] && alive+=("$p"); done
        [[ ${#alive[@]} -eq 0 ]] && return 0
        if ((SECONDS >= deadline)); then
            kill -KILL "${alive[@]}" 2>/dev/null || true
            sleep 0.2
            return 0
        fi
        sleep 0.1
    done
}

# ---------------------------------------------------------------- packages --
packages_missing() {
    local f
    for f in /usr/sbin/munged /usr/bin/munge /usr/bin/unmunge \
             /usr/sbin/slurmctld /usr/sbin/slurmd /usr/bin/sbatch /usr/bin/sinfo \
             /usr/bin/scontrol /usr/bin/srun /usr/sbin/sshd /usr/bin/ssh \
             /usr/bin/ssh-keygen /usr/bin/tmux /usr/bin/zsh /usr/sbin/nft /usr/bin/faketime; do
        [[ -x $f ]] || return 0
    done
    return 1
}

ensure_packages() {
    packages_missing || return 0
    log "installing ${PACKAGES[*]} (apt-get)"
    # Lock timeout: wait for any concurrently running apt/dpkg instead of failing.
    apt-get -o DPkg::Lock::Timeout=600 update
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 \
        install -y "${PACKAGES[@]}"
    packages_missing && die "packages still missing after apt-get install"
    return 0
}

# ------------------------------------------------------------------- munge --
munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

ensure_munge() {
    install -d -o munge -g munge -m 0700 /etc/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "creating /etc/munge/munge.key"
        if command -v mungekey >/dev/null 2>&1; then
            mungekey --create --keyfile=/etc/munge/munge.key --force
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
        fi
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 0600 /etc/munge/munge.key
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/lib/munge
    install -d -o munge -g munge -m 0700 /var/log/munge

    munge_ok && return 0
    # A stale munged (or stale socket) may be around; clear it.
    local pids
    mapfile -t pids < <(pids_by_comm munged)
    kill_and_wait 10 "${pids[@]}"
    rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock /run/munge/munged.pid
    log "starting munged"
    spawn_detached /var/log/munge/munged.stdout \
        runuser -u munge -- /usr/sbin/munged
    wait_until 20 munge munge_ok || die "munged did not come up (see /var/log/munge/)"
}

# ------------------------------------------------------------------- slurm --
mem_total_mb() { awk '/^MemTotal:/{print int($2/1024)}' /proc/meminfo; }

render_slurm_conf() {
    local cpus mem
    cpus="$(nproc)"
    ((cpus < SLURM_MIN_CPUS)) && cpus="$SLURM_MIN_CPUS"
    mem="$(mem_total_mb)"
    mem=$((mem * 95 / 100))
    ((mem < 1)) && mem=1
    cat <<EOF
# Generated by scripts/testcluster.sh - single-node TEST cluster. Do not edit.
ClusterName=${SLURM_CLUSTER_NAME}
SlurmctldHost=${NODE_NAME}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=${SLURM_STATE_DIR}
SlurmdSpoolDir=${SLURMD_SPOOL_DIR}
SlurmctldPidFile=${SLURMCTLD_PIDFILE}
SlurmdPidFile=${SLURMD_PIDFILE}
SlurmctldLogFile=${SLURM_LOG_DIR}/slurmctld.log
SlurmdLogFile=${SLURM_LOG_DIR}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1,default_queue_depth=1000,bf_max_job_test=1000,bf_continue
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Let the node declare more CPUs/memory than physically present.
SlurmdParameters=config_overrides
ReturnToService=2
InactiveLimit=0
KillWait=5
MinJobAge=600
MaxJobCount=20000
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=${NODE_NAME} NodeAddr=127.0.0.1 NodeHostname=${NODE_NAME} CPUs=${cpus} RealMemory=${mem} State=UNKNOWN
PartitionName=debug Nodes=${NODE_NAME} Default=YES MaxTime=INFINITE State=UP
PartitionName=short Nodes=${NODE_NAME} MaxTime=01:00:00 State=UP
EOF
}

slurmctld_pids() { pids_by_comm slurmctld; }
slurmd_pids()    { pids_by_comm slurmd; }

slurmctld_ping() { scontrol ping 2>/dev/null | grep -q 'is UP'; }

# First state of our node as sinfo prints it (e.g. idle, mixed, idle*, drained)
node_state() { sinfo -h -N -n "$NODE_NAME" -o '%T' 2>/dev/null | head -n1; }

node_ready() {
    case "$(node_state)" in
        idle|mixed|allocated|completing) return 0 ;;
        *) return 1 ;;
    esac
}

ensure_slurm_config() {
    install -d -m 0755 /etc/slurm "$SLURM_LOG_DIR" "$SLURM_STATE_DIR" "$SLURMD_SPOOL_DIR"
    if render_slurm_conf | write_if_changed "$SLURM_CONF" 0644; then
        log "wrote $SLURM_CONF"
        return 0   # changed
    fi
    return 1
}

start_slurmctld() {
    if [[ -n $(slurmctld_pids) ]]; then
        wait_until 60 slurmctld slurmctld_ping || die "slurmctld running but not answering (see $SLURM_LOG_DIR/slurmctld.log)"
        return 0
    fi
    log "starting slurmctld"
    rm -f "$SLURMCTLD_PIDFILE"
    spawn_detached "$SLURM_LOG_DIR/slurmctld.stdout" /usr/sbin/slurmctld
    wait_until 60 slurmctld slurmctld_ping || die "slurmctld did not come up (see $SLURM_LOG_DIR/slurmctld.log)"
}

stop_slurmctld() {
    local pids
    mapfile -t pids < <(slurmctld_pids)
    [[ ${#pids[@]} -gt 0 ]] || return 0
    log "stopping slurmctld (${pids[*]})"
    kill_and_wait 30 "${pids[@]}"
    rm -f "$SLURMCTLD_PIDFILE"
}

start_slurmd() {
    [[ -n $(slurmd_pids) ]] && return 0
    log "starting slurmd"
    rm -f "$SLURMD_PIDFILE"
    spawn_detached "$SLURM_LOG_DIR/slurmd.stdout" /usr/sbin/slurmd -N "$NODE_NAME"
    wait_until 30 slurmd test -s "$SLURMD_PIDFILE" || die "slurmd did not come up (see $SLURM_LOG_DIR/slurmd.log)"
}

stop_slurmd() {
    local pids
    mapfile -t pids < <(slurmd_pids)
    [[ ${#pids[@]} -gt 0 ]] || return 0
    log "stopping slurmd (${pids[*]})"
    kill_and_wait 30 "${pids[@]}"
    rm -f "$SLURMD_PIDFILE"
}

# Wait until the node is usable; resume it if it is down/drained (a test
# cluster should never stay drained after e.g. an unclean restart).
wait_node_ready() {
    local deadline=$((SECONDS + 90)) next_resume=$((SECONDS + 3)) st
    while ! node_ready; do
        st="$(node_state)"
        if ((SECONDS >= deadline)); then
            scontrol show node "$NODE_NAME" >&2 || true
            die "node $NODE_NAME not ready (state '$st'; see $SLURM_LOG_DIR/)"
        fi
        if [[ $st == *drain* || $st == down* ]] && ((SECONDS >= next_resume)); then
            log "node state '$st' - resuming"
            scontrol update NodeName="$NODE_NAME" State=RESUME >/dev/null 2>&1 || true
            next_resume=$((SECONDS + 5))
        fi
        sleep 0.25
    done
}

ensure_slurm() {
    local changed=0
    ensure_slurm_config && changed=1
    if ((changed)) && [[ -n "$(slurmctld_pids)$(slurmd_pids)" ]]; then
        log "slurm.conf changed - restarting Slurm daemons"
        stop_slurmd
        stop_slurmctld
    fi
    start_slurmctld
    start_slurmd
    wait_node_ready
}

# --------------------------------------------------------------------- ssh --
account_key() { echo "$CLUSTER_DIR/id_ed25519_$1"; }

# ensure_user NAME HOME_MODE
ensure_user() {
    local user="$1" mode="$2" home
    if ! getent passwd "$user" >/dev/null; then
        log "creating user $user"
        useradd --create-home --shell /bin/bash "$user"
    fi
    home="$(getent passwd "$user" | cut -d: -f6)"
    [[ -d $home ]] || install -d -o "$user" -g "$(id -gn "$user")" -m "$mode" "$home"
    chmod "$mode" "$home"
    # With UsePAM=no sshd refuses accounts whose password field starts with
    # '!' (locked, useradd's default). '*' = no password, but not locked.
    if [[ $(getent shadow "$user" | cut -d: -f2) == '!'* ]]; then
        usermod -p '*' "$user"
    fi
}

ensure_users() {
    local account
    ensure_user "$SSH_USER" 0755
    # The accounts' homes (where their jobs write) are closed to each other.
    for account in "${ACCOUNTS[@]}" "${IDENTITY_ACCOUNTS[@]}"; do ensure_user "$account" 0700; done
}

# ensure_client_key USER KEYFILE: the key exists and USER's authorized_keys holds it.
ensure_client_key() {
    local user="$1" key="$2"
    install -d -m 0755 "$CLUSTER_DIR"
    if [[ ! -s $key || ! -s $key.pub ]]; then
        log "generating client key $key"
        rm -f "$key" "$key.pub"
        ssh-keygen -q -t ed25519 -N '' -C "activate-testcluster-$user" -f "$key"
    fi
    chmod 0600 "$key"
    chmod 0644 "$key.pub"

    local home group pub
    home="$(getent passwd "$user" | cut -d: -f6)"
    group="$(id -gn "$user")"
    pub="$(cat "$key.pub")"
    install -d -o "$user" -g "$group" -m 0700 "$home/.ssh"
    touch "$home/.ssh/authorized_keys"
    grep -qxF -- "$pub" "$home/.ssh/authorized_keys" || printf '%s\n' "$pub" >>"$home/.ssh/authorized_keys"
    chown "$user:$group" "$home/.ssh/authorized_keys"
    chmod 0600 "$home/.ssh/authorized_keys"
}

ensure_client_keys() {
    local account
    ensure_client_key "$SSH_USER" "$CLIENT_KEY"
    for account in "${ACCOUNTS[@]}" "${IDENTITY_ACCOUNTS[@]}"; do
        ensure_client_key "$account" "$(account_key "$account")"
    done
}

host_key_line() { awk '{print $1" "$2}' "$SSHD_HOST_KEY.pub"; }

render_sshd_config() {
    cat <<EOF
# Generated by scripts/testcluster.sh - dedicated TEST sshd. Do not edit.
Port ${SSH_PORT}
ListenAddress ${SSH_HOST}
HostKey ${SSHD_HOST_KEY}
PidFile ${SSHD_PIDFILE}
AllowUsers ${SSH_USER} ${ACCOUNTS[*]} ${IDENTITY_ACCOUNTS[*]}
PermitRootLogin no
AuthenticationMethods publickey
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
HostbasedAuthentication no
PermitEmptyPasswords no
UsePAM no
AuthorizedKeysFile .ssh/authorized_keys
TrustedUserCAKeys ${USER_CA_KEYS}
StrictModes yes
UseDNS no
PrintMotd no
X11Forwarding no
LoginGraceTime 30
MaxAuthTries 6
MaxSessions 100
MaxStartups 100:30:200
AcceptEnv LANG LC_*
Subsystem sftp internal-sftp
LogLevel INFO
EOF
}

sshd_pids() { pids_by_comm sshd "$SSHD_CONFIG"; }

# ssh_opts [KEYFILE]
ssh_opts() {
    printf '%s\n' -i "${1:-$CLIENT_KEY}" -p "$SSH_PORT" \
        -o BatchMode=yes -o IdentitiesOnly=yes -o StrictHostKeyChecking=yes \
        -o UserKnownHostsFile="$KNOWN_HOSTS_FILE" -o GlobalKnownHostsFile=/dev/null \
        -o ConnectTimeout=5 -o LogLevel=ERROR
}

# ssh_ok [USER KEYFILE]: USER (default: the test user) logs in with KEYFILE.
ssh_ok() {
    local opts
    mapfile -t opts < <(ssh_opts "${2:-$CLIENT_KEY}")
    ssh "${opts[@]}" "${1:-$SSH_USER}@$SSH_HOST" true </dev/null
}

ensure_sshd_host_key() {
    if [[ ! -s $SSHD_HOST_KEY || ! -s $SSHD_HOST_KEY.pub ]]; then
        log "generating host key $SSHD_HOST_KEY"
        rm -f "$SSHD_HOST_KEY" "$SSHD_HOST_KEY.pub"
        ssh-keygen -q -t ed25519 -N '' -f "$SSHD_HOST_KEY"
    fi
}

# Created empty, never emptied: the lines tests add are theirs to remove.
ensure_user_ca_keys() {
    [[ -e $USER_CA_KEYS ]] || : >"$USER_CA_KEYS"
    chown root:root "$USER_CA_KEYS"
    chmod 0644 "$USER_CA_KEYS"
}

ensure_sshd_config() {
    ensure_sshd_host_key
    ensure_user_ca_keys
    install -d -m 0755 /run/sshd
    if render_sshd_config | write_if_changed "$SSHD_CONFIG" 0644; then
        log "wrote $SSHD_CONFIG"
        /usr/sbin/sshd -t -f "$SSHD_CONFIG" || die "invalid $SSHD_CONFIG"
        return 0
    fi
    return 1
}

start_sshd() {
    install -d -m 0755 /run/sshd
    if [[ -z $(sshd_pids) ]]; then
        log "starting sshd on $SSH_HOST:$SSH_PORT"
        rm -f "$SSHD_PIDFILE"
        spawn_detached "$SSHD_LOG" /usr/sbin/sshd -f "$SSHD_CONFIG" -E "$SSHD_LOG"
    fi
    wait_until 30 sshd ssh_ok || die "sshd does not accept the test key (see $SSHD_LOG)"
}

# Simulates an outage: stops the listener AND drops established connections.
stop_sshd() {
    local listeners=() conns=() p l
    mapfile -t listeners < <(sshd_pids)
    [[ ${#listeners[@]} -gt 0 ]] || return 0
    for p in $(pids_by_comm sshd); do
        for l in "${listeners[@]}"; do
            [[ $(ppid_of "$p") == "$l" ]] && conns+=("$p")
        done
    done
    log "stopping sshd (${listeners[*]}; ${#conns[@]} connection(s))"
    kill_and_wait 10 "${listeners[@]}"
    [[ ${#conns[@]} -gt 0 ]] && kill_and_wait 10 "${conns[@]}"
    rm -f "$SSHD_PIDFILE"
}

ensure_sshd() {
    local pids account
    if ensure_sshd_config; then
        mapfile -t pids < <(sshd_pids)
        if [[ ${#pids[@]} -gt 0 ]]; then
            # SIGHUP: sshd re-executes itself with the new config and keeps the sessions it
            # has (other test runs' kept connections), unlike a restart.
            log "sshd config changed - reloading sshd (${pids[*]})"
            kill -HUP "${pids[@]}"
            sleep 0.5
        fi
    fi
    start_sshd
    for account in "${ACCOUNTS[@]}" "${IDENTITY_ACCOUNTS[@]}"; do
        wait_until 30 "sshd ($account)" ssh_ok "$account" "$(account_key "$account")" \
            || die "sshd does not accept $account's key (see $SSHD_LOG)"
    done
}

write_cluster_files() {
    install -d -m 0755 "$CLUSTER_DIR"
    local hk
    hk="$(host_key_line)"
    printf '%s\n' "$hk" | write_if_changed "$KNOWN_HOST_FILE" 0644 || true
    printf '[%s]:%s %s\n' "$SSH_HOST" "$SSH_PORT" "$hk" | write_if_changed "$KNOWN_HOSTS_FILE" 0644 || true
    local account accounts
    accounts="$(IFS=,; echo "${ACCOUNTS[*]}")"
    {
        cat <<EOF
ACTIVATE_TEST_SSH_HOST=${SSH_HOST}
ACTIVATE_TEST_SSH_PORT=${SSH_PORT}
ACTIVATE_TEST_SSH_USER=${SSH_USER}
ACTIVATE_TEST_SSH_KEY=${CLIENT_KEY}
ACTIVATE_TEST_SSH_HOST_KEY=${hk}
ACTIVATE_TEST_SLURM_PARTITION=${SLURM_PARTITION}
ACTIVATE_TEST_ACCOUNTS=${accounts}
EOF
        printf 'ACTIVATE_TEST_IDENTITY_ACCOUNTS=%s\n' "$(IFS=,; echo "${IDENTITY_ACCOUNTS[*]}")"
        printf 'ACTIVATE_TEST_USER_CA_KEYS=%s\n' "$USER_CA_KEYS"
        for account in "${ACCOUNTS[@]}" "${IDENTITY_ACCOUNTS[@]}"; do
            printf 'ACTIVATE_TEST_ACCOUNT_KEY_%s=%s\n' "$account" "$(account_key "$account")"
        done
        sge_env_lines
    } | write_if_changed "$ENV_FILE" 0644 || true
}

# ------------------------------------------------------------------ checks --
# End-to-end check over SSH as the test user (sbatch/squeue/scontrol/scancel/
# sinfo/srun --overlap, python3 and loopback HTTP from inside a job).
run_check() {
    local opts
    mapfile -t opts < <(ssh_opts)
    # shellcheck disable=SC2029  # arguments are meant to be expanded here
    rs() { ssh "${opts[@]}" "$SSH_USER@$SSH_HOST" "$@"; }

    # Tiny HTTP server on loopback (root side) for the job to talk to.
    local portfile srvpid port
    portfile="$(mktemp)"
    python3 - "$portfile" 9>&- <<'PY' &
import http.server, socketserver, sys, threading
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"pong")
    def log_message(self, *a): pass
srv = socketserver.TCPServer(("127.0.0.1", 0), H)
open(sys.argv[1], "w").write(str(srv.server_address[1]))
threading.Timer(120, srv.shutdown).start()
srv.serve_forever()
PY
    srvpid=$!
    wait_until 10 http test -s "$portfile"
    port="$(cat "$portfile")"; rm -f "$portfile"

    echo "== sinfo"; rs sinfo
    echo "== sbatch (script on stdin): python3 + HTTP to 127.0.0.1:$port"
    local jid
    jid="$(rs sbatch --parsable --job-name=tc-check --time=2 -o 'tc-check-%j.out' <<EOF
#!/bin/bash
/usr/bin/python3 -c 'import urllib.request,sys; print("http:", urllib.request.urlopen("http://127.0.0.1:$port/").read().decode()); print("py", sys.version.split()[0])'
sleep 20
EOF
)"
    echo "job $jid"
    wait_until 30 running bash -c "[[ \$(squeue -h -j $jid -o %T) == RUNNING ]]" || die "job $jid not running"
    echo "== squeue"; rs squeue -j "$jid" -o "'%.10i %.9P %.20j %.8u %.10T %.10M %.10l %.6D %R'"
    echo "== srun --jobid=$jid --overlap hostname"; rs srun --jobid="$jid" --overlap hostname
    echo "== scancel $jid"; rs scancel "$jid"
    wait_until 30 ended bash -c "[[ \$(scontrol show job $jid 2>/dev/null) != *JobState=RUNNING* && \$(scontrol show job $jid 2>/dev/null) != *JobState=COMPLETING* ]]"
    echo "== scontrol show job $jid (after end)"
    rs scontrol show job "$jid" | grep -oE '(JobState|Reason|ExitCode)=[^ ]+'
    local out
    out="$(rs cat "tc-check-$jid.out")"; rs rm -f "tc-check-$jid.out"
    echo "== job output"; printf '%s\n' "$out"
    kill "$srvpid" 2>/dev/null || true
    wait "$srvpid" 2>/dev/null || true
    [[ $out == *"http: pong"* ]] || die "job could not reach http://127.0.0.1:$port/"
    echo "check OK"
}

# ----------------------------------------------------------------- summary --
summary() {
    cat <<EOF
------------------------------------------------------------------------
Slurm test cluster is UP
  node      : $NODE_NAME ($(node_state)), partitions: debug (default), short
  ssh       : ssh -i $CLIENT_KEY -p $SSH_PORT -o UserKnownHostsFile=$KNOWN_HOSTS_FILE $SSH_USER@$SSH_HOST
  env file  : $ENV_FILE
------------------------------------------------------------------------
EOF
    sinfo
}

# -------------------------------------------------------------------- main --
usage() {
    cat >&2 <<EOF
usage: $0 {up|down|status|check|env|stop-sshd|start-sshd|stop-slurmctld|start-slurmctld|empty-slurmctld|stop-qmaster|start-qmaster}
EOF
    exit 2
}

cmd="${1:-}"
case "$cmd" in
    env)
        echo "$ENV_FILE"
        exit 0 ;;
    up|down|status|check|stop-sshd|start-sshd|stop-slurmctld|start-slurmctld|empty-slurmctld|stop-qmaster|start-qmaster) ;;
    *) usage ;;
esac

need_root
take_lock

case "$cmd" in
    up)
        ensure_packages
        ensure_munge
        ensure_users
        ensure_client_keys
        ensure_sshd_host_key
        write_cluster_files
        ensure_slurm
        ensure_sshd
        sge_up
        [[ -x /usr/bin/python3 ]] || log "WARNING: /usr/bin/python3 missing - jobs that need it will fail"
        summary
        sge_summary
        ;;
    down)
        stop_slurmd
        stop_slurmctld
        sge_down
        stop_sshd
        log "down (munged left running)"
        ;;
    status)
        printf 'munged    : %s\n' "$(munge_ok && echo up || echo DOWN)"
        printf 'slurmctld : %s\n' "$(slurmctld_ping && echo up || echo DOWN)"
        printf 'slurmd    : %s\n' "$([[ -n $(slurmd_pids) ]] && echo up || echo DOWN)"
        printf 'node      : %s\n' "$(node_state || true)"
        printf 'sshd      : %s\n' "$(ssh_ok >/dev/null 2>&1 && echo up || echo DOWN)"
        sge_status
        ;;
    check)
        run_check
        sge_run_check
        ;;
    stop-sshd)
        stop_sshd ;;
    start-sshd)
        ensure_users
        ensure_client_keys
        ensure_sshd_host_key
        write_cluster_files
        ensure_sshd ;;
    stop-slurmctld)
        stop_slurmctld ;;
    start-slurmctld)
        ensure_munge
        start_slurmctld
        wait_node_ready ;;
    empty-slurmctld)
        # Every job forgotten, ended ones too (kept MinJobAge): a controller as if new, which
        # benchmarks race on. Job ids start again from 1.
        stop_slurmctld
        rm -rf "$SLURM_STATE_DIR"/job_state "$SLURM_STATE_DIR"/job_state.old "$SLURM_STATE_DIR"/hash.*
        ensure_munge
        start_slurmctld
        wait_node_ready ;;
    stop-qmaster)
        sge_stop_qmaster ;;
    start-qmaster)
        sge_start_qmaster
        sge_wait_queue_ready ;;
esac
