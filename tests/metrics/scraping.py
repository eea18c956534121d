"""Read Prometheus text as prometheus_client's parser reads it, into {(name, labels): value}."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, tuple[tuple[str, str], ...]]


def parse(text: str) -> dict[Sample, float]:
    """Every sample of an exposition, keyed by its name and its labels (sorted)."""
    samples: dict[Sample, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Sample, float], metric: str, /, **labels: str) -> float | None:
    """One sample's value (labels may include `name`, a job name label), None when absent."""
    return samples.get((metric, tuple(sorted(labels.items()))))


def named(samples: dict[Sample, float], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of one name, keyed by their labels."""
    return {labels: v for (n, labels), v in samples.items() if n == name}


def fetch(url: str) -> tuple[str, str]:
    """GET a metrics endpoint: its body and content type."""
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode(), response.headers["Content-Type"]


def scrape_when(url: str, ready: Callable[[dict[Sample, float]], bool], timeout: float = 10.0) -> dict[Sample, float]:
    """Scrape until `ready` holds of the samples (or `timeout` passes), and return them: a
    worker counts a job's outcome just after its finish commits, so a scrape taken when the
    database shows the job finished may be a moment early."""
    deadline = time.monotonic() + timeout
    while True:
        samples = parse(fetch(url)[0])
        if ready(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.02)
