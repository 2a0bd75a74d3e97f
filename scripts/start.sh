#!/usr/bin/env bash
# The one way each process of the platform starts: `make run`, Docker and operators share it.
#   scripts/start.sh web|agents|worker|beat
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
[ -x .venv/bin/python ] && PY=.venv/bin/python
BIN=$(dirname "$PY")

case "${1:-}" in
  web)
    "$PY" manage.py migrate --noinput >/dev/null
    "$PY" manage.py collectstatic --noinput >/dev/null
    exec "$BIN/gunicorn" activate.wsgi:application \
      --bind "${ACTIVATE_BIND:-127.0.0.1:8000}" \
      --workers "${ACTIVATE_WEB_WORKERS:-2}" --threads "${ACTIVATE_WEB_THREADS:-4}" \
      --access-logfile - --logger-class activate.gunicorn_logging.QuietHeartbeatLogger \
      --graceful-timeout 10
    ;;
  agents)
    # The agents' endpoints only (every other path is a 404), in a server of their own: users'
    # requests filling the web server's threads never delay a heartbeat.
    export ACTIVATE_AGENT_SERVER=true
    exec "$BIN/gunicorn" activate.wsgi:application \
      --bind "${ACTIVATE_AGENT_BIND:-127.0.0.1:8001}" \
      --workers "${ACTIVATE_AGENT_WORKERS:-2}" --threads "${ACTIVATE_AGENT_THREADS:-8}" \
      --access-logfile - --logger-class activate.gunicorn_logging.QuietHeartbeatLogger \
      --graceful-timeout 10
    ;;
  worker)
    exec "$BIN/celery" -A activate worker --loglevel "${ACTIVATE_LOG_LEVEL:-INFO}" \
      --concurrency "${ACTIVATE_CELERY_CONCURRENCY:-4}" --hostname "worker@%h"
    ;;
  beat)
    mkdir -p data
    exec "$BIN/celery" -A activate beat --loglevel "${ACTIVATE_LOG_LEVEL:-INFO}" \
      --schedule "${ACTIVATE_BEAT_SCHEDULE_FILE:-data/celerybeat-schedule}"
    ;;
  *)
    echo "usage: $0 web|agents|worker|beat" >&2
    exit 2
    ;;
esac
