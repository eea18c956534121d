"""How the app is served: under a prefix, on the host's own pool, without its database,
and the arguments create_app refuses."""

from __future__ import annotations

import re
import socket
from typing import Any

import psycopg
import pytest
from flask import Flask
from flask.testing import FlaskClient
from psycopg_pool import ConnectionPool
from werkzeug.middleware.dispatcher import DispatcherMiddleware
from werkzeug.test import Client

from tests.dashboard.seeding import Seeded, job_state
from treadle.dashboard import create_app, dashboard_of

JSON = {"Accept": "application/json"}


def test_mounted_under_a_prefix_every_link_and_action_stays_under_it(
    app: Flask, conn: psycopg.Connection, seeded: Seeded
) -> None:
    host = Flask("host")
    client = Client(DispatcherMiddleware(host.wsgi_app, {"/admin/jobs": app}))

    page = client.get("/admin/jobs/").get_data(as_text=True)
    links = re.findall(r'(?:href|src|action)="([^"]+)"', page)
    assert links and all(link.startswith("/admin/jobs/") for link in links), links
    assert client.get("/admin/jobs/static/dashboard.js", buffered=True).status_code == 200
    assert client.get("/admin/jobs/jobs/" + str(seeded.running)).status_code == 200

    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token
    response = client.post(
        f"/admin/jobs/jobs/{seeded.discarded}/retry", data={"csrf_token": token.group(1), "next": "/jobs"}
    )
    assert response.status_code == 303 and response.headers["Location"] == "/admin/jobs/jobs"
    assert job_state(conn, seeded.discarded) == "available"
    assert client.get("/jobs").status_code == 404  # the host's own paths are the host's


def test_runs_on_the_host_applications_pool(operator_dsn: str, conn: psycopg.Connection, seeded: Seeded) -> None:
    with ConnectionPool(operator_dsn, min_size=1, max_size=2, open=True) as pool:
        app = create_app(pool, secret_key="k")
        client = app.test_client()
        assert client.get("/").status_code == 200
        token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/").get_data(as_text=True))
        assert token
        response = client.post(f"/jobs/{seeded.available}/cancel", data={"csrf_token": token.group(1)}, headers=JSON)
        assert response.status_code == 200
        dashboard_of(app).close()  # the host's pool is the host's to close
        assert not pool.closed
        with pool.connection() as c:  # and its connections are left outside a transaction
            assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert job_state(conn, seeded.available) == "cancelled"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_without_its_database_it_answers_503_and_says_why() -> None:
    app = create_app(f"postgresql://postgres@127.0.0.1:{closed_port()}/none?connect_timeout=1", secret_key="k")
    dashboard_of(app).store.pool.timeout = 1.0
    try:
        client = app.test_client()
        page = client.get("/")
        assert page.status_code == 503 and "cannot reach its database" in page.get_data(as_text=True)
        assert client.get("/jobs/1", headers=JSON).get_json() == {
            "ok": False,
            "message": "The dashboard cannot reach its database right now.",
        }
        assert client.get("/health").status_code == 503
    finally:
        dashboard_of(app).close()


def test_a_database_without_the_extension_is_named_as_such(pg_server: str) -> None:
    app = create_app(pg_server, secret_key="k")
    try:
        page = app.test_client().get("/")
        assert page.status_code == 503 and "CREATE EXTENSION treadle" in page.get_data(as_text=True)
    finally:
        dashboard_of(app).close()


def test_a_query_over_its_time_is_a_503(reader_dsn: str, conn: psycopg.Connection) -> None:
    conn.execute(
        "INSERT INTO treadle.jobs (queue, name, state, run_at, created_at, finished_at)"
        " SELECT 'bulk', 'n', 'completed', now(), now(), now() FROM generate_series(1, 100000)"
    )
    app = create_app(reader_dsn, secret_key="k", statement_timeout_ms=1)
    try:
        page = app.test_client().get("/jobs?name=nothing-has-this-name")
        assert page.status_code == 503 and "took too long" in page.get_data(as_text=True)
    finally:
        dashboard_of(app).close()


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"dsn_or_pool": 42}, TypeError, "dsn_or_pool must be a connection string or a psycopg_pool.ConnectionPool"),
        ({"dsn_or_pool": "  "}, ValueError, "dsn_or_pool must not be an empty connection string"),
        ({"auth": "yes"}, TypeError, "auth must be a callable"),
        ({"basic_auth": ("admin",)}, ValueError, "basic_auth must be a (username, password) tuple"),
        ({"basic_auth": ("admin", "")}, ValueError, "basic_auth must be a (username, password) tuple"),
        ({"basic_auth": ("ad:min", "pw")}, ValueError, "username must not contain ':'"),
        ({"refresh_seconds": 0.5}, ValueError, "refresh_seconds must be between 1 and 3600"),
        ({"statement_timeout_ms": 0}, ValueError, "statement_timeout_ms must be between 1 and 600000"),
        ({"exact_counts_up_to": -1}, ValueError, "exact_counts_up_to must not be negative"),
        ({"page_size": 501}, ValueError, "page_size must be between 1 and 500"),
        ({"recent_rows": 0}, ValueError, "recent_rows must be between 1 and 500"),
        ({"trusted_hosts": []}, ValueError, "trusted_hosts must be a non-empty list of host names"),
        ({"trusted_hosts": "localhost"}, ValueError, "trusted_hosts must be a non-empty list of host names"),
        ({"trusted_hosts": [""]}, ValueError, "trusted_hosts must be a non-empty list of host names"),
    ],
)
def test_create_app_refuses_bad_arguments(
    dsn: str, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    target = options.pop("dsn_or_pool", dsn)
    with pytest.raises(error) as caught:
        create_app(target, **options)
    assert message in str(caught.value)


def test_a_response_is_never_cached(client: FlaskClient, seeded: Seeded) -> None:
    assert client.get("/").headers["Cache-Control"] == "no-store"
