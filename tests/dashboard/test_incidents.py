"""The pages for incidents, through the app's test client: search by args, key, worker
and error text; each job's attempts; bulk retry and cancel; the queue page.

The browser drives the same pages in test_browser.py; here each rule is checked
against the database, as each dashboard role: grant_dashboard, read-only, a tenant.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.conftest import as_role
from tests.dashboard.seeding import Seeded, claim, csrf_from, enqueue, job_state, one
from treadle.dashboard import create_app, dashboard_of
from treadle.dashboard.queries import QueueCounts, StateCount
from treadle.dashboard.state import DepthHistory

JSON = {"Accept": "application/json"}
OUTAGE_ERROR = "ConnectionRefusedError: [Errno 111] Connection refused"


def text(client: FlaskClient, path: str) -> str:
    response = client.get(path)
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_data(as_text=True)


def found_ids(html: str) -> list[int]:
    """The job ids a search page lists, in order."""
    results = html.split('<section id="results">')[1]
    return [int(n) for n in re.findall(r'<a href="/jobs/(\d+)">', results)]


def outage(conn: psycopg.Connection, jobs: int, queue: str = "outage", error: str = OUTAGE_ERROR) -> list[int]:
    """`jobs` jobs discarded by one error, as a worker that lost its database leaves them."""
    conn.execute(
        "SELECT treadle.enqueue('sync_account', jsonb_build_object('account', g), %s, max_attempts => 1)"
        "  FROM generate_series(1, %s) AS g",
        (queue, jobs),
    )
    while conn.execute(
        "SELECT count(treadle.fail(c.id, c.lease_token, %s, interval '1 hour'))"
        "  FROM treadle.claim('worker-outage-1', ARRAY[%s], batch => 500) AS c",
        (error, queue),
    ).fetchone() != (0,):
        pass
    return [int(r[0]) for r in conn.execute("SELECT id FROM treadle.jobs WHERE queue = %s ORDER BY id", (queue,))]


def states(conn: psycopg.Connection, queue: str) -> dict[str, int]:
    rows = conn.execute("SELECT state, count(*) FROM treadle.jobs WHERE queue = %s GROUP BY state", (queue,))
    return {state: int(n) for state, n in rows}


# --- search ---------------------------------------------------------------------------


def test_search_by_args_containment(client: FlaskClient, conn: psycopg.Connection, seeded: Seeded) -> None:
    pro = enqueue(conn, "invoice", "bills", json.dumps({"user": {"id": 42}, "plan": "pro", "tags": ["eu", "vip"]}))
    enqueue(conn, "invoice", "bills", json.dumps({"user": {"id": 7}, "plan": "pro"}))
    html = text(client, "/jobs?args=" + json.dumps({"user": {"id": 42}}))
    assert found_ids(html) == [pro]
    assert found_ids(text(client, "/jobs?args=" + json.dumps({"tags": ["vip"]}))) == [pro]
    assert len(found_ids(text(client, '/jobs?args={"plan": "pro"}&queue=bills'))) == 2
    assert 'id="window"' in html and "No index serves this search" in html  # the page says what it read
    assert 'value="{&#34;user&#34;: {&#34;id&#34;: 42}}"' in html  # the form keeps the search


def test_search_by_idempotency_key_is_indexed_with_a_queue(
    client: FlaskClient, conn: psycopg.Connection, seeded: Seeded
) -> None:
    keyed = one(conn, "SELECT treadle.enqueue('charge', '{}', 'billing', idempotency_key => 'order-7')")
    one(conn, "SELECT treadle.enqueue('charge', '{}', 'refunds', idempotency_key => 'order-8')")
    with_queue = text(client, "/jobs?key=order-7&queue=billing")
    assert found_ids(with_queue) == [keyed] and 'id="window"' not in with_queue
    without_queue = text(client, "/jobs?key=order-7")
    assert found_ids(without_queue) == [keyed] and 'id="window"' in without_queue
    assert found_ids(text(client, "/jobs?key=order-7&queue=refunds")) == []


def test_search_by_worker_and_by_error_text(client: FlaskClient, conn: psycopg.Connection, seeded: Seeded) -> None:
    html = text(client, "/jobs?worker=worker-a")
    assert set(found_ids(html)) >= {seeded.running, seeded.retryable, seeded.discarded, seeded.completed}
    assert seeded.available not in found_ids(html)
    assert found_ids(text(client, "/jobs?worker=nobody")) == []

    assert found_ids(text(client, "/jobs?error=INSUFFICIENT+funds")) == [seeded.discarded]  # any case
    assert found_ids(text(client, "/jobs?error=%25")) == []  # a LIKE wildcard is plain text here
    # an error that is no longer the last one is found in the job's history
    enqueue(conn, "flaky_feed", "feeds", max_attempts=3)
    job_id, token = claim(conn, "feeds")
    conn.execute("SELECT treadle.fail(%s, %s::uuid, 'alpha: first failure', interval '0')", (job_id, token))
    job_id, token = claim(conn, "feeds")
    conn.execute("SELECT treadle.fail(%s, %s::uuid, 'beta: second failure', interval '0')", (job_id, token))
    assert found_ids(text(client, "/jobs?error=alpha")) == [job_id]
    assert found_ids(text(client, "/jobs?error=alpha&state=completed")) == []


def test_a_windowed_search_reads_the_next_window_on_the_next_page(operator_dsn: str, conn: psycopg.Connection) -> None:
    wanted = [enqueue(conn, "tagged", "tags", '{"tag": "x"}') for _ in range(5)]
    for _ in range(4):
        enqueue(conn, "other", "tags", '{"tag": "y"}')
    app = create_app(operator_dsn, secret_key="test-secret", search_window=3, page_size=2)
    try:
        client = app.test_client()
        seen: list[int] = []
        path: str | None = '/jobs?args={"tag": "x"}'
        pages = 0
        while path is not None:
            html = text(client, path)
            assert "only the 3 newest jobs" in html
            seen += found_ids(html)
            older = re.search(r'<a href="([^"]+)" rel="next">Older</a>', html)
            path = older.group(1).replace("&amp;", "&") if older else None
            pages += 1
        assert seen == sorted(wanted, reverse=True)  # every match, once, newest first
        assert pages >= 3  # 9 jobs in windows of 3
    finally:
        dashboard_of(app).close()


def fail_at(conn: psycopg.Connection, when: str, queue: str, error: str = OUTAGE_ERROR) -> int:
    """A job of `queue` discarded at `when` (treadle's clock, moved in the superuser's session)."""
    conn.execute("SELECT set_config('treadle.now', %s, false)", (when,))
    try:
        job_id = enqueue(conn, "sync_account", queue, max_attempts=1)
        claimed, token = claim(conn, queue)
        conn.execute("SELECT treadle.fail(%s, %s::uuid, %s, interval '1 hour')", (claimed, token, error))
    finally:
        conn.execute("SELECT set_config('treadle.now', '', false)")
    return job_id


def test_search_by_failure_time_reads_every_failed_job_in_the_range(
    operator_dsn: str, conn: psycopg.Connection
) -> None:
    before_outage = fail_at(conn, "2026-11-30 01:59:00+00", "sync")
    during = [fail_at(conn, f"2026-11-30 02:{m:02}:00+00", "sync") for m in (0, 30, 59)]
    other_error = fail_at(conn, "2026-11-30 02:10:00+00", "sync", "KeyError: 'account'")
    after_outage = fail_at(conn, "2026-11-30 03:00:00+00", "sync")
    for _ in range(5):
        enqueue(conn, "newer", "sync")  # newer jobs that push the outage out of a small window
    app = create_app(operator_dsn, secret_key="test-secret", search_window=3)
    try:
        client = app.test_client()
        in_range = "failed_after=2026-11-30T02:00&failed_before=2026-11-30T03:00"
        html = text(client, f"/jobs?{in_range}")
        assert found_ids(html) == sorted([*during, other_error], reverse=True)
        assert 'id="window"' not in html and 'value="2026-11-30T02:00:00"' in html
        html = text(client, f"/jobs?{in_range}&error=refused")  # unindexed text, bounded by the range
        assert found_ids(html) == sorted(during, reverse=True) and 'id="window"' not in html
        assert found_ids(text(client, "/jobs?error=refused")) == []  # the window alone misses them
        assert found_ids(text(client, "/jobs?failed_before=2026-11-30T02:00Z")) == [before_outage]
        assert found_ids(text(client, "/jobs?failed_after=2026-11-30T04:00%2B01:00")) == [after_outage]

        html = text(client, f"/jobs/bulk/retry?{in_range}&error=refused")
        assert "Retry 3 jobs?" in html and "every job the search finds (an index bounds it)" in html
        fields = confirm(client, "retry", f"{in_range}&error=refused")
        assert client.post("/jobs/bulk/retry", data=fields, headers=JSON).status_code == 200
        assert [job_state(conn, j) for j in during] == ["available"] * 3
        assert job_state(conn, other_error) == "discarded" and job_state(conn, before_outage) == "discarded"
    finally:
        dashboard_of(app).close()


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("args=not-json", "this is not JSON"),
        ("args=42", "must be a JSON object or array"),
        ('args="text"', "must be a JSON object or array"),
        ("args=" + "[" * 300 + "]" * 300, "nested at most 100 deep"),
        ("args=" + json.dumps({"k": "x" * 2000}), "at most 2000 characters"),
        ("args=" + json.dumps({"k": "\u0000"}), "U+0000"),
        ("error=a%00b", "printable text"),
        ("error=" + "e" * 201, "printable text"),
        ("worker=tab%09in", "printable text"),
        ("key=" + "k" * 201, "printable text"),
        ("failed_after=yesterday", "must be a time like"),
        ("failed_before=2026-13-01T00:00", "must be a time like"),
        ("failed_after=" + "2" * 41, "must be a time like"),
    ],
)
def test_bad_search_input_is_refused(client: FlaskClient, query: str, says: str) -> None:
    response = client.get(f"/jobs?{query}")
    assert response.status_code == 400
    assert says in response.get_data(as_text=True)


# --- attempts ---------------------------------------------------------------------------


def attempt_rows(html: str) -> list[list[str]]:
    table = html.split('<table class="attempts" id="attempts">')[1].split("</table>")[0]
    rows = re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>")[1], re.S)
    return [
        [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)] for row in rows
    ]


def test_the_attempts_of_a_job_newest_first(client: FlaskClient, conn: psycopg.Connection) -> None:
    job_id = enqueue(conn, "import_feed", "feeds", max_attempts=5)
    claimed, token = claim(conn, "feeds", worker="worker-one")
    conn.execute("SELECT treadle.fail(%s, %s::uuid, 'TimeoutError: feed slow', interval '0')", (claimed, token))
    # the second claim's lease runs out: rescue() records the worker that stopped
    conn.execute("SELECT treadle.claim('worker-two', ARRAY['feeds'], lease => interval '1 millisecond')")
    conn.execute("SELECT pg_sleep(0.05)")
    assert one(conn, "SELECT treadle.rescue()") == 1
    _, token = claim(conn, "feeds", worker="worker-three")
    conn.execute("SELECT treadle.complete(%s, %s::uuid, '{}')", (job_id, token))

    rows = attempt_rows(text(client, f"/jobs/{job_id}"))
    assert [(r[0], r[1]) for r in rows] == [("3", "worker-three"), ("2", "worker-two"), ("1", "worker-one")]
    assert rows[0][5] == "completed" and rows[0][2] != "—" and rows[0][3] != "—"
    assert rows[1][5].startswith("lease expired: worker worker-two stopped heartbeating")
    assert rows[2][5] == "TimeoutError: feed slow" and rows[2][2] != "—"  # each attempt keeps its start


def test_a_running_attempt_and_a_job_never_run(client: FlaskClient, conn: psycopg.Connection, seeded: Seeded) -> None:
    rows = attempt_rows(text(client, f"/jobs/{seeded.running}"))
    assert len(rows) == 1 and rows[0][:2] == ["1", "worker-a"] and rows[0][3] == "running"
    assert "No attempt yet." in text(client, f"/jobs/{seeded.available}")
    # retried by hand: the old failure stays, the counter starts again
    conn.execute("SELECT treadle.retry(%s)", (seeded.discarded,))
    rows = attempt_rows(text(client, f"/jobs/{seeded.discarded}"))
    assert len(rows) == 1 and rows[0][0] == "1" and "CardDeclined" in rows[0][5]
    claim(conn, "billing", worker="worker-b")
    rows = attempt_rows(text(client, f"/jobs/{seeded.discarded}"))
    # the new claim is the one the job records: the old attempt's worker is no longer known
    assert [(r[0], r[1]) for r in rows] == [("1", "worker-b"), ("1", "worker-a")]


def test_an_entry_that_records_its_worker_and_start_shows_them(
    client: FlaskClient, conn: psycopg.Connection, seeded: Seeded
) -> None:
    """Entries as _append_error would write them if it kept each attempt's worker and start."""
    conn.execute(
        "UPDATE treadle.jobs SET errors = jsonb_build_array("
        "  jsonb_build_object('attempt', 1, 'at', '2026-11-30T02:00:05+00:00', 'error', 'first',"
        "                     'worker', 'host-7:worker', 'started_at', '2026-11-30T02:00:00+00:00'),"
        "  errors -> 0)"
        " WHERE id = %s",
        (seeded.retryable,),
    )
    rows = attempt_rows(text(client, f"/jobs/{seeded.retryable}"))
    assert rows[1][:5] == ["1", "host-7:worker", "2026-11-30 02:00:00", "2026-11-30 02:00:05", "5 s"]


