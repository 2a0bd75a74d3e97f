# shellcheck shell=bash
# testcell-gridengine.sh - a real one-node Son of Grid Engine 8.1.9 cell (Debian's
# gridengine-* packages) beside the Slurm test cluster, reached over the same sshd
# by the same users. Sourced by testcluster.sh, which provides the helpers (its own
# pids_by_comm, kill_and_wait, ssh_opts, account_key; scripts/lib.sh's log, die,
# spawn_detached, wait_until, write_if_changed, apt_install_unstarted) and the settings (NODE_NAME, SSH_*, CLUSTER_DIR).
# See scripts/README.md.

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    echo "testcell-gridengine.sh is sourced by testcluster.sh; run: scripts/testcluster.sh up" >&2
    exit 2
fi

# ---------------------------------------------------------------- settings --
SGE_PACKAGES=(gridengine-master gridengine-exec gridengine-client)
SGE_ROOT_DIR=/var/lib/gridengine
SGE_CELL_NAME=default
SGE_COMMON_DIR="$SGE_ROOT_DIR/$SGE_CELL_NAME/common"
SGE_HOST_ALIASES="$SGE_COMMON_DIR/host_aliases"
SGE_ADMIN_USER=sgeadmin
SGE_SPOOL_DIR=/var/spool/gridengine
SGE_QMASTER_SPOOL="$SGE_SPOOL_DIR/qmaster"
SGE_QMASTER_MESSAGES="$SGE_QMASTER_SPOOL/messages"
SGE_SPOOLDB="$SGE_SPOOL_DIR/spooldb"
SGE_EXECD_SPOOL="$SGE_SPOOL_DIR/execd"
SGE_RUN_DIR=/var/run/gridengine
SGE_MASTER_PIDFILE="$SGE_RUN_DIR/qmaster.pid"
SGE_LOG_DIR=/var/log/gridengine            # daemons' stdout/stderr only

SGE_NODE="$NODE_NAME"
SGE_QUEUE=all.q
SGE_PE=smp
SGE_HOSTGROUP=@allhosts
SGE_QUEUE_SLOTS=64

# ----------------------------------------------------------------- helpers --
# Run a Grid Engine command against our cell, whatever the caller's environment says.
sge_run() { SGE_ROOT="$SGE_ROOT_DIR" SGE_CELL="$SGE_CELL_NAME" "$@"; }

# One "key value" line per attribute: continuation lines joined, blanks squeezed,
# comments and empty lines dropped. Used to compare qconf output with our files.
sge_norm() {
    sed -e ':a' -e '/\\$/{N;s/\\\n[[:space:]]*/ /;ba' -e '}' \
        | awk '/^[[:space:]]*#/{next} NF{$1=$1; print}'
}

# sge_set_keys KEY VALUE [KEY VALUE...] <conf >conf: replace the values of the keys.
sge_set_keys() {
    awk -v kv="$(printf '%s\n' "$@")" '
        BEGIN { n = split(kv, a, "\n"); for (i = 1; i + 1 <= n; i += 2) v[a[i]] = a[i + 1] }
        ($1 in v) { print $1, v[$1]; next }
        { print }'
}

# ---------------------------------------------------------------- packages --
sge_packages_missing() {
    local f st
    for f in /usr/lib/gridengine/sge_qmaster /usr/lib/gridengine/sge_execd \
             /usr/lib/gridengine/sge_shepherd /usr/lib/gridengine/qconf \
             /usr/lib/gridengine/qsub /usr/lib/gridengine/qrsh /usr/lib/gridengine/qacct \
             /usr/sbin/sge_qmaster /usr/sbin/sge_execd /usr/bin/qsub /usr/bin/qstat \
             /usr/bin/qconf /usr/share/gridengine/scripts/init_cluster; do
        [[ -x $f ]] || return 0
    done
    # Half-configured packages (an aborted postinst) count as missing.
    st="$(dpkg-query -W -f='${db:Status-Abbrev}\n' "${SGE_PACKAGES[@]}" 2>/dev/null)" || return 0
    grep -qv '^ii' <<<"$st" && return 0
    return 1
}

