"""Fixtures for the dashboard tests: a seeded database and the app over it.

The dashboard connects as the docs tell an operator to set it up: a role given
`treadle.grant_dashboard(role)` (`operator_dsn`), or, for a read-only dashboard,
`grant_dashboard(role, read_only => true)` (`reader_dsn`); never as the superuser.
Seeding and checks go through `conn`, the superuser's connection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.conftest import as_role
from tests.dashboard.seeding import Seeded, seed
from treadle.dashboard import create_app, dashboard_of


@pytest.fixture(scope="session")
def operator_role(make_role: Callable[[str], str]) -> str:
    return make_role("dashboard")


@pytest.fixture(scope="session")
def reader_role(make_role: Callable[[str], str]) -> str:
    return make_role("dashboard_ro")


@pytest.fixture
def operator_dsn(dsn: str, conn: psycopg.Connection[Any], operator_role: str) -> str:
    """The test's database, as a role that may read and act (grant_dashboard)."""
    conn.execute("SELECT treadle.grant_dashboard(%s)", (operator_role,))
    return as_role(dsn, operator_role)


@pytest.fixture
def reader_dsn(dsn: str, conn: psycopg.Connection[Any], reader_role: str) -> str:
    """The test's database, as a role that may only read (grant_dashboard, read_only)."""
    conn.execute("SELECT treadle.grant_dashboard(%s, read_only => true)", (reader_role,))
    return as_role(dsn, reader_role)


@pytest.fixture
def seeded(conn: psycopg.Connection[Any]) -> Seeded:
    return seed(conn)


@pytest.fixture
def app(operator_dsn: str) -> Iterator[Flask]:
    application = create_app(operator_dsn, secret_key="test-secret")
    yield application
    dashboard_of(application).close()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()