def test_a_long_history_says_older_failures_were_dropped(client: FlaskClient, conn: psycopg.Connection) -> None:
    job_id = enqueue(conn, "hopeless", "hopeless", max_attempts=25)
    for attempt in range(1, 23):
        claimed, token = claim(conn, "hopeless")
        conn.execute("SELECT treadle.fail(%s, %s::uuid, %s, interval '0')", (claimed, token, f"Error {attempt}"))
    html = text(client, f"/jobs/{job_id}")
    rows = attempt_rows(html)
    assert [r[0] for r in rows] == [str(n) for n in range(22, 2, -1)]  # the newest 20 kept
    assert "Only the newest 20 failures are kept." in html


# --- bulk actions ----------------------------------------------------------------------


def confirm(client: FlaskClient, action: str, query: str) -> dict[str, str]:
    """The confirmation page's form fields (what the browser would post)."""
    html = text(client, f"/jobs/bulk/{action}?{query}")
    form = html.split('<form method="post"')[1].split("</form>")[0]
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', form))
    return {name: value.replace("&#34;", '"').replace("&amp;", "&") for name, value in fields.items()}


def test_bulk_retry_confirms_the_count_then_retries_in_batches(
    client: FlaskClient, conn: psycopg.Connection, seeded: Seeded
) -> None:
    ids = outage(conn, 1200)
    html = text(client, "/jobs/bulk/retry?queue=outage&state=discarded&error=refused")
    assert "Retry 1,200 jobs?" in html
    fields = confirm(client, "retry", "queue=outage&state=discarded&error=refused")
    assert fields["expected"] == "1200" and fields["queue"] == "outage"
    late = enqueue(conn, "sync_account", "outage")  # after the confirmation: not in it

    response = client.post("/jobs/bulk/retry", data=fields, headers=JSON)
    assert response.status_code == 200
    assert response.get_json() == {
        "ok": True,
        "message": "1,200 of 1,200 jobs retried in 3 batches.",
        "changed": 1200,
        "batches": 3,
    }
    assert states(conn, "outage") == {"available": 1201}
    assert one(conn, "SELECT count(*) FROM treadle.jobs WHERE id = ANY(%s) AND attempt = 0", ids) == 1200
    assert job_state(conn, late) == "available" and job_state(conn, seeded.discarded) == "discarded"


