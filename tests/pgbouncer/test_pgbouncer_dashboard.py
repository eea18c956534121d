"""The dashboard through PgBouncer in transaction mode, with its default options.

A pooler hands each transaction whichever server connection is free, so a statement the
dashboard had prepared on one is missing on the next: every page is loaded many times
over, more than psycopg's default threshold for preparing a statement, while another
client takes and gives back a server connection between loads, so that the pooler hands
the dashboard a different one each time (alone, it would get the same one again).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from flask import Flask

from tests.dashboard.seeding import Seeded, seed
from treadle.dashboard import create_app, dashboard_of

LOADS = 12  # each page, more than the 5 runs after which psycopg would prepare a statement


@pytest.fixture
def seeded(conn: psycopg.Connection[Any]) -> Seeded:
    return seed(conn)


@pytest.fixture
def app(bouncer_dsn: str) -> Iterator[Flask]:
    application = create_app(bouncer_dsn, secret_key="test-secret")
    yield application
    dashboard_of(application).close()


def test_every_page_loads_again_and_again_through_the_pooler(app: Flask, seeded: Seeded, bouncer_dsn: str) -> None:
    client = app.test_client()
    other = psycopg.connect(bouncer_dsn, prepare_threshold=None)  # not autocommit: holds a server connection
    pages = [
        "/",
        "/jobs",
        f"/jobs/{seeded.running}",
        f"/jobs/{seeded.discarded}",
        f"/runs/{seeded.failed_run}",
        f"/runs/{seeded.running_run}",
    ]
    with other:
        for load in range(LOADS):
            for page in pages:
                if load % 2:
                    other.execute("SELECT 1")  # a transaction: the pooler gives the dashboard another connection
                else:
                    other.commit()
                response = client.get(page)
                assert response.status_code == 200, (page, response.status_code, response.get_data(as_text=True)[:500])
