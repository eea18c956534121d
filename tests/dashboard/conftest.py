"""Fixtures for the dashboard tests: a seeded database and the app over it."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from flask import Flask
from flask.testing import FlaskClient
from seeding import Seeded, seed

from treadle.dashboard import create_app, dashboard_of


@pytest.fixture
def seeded(conn: psycopg.Connection) -> Seeded:
    return seed(conn)


@pytest.fixture
def app(dsn: str) -> Iterator[Flask]:
    application = create_app(dsn, secret_key="test-secret")
    yield application
    dashboard_of(application).close()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()
