"""The queue page's controls (pause, resume, limits), paused marks, explain and the schedules page.

The dashboard connects as a grant_dashboard role (`client`), a read-only one and a
tenant; every check of what changed reads the database as the superuser.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from flask.testing import FlaskClient

from tests.conftest import as_role
from tests.dashboard.seeding import Seeded, csrf_from
from treadle.dashboard import create_app, dashboard_of

JSON = {"Accept": "application/json"}
SETTINGS = (
    "SELECT paused, concurrency, rate_limit, extract(epoch FROM rate_period)::int, max_depth,"
    " extract(epoch FROM retain_completed)::int, extract(epoch FROM retain_failed)::int"
    " FROM treadle.queue_settings WHERE queue = %s"
)
EMPTY_LIMITS = dict.fromkeys(
    ("concurrency", "rate_limit", "rate_period", "max_depth", "retain_completed", "retain_failed"), ""
)


def settings(conn: psycopg.Connection[Any], queue: str) -> tuple[Any, ...] | None:
    return conn.execute(SETTINGS, [queue]).fetchone()


def post(client: FlaskClient, path: str, **form: str) -> tuple[int, dict[str, Any]]:
    token = csrf_from(client, "/queues/mail")
    response = client.post(path, data={"csrf_token": token, **form}, headers=JSON)
    return response.status_code, response.get_json()


def test_pause_and_resume_from_the_queue_page(
    client: FlaskClient, conn: psycopg.Connection[Any], seeded: Seeded
) -> None:
    page = client.get("/queues/mail").get_data(as_text=True)
    assert 'action="/queues/mail/pause"' in page and "/queues/mail/resume" not in page
    assert post(client, "/queues/mail/pause") == (200, {"ok": True, "message": "Queue mail paused."})
    assert settings(conn, "mail") == (True, None, None, None, None, None, None)
    again = post(client, "/queues/mail/pause")
    assert again == (409, {"ok": False, "message": "Queue mail was already paused: nothing changed."})
    page = client.get("/queues/mail").get_data(as_text=True)
    assert 'action="/queues/mail/resume"' in page and 'class="flag paused"' in page
    overview = client.get("/").get_data(as_text=True)
    assert '>mail</a> <span class="flag paused"' in overview
    assert '>media</a> <span class="flag paused"' not in overview
    assert post(client, "/queues/mail/resume") == (200, {"ok": True, "message": "Queue mail resumed."})
    assert settings(conn, "mail") is None  # no setting left: the queue is like any other again


def test_a_paused_queue_without_jobs_is_listed_on_the_overview(
    client: FlaskClient, conn: psycopg.Connection[Any], seeded: Seeded
) -> None:
    conn.execute("SELECT treadle.pause('quiet')")
    overview = client.get("/").get_data(as_text=True)
    assert 'Paused, with no jobs: <a href="/queues/quiet">quiet</a>' in overview


def test_the_limits_form_sets_every_limit_and_shows_them(
    client: FlaskClient, conn: psycopg.Connection[Any], seeded: Seeded
) -> None:
    conn.execute("SELECT treadle.pause('mail')")
    form = {"concurrency": "2", "rate_limit": "10", "rate_period": "1s", "max_depth": "500",
            "retain_completed": "7d", "retain_failed": "30d"}  # fmt: skip
    status, body = post(client, "/queues/mail/limits", **form)
    assert status == 200, body
    assert body["message"] == (
        "Queue mail: concurrency 2, rate 10/1s, max depth 500, keep completed 7d, keep failed 30d."
    )
    assert settings(conn, "mail") == (True, 2, 10, 1, 500, 7 * 86400, 30 * 86400)  # still paused
    page = client.get("/queues/mail").get_data(as_text=True)
    assert 'name="concurrency" inputmode="numeric" size="7" placeholder="no limit" value="2"' in page
    assert 'name="retain_failed" size="5" placeholder="global" value="30d"' in page
    assert "<dt>Rate limit</dt><dd>10 per 1s</dd>" in page
    # an empty field is no limit: the form holds every setting
    status, body = post(client, "/queues/mail/limits", **(EMPTY_LIMITS | {"max_depth": "9"}))
    assert (status, body["message"]) == (200, "Queue mail: max depth 9.")
    assert settings(conn, "mail") == (True, None, None, None, 9, None, None)


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"concurrency": "0"}, "concurrency"),
        ({"concurrency": "-3"}, "concurrency must be a whole number"),
        ({"concurrency": "1e3"}, "concurrency must be a whole number"),
        ({"concurrency": "9" * 40}, "concurrency must be a whole number"),
        ({"max_depth": "2000000"}, "max_depth"),
        ({"rate_limit": "5"}, "rate"),
        ({"rate_limit": "5", "rate_period": "soon"}, "rate period: 'soon' is not a duration"),
        ({"rate_limit": "5", "rate_period": "0s"}, "rate_period"),
        ({"retain_completed": "6000w"}, "retain_completed"),
        ({"retain_failed": "1d\x00"}, "retain failed"),
    ],
)
def test_bad_limits_are_refused_and_change_nothing(
    client: FlaskClient, conn: psycopg.Connection[Any], seeded: Seeded, form: dict[str, str], message: str
) -> None:
    conn.execute("SELECT treadle.set_queue('mail', concurrency => 4)")
    status, body = post(client, "/queues/mail/limits", **(EMPTY_LIMITS | form))
    assert status == 400 and not body["ok"] and message in body["message"], body
    assert settings(conn, "mail") == (False, 4, None, None, None, None, None)


def test_controls_need_the_csrf_token_and_post(
    client: FlaskClient, conn: psycopg.Connection[Any], seeded: Seeded
) -> None:
    csrf_from(client, "/queues/mail")
    for path in ("/queues/mail/pause", "/queues/mail/limits"):
        refused = client.post(path, data={"concurrency": "1"}, headers=JSON)
        assert refused.status_code == 400 and "CSRF" in refused.get_json()["message"]
        wrong = client.post(path, data={"csrf_token": "guess", "concurrency": "1"}, headers=JSON)
        assert wrong.status_code == 400
        foreign = client.post(
            path,
            data={"csrf_token": csrf_from(client), "concurrency": "1"},
            headers={**JSON, "Origin": "https://evil.example"},
        )
        assert foreign.status_code == 400
    assert client.get("/queues/mail/pause").status_code == 200  # a GET is the page of a queue named mail/pause
    assert settings(conn, "mail") is None
    assert settings(conn, "mail/pause") is None


def test_a_queue_name_with_a_slash(client: FlaskClient, conn: psycopg.Connection[Any], seeded: Seeded) -> None:
    assert post(client, "/queues/team/mail/pause")[0] == 200
    assert settings(conn, "team/mail") == (True, None, None, None, None, None, None)
    assert 'action="/queues/team/mail/resume"' in client.get("/queues/team/mail").get_data(as_text=True)


def test_read_only_shows_settings_without_controls_and_refuses_them(
    reader_dsn: str, conn: psycopg.Connection[Any], seeded: Seeded
) -> None:
    conn.execute("SELECT treadle.set_queue('mail', concurrency => 3), treadle.pause('mail')")
    app = create_app(reader_dsn, secret_key="test-secret", read_only=True)
    try:
        client = app.test_client()
        page = client.get("/queues/mail").get_data(as_text=True)
        assert "<dt>Concurrency</dt><dd>3</dd>" in page and 'class="flag paused"' in page
        assert "<form" not in page
        with client.session_transaction() as session:
            session["treadle_csrf"] = token = "known-token"
        for path in ("/queues/mail/resume", "/queues/mail/limits"):
            refused = client.post(path, data={"csrf_token": token}, headers=JSON)
            assert refused.status_code == 403 and "read-only" in refused.get_json()["message"]
    finally:
        dashboard_of(app).close()
    assert settings(conn, "mail") == (True, 3, None, None, None, None, None)


def test_a_read_only_grant_under_an_acting_dashboard_says_which_grant(
    dsn: str, reader_dsn: str, conn: psycopg.Connection[Any], seeded: Seeded
) -> None:
    app = create_app(reader_dsn, secret_key="test-secret")  # the dashboard acts; its role may not
    try:
        client = app.test_client()
        status, body = post(client, "/queues/mail/pause")
        assert status == 403 and "permission denied" in body["message"] and "grant_dashboard" in body["message"]
    finally:
        dashboard_of(app).close()
    assert settings(conn, "mail") is None


def test_a_tenant_controls_only_its_own_queues(
    dsn: str, conn: psycopg.Connection[Any], seeded: Seeded, make_role: Callable[[str], str]
) -> None:
    tenant = make_role("tenant")
    conn.execute("SELECT treadle.grant_dashboard(%s)", (tenant,))
    conn.execute("SELECT treadle.set_tenant(%s, 'billing')", (tenant,))
    conn.execute("SELECT treadle.set_queue('mail', concurrency => 5)")
    app = create_app(as_role(dsn, tenant), secret_key="test-secret")
    try:
        client = app.test_client()
        token = csrf_from(client, "/queues/billing")
        assert "<dt>Concurrency</dt><dd>no limit</dd>" in client.get("/queues/mail").get_data(as_text=True)
        for path, form in (("/queues/mail/pause", {}), ("/queues/mail/limits", {"concurrency": "1"})):
            refused = client.post(path, data={"csrf_token": token, **form}, headers=JSON)
            assert refused.status_code == 403, refused.get_data(as_text=True)
            assert f"role {tenant} may not use queue" in refused.get_json()["message"]
        mine = client.post("/queues/billing/limits", data={"csrf_token": token, "max_depth": "3"}, headers=JSON)
        assert mine.status_code == 200
    finally:
        dashboard_of(app).close()
    assert settings(conn, "mail") == (False, 5, None, None, None, None, None)
    assert settings(conn, "billing") == (False, None, None, None, 3, None, None)


def test_the_job_page_says_why_the_job_is_here(
    client: FlaskClient, conn: psycopg.Connection[Any], seeded: Seeded
) -> None:
    conn.execute("SELECT treadle.pause('mail')")
    page = client.get(f"/jobs/{seeded.available}").get_data(as_text=True)
    assert "Why is this job here?" in page
    reasons = conn.execute("SELECT reason, message FROM treadle.explain(%s)", [seeded.available]).fetchall()
    assert "paused" in [reason for reason, _ in reasons]
    for reason, message in reasons:
        assert f"<td><code>{reason}</code></td>" in page
        assert str(message).replace("'", "&#39;").replace('"', "&#34;") in page
    done = client.get(f"/jobs/{seeded.completed}").get_data(as_text=True)
    assert "<td><code>completed</code></td>" in done


def test_the_schedules_page_shows_next_runs_on_their_zones_clock(
    client: FlaskClient, conn: psycopg.Connection[Any], seeded: Seeded
) -> None:
    assert "No schedules." in client.get("/schedules").get_data(as_text=True)
    conn.execute("SELECT treadle.schedule('nightly', '30 2 * * *', 'build_report', tz => 'Europe/Paris')")
    conn.execute("SELECT treadle.schedule('hourly', '0 * * * *', 'sync', queue => 'flaky', tz => 'Asia/Kolkata')")
    rows = conn.execute(
        "SELECT name, to_char(next_run_local, 'YYYY-MM-DD HH24:MI'), to_char(next_run_at AT TIME ZONE 'UTC',"
        " 'YYYY-MM-DD HH24:MI:SS') FROM treadle.schedules ORDER BY name"
    ).fetchall()
    page = client.get("/schedules").get_data(as_text=True)
    assert 'aria-current="page">Schedules</a>' in page
    for name, local, utc in rows:
        assert f"<td>{name}</td>" in page
        assert f'<td class="when next-local">{local}</td>' in page
        assert f'<td class="when">{utc} ' in page
    assert next(local for name, local, _ in rows if name == "nightly").endswith(" 02:30")
    assert next(local for name, local, _ in rows if name == "hourly").endswith(":00")
    assert page.index("<td>hourly</td>") < page.index("<td>nightly</td>")


def test_a_plain_form_post_redirects_back_to_the_queue_with_a_message(
    client: FlaskClient, conn: psycopg.Connection[Any], seeded: Seeded
) -> None:
    token = csrf_from(client, "/queues/mail")
    done = client.post("/queues/mail/pause", data={"csrf_token": token, "next": "/queues/mail"})
    assert done.status_code == 303 and done.headers["Location"].endswith("/queues/mail")
    assert "Queue mail paused." in client.get("/queues/mail").get_data(as_text=True)
    refused = client.post("/queues/mail/limits", data={"csrf_token": token, "next": "/queues/mail", "concurrency": "0"})
    assert refused.status_code == 303
    assert "Queue mail: concurrency must be between 1 and 100000, got 0." in client.get("/queues/mail").get_data(
        as_text=True
    )
    assert settings(conn, "mail") == (True, None, None, None, None, None, None)