def test_bulk_cancel_cancels_waiting_jobs_and_asks_running_ones(
    client: FlaskClient, conn: psycopg.Connection, seeded: Seeded
) -> None:
    waiting = [enqueue(conn, "render", "renders") for _ in range(3)]
    running, _ = claim(conn, "renders")
    fields = confirm(client, "cancel", "queue=renders")
    assert fields["expected"] == "3"
    response = client.post("/jobs/bulk/cancel", data=fields)  # a plain form post
    assert response.status_code == 303 and response.headers["Location"] == "/jobs?queue=renders"
    assert "3 of 3 jobs cancelled" in text(client, "/jobs?queue=renders")  # the flashed message
    assert [job_state(conn, j) for j in waiting if j != running] == ["cancelled", "cancelled"]
    assert one(conn, "SELECT cancel_requested FROM treadle.jobs WHERE id = %s", running) is True
    assert job_state(conn, seeded.available) == "available"  # another queue


def test_bulk_action_takes_at_most_its_limit_and_skips_what_changed(
    operator_dsn: str, conn: psycopg.Connection
) -> None:
    outage(conn, 5)
    app = create_app(operator_dsn, secret_key="test-secret", bulk_limit=3)
    try:
        client = app.test_client()
        assert "More than 3 jobs match: this acts on the newest 3." in text(client, "/jobs/bulk/retry?queue=outage")
        fields = confirm(client, "retry", "queue=outage")
        newest = one(conn, "SELECT max(id) FROM treadle.jobs WHERE queue = 'outage'")
        conn.execute("SELECT treadle.retry(%s)", (newest,))  # someone was quicker with one
        response = client.post("/jobs/bulk/retry", data=fields, headers=JSON)
        assert response.get_json()["message"] == "3 of 3 jobs retried in 1 batch."
        assert states(conn, "outage") == {"available": 4, "discarded": 1}
    finally:
        dashboard_of(app).close()


