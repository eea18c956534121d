"""Prometheus metrics: what the database holds, and what a worker process did.

Two sources, each written to a prometheus_client registry:

- `DatabaseCollector` reads the database when it is scraped, in one statement, from
  cheap sources only: treadle.job_counts() (which estimates finished states on large
  tables instead of counting them), treadle.live_workers, and the running jobs whose
  lease has expired (from the lease index).
- `WorkerMetrics` counts in the worker process: the outcome of every job it ran,
  claim-to-start and run-time histograms, busy slots, rescued leases, lost leases.

docs/metrics.md lists every metric with its labels and source. This module needs
prometheus_client, the `metrics` extra: importing it without raises an ImportError
that says which `pip install` gives it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Final

import psycopg
from psycopg.rows import tuple_row

from treadle._events import WorkerEvent
from treadle._sql import QUEUE_RANKS

INSTALL_HINT: Final = "treadle's metrics need prometheus_client: pip install 'treadle[metrics]'"

try:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector
except ImportError as error:  # pragma: no cover - the message is what matters
    raise ImportError(INSTALL_HINT) from error

__all__ = [
    "CONTENT_TYPE_LATEST",
    "INSTALL_HINT",
    "DatabaseCollector",
    "MetricsServer",
    "WorkerMetrics",
    "database_registry",
    "exposition",
]

log = logging.getLogger("treadle.metrics")

Connect = Callable[[], AbstractContextManager[psycopg.Connection[Any]]]

# The queue label of the series that sum every queue beyond the top `top_queues`
# (a label value, so that sum(treadle_jobs) stays the whole); see docs/metrics.md.
OTHER_QUEUES: Final = "(other queues)"
TOP_QUEUES: Final = 50  # the default number of queues a scrape names

# One statement, one snapshot: counts per queue and state (estimated on large tables) for
# the top %(top)s queues, the rest summed (queue null) with how many queues they are,
# the live workers, and the leases that expired without a rescue (jobs_lease_idx).
DATABASE_READ: Final = (
    """
WITH counts AS MATERIALIZED (
    SELECT queue, state, jobs, oldest_available_age
      FROM treadle.job_counts(exact_up_to => %(exact_up_to)s)
     WHERE queue IS NOT NULL),"""
    + QUEUE_RANKS
    + """
SELECT (SELECT coalesce(json_agg(json_build_object(
                    'queue', t.queue, 'state', t.state, 'jobs', t.jobs,
                    'oldest_waiting', t.oldest_waiting)), '[]')::text
          FROM (SELECT CASE WHEN r.rank <= %(top)s THEN c.queue END AS queue, c.state, sum(c.jobs) AS jobs,
                       extract(epoch FROM max(c.oldest_available_age)) AS oldest_waiting
                  FROM counts AS c JOIN ranked AS r USING (queue)
                 GROUP BY 1, 2) AS t) AS counts,
       (SELECT coalesce(json_agg(q.queue), '[]')::text
          FROM ranked AS q WHERE q.rank <= %(top)s) AS top,
       (SELECT count(*) FROM ranked AS q WHERE q.rank > %(top)s) AS other_queues,
       (SELECT coalesce(json_agg(json_build_object(
                    'worker_id', w.id, 'host', w.host, 'queues', w.queues,
                    'concurrency', w.concurrency, 'running', w.running_jobs)), '[]')::text
          FROM treadle.live_workers AS w) AS workers,
       (SELECT count(*)
          FROM treadle.jobs AS j
         WHERE j.state = 'running' AND j.lease_until < treadle.now()) AS expired_leases