sge_ensure_packages() {
    sge_packages_missing || return 0
    log "installing ${SGE_PACKAGES[*]} (apt-get)"
    # Answer the packages' questions: the master's postinst then creates the cell
    # (init_cluster: SGE_ROOT=$SGE_ROOT_DIR, cell $SGE_CELL_NAME, admin user $SGE_ADMIN_USER).
    local owner
    for owner in gridengine-common gridengine-master gridengine-exec gridengine-client; do
        printf '%s shared/gridengineconfig boolean true\n' "$owner"
        printf '%s shared/gridenginecell string %s\n' "$owner" "$SGE_CELL_NAME"
        printf '%s shared/gridenginemaster string %s\n' "$owner" "$SGE_NODE"
    done | debconf-set-selections
    # The postinsts run `invoke-rc.d gridengine-* start`; there is no init system
    # here and we start the daemons ourselves.
    apt_install_unstarted "${SGE_PACKAGES[@]}"
    sge_packages_missing && die "Grid Engine packages still missing after apt-get install"
    return 0
}

# -------------------------------------------------------------------- cell --
# Names under which SGE may see this node (the reverse names of its addresses,
# e.g. "localhost" for 127.0.0.1), all aliased to the node name. Without this,
# qmaster refuses clients: "client IP resolved to host name "localhost". This is
# not identical to clients host name "vm"".
sge_render_host_aliases() {
    local addr names
    names="$({
        echo localhost
        getent hosts "$SGE_NODE" | awk '{print $2}'
        for addr in $(getent ahostsv4 "$SGE_NODE" | awk '{print $1}' | sort -u); do
            getent hosts "$addr" | awk '{print $2}'
        done
    } | awk -v n="$SGE_NODE" 'NF && $1 != n && !seen[$1]++ {printf " %s", $1}')"
    printf '%s%s\n' "$SGE_NODE" "$names"
}

# Files of the cell (created by the packages, repaired here). Returns 0 when a
# file the daemons read at start changed (they must restart), 1 otherwise.
sge_ensure_cell() {
    local changed=1 d
    id "$SGE_ADMIN_USER" >/dev/null 2>&1 || die "user $SGE_ADMIN_USER missing (gridengine-common not configured?)"
    for d in "$SGE_ROOT_DIR/$SGE_CELL_NAME" "$SGE_COMMON_DIR" "$SGE_QMASTER_SPOOL" \
             "$SGE_QMASTER_SPOOL/job_scripts" "$SGE_SPOOLDB" "$SGE_EXECD_SPOOL" "$SGE_RUN_DIR"; do
        [[ -d $d ]] || install -d -o "$SGE_ADMIN_USER" -g "$SGE_ADMIN_USER" -m 0755 "$d"
    done
    install -d -m 0755 "$SGE_LOG_DIR"
    if [[ ! -s $SGE_COMMON_DIR/bootstrap ]]; then
        log "writing $SGE_COMMON_DIR/bootstrap"
        install -m 0644 -o "$SGE_ADMIN_USER" -g "$SGE_ADMIN_USER" \
            /usr/share/gridengine/default-bootstrap "$SGE_COMMON_DIR/bootstrap"
        changed=0
    fi
    # The master's postinst runs init_cluster on a first install only (and only if
    # debconf said so); do it here when the spool database is missing.
    if [[ ! -e $SGE_SPOOLDB/sge ]]; then
        log "initialising cell $SGE_CELL_NAME (init_cluster)"
        runuser -u "$SGE_ADMIN_USER" -- /usr/share/gridengine/scripts/init_cluster \
            "$SGE_ROOT_DIR" "$SGE_CELL_NAME" "$SGE_SPOOLDB" "$SGE_ADMIN_USER" >&2 \
            || die "init_cluster failed"
        changed=0
    fi
    if printf '%s\n' "$SGE_NODE" | write_if_changed "$SGE_COMMON_DIR/act_qmaster" 0644; then
        log "wrote $SGE_COMMON_DIR/act_qmaster"
        changed=0
    fi
    chown "$SGE_ADMIN_USER:$SGE_ADMIN_USER" "$SGE_COMMON_DIR/act_qmaster"
    if sge_render_host_aliases | write_if_changed "$SGE_HOST_ALIASES" 0644; then
        log "wrote $SGE_HOST_ALIASES ($(cat "$SGE_HOST_ALIASES"))"
        changed=0
    fi
    return "$changed"
}