def test_bulk_post_without_its_csrf_token_or_from_another_site_is_refused(
    client: FlaskClient, conn: psycopg.Connection
) -> None:
    outage(conn, 3)
    fields = confirm(client, "retry", "queue=outage")
    without = {k: v for k, v in fields.items() if k != "csrf_token"}
    assert client.post("/jobs/bulk/retry", data=without, headers=JSON).status_code == 400
    assert client.post("/jobs/bulk/retry", data=fields | {"csrf_token": "forged"}, headers=JSON).status_code == 400
    foreign = client.post("/jobs/bulk/retry", data=fields, headers=JSON | {"Origin": "https://evil.example"})
    assert foreign.status_code == 400
    assert states(conn, "outage") == {"discarded": 3}


@pytest.mark.parametrize(
    "form",
    [
        {},  # no confirmation
        {"upto": "0", "expected": "3"},
        {"upto": "1", "expected": "-1"},
        {"upto": "x", "expected": "3"},
        {"upto": str(2**63), "expected": "3"},
        {"upto": "1", "expected": "3", "args": "[[["},
        {"upto": "1", "expected": "3", "state": "lost"},
    ],
)
def test_bulk_post_with_bad_fields_is_refused(
    client: FlaskClient, conn: psycopg.Connection, form: dict[str, str]
) -> None:
    outage(conn, 3)
    token = csrf_from(client, "/jobs/bulk/retry?queue=outage")
    response = client.post("/jobs/bulk/retry", data={"csrf_token": token, "queue": "outage", **form}, headers=JSON)
    assert response.status_code == 400
    assert states(conn, "outage") == {"discarded": 3}