"""
)

# The outcome label of treadle_worker_jobs_total, by the event that ends a run and the
# state it wrote. A failed attempt that will run again is "failed"; its last, "discarded".
OUTCOMES: Final = ("completed", "failed", "discarded", "cancelled", "released")

CLAIM_TO_START_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
RUN_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)


class DatabaseCollector(Collector):
    """Metrics read from the database on each scrape, through `connect()`.

    `connect` returns a context manager giving a psycopg connection (a pool's
    `connection`, or `lambda: psycopg.connect(dsn)`). Above `exact_up_to` jobs, counts
    of finished states are estimates (treadle.job_counts). When the database cannot
    be read, the scrape still answers, with treadle_database_up 0.

    A scrape names at most `top_queues` queues (those with the most jobs waiting or
    running, then the most jobs): the others are summed under the queue label
    OTHER_QUEUES, and treadle_other_queues says how many they are. So however many
    queues producers make, a scrape stays about the same size.
    """

    def __init__(self, connect: Connect, *, exact_up_to: int = 100_000, top_queues: int = TOP_QUEUES) -> None:
        if isinstance(top_queues, bool) or not isinstance(top_queues, int) or not 1 <= top_queues <= 10_000:
            raise ValueError(f"top_queues must be an integer from 1 to 10000, got {top_queues!r}")
        self._connect = connect
        self._exact_up_to = exact_up_to
        self._top = top_queues

    def describe(self) -> list[GaugeMetricFamily]:
        # Without describe() the registry would collect (read the database) at registration.
        return list(self._families().values())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = self._families()
        started = time.monotonic()
        try:
            counts, top, other_queues, workers, expired = self._read()
        except psycopg.Error as error:
            log.warning("metrics: reading the database failed: %s", str(error).strip().splitlines()[0])
            families["up"].add_metric([], 0)
            families["scrape"].add_metric([], time.monotonic() - started)
            yield families["up"]
            yield families["scrape"]
            return
        families["up"].add_metric([], 1)
        families["scrape"].add_metric([], time.monotonic() - started)
        oldest: dict[str, float] = {}
        for count in counts:
            queue = OTHER_QUEUES if count["queue"] is None else count["queue"]
            families["jobs"].add_metric([queue, count["state"]], count["jobs"])
            oldest[queue] = max(oldest.get(queue, 0.0), float(count["oldest_waiting"] or 0.0), 0.0)
        serving = dict.fromkeys(oldest, 0)  # every queue with jobs, 0 until a live worker claims from it
        named = set(top)
        beyond: set[str] = set()  # the live workers claiming from a queue that is not named
        for worker in workers:
            families["worker_slots"].add_metric([worker["worker_id"], worker["host"]], worker["concurrency"])
            families["worker_busy"].add_metric([worker["worker_id"], worker["host"]], worker["running"])
            for queue in worker["queues"]:
                if queue not in named and (other_queues or len(named) >= self._top):
                    beyond.add(worker["worker_id"])  # among the others, or past the bound: summed
                    continue
                named.add(queue)  # a queue without jobs, while there is room for it
                serving[queue] = serving.get(queue, 0) + 1
        if beyond:
            serving[OTHER_QUEUES] = len(beyond)
        for queue, age in sorted(oldest.items()):
            families["oldest"].add_metric([queue], age)
        for queue, live in sorted(serving.items()):
            families["live"].add_metric([queue], live)
        families["other"].add_metric([], other_queues)
        families["expired"].add_metric([], expired)
        yield from families.values()

    def _read(self) -> tuple[list[dict[str, Any]], list[str], int, list[dict[str, Any]], int]:
        """(counts of the top queues and of the rest, the top queues, how many the rest are, live workers,
        expired leases), in one statement."""
        # a tuple row and JSON as text: whatever row factory or loaders the connection has
        with self._connect() as conn, conn.cursor(row_factory=tuple_row) as cur:
            row = cur.execute(DATABASE_READ, {"exact_up_to": self._exact_up_to, "top": self._top}).fetchone()
        assert row is not None
        counts, top, other_queues, workers, expired = row
        return json.loads(counts), json.loads(top), int(other_queues), json.loads(workers), int(expired)

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily]:
        return {
            "up": GaugeMetricFamily("treadle_database_up", "1 when this scrape read the database, 0 when it could not"),
            "scrape": GaugeMetricFamily(
                "treadle_database_scrape_seconds", "How long this scrape's read of the database took"
            ),
            "jobs": GaugeMetricFamily(
                "treadle_jobs",
                "Jobs per queue and state (treadle.job_counts; finished states are estimated on large tables)",
                labels=["queue", "state"],
            ),
            "oldest": GaugeMetricFamily(
                "treadle_queue_oldest_waiting_seconds",
                "Age of the queue's oldest due job that is available or retryable; 0 when none waits",
                labels=["queue"],
            ),
            "live": GaugeMetricFamily(
                "treadle_live_workers",
                "Live worker processes claiming from the queue (treadle.live_workers: seen in the last 30 s)",
                labels=["queue"],
            ),
            "worker_slots": GaugeMetricFamily(
                "treadle_live_worker_slots", "A live worker's concurrency", labels=["worker_id", "host"]
            ),
            "worker_busy": GaugeMetricFamily(
                "treadle_live_worker_busy_slots", "Running jobs a live worker holds", labels=["worker_id", "host"]
            ),
            "other": GaugeMetricFamily(
                "treadle_other_queues",
                f"Queues beyond the scrape's top N, their jobs summed under queue={OTHER_QUEUES!r}",
            ),
            "expired": GaugeMetricFamily(
                "treadle_expired_leases", "Running jobs whose lease expired and that no rescue has returned yet"
            ),
        }


def database_registry(
    connect: Connect, *, exact_up_to: int = 100_000, top_queues: int = TOP_QUEUES
) -> CollectorRegistry:
    """A registry holding a DatabaseCollector only (for the dashboard's /metrics)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(DatabaseCollector(connect, exact_up_to=exact_up_to, top_queues=top_queues))
    return registry


def exposition(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The registry in Prometheus's text format, and its content type."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


class WorkerMetrics:
    """Counters, histograms and gauges of one worker process, fed by its events.

    `observe(event)` takes every WorkerEvent; `rescued(count)` what each
    treadle.rescue() returned; `track_slots(busy, concurrency)` reads the busy slots
    at each scrape.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.jobs = Counter(
            "treadle_worker_jobs",
            "Jobs this worker ran, by how their run ended",
            ["queue", "name", "outcome"],
            registry=self.registry,
        )
        self.lease_losses = Counter(
            "treadle_worker_lease_losses",
            "Runs whose lease was lost before they finished (nothing of them was written)",
            ["queue", "name"],
            registry=self.registry,
        )
        self.rescued_jobs = Counter(
            "treadle_worker_rescued_jobs",
            "Expired leases this worker's treadle.rescue() calls returned to the queue",
            registry=self.registry,
        )
        self.claim_to_start = Histogram(
            "treadle_worker_claim_to_start_seconds",
            "From the claim's answer to the handler's call",
            ["queue", "name"],
            buckets=CLAIM_TO_START_BUCKETS,
            registry=self.registry,
        )
        self.run_time = Histogram(
            "treadle_worker_run_seconds",
            "From the handler's call to its return or raise",
            ["queue", "name"],
            buckets=RUN_BUCKETS,
            registry=self.registry,
        )
        self.busy_slots = Gauge("treadle_worker_busy_slots", "Handlers running now", registry=self.registry)
        self.slots = Gauge("treadle_worker_slots", "The worker's concurrency", registry=self.registry)
        self._lock = threading.Lock()
        self._claimed: dict[tuple[int, int], float] = {}  # (job id, attempt) -> when it was claimed
        self._started: dict[tuple[int, int], float] = {}  # ... -> when its handler was called

    def track_slots(self, busy: Callable[[], int], concurrency: int) -> None:
        self.busy_slots.set_function(lambda: float(busy()))
        self.slots.set(concurrency)

    def rescued(self, count: int) -> None:
        if count > 0:
            self.rescued_jobs.inc(count)

    def observe(self, event: WorkerEvent) -> None:
        now = time.monotonic()
        key = (event.job_id, event.attempt)
        labels = (event.queue, event.name)
        with self._lock:
            if event.kind == "claimed":
                self._claimed[key] = now
                return
            if event.kind == "started":
                claimed = self._claimed.pop(key, None)
                if claimed is not None:
                    self.claim_to_start.labels(*labels).observe(now - claimed)
                self._started[key] = now
                return
            # the handler returned or raised: its run time (a lost lease or a hand-back
            # ends the run while the handler may still be running: not a run time)
            started = self._started.pop(key, None)
            if started is not None and event.kind in ("completing", "failed", "cancelled", "snoozed"):
                self.run_time.labels(*labels).observe(now - started)
            if event.kind in ("lease_lost", "released", "cancelled"):  # (cancelled: perhaps before it started)
                self._claimed.pop(key, None)
        if event.kind == "lease_lost":
            self.lease_losses.labels(*labels).inc()
        elif event.kind != "completing":
            self.jobs.labels(*labels, _outcome(event)).inc()


def _outcome(event: WorkerEvent) -> str:
    if event.kind == "failed":
        return "discarded" if event.state == "discarded" else "failed"
    return event.kind


class MetricsServer:
    """prometheus_client's HTTP server for one registry, in a daemon thread, until `close()`."""

    def __init__(self, registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> None:
        from prometheus_client import start_http_server

        self._server, self._thread = start_http_server(port, addr=host, registry=registry)

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
