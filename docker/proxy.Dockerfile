# The proxy of compose.yaml: Debian's HAProxy (the same package `make test` installs), with
# haproxy.cfg.
FROM debian:bookworm-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends haproxy \
    && rm -rf /var/lib/apt/lists/*
COPY docker/haproxy.cfg /etc/haproxy/haproxy.cfg
RUN haproxy -c -q -f /etc/haproxy/haproxy.cfg
USER haproxy
EXPOSE 8000 8001
# Requests under way finish (hard-stop-after in haproxy.cfg bounds it); SIGTERM would cut them.
STOPSIGNAL SIGUSR1
ENTRYPOINT ["haproxy", "-W", "-db", "-f", "/etc/haproxy/haproxy.cfg"]