def test_an_unknown_bulk_action_is_not_found(client: FlaskClient) -> None:
    assert client.get("/jobs/bulk/delete").status_code == 404
    assert client.post("/jobs/bulk/delete", data={"csrf_token": "x"}).status_code in (400, 404)


def test_a_read_only_dashboard_offers_no_bulk_action_and_refuses_them(
    operator_dsn: str, conn: psycopg.Connection
) -> None:
    outage(conn, 3)
    app = create_app(operator_dsn, secret_key="test-secret", read_only=True)
    try:
        client = app.test_client()
        assert "Retry all matching" not in text(client, "/jobs?queue=outage")
        assert client.get("/jobs/bulk/retry?queue=outage").status_code == 403
        upto = one(conn, "SELECT max(id) FROM treadle.jobs")
        response = client.post("/jobs/bulk/retry", data={"queue": "outage", "upto": upto, "expected": 3})
        assert response.status_code == 403
        assert states(conn, "outage") == {"discarded": 3}
    finally:
        dashboard_of(app).close()


def test_a_read_only_role_is_refused_by_the_database_and_the_page_says_so(
    reader_dsn: str, conn: psycopg.Connection
) -> None:
    """A dashboard not told it is read-only, connected as grant_dashboard(read_only => true)."""
    outage(conn, 3)
    app = create_app(reader_dsn, secret_key="test-secret")
    try:
        client = app.test_client()
        fields = confirm(client, "retry", "queue=outage")
        response = client.post("/jobs/bulk/retry", data=fields, headers=JSON)
        assert response.status_code == 403
        message = response.get_json()["message"]
        assert message.startswith("Stopped after 0 of 3 jobs (0 retried): the database refused the next batch:")
        assert "permission denied for function retry" in message
        assert states(conn, "outage") == {"discarded": 3}
    finally:
        dashboard_of(app).close()


