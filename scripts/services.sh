#!/usr/bin/env bash
# Makes sure PostgreSQL and Redis answer on loopback, starting them if they are installed but
# stopped, and installing them from Debian's packages on a machine that has neither.
set -euo pipefail

log() { printf '[services] %s\n' "$*"; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# `scripts/services.sh redis` is enough for `make run` on the embedded defaults.
want_postgres=1
[ "${1:-all}" = "redis" ] && want_postgres=0

need_install=()
command -v redis-server >/dev/null || need_install+=(redis-server)
[ $want_postgres -eq 0 ] || command -v pg_ctlcluster >/dev/null || need_install+=(postgresql)
# The load balancer in front of two hosts' web and agents' servers (the host-loss drill, and
# the compose file's check of its configuration).
[ $want_postgres -eq 0 ] || command -v haproxy >/dev/null || need_install+=(haproxy)
if [ ${#need_install[@]} -gt 0 ]; then
  log "installing ${need_install[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_install[@]}" >/dev/null
fi

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  log "starting redis"
  mkdir -p /var/lib/redis /var/log/redis
  $SUDO redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" \
    --appendonly no --dir /var/lib/redis --logfile /var/log/redis/activate.log
fi

if [ $want_postgres -eq 1 ] && ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  version=$(ls /etc/postgresql | sort -V | tail -n 1)
  log "starting postgresql $version"
  $SUDO pg_ctlcluster --skip-systemctl-redirect "$version" main start
fi

for _ in $(seq 1 60); do
  if redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 \
    && { [ $want_postgres -eq 0 ] || pg_isready -h 127.0.0.1 -p 5432 -q; }; then
    log "services are up"
    exit 0
  fi
  sleep 0.5
done
log "postgresql or redis did not come up" >&2
exit 1
