#!/usr/bin/env bash
# standby.sh - a PostgreSQL primary and its streaming standby of the tests' own (Debian's
# postgresql clusters, apart from the "main" one everything else uses): the primary on
# 127.0.0.1:5440, the standby on 127.0.0.1:5441 streaming from it. What the failover tests stop
# and promote; never the machine's main PostgreSQL.
#
# Usage: scripts/standby.sh {up|down|status|env}
#
# `up` is idempotent and repairs: a pair that is not "primary up, standby up and streaming from
# it" (after a test stopped the primary and promoted the standby, say) is made again from
# nothing (a few seconds). Must run as root. See scripts/README.md.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
ENV_FILE="$REPO_ROOT/.cluster/standby.env"
LOCK_FILE=/run/activate-standby.lock
LOG_TAG=standby
# shellcheck source=scripts/lib.sh
. "$REPO_ROOT/scripts/lib.sh"

PRIMARY=activate_primary
STANDBY=activate_standby
PRIMARY_PORT=5440
STANDBY_PORT=5441

version() { ls /usr/lib/postgresql | sort -V | tail -n 1; }
as_postgres() { runuser -u postgres -- "$@"; }
data_dir() { echo "/var/lib/postgresql/$(version)/$1"; }
# Never with the lock's descriptor: a server started holding it would hold the lock for good.
ctl() { pg_ctlcluster --skip-systemctl-redirect "$(version)" "$@" 9>&-; }
sql() { as_postgres psql -h 127.0.0.1 -p "$1" -U postgres -Atqc "$2" 2>/dev/null; }

exists() { pg_lsclusters -h 2>/dev/null | awk '{print $2}' | grep -qx "$1"; }

healthy() {
    [[ $(sql "$PRIMARY_PORT" "SELECT pg_is_in_recovery()") == f ]] || return 1
    [[ $(sql "$STANDBY_PORT" "SELECT pg_is_in_recovery()") == t ]] || return 1
    [[ $(sql "$PRIMARY_PORT" "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'") -ge 1 ]]
}

drop() {
    local name
    for name in "$STANDBY" "$PRIMARY"; do
        if exists "$name"; then
            pg_dropcluster --stop "$(version)" "$name"
        fi
    done
}

settings() {
    # Loopback only, trust there (as the machine's main cluster in the tests), replication too.
    local name="$1" conf
    conf="/etc/postgresql/$(version)/$name"
    cat >"$conf/conf.d/activate.conf" <<EOF
listen_addresses = '127.0.0.1'
wal_level = replica
max_wal_senders = 5
wal_keep_size = '64MB'
hot_standby = on
EOF
    if [[ $name == "$PRIMARY" ]]; then
        # A commit is answered once the standby has it: what was acknowledged survives a failover.
        echo "synchronous_standby_names = '*'" >>"$conf/conf.d/activate.conf"
    fi
    cat >"$conf/pg_hba.conf" <<EOF
local all all trust
host all all 127.0.0.1/32 trust
host replication all 127.0.0.1/32 trust
EOF
}

make_pair() {
    log "making the primary ($PRIMARY_PORT) and its standby ($STANDBY_PORT)"
    pg_createcluster --port "$PRIMARY_PORT" "$(version)" "$PRIMARY" >/dev/null
    settings "$PRIMARY"
    ctl "$PRIMARY" start
    wait_until 30 "the primary" sql "$PRIMARY_PORT" "SELECT 1"
    pg_createcluster --port "$STANDBY_PORT" "$(version)" "$STANDBY" >/dev/null
    settings "$STANDBY"
    rm -rf "$(data_dir "$STANDBY")"
    install -d -o postgres -g postgres -m 0700 "$(data_dir "$STANDBY")"
    # -R: standby.signal and primary_conninfo, so it starts as a standby streaming from it.
    as_postgres pg_basebackup -h 127.0.0.1 -p "$PRIMARY_PORT" -U postgres -D "$(data_dir "$STANDBY")" \
        -R -X stream -c fast
    ctl "$STANDBY" start
    wait_until 60 "the standby streaming" healthy
}

up() {
    need_root
    take_lock
    command -v pg_createcluster >/dev/null || die "no PostgreSQL server tools: run scripts/services.sh"
    if exists "$PRIMARY" && exists "$STANDBY"; then
        ctl "$PRIMARY" start >/dev/null 2>&1 || true
        ctl "$STANDBY" start >/dev/null 2>&1 || true
        if wait_until 10 "the pair" healthy; then
            write_env
            log "up: primary 127.0.0.1:$PRIMARY_PORT, standby 127.0.0.1:$STANDBY_PORT (streaming)"
            return 0
        fi
        log "the pair is not a primary with its standby streaming: making it again"
    fi
    drop
    make_pair
    write_env
    log "up: primary 127.0.0.1:$PRIMARY_PORT, standby 127.0.0.1:$STANDBY_PORT (streaming)"
}

write_env() {
    mkdir -p "$(dirname "$ENV_FILE")"
    write_if_changed "$ENV_FILE" 0644 <<EOF || true
ACTIVATE_TEST_PG_VERSION=$(version)
ACTIVATE_TEST_PG_PRIMARY=$PRIMARY
ACTIVATE_TEST_PG_PRIMARY_PORT=$PRIMARY_PORT
ACTIVATE_TEST_PG_STANDBY=$STANDBY
ACTIVATE_TEST_PG_STANDBY_PORT=$STANDBY_PORT
EOF
}

down() {
    need_root
    take_lock
    drop
    rm -f "$ENV_FILE"
}

status() {
    if healthy; then
        echo "primary 127.0.0.1:$PRIMARY_PORT, standby 127.0.0.1:$STANDBY_PORT streaming"
    else
        echo "not up"
        return 1
    fi
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    env) echo "$ENV_FILE" ;;
    *) echo "usage: $0 {up|down|status|env}" >&2; exit 2 ;;
esac