@pytest.fixture
def tenant_client(dsn: str, conn: psycopg.Connection, make_role: Callable[[str], str]) -> Iterator[FlaskClient]:
    """A dashboard connected as a grant_dashboard role kept to the queues under 'outage'."""
    tenant = make_role("tenant")
    conn.execute("SELECT treadle.grant_dashboard(%s)", (tenant,))
    conn.execute("SELECT treadle.set_tenant(%s, 'outage')", (tenant,))
    app: Flask = create_app(as_role(dsn, tenant), secret_key="test-secret")
    yield app.test_client()
    dashboard_of(app).close()


def test_a_tenants_bulk_action_reaches_its_queues_only(tenant_client: FlaskClient, conn: psycopg.Connection) -> None:
    outage(conn, 3, queue="outage-eu")
    outage(conn, 3, queue="billing")
    assert "Retry 3 jobs?" in text(tenant_client, "/jobs/bulk/retry?state=discarded")  # its own only
    assert "No job of this search is in a state to retry." in text(tenant_client, "/jobs/bulk/retry?queue=billing")
    # a crafted post for the other queue finds nothing it may see
    token = csrf_from(tenant_client, "/jobs/bulk/retry?state=discarded")
    upto = one(conn, "SELECT max(id) FROM treadle.jobs")
    refused = tenant_client.post(
        "/jobs/bulk/retry", data={"csrf_token": token, "queue": "billing", "upto": upto, "expected": 3}, headers=JSON
    )
    assert refused.status_code == 409 and refused.get_json()["message"] == "No job matches any more: nothing changed."
    fields = confirm(tenant_client, "retry", "state=discarded")
    assert tenant_client.post("/jobs/bulk/retry", data=fields, headers=JSON).status_code == 200
    assert states(conn, "outage-eu") == {"available": 3} and states(conn, "billing") == {"discarded": 3}


def test_a_tenants_single_action_outside_its_queues_shows_the_databases_refusal(
    tenant_client: FlaskClient, conn: psycopg.Connection
) -> None:
    (foreign,) = outage(conn, 1, queue="billing")
    outage(conn, 1, queue="outage-eu")
    token = csrf_from(tenant_client, "/jobs/bulk/retry?state=discarded")
    response = tenant_client.post(f"/jobs/{foreign}/retry", data={"csrf_token": token}, headers=JSON)
    assert response.status_code == 403 and "may not use queue" in response.get_json()["message"]
    assert job_state(conn, foreign) == "discarded"


