"""Fixtures for the producer-side tests; helpers live in producer_support.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.client.producer_support import SqlWorker


@pytest.fixture
def sql_worker(dsn: str) -> Iterator[SqlWorker]:
    worker = SqlWorker(dsn)
    yield worker
    worker.close()


@pytest.fixture(scope="module")
def module_dsn(pg_server: str, template_db: str) -> Iterator[str]:
    """A database with treadle shared by one module's tests that never leave a row behind.

    Tests of refused arguments are many and write nothing, so they need no fresh database each.
    """
    name = f"treadle_m_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    yield pg_server.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def module_conn(module_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to `module_dsn`."""
    with psycopg.connect(module_dsn, autocommit=True) as conn:
        yield conn
