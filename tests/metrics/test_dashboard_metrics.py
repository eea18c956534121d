"""The dashboard's /metrics, through Flask's test client, on the real test server."""

from __future__ import annotations

import base64
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from flask import Flask

from tests.metrics.scraping import named, parse, value
from treadle.dashboard import create_app
from treadle.dashboard.state import dashboard_of


@pytest.fixture
def make_app(dsn: str) -> Iterator[Callable[..., Flask]]:
    made: list[Flask] = []

    def make(**options: Any) -> Flask:
        app = create_app(dsn, **options)
        made.append(app)
        return app

    yield make
    for app in made:
        dashboard_of(app).close()


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_metrics_show_the_jobs_the_database_holds(
    make_app: Callable[..., Flask], conn: psycopg.Connection[Any]
) -> None:
    for queue in ("mail", "mail", "media"):
        conn.execute("SELECT treadle.enqueue('send', queue => %s)", (queue,))
    conn.execute("SELECT treadle.worker_seen('w-1', 'host-a', 7, ARRAY['mail'], 4, 0)")
    client = make_app(read_only=True).test_client()

    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.content_type.startswith("text/plain; version=")
    samples = parse(response.get_data(as_text=True))
    assert value(samples, "treadle_database_up") == 1
    assert named(samples, "treadle_jobs") == {
        (("queue", "mail"), ("state", "available")): 2,
        (("queue", "media"), ("state", "available")): 1,
    }
    assert named(samples, "treadle_live_workers") == {(("queue", "mail"),): 1, (("queue", "media"),): 0}

    # each scrape reads anew
    conn.execute("SELECT treadle.enqueue('send', queue => 'media')")
    samples = parse(client.get("/metrics").get_data(as_text=True))
    assert value(samples, "treadle_jobs", queue="media", state="available") == 2


def test_metrics_need_the_dashboards_authentication(make_app: Callable[..., Flask]) -> None:
    client = make_app(basic_auth=("prometheus", "s3cret")).test_client()
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=basic("prometheus", "wrong")).status_code == 401
    answer = client.get("/metrics", headers=basic("prometheus", "s3cret"))
    assert answer.status_code == 200
    assert value(parse(answer.get_data(as_text=True)), "treadle_database_up") == 1

    hooked = make_app(auth=lambda request: request.headers.get("X-Token") == "let-me").test_client()
    assert hooked.get("/metrics").status_code == 403
    assert hooked.get("/metrics", headers={"X-Token": "let-me"}).status_code == 200


@pytest.mark.subprocess
def test_without_prometheus_client_metrics_say_what_to_install(dsn: str) -> None:
    script = textwrap.dedent(f"""
        import sys
        sys.modules["prometheus_client"] = None  # as if the extra were not installed
        from treadle.dashboard import create_app
        from treadle.dashboard.state import dashboard_of
        app = create_app({dsn!r})
        client = app.test_client()
        assert client.get("/health").status_code == 200
        answer = client.get("/metrics")
        print(answer.status_code, answer.get_data(as_text=True).strip())
        dashboard_of(app).close()
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "501 treadle's metrics need prometheus_client: pip install 'treadle[metrics]'"