# --- the queue page -----------------------------------------------------------------------


def test_the_queue_page(client: FlaskClient, conn: psycopg.Connection, seeded: Seeded) -> None:
    outage(conn, 4)
    outage(conn, 2, error="KeyError: 'account'")
    enqueue(conn, "sync_account", "outage")
    complete_id, token = claim(conn, "outage", worker="worker-q")
    conn.execute("SELECT treadle.complete(%s, %s::uuid, '{}')", (complete_id, token))
    enqueue(conn, "sync_account", "outage")
    conn.execute("SELECT treadle.worker_seen('worker-q', 'host-q', 7, ARRAY['outage'], 2, 0)")

    html = text(client, "/queues/outage")
    assert "<h1>outage <span" in html
    assert re.search(r"<b>6</b>\s*<span class=\"state-discarded\">", html)
    assert re.search(r"<b>1</b>\s*<span class=\"state-available\">", html)
    assert "1 completed, 6 discarded" in html  # this queue's only: the seed completed one elsewhere
    common = html.split('<table class="common-errors">')[1].split("</table>")[0]
    assert re.search(r'<td class="num">4</td><td><span class="error">ConnectionRefusedError', common)
    assert re.search(r"<td class=\"num\">2</td><td><span class=\"error\">KeyError: &#39;account&#39;", common)
    assert "<td>worker-q</td>" in html and "<td>worker-a</td>" not in html  # worker-a serves media
    assert 'id="controls"' in html and 'action="/queues/outage/pause"' in html  # test_queue_controls tests them
    assert "<polyline" in html and "1 sample" in html  # the first depth sample
    assert "No live worker serves this queue." in text(client, "/queues/mail")


def test_the_queue_page_of_a_large_table_estimates_finished_states_only(
    operator_dsn: str, conn: psycopg.Connection
) -> None:
    outage(conn, 40)
    enqueue(conn, "sync_account", "outage")
    enqueue(conn, "sync_account", "outage")
    claim(conn, "outage", worker="worker-q")
    conn.execute("ANALYZE treadle.jobs")
    app = create_app(operator_dsn, secret_key="test-secret", exact_counts_up_to=10)  # 42 rows: "large"
    try:
        html = text(app.test_client(), "/queues/outage")
    finally:
        dashboard_of(app).close()
    assert re.search(r'<b class="estimate"[^>]*>≈\d+</b>\s*<span class="state-discarded">', html)
    assert re.search(r"<b>1</b>\s*<span class=\"state-available\">", html)  # from the claim index
    assert re.search(r"<b>1</b>\s*<span class=\"state-running\">", html)  # from the lease index
    assert re.search(r"<b>0</b>\s*<span class=\"state-retryable\">", html)


def test_a_queue_without_jobs_and_bad_queue_names(client: FlaskClient, seeded: Seeded) -> None:
    assert "This queue holds no jobs now." in text(client, "/queues/nothing-here")
    assert client.get("/queues/" + "q" * 201).status_code == 404
    assert client.get("/queues/a%09b").status_code == 404


def test_depth_history_samples_at_most_every_spacing_and_forgets_after_its_span() -> None:
    history = DepthHistory(span=timedelta(minutes=10), spacing=timedelta(seconds=10), max_queues=2)
    start = datetime(2026, 12, 1, tzinfo=timezone.utc)

    def counts(queue: str, waiting: int) -> QueueCounts:
        return QueueCounts(queue, {"available": StateCount("available", waiting, False)})

    for second in range(0, 700, 5):  # a sample every 5 s for 11 min 40 s
        samples = history.record(start + timedelta(seconds=second), [counts("a", second)])
    kept = samples["a"]
    assert [s.at - kept[0].at for s in kept[:2]] == [timedelta(0), timedelta(seconds=10)]
    assert kept[-1].waiting == 690 and kept[-1].at - kept[0].at <= timedelta(minutes=10)
    history.record(start, [counts("b", 1), counts("c", 1)])
    assert set(history.record(start, [])) == {"a", "b"}  # no more queues than max_queues
