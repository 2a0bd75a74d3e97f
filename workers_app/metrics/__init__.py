"""Prometheus metrics: what operators scrape at /metrics.

- ``families``: counters, histograms and gauges that processes record as things happen (a
  counter increment on a hot path, nothing more); prometheus_client's multiprocess mode puts
  every process's values in PROMETHEUS_MULTIPROC_DIR, where the web server reads them
- ``scrape``: what is read when Prometheus asks (workers by status, sweep lag, relays,
  breakers, clusters): one query or Redis read per family, never on a request's path; other
  apps add theirs (sessions_app, in its ``ready()``)
- ``views``: the endpoint, for staff or a bearer token (ACTIVATE_METRICS_TOKEN)
"""
