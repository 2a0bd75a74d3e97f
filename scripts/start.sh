#!/usr/bin/env bash
# The one way each process of the platform starts: `make run`, Docker and operators share it.
#   scripts/start.sh web|agents|worker|sweeper|beat|relays
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
[ -x .venv/bin/python ] && PY=.venv/bin/python
BIN=$(dirname "$PY")
# Every process of this host writes its metrics to files in one directory, which the web
# server's /metrics adds up (prometheus_client's multiprocess mode). Never emptied here, since
# the others' files are in it: `make run` empties it before it starts them all.
export PROMETHEUS_MULTIPROC_DIR=${PROMETHEUS_MULTIPROC_DIR:-${ACTIVATE_DATA_DIR:-data}/metrics}
(umask 077 && mkdir -p "$PROMETHEUS_MULTIPROC_DIR")

# celery_worker QUEUE CONCURRENCY NAME: a Celery worker consuming QUEUE only, started again when
# it ends by itself: one whose consumer got stuck after a broker outage exits 70
# (core/watchdog.py), and Celery may die of what nobody has seen yet (the known death of a
# broker lost mid-task is mended in core/celery_consumer.py). Five deaths in a row within 10 s
# of starting are no outage but a fault (a bad setting): then it stays down, saying so.
celery_worker() {
  local child="" started status quick=0
  trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null; wait "$child"; exit 0' TERM INT
  while true; do
    started=$SECONDS
    "$BIN/celery" -A activate worker --loglevel "${ACTIVATE_LOG_LEVEL:-INFO}" \
      --queues "$1" --concurrency "$2" --hostname "$3@%h" &
    child=$!
    status=0
    wait "$child" || status=$?
    [ "$status" -eq 0 ] && exit 0
    if ((SECONDS - started < 10)); then quick=$((quick + 1)); else quick=0; fi
    if ((quick >= 5)); then
      echo "celery $3: ended $quick times in a row within 10 s of starting (status $status); giving up" >&2
      exit "$status"
    fi
    if [ "$status" -eq 70 ]; then
      echo "celery $3: its consumer was stuck; starting it again" >&2
    else
      echo "celery $3: ended with status $status; starting it again" >&2
      sleep 1
    fi
  done
}

case "${1:-}" in
  web)
    "$PY" manage.py migrate --noinput >/dev/null
    "$PY" manage.py collectstatic --noinput >/dev/null
    # ASGI: terminals and session proxies are long-lived WebSockets on the event loop; pages
    # and the API run in threads of their own per request, as under WSGI.
    bind=${ACTIVATE_BIND:-127.0.0.1:8000}
    # A browser cut off (not closed) leaves its WebSocket open here, and a terminal's SSH
    # channel behind it: a ping every half silence, unanswered for another half, ends it within
    # ACTIVATE_PEER_SILENCE (settings checked it above: an integer of at least 3).
    ping=$(( ${ACTIVATE_PEER_SILENCE:-30} / 2 ))
    exec "$BIN/uvicorn" activate.asgi:application \
      --host "${bind%:*}" --port "${bind##*:}" \
      --workers "${ACTIVATE_WEB_WORKERS:-2}" --lifespan off --proxy-headers \
      --timeout-graceful-shutdown 10 --ws-ping-interval "$ping" --ws-ping-timeout "$ping"
    ;;
  agents)
    # The agents' endpoints only (every other path is a 404), in a server of their own: users'
    # requests filling the web server's threads never delay a heartbeat.
    # Heartbeats are answered by a lean ASGI callable on uvicorn's event loop (one Redis round
    # trip each); connect and ping go on to Django's ASGI application. The access log is the
    # callable's own: every request but the successful beats.
    export ACTIVATE_AGENT_SERVER=true
    agent_bind=${ACTIVATE_AGENT_BIND:-127.0.0.1:8001}
    # Agents keep their connection across beats (30 s apart): it is kept open longer than
    # that, and every agent's idle connection is a descriptor.
    ulimit -n "$(ulimit -Hn)"
    exec "$BIN/uvicorn" activate.agent_asgi:application \
      --host "${agent_bind%:*}" --port "${agent_bind##*:}" \
      --workers "${ACTIVATE_AGENT_WORKERS:-2}" --loop uvloop --http httptools \
      --timeout-keep-alive "${ACTIVATE_AGENT_KEEP_ALIVE:-75}" \
      --timeout-graceful-shutdown 10 --no-server-header --no-access-log
    ;;
  worker)
    # Polls, submissions, cancels, sessions' starts: everything but the sweeps (unless
    # ACTIVATE_WORKER_QUEUES=celery,sweeps: one worker for all, as before the sweeper).
    celery_worker "${ACTIVATE_WORKER_QUEUES:-celery}" "${ACTIVATE_CELERY_CONCURRENCY:-4}" worker
    ;;
  sweeper)
    # The sweeps only (settings SWEEP_TASKS), so no slow poll or submission delays them.
    celery_worker sweeps "${ACTIVATE_SWEEPER_CONCURRENCY:-2}" sweeper
    ;;
  beat)
    # Run one on every host: the one holding the beat lease in Redis sends (core/beat.py).
    mkdir -p data
    exec "$BIN/celery" -A activate beat --loglevel "${ACTIVATE_LOG_LEVEL:-INFO}" \
      --schedule "${ACTIVATE_BEAT_SCHEDULE_FILE:-data/celerybeat-schedule}"
    ;;
  relays)
    # Keeps the relays of clusters whose agents go via the login host (one per cluster and
    # installation, however many of these run); idle when there are none.
    exec "$PY" manage.py run_relays
    ;;
  *)
    echo "usage: $0 web|agents|worker|sweeper|beat|relays" >&2
    exit 2
    ;;
esac
