"""What a dashboard app keeps between requests: its settings and its store."""

from __future__ import annotations

from dataclasses import dataclass, field
from threading import Lock
from typing import Any

from flask import Flask, current_app

from .queries import Store
from .security import AuthHook

EXTENSION_KEY = "treadle_dashboard"


@dataclass(frozen=True)
class Settings:
    read_only: bool
    refresh_ms: int
    page_size: int
    recent_rows: int
    auth: AuthHook | None
    basic_auth: tuple[str, str] | None
    trusted_hosts: frozenset[str] | None


@dataclass
class Dashboard:
    """What the app keeps in `app.extensions["treadle_dashboard"]`."""

    store: Store
    settings: Settings
    _metrics: Any = field(default=None, repr=False)  # the /metrics registry, made at the first scrape
    _metrics_lock: Lock = field(default_factory=Lock, repr=False)

    def metrics_registry(self) -> Any:
        """The registry /metrics serves: the database's metrics, read through the store.

        Raises ImportError, naming the `pip install` that gives it, without prometheus_client.
        """
        with self._metrics_lock:
            if self._metrics is None:
                from treadle.metrics import database_registry

                self._metrics = database_registry(self.store.reading, exact_up_to=self.store.exact_counts_up_to)
            return self._metrics

    def close(self) -> None:
        """Close the connection pool, when the dashboard opened it from a DSN."""
        self.store.close()


def dashboard_of(app: Flask) -> Dashboard:
    state: Dashboard = app.extensions[EXTENSION_KEY]
    return state


def current() -> Dashboard:
    """The dashboard serving the current request."""
    return dashboard_of(current_app)