# ----------------------------------------------------------------- daemons --
sge_qmaster_pids() { pids_by_comm sge_qmaster; }
sge_execd_pids()   { pids_by_comm sge_execd; }

sge_qmaster_ok() { sge_run timeout 20 qconf -sh >/dev/null 2>&1; }

sge_start_qmaster() {
    if [[ -n $(sge_qmaster_pids) ]]; then
        wait_until 60 sge_qmaster sge_qmaster_ok \
            || die "sge_qmaster running but not answering (see $SGE_QMASTER_MESSAGES)"
        return 0
    fi
    log "starting sge_qmaster"
    install -d -o "$SGE_ADMIN_USER" -g "$SGE_ADMIN_USER" -m 0755 "$SGE_RUN_DIR"
    # No qmaster runs, so a lock file left by one that was killed is stale.
    rm -f "$SGE_QMASTER_SPOOL/lock" "$SGE_MASTER_PIDFILE"
    spawn_detached "$SGE_LOG_DIR/qmaster.stdout" env SGE_ROOT="$SGE_ROOT_DIR" \
        SGE_CELL="$SGE_CELL_NAME" SGE_MASTER_PIDFILE="$SGE_MASTER_PIDFILE" /usr/sbin/sge_qmaster
    if ! wait_until 60 sge_qmaster sge_qmaster_ok; then
        tail -n 20 "$SGE_QMASTER_MESSAGES" >&2 || true
        die "sge_qmaster did not come up (see $SGE_QMASTER_MESSAGES, $SGE_LOG_DIR/qmaster.stdout)"
    fi
}

