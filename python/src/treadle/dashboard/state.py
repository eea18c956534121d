"""What a dashboard app keeps between requests: its settings and its store."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from threading import Lock
from typing import Any

from flask import Flask, current_app

from .queries import QueueCounts, Store
from .security import AuthHook

EXTENSION_KEY = "treadle_dashboard"
VERSION_RECHECK = 10.0  # seconds a good answer about the installed version is kept


@dataclass(frozen=True)
class Settings:
    read_only: bool
    refresh_ms: int
    page_size: int
    recent_rows: int
    auth: AuthHook | None
    basic_auth: tuple[str, str] | None
    trusted_hosts: frozenset[str] | None
    search_window: int = 100_000
    bulk_limit: int = 10_000
    top_queues: int = 50  # queues per overview page, and named by /metrics


@dataclass(frozen=True)
class DepthSample:
    at: datetime
    waiting: int  # available and retryable
    running: int
    estimated: bool


class DepthHistory:
    """Each queue's depth as this process saw it when it showed a page.

    The database keeps no history of depth, so the dashboard keeps the counts it
    reads anyway (the overview's and the queue page's, estimated on large tables),
    at most one sample per `spacing`, for `span`, for at most `max_queues` queues.
    Each dashboard process has its own; Prometheus keeps the lasting history.
    """

    def __init__(
        self, span: timedelta = timedelta(hours=1), spacing: timedelta = timedelta(seconds=10), max_queues: int = 1000
    ) -> None:
        self.span, self.spacing, self.max_queues = span, spacing, max_queues
        self._samples: dict[str, deque[DepthSample]] = {}
        self._lock = Lock()

    def record(self, now: datetime, queues: Iterable[QueueCounts]) -> dict[str, list[DepthSample]]:
        """Add a sample of each queue (unless one is more recent than `spacing`); each queue's samples."""
        with self._lock:
            for queue in queues:
                samples = self._samples.get(queue.queue)
                if samples is None:
                    if len(self._samples) >= self.max_queues:
                        continue
                    samples = self._samples[queue.queue] = deque()
                if samples and now - samples[-1].at < self.spacing:
                    continue
                counts = [queue.counts.get(s) for s in ("available", "retryable", "running")]
                samples.append(
                    DepthSample(
                        at=now,
                        waiting=sum(c.jobs for c in counts[:2] if c is not None),
                        running=counts[2].jobs if counts[2] is not None else 0,
                        estimated=any(c.estimated for c in counts if c is not None),
                    )
                )
                while samples and now - samples[0].at > self.span:
                    samples.popleft()
            return {name: list(samples) for name, samples in self._samples.items()}


@dataclass
class Dashboard:
    """What the app keeps in `app.extensions["treadle_dashboard"]`."""

    store: Store
    settings: Settings
    depth: DepthHistory = field(default_factory=lambda: DepthHistory())
    _metrics: Any = field(default=None, repr=False)  # the /metrics registry, made at the first scrape
    _metrics_lock: Lock = field(default_factory=Lock, repr=False)
    _version_ok_at: float | None = field(default=None, repr=False)  # when the installed version was last found good

    def metrics_registry(self) -> Any:
        """The registry /metrics serves: the database's metrics, read through the store.

        Raises ImportError, naming the `pip install` that gives it, without prometheus_client.
        """
        with self._metrics_lock:
            if self._metrics is None:
                from treadle.metrics import database_registry

                self._metrics = database_registry(
                    self.store.reading, exact_up_to=self.store.exact_counts_up_to, top_queues=self.settings.top_queues
                )
            return self._metrics

    def version_problem(self) -> str | None:
        """The database's treadle is not the one this package speaks: why, and the command that fixes it.

        Read at most every VERSION_RECHECK seconds while the answer is good; at each
        request while it is not, so that a page works again as soon as the upgrade ran.
        """
        now = time.monotonic()
        if self._version_ok_at is not None and now - self._version_ok_at < VERSION_RECHECK:
            return None
        problem = self.store.version_problem()
        self._version_ok_at = now if problem is None else None
        return problem

    def close(self) -> None:
        """Close the connection pool, when the dashboard opened it from a DSN."""
        self.store.close()


def dashboard_of(app: Flask) -> Dashboard:
    state: Dashboard = app.extensions[EXTENSION_KEY]
    return state


def current() -> Dashboard:
    """The dashboard serving the current request."""
    return dashboard_of(current_app)
