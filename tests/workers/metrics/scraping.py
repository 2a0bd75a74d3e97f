"""Reading the Prometheus text format /metrics answers, as Prometheus would."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an exposition by (name, labels); parsing fails on a malformed one."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(text: str, name: str, **labels: str) -> float | None:
    """One sample's value, None if the exposition has no such sample."""
    return samples(text).get((name, frozenset(labels.items())))
