"""CSRF, read-only mode, the auth hook, basic auth, headers and escaping."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from flask import Flask, Request
from flask.testing import FlaskClient
from markupsafe import escape
from werkzeug.wrappers import Response as BaseResponse

from tests.conftest import as_role
from tests.dashboard.seeding import XSS_ARGS, XSS_ERROR, XSS_NAME, Seeded, csrf_from, job_state
from treadle.dashboard import create_app, dashboard_of

JSON = {"Accept": "application/json"}


MakeApp = Callable[..., Flask]


@pytest.fixture
def make_app(operator_dsn: str, reader_dsn: str) -> Iterator[MakeApp]:
    """create_app over the test's database with the options given; closed after the test.

    A read-only dashboard connects as a role granted only reading."""
    made: list[Flask] = []

    def make(**options: Any) -> Flask:
        dsn = reader_dsn if options.get("read_only") else operator_dsn
        app = create_app(dsn, secret_key="test-secret", **options)
        made.append(app)
        return app

    yield make
    for app in made:
        dashboard_of(app).close()


# CSRF


def test_a_post_without_the_token_is_refused_and_changes_nothing(
    client: FlaskClient, conn: psycopg.Connection, seeded: Seeded
) -> None:
    client.get("/")  # the session exists, the token is not sent
    response = client.post(f"/jobs/{seeded.discarded}/retry", headers=JSON)
    assert response.status_code == 400 and "CSRF token is missing or wrong" in response.get_json()["message"]
    assert job_state(conn, seeded.discarded) == "discarded"


def test_a_token_from_another_session_is_refused(app: Flask, conn: psycopg.Connection, seeded: Seeded) -> None:
    other = csrf_from(app.test_client())
    client = app.test_client()
    client.get("/")
    response = client.post(f"/jobs/{seeded.available}/cancel", data={"csrf_token": other}, headers=JSON)
    assert response.status_code == 400
    assert job_state(conn, seeded.available) == "available"


def test_a_post_with_no_session_at_all_is_refused(
    client: FlaskClient, conn: psycopg.Connection, seeded: Seeded
) -> None:
    response = client.post(f"/jobs/{seeded.available}/cancel", data={"csrf_token": "guess"})
    assert response.status_code == 400 and "CSRF token" in response.get_data(as_text=True)
    assert job_state(conn, seeded.available) == "available"


def test_the_token_may_come_in_a_header(client: FlaskClient, conn: psycopg.Connection, seeded: Seeded) -> None:
    token = csrf_from(client)
    response = client.post(f"/jobs/{seeded.available}/cancel", headers={**JSON, "X-CSRF-Token": token})
    assert response.status_code == 200
    assert job_state(conn, seeded.available) == "cancelled"


def test_a_post_from_another_origin_is_refused(client: FlaskClient, conn: psycopg.Connection, seeded: Seeded) -> None:
    token = csrf_from(client)
    response = client.post(
        f"/jobs/{seeded.available}/cancel",
        data={"csrf_token": token},
        headers={**JSON, "Origin": "https://evil.example"},
    )
    assert response.status_code == 400 and "another site" in response.get_json()["message"]
    assert job_state(conn, seeded.available) == "available"
    same = client.post(
        f"/jobs/{seeded.available}/cancel", data={"csrf_token": token}, headers={**JSON, "Origin": "http://localhost"}
    )
    assert same.status_code == 200


def test_the_session_cookie_is_http_only_and_same_site(client: FlaskClient, seeded: Seeded) -> None:
    csrf_from(client)
    cookie = client.get_cookie("treadle_dashboard")
    assert cookie is not None and cookie.http_only and cookie.same_site == "Lax"


def runs_now(conn: psycopg.Connection) -> list[tuple[Any, ...]]:
    """Every workflow run and step job as it stands: what a run action could change."""
    return conn.execute(
        "SELECT 'run', r.id, r.state, r.results::text, 0 FROM treadle.workflow_runs AS r"
        " UNION ALL SELECT 'job', j.id, j.state, j.step, j.attempt FROM treadle.jobs AS j"
        " WHERE j.workflow_run_id IS NOT NULL ORDER BY 1, 2"
    ).fetchall()


def test_run_actions_without_the_right_token_are_refused_and_change_nothing(
    app: Flask, client: FlaskClient, conn: psycopg.Connection, seeded: Seeded
) -> None:
    other_session = csrf_from(app.test_client())
    token = csrf_from(client, f"/runs/{seeded.failed_run}")
    actions = (
        f"/runs/{seeded.running_run}/cancel",
        f"/runs/{seeded.failed_run}/retry",
        f"/runs/{seeded.failed_run}/fork",
        f"/runs/{seeded.failed_run}/compensate",
    )
    before = runs_now(conn)
    for path in actions:
        for sent in ({}, {"csrf_token": other_session}, {"csrf_token": "guess"}):
            response = client.post(path, data={**sent, "step": "charge"}, headers=JSON)
            assert response.status_code == 400, (path, sent, response.status_code)
            assert "CSRF token is missing or wrong" in response.get_json()["message"]
        response = client.post(
            path, data={"csrf_token": token, "step": "charge"}, headers={**JSON, "Origin": "https://evil.example"}
        )
        assert response.status_code == 400 and "another site" in response.get_json()["message"], path
    assert runs_now(conn) == before
    # the same actions with the session's token do act: what the refusals left alone could change
    for path in actions[:3]:
        response = client.post(path, data={"csrf_token": token, "step": "charge"}, headers=JSON)
        assert response.status_code == 200, (path, response.get_data(as_text=True))
    after = runs_now(conn)
    assert (
        after != before
        and len([row for row in after if row[0] == "run"]) == len([row for row in before if row[0] == "run"]) + 1
    ), "the fork is a new run"


# read-only


def test_read_only_hides_and_refuses_actions(make_app: MakeApp, conn: psycopg.Connection, seeded: Seeded) -> None:
    client = make_app(read_only=True).test_client()
    before = runs_now(conn)
    for path in ("/", f"/jobs/{seeded.discarded}", f"/runs/{seeded.failed_run}", f"/?run={seeded.failed_run}"):
        page = client.get(path).get_data(as_text=True)
        assert '<form class="action"' not in page and "read-only</span>" in page
    with client.session_transaction() as session:
        session["treadle_csrf"] = token = "known-token"
    for path in (
        f"/jobs/{seeded.discarded}/retry",
        f"/jobs/{seeded.available}/cancel",
        f"/runs/{seeded.running_run}/cancel",
        f"/runs/{seeded.failed_run}/retry",
        f"/runs/{seeded.failed_run}/fork",
        f"/runs/{seeded.failed_run}/compensate",
    ):
        response = client.post(path, data={"csrf_token": token, "step": "charge"}, headers=JSON)
        assert response.status_code == 403 and "read-only" in response.get_json()["message"]
    assert job_state(conn, seeded.discarded) == "discarded" and job_state(conn, seeded.available) == "available"
    assert runs_now(conn) == before, "no run action of a read-only dashboard changed a run"


def test_a_role_without_grants_is_told_how_to_get_them(
    dsn: str, seeded: Seeded, make_role: Callable[[str], str]
) -> None:
    app = create_app(as_role(dsn, make_role("ungranted")), secret_key="test-secret")
    try:
        page = app.test_client().get("/")
        assert page.status_code == 403
        assert "permission denied" in page.get_data(as_text=True)
        assert "treadle.grant_dashboard(role)" in page.get_data(as_text=True)
    finally:
        dashboard_of(app).close()


def test_a_tenants_dashboard_shows_and_acts_on_its_queues_only(
    dsn: str, conn: psycopg.Connection, seeded: Seeded, make_role: Callable[[str], str]
) -> None:
    tenant = make_role("tenant")
    conn.execute("SELECT treadle.grant_dashboard(%s)", (tenant,))
    conn.execute("SELECT treadle.set_tenant(%s, 'billing')", (tenant,))
    app = create_app(as_role(dsn, tenant), secret_key="test-secret")
    try:
        client = app.test_client()
        overview = client.get("/").get_data(as_text=True)
        assert "charge_card" in overview and "sync_crm" not in overview and ">mail<" not in overview
        found = client.get("/jobs").get_data(as_text=True)
        assert f"#{seeded.discarded}<" in found and f"#{seeded.available}<" not in found
        assert client.get(f"/jobs/{seeded.available}").status_code == 404  # another tenant's job
        token = csrf_from(client)
        refused = client.post(f"/jobs/{seeded.available}/cancel", data={"csrf_token": token}, headers=JSON)
        assert refused.status_code == 403
        assert f"role {tenant} may not use queue" in refused.get_json()["message"]
        assert job_state(conn, seeded.available) == "available"
        retried = client.post(f"/jobs/{seeded.discarded}/retry", data={"csrf_token": token}, headers=JSON)
        assert retried.status_code == 200 and job_state(conn, seeded.discarded) == "available"
    finally:
        dashboard_of(app).close()


# the auth hook


def test_an_auth_hook_decides_who_sees_and_who_acts(
    make_app: MakeApp, conn: psycopg.Connection, seeded: Seeded
) -> None:
    def auth(request: Request) -> object:
        return {"operator": True, "viewer": "read"}.get(request.headers.get("X-User", ""), False)

    app = make_app(auth=auth)
    stranger = app.test_client()
    assert stranger.get("/").status_code == 403
    assert stranger.get("/static/dashboard.js").status_code == 403
    assert stranger.get("/health").status_code == 200

    viewer = app.test_client()
    viewer.environ_base["HTTP_X_USER"] = "viewer"
    page = viewer.get("/").get_data(as_text=True)
    assert "Retry now" not in page and "read-only</span>" in page
    with viewer.session_transaction() as session:
        session["treadle_csrf"] = "t"
    assert viewer.post(f"/jobs/{seeded.discarded}/retry", data={"csrf_token": "t"}).status_code == 403

    operator = app.test_client()
    operator.environ_base["HTTP_X_USER"] = "operator"
    token = csrf_from(operator)
    assert operator.post(f"/jobs/{seeded.discarded}/retry", data={"csrf_token": token}, headers=JSON).status_code == 200
    assert job_state(conn, seeded.discarded) == "available"


def test_an_auth_hook_may_answer_with_its_own_response(make_app: MakeApp) -> None:
    def auth(request: Request) -> BaseResponse:  # a plain werkzeug response, not Flask's
        return BaseResponse("log in first", status=302, headers={"Location": "/login?next=" + request.path})

    response = make_app(auth=auth).test_client().get("/jobs")
    assert response.status_code == 302 and response.headers["Location"] == "/login?next=/jobs"


def test_an_auth_hook_with_a_strange_answer_is_an_error(make_app: MakeApp) -> None:
    app = make_app(auth=lambda request: "admin")
    app.testing = False
    assert app.test_client().get("/").status_code == 500


# basic auth


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_basic_auth_guards_every_page_but_health(make_app: MakeApp, seeded: Seeded) -> None:
    client = make_app(basic_auth=("admin", "s3cret")).test_client()
    for path in ("/", "/jobs", f"/jobs/{seeded.running}", "/static/dashboard.css", "/nowhere"):
        response = client.get(path)
        assert response.status_code == 401, path
        assert response.headers["WWW-Authenticate"].startswith("Basic realm=")
    assert client.get("/", headers=basic("admin", "wrong")).status_code == 401
    assert client.get("/", headers=basic("root", "s3cret")).status_code == 401
    assert client.get("/", headers=basic("admin", "s3cret")).status_code == 200
    assert client.get("/health").status_code == 200


def test_basic_auth_still_needs_the_csrf_token(make_app: MakeApp, conn: psycopg.Connection, seeded: Seeded) -> None:
    client = make_app(basic_auth=("admin", "s3cret")).test_client()
    credentials = basic("admin", "s3cret")
    client.get("/", headers=credentials)
    assert client.post(f"/jobs/{seeded.available}/cancel", headers={**credentials, **JSON}).status_code == 400
    assert job_state(conn, seeded.available) == "available"


def test_trusted_hosts_turn_away_other_host_names(make_app: MakeApp, seeded: Seeded) -> None:
    client = make_app(trusted_hosts=["localhost", "127.0.0.1"]).test_client()
    assert client.get("/").status_code == 200  # the test client says Host: localhost
    assert client.get("/", headers={"Host": "127.0.0.1:5000"}).status_code == 200
    for path in ("/", "/health", "/static/dashboard.js"):
        response = client.get(path, headers={"Host": "rebound.example:5000"})
        assert response.status_code == 400, path
        assert "does not answer to that host name" in response.get_data(as_text=True)


# headers


def test_every_answer_carries_the_security_headers(client: FlaskClient, seeded: Seeded) -> None:
    for path in ("/", "/jobs", "/nowhere", "/health", "/static/dashboard.js"):
        headers = client.get(path, buffered=True).headers  # a file's answer read and closed
        policy = headers["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy and "unsafe-inline" not in policy
        assert headers["X-Content-Type-Options"] == "nosniff" and headers["X-Frame-Options"] == "DENY"


def test_pages_hold_no_inline_script_or_handler(client: FlaskClient, seeded: Seeded) -> None:
    for path in ("/", f"/?run={seeded.failed_run}", "/jobs", f"/jobs/{seeded.xss}", f"/runs/{seeded.failed_run}"):
        page = client.get(path).get_data(as_text=True)
        assert re.findall(r"<script[^>]*>", page) == ['<script src="/static/dashboard.js" defer>']
        assert not re.search(r"<[^>]+\son\w+=", page), path
        assert "style=" not in page


# escaping


def shown(text: str) -> str:
    """Text as the templates write it into HTML."""
    return str(escape(text))


def test_markup_in_names_args_and_errors_is_shown_as_text(client: FlaskClient, seeded: Seeded) -> None:
    overview = client.get("/").get_data(as_text=True)
    assert shown(XSS_NAME) in overview and XSS_NAME not in overview
    first_line = XSS_ERROR.splitlines()[0]
    assert shown(first_line) in overview and first_line not in overview

    job = client.get(f"/jobs/{seeded.xss}").get_data(as_text=True)
    assert shown(XSS_ARGS["html"]) in job and XSS_ARGS["html"] not in job
    assert shown(XSS_ERROR) in job and "<script>window" not in job

    search = client.get("/jobs?queue=hostile").get_data(as_text=True)
    assert shown(XSS_NAME) in search and XSS_NAME not in search


def test_markup_in_search_input_is_shown_as_text(client: FlaskClient) -> None:
    payload = '"><script>alert(1)</script>'
    page = client.get("/jobs", query_string={"queue": payload}).get_data(as_text=True)
    assert 'value="&#34;&gt;&lt;script&gt;alert(1)&lt;/script&gt;"' in page and payload not in page
    error = client.get("/jobs", query_string={"id": payload}).get_data(as_text=True)
    assert payload not in error
