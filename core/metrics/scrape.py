"""What is read when Prometheus asks: each room adds its sources (the workers' counts from the
database and the sweeps' marks in Redis, the sessions'), read at scrape time.

Each source is one query (or one Redis read) per scrape, off every request's path. A source
that fails (the database or Redis is down) is left out of that scrape and says so in
``activate_scrape_source_up``, so a dead dependency shows as such and not as zero workers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from prometheus_client.core import GaugeMetricFamily, Metric

log = logging.getLogger(__name__)

Source = Callable[[], Iterable[Metric]]
_sources: dict[str, Source] = {}


def add_source(name: str, source: Source) -> None:
    """A room's families read at scrape time (each app adds its own in its ready())."""
    _sources[name] = source


class ScrapeTime:
    """Every source, each on its own: one that fails is marked down, the others still answer."""

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily(
            "activate_scrape_source_up",
            "1 when this scrape could read the source (database, Redis)",
            labels=["source"],
        )
        gathered: list[Metric] = []
        for name, source in _sources.items():
            try:
                gathered += list(source())
            except Exception as exc:
                log.warning("metrics: %s could not be read: %s", name, exc)
                up.add_metric([name], 0.0)
            else:
                up.add_metric([name], 1.0)
        return [*gathered, up]

    def describe(self) -> Iterable[Metric]:
        # Nothing to check against other collectors: the names are ours alone.
        return []