sge_stop_qmaster() {
    local pids
    mapfile -t pids < <(sge_qmaster_pids)
    [[ ${#pids[@]} -gt 0 ]] || return 0
    log "stopping sge_qmaster (${pids[*]})"
    kill_and_wait 30 "${pids[@]}"
    rm -f "$SGE_MASTER_PIDFILE"
}

sge_execd_registered() { sge_run qconf -sel 2>/dev/null | grep -qxF "$SGE_NODE"; }

sge_start_execd() {
    [[ -n $(sge_execd_pids) ]] && return 0
    log "starting sge_execd"
    install -d -o "$SGE_ADMIN_USER" -g "$SGE_ADMIN_USER" -m 0755 "$SGE_EXECD_SPOOL" "$SGE_RUN_DIR"
    spawn_detached "$SGE_LOG_DIR/execd.stdout" env SGE_ROOT="$SGE_ROOT_DIR" \
        SGE_CELL="$SGE_CELL_NAME" /usr/sbin/sge_execd
    wait_until 30 sge_execd test -n "$(sge_execd_pids)" || true
    wait_until 60 "sge_execd to register" sge_execd_registered \
        || die "sge_execd did not register (see $SGE_EXECD_SPOOL/*/messages, $SGE_LOG_DIR/execd.stdout)"
}

sge_stop_execd() {
    local pids
    mapfile -t pids < <(sge_execd_pids)
    [[ ${#pids[@]} -gt 0 ]] || return 0
    log "stopping sge_execd (${pids[*]})"
    kill_and_wait 30 "${pids[@]}"
}

# State letters of the queue instance (qstat -f): "" = usable, "-" = not listed,
# e.g. "u" = execd not heard of yet, "au", "d" = disabled, "E" = error.
sge_queue_state() {
    local out
    out="$(sge_run qstat -f -q "$SGE_QUEUE@$SGE_NODE" 2>/dev/null)" || { echo -; return 0; }
    awk -v q="$SGE_QUEUE@$SGE_NODE" '$1 == q { print (NF >= 6 ? $6 : ""); f = 1; exit }
                                     END { if (!f) print "-" }' <<<"$out"
}

sge_queue_ready() { [[ -z $(sge_queue_state) ]]; }

# Wait until the queue instance takes jobs; re-enable / clear it if a test (or an
# unclean stop) left it disabled, suspended or in error. After a qmaster restart
# the instance stays "u" until the running execd registers again: about 25 s.
sge_wait_queue_ready() {
    local deadline=$((SECONDS + 150)) next_fix=$((SECONDS + 2)) said=0 st
    while ! sge_queue_ready; do
        st="$(sge_queue_state)"
        if [[ $st == *u* ]] && ((!said && SECONDS >= next_fix)); then
            log "waiting for sge_execd to report to sge_qmaster ($SGE_QUEUE@$SGE_NODE state '$st')"
            said=1
        fi
        if ((SECONDS >= deadline)); then
            sge_run qstat -f >&2 || true
            die "queue instance $SGE_QUEUE@$SGE_NODE not usable (state '$st'; see $SGE_QMASTER_MESSAGES)"
        fi
        if ((SECONDS >= next_fix)) && [[ $st != - ]]; then
            [[ $st == *E* ]] && { log "$SGE_QUEUE@$SGE_NODE in error - clearing"; sge_run qmod -c "$SGE_QUEUE@$SGE_NODE" >/dev/null 2>&1 || true; }
            [[ $st == *d* ]] && { log "$SGE_QUEUE@$SGE_NODE disabled - enabling"; sge_run qmod -e "$SGE_QUEUE@$SGE_NODE" >/dev/null 2>&1 || true; }
            [[ $st == *s* ]] && { log "$SGE_QUEUE@$SGE_NODE suspended - resuming"; sge_run qmod -us "$SGE_QUEUE@$SGE_NODE" >/dev/null 2>&1 || true; }
            next_fix=$((SECONDS + 5))
        fi
        sleep 0.25
    done
}

# ------------------------------------------------------------ configuration --
# sge_ensure_object WHAT NAME SHOW ADD MODIFY FILE: make object NAME match FILE.
sge_ensure_object() {
    local what="$1" name="$2" show="$3" add="$4" mod="$5" file="$6" cur
    if cur="$(sge_run qconf "$show" "$name" 2>/dev/null)"; then
        [[ $(sge_norm <<<"$cur") == "$(sge_norm <"$file")" ]] && return 0
        log "updating $what $name"
        sge_run qconf "$mod" "$file" >&2 || die "qconf $mod ($what $name) failed"
    else
        log "adding $what $name"
        sge_run qconf "$add" "$file" >&2 || die "qconf $add ($what $name) failed"
    fi
}

# Node as admin and submit host; global and scheduler configuration. Before execd.
sge_configure_master() {
    local tmp cur
    if ! sge_run qconf -sh 2>/dev/null | grep -qxF "$SGE_NODE"; then
        log "adding admin host $SGE_NODE"
        sge_run qconf -ah "$SGE_NODE" >&2
    fi
    if ! sge_run qconf -ss 2>/dev/null | grep -qxF "$SGE_NODE"; then
        log "adding submit host $SGE_NODE"
        sge_run qconf -as "$SGE_NODE" >&2
    fi
    tmp="$(mktemp -d)"
    # Global configuration: accounting flushed every second (qacct sees a finished
    # job at once), load reports every 10 s. -Mconf takes the file named "global".
    cur="$(sge_run qconf -sconf global | sge_norm)"
    sge_set_keys reporting_params \
        "accounting=true reporting=false flush_time=00:00:01 joblog=false sharelog=00:00:00" \
        load_report_time 00:00:10 <<<"$cur" >"$tmp/global"
    if [[ $(sge_norm <"$tmp/global") != "$cur" ]]; then
        log "updating global configuration"
        sge_run qconf -Mconf "$tmp/global" >&2 || die "qconf -Mconf failed"
    fi
    # Scheduler: run every second and right after a submit / a job's end.
    cur="$(sge_run qconf -ssconf | sge_norm)"
    sge_set_keys schedule_interval 0:0:1 flush_submit_sec 1 flush_finish_sec 1 \
        <<<"$cur" >"$tmp/sconf"
    if [[ $(sge_norm <"$tmp/sconf") != "$cur" ]]; then
        log "updating scheduler configuration"
        sge_run qconf -Msconf "$tmp/sconf" >&2 || die "qconf -Msconf failed"
    fi
    rm -rf "$tmp"
}

# Host group, parallel environment and queue. After execd registered the host.
sge_configure_queue() {
    local tmp
    tmp="$(mktemp -d)"
    printf 'group_name %s\nhostlist %s\n' "$SGE_HOSTGROUP" "$SGE_NODE" >"$tmp/hgrp"
    sge_ensure_object "host group" "$SGE_HOSTGROUP" -shgrp -Ahgrp -Mhgrp "$tmp/hgrp"
    # control_slaves TRUE: `qrsh -inherit` into a job works only in such a PE.
    cat >"$tmp/pe" <<EOF
pe_name            $SGE_PE
slots              999
user_lists         NONE
xuser_lists        NONE
start_proc_args    NONE
stop_proc_args     NONE
allocation_rule    \$pe_slots
control_slaves     TRUE
job_is_first_task  FALSE
urgency_slots      min
accounting_summary FALSE
qsort_args         NONE
EOF
    sge_ensure_object "parallel environment" "$SGE_PE" -sp -Ap -Mp "$tmp/pe"
    # The queue: qconf's template with our values.
    sge_run qconf -sq | sge_norm | sge_set_keys qname "$SGE_QUEUE" hostlist "$SGE_HOSTGROUP" \
        slots "$SGE_QUEUE_SLOTS" load_thresholds NONE pe_list "$SGE_PE" shell /bin/bash \
        >"$tmp/queue"
    sge_ensure_object queue "$SGE_QUEUE" -sq -Aq -Mq "$tmp/queue"
    rm -rf "$tmp"
}

# ------------------------------------------------------------ entry points --
sge_up() {
    sge_ensure_packages
    if sge_ensure_cell && [[ -n "$(sge_qmaster_pids)$(sge_execd_pids)" ]]; then
        log "Grid Engine cell files changed - restarting its daemons"
        sge_stop_execd
        sge_stop_qmaster
    fi
    sge_start_qmaster
    sge_configure_master
    sge_start_execd
    sge_configure_queue
    sge_wait_queue_ready
    # The qmaster creates its accounting file when the first job ends; until then qacct cannot
    # open it, which the adapter reads as a cell without accounting (FINISHED, no exit code).
    if [[ ! -e "$SGE_COMMON_DIR/accounting" ]]; then
        install -o "$SGE_ADMIN_USER" -g "$SGE_ADMIN_USER" -m 644 /dev/null "$SGE_COMMON_DIR/accounting"
    fi
    # The users' clients (no SGE_ROOT in their environment) reach the qmaster.
    runuser -u "$SSH_USER" -- qstat -f >/dev/null 2>&1 \
        || die "qstat as $SSH_USER fails: $(runuser -u "$SSH_USER" -- qstat -f 2>&1 | head -n 3)"
}

sge_down() {
    sge_stop_execd
    sge_stop_qmaster
}

# Lines for .cluster/cluster.env
sge_env_lines() {
    cat <<EOF
ACTIVATE_TEST_SGE_QUEUE=${SGE_QUEUE}
ACTIVATE_TEST_SGE_PE=${SGE_PE}
ACTIVATE_TEST_SGE_NODE=${SGE_NODE}
EOF
}

sge_status() {
    local st=
    printf 'qmaster   : %s\n' "$(sge_qmaster_ok && echo up || echo DOWN)"
    printf 'execd     : %s\n' "$([[ -n $(sge_execd_pids) ]] && echo up || echo DOWN)"
    if sge_qmaster_ok; then
        st="$(sge_queue_state)"
        st="$([[ -z $st ]] && echo ok || echo "state '$st'")"
    else
        st="unknown (qmaster down)"
    fi
    printf 'sge queue : %s %s\n' "$SGE_QUEUE@$SGE_NODE" "$st"
}

sge_summary() {
    cat <<EOF
Grid Engine cell '$SGE_CELL_NAME' is UP (SGE_ROOT=$SGE_ROOT_DIR)
  queue     : $SGE_QUEUE@$SGE_NODE, $SGE_QUEUE_SLOTS slots, parallel environment $SGE_PE
------------------------------------------------------------------------
EOF
}

# End-to-end check over SSH: qstat; qsub (script on stdin) as the test user; the
# job runs; `qrsh -inherit` into it works for its owner and is refused to another
# user; qdel; qacct sees the ended job.
sge_run_check() {
    local opts bob_opts jid out st bob
    mapfile -t opts < <(ssh_opts)
    mapfile -t bob_opts < <(ssh_opts "$(account_key "${ACCOUNTS[1]}")")
    # shellcheck disable=SC2029  # arguments are meant to be expanded here
    sge_rs_in() { ssh "${opts[@]}" "$SSH_USER@$SSH_HOST" "$@"; }   # passes stdin on
    sge_rs() { sge_rs_in "$@" </dev/null; }

    echo "== qstat -f (Grid Engine)"; sge_rs qstat -f
    echo "== qsub -pe $SGE_PE 1 (script on stdin)"
    jid="$(sge_rs_in "qsub -terse -N tc-sge-check -pe $SGE_PE 1 -j y -o 'tc-sge-check.\$JOB_ID.out'" <<'EOF'
#!/bin/bash
echo "sge job $JOB_ID on $(hostname) as $(id -un), NSLOTS=$NSLOTS"
sleep 30
EOF
)"
    [[ $jid =~ ^[0-9]+$ ]] || die "qsub printed '$jid'"
    echo "job $jid"
    wait_until 30 "SGE job $jid running" \
        bash -c "SGE_ROOT=$SGE_ROOT_DIR SGE_CELL=$SGE_CELL_NAME qstat -u '*' | awk '\$1 == $jid && \$5 == \"r\" {f=1} END {exit !f}'" \
        || { sge_run qstat -j "$jid" >&2 || true; die "SGE job $jid not running"; }
    sge_rs qstat -u "$SSH_USER"
    echo "== qrsh -inherit $SGE_NODE hostname (as $SSH_USER)"
    sge_rs "JOB_ID=$jid SGE_TASK_ID=undefined qrsh -inherit $SGE_NODE hostname" \
        || die "qrsh -inherit into job $jid failed"
    echo "== qrsh -inherit as ${ACCOUNTS[1]} (must be refused)"
    # shellcheck disable=SC2029
    if bob="$(ssh "${bob_opts[@]}" "${ACCOUNTS[1]}@$SSH_HOST" \
              "JOB_ID=$jid SGE_TASK_ID=undefined qrsh -inherit $SGE_NODE hostname" </dev/null 2>&1)"; then
        die "${ACCOUNTS[1]} could run in $SSH_USER's job $jid: $bob"
    fi
    echo "refused: $bob"
    echo "== qdel $jid"; sge_rs qdel "$jid"
    wait_until 30 "SGE job $jid to end" \
        bash -c "! SGE_ROOT=$SGE_ROOT_DIR SGE_CELL=$SGE_CELL_NAME qstat -u '*' | awk '\$1 == $jid {f=1} END {exit !f}'" \
        || die "SGE job $jid did not end after qdel"
    wait_until 15 "qacct -j $jid" sge_rs qacct -j "$jid" || die "qacct does not know job $jid"
    echo "== qacct -j $jid"; sge_rs qacct -j "$jid" | grep -E '^(qname|owner|jobname|granted_pe|slots|failed|exit_status) '
    out="$(sge_rs cat "tc-sge-check.$jid.out")"; sge_rs rm -f "tc-sge-check.$jid.out"
    echo "== job output"; printf '%s\n' "$out"
    [[ $out == "sge job $jid on "* ]] || die "unexpected output of SGE job $jid"
    st="$(sge_queue_state)"
    [[ -z $st ]] || die "queue instance $SGE_QUEUE@$SGE_NODE in state '$st'"
    echo "Grid Engine check OK"
}
