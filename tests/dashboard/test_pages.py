"""Every page through Flask's test client, over a database with jobs in every state."""

from __future__ import annotations

import re

import psycopg
import pytest
from flask import Flask
from flask.testing import FlaskClient
from markupsafe import escape

from tests.conftest import EXTENSION_VERSION
from tests.dashboard.seeding import (
    DEEP_JSON,
    Seeded,
    deep_rows,
    enqueue,
    fail_with_traceback,
    lease_token,
    one,
    python_traceback,
)
from treadle.dashboard import create_app, dashboard_of
from treadle.dashboard.formatting import error_summary


def text(client: FlaskClient, path: str, status: int = 200) -> str:
    response = client.get(path)
    assert response.status_code == status, response.get_data(as_text=True)
    return response.get_data(as_text=True)


def section(html: str, section_id: str) -> str:
    match = re.search(rf'<section id="{section_id}".*?</section>', html, re.S)
    assert match, f"no section {section_id}"
    return match.group(0)


def test_overview_counts_every_state(client: FlaskClient, seeded: Seeded) -> None:
    states = section(text(client, "/"), "states")
    found = {state: n for n, state in re.findall(r"<b>([\d,]+)</b>\s*<span class=\"state-(\w+)\">", states)}
    assert found == {
        "available": "2",  # the mail job and the signup run's first step
        "running": "1",
        "retryable": "1",
        "completed": "2",
        "discarded": "3",
        "cancelled": "1",
        "blocked": "0",
    }
    assert "≈" not in states


def test_overview_lists_queues_with_their_oldest_waiting_age(client: FlaskClient, seeded: Seeded) -> None:
    queues = section(text(client, "/"), "queues")
    rows = re.findall(r'<tr>\s*<td><a href="/queues/(\w+)">', queues)
    # the busiest first (test_many_queues.py pins the order)
    assert len(rows) == len(set(rows)) and {"mail", "media", "billing", "orders", "signups"} <= set(rows)
    mail = re.search(r"/queues/mail\">mail</a></td>(.*?)</tr>", queues, re.S)
    assert mail and re.search(r'<td class="num[^"]*">\d+(\.\d)? s</td>', mail.group(1))


def test_overview_shows_estimates_as_estimates(operator_dsn: str, conn: psycopg.Connection) -> None:
    conn.execute(
        "INSERT INTO treadle.jobs (queue, name, state, run_at, created_at, finished_at)"
        " SELECT 'bulk', 'n', 'completed', now(), now(), now() FROM generate_series(1, 500)"
    )
    conn.execute("ANALYZE treadle.jobs")
    app = create_app(operator_dsn, exact_counts_up_to=100)
    try:
        html = text(app.test_client(), "/")
    finally:
        dashboard_of(app).close()
    assert re.search(
        r'<b class="estimate" title="Estimated from table statistics">≈\d+</b>\s*<span class="state-completed">', html
    )
    assert "estimated from PostgreSQL's statistics" in html


def test_overview_chart_has_a_bar_and_title_per_minute(client: FlaskClient, seeded: Seeded) -> None:
    chart = section(text(client, "/"), "throughput")
    titles = re.findall(r"<title>(\d\d:\d\d) UTC: (\d+) completed, (\d+) discarded</title>", chart)
    assert len(titles) == 60
    assert sum(int(c) for _, c, _ in titles) == 2 and sum(int(d) for _, _, d in titles) == 3
    assert chart.count('class="discarded"') >= 1 and chart.count('class="completed"') >= 1


def test_overview_failures_show_first_line_and_whole_error(client: FlaskClient, seeded: Seeded) -> None:
    failures = section(text(client, "/"), "failures")
    assert f'href="/jobs/{seeded.retryable}">sync_crm</a>' in failures
    assert (
        "<summary>ConnectionError: timed out</summary><pre>ConnectionError: timed out\n  at sync_crm()</pre>"
        in failures
    )
    assert '<span class="error">CardDeclined: insufficient funds</span>' in failures
    assert "1 / 3" in failures and "1 / 1" in failures
    retry_forms = re.findall(r'action="/jobs/(\d+)/retry"', failures)
    cancel_forms = re.findall(r'action="/jobs/(\d+)/cancel"', failures)
    assert str(seeded.discarded) in retry_forms and str(seeded.retryable) in retry_forms
    assert cancel_forms == [str(seeded.retryable)]  # a discarded job is finished: nothing to cancel


def test_a_traceback_is_summed_up_by_its_exception_and_shown_whole_on_demand(
    client: FlaskClient, conn: psycopg.Connection
) -> None:
    job_id = fail_with_traceback(conn)
    whole = str(escape(python_traceback()))
    failures = section(text(client, "/"), "failures")
    assert f"<summary>ValueError: feed 7 has no items</summary><pre>{whole}</pre>" in failures
    assert "<summary>Traceback" not in failures
    found = section(text(client, "/jobs?queue=feeds"), "results")
    assert '<span class="error">ValueError: feed 7 has no items</span>' in found
    assert f"<pre>{whole}</pre>" in text(client, f"/jobs/{job_id}")  # the job page: the whole traceback


@pytest.mark.parametrize(
    ("error", "summary"),
    [
        (python_traceback(), "ValueError: feed 7 has no items"),
        (
            "Traceback (most recent call last):\n  File \"w.py\", line 1, in f\n    g()\nKeyError: 'x'\n",
            "KeyError: 'x'",
        ),
        (
            '  + Exception Group Traceback (most recent call last):\n  |   File "w.py", line 3, in <module>\n'
            "  | ExceptionGroup: two failed (2 sub-exceptions)\n  +-+---------------- 1 ----------------\n"
            "    | ValueError: a\n    +------------------------------------\n",
            "ExceptionGroup: two failed (2 sub-exceptions)",
        ),
        ("CardDeclined: insufficient funds\n  at charge()", "CardDeclined: insufficient funds"),
        ("\n  only indented\n", "only indented"),
    ],
)
def test_error_summary_names_the_exception(error: str, summary: str) -> None:
    assert error_summary(error) == summary


def test_overview_lists_runs_and_opens_one(client: FlaskClient, seeded: Seeded) -> None:
    runs = section(text(client, "/"), "runs")
    assert f'data-run="{seeded.failed_run}" aria-expanded="false"' in runs
    assert '<td class="num">1 / 3</td>' in runs
    assert f'action="/runs/{seeded.running_run}/cancel"' in runs
    assert f'action="/runs/{seeded.failed_run}/cancel"' not in runs
    assert 'class="steps"' not in runs

    opened = section(text(client, f"/?run={seeded.failed_run}"), "runs")
    assert f'data-run="{seeded.failed_run}" aria-expanded="true"' in opened
    steps = re.findall(r'<td>(reserve|charge|ship)</td>\s*<td><span class="state state-(\w+)">', opened)
    assert steps == [("reserve", "completed"), ("charge", "discarded"), ("ship", "pending")]
    assert f'action="/jobs/{seeded.failed_step}/retry"' in opened and "Retry step" in opened
    assert '{"hold": "h-1"}' in opened.replace("&#34;", '"')


def test_overview_opens_a_run_that_is_not_among_the_recent(
    operator_dsn: str, conn: psycopg.Connection, seeded: Seeded
) -> None:
    for _ in range(3):
        conn.execute("SELECT treadle.start_workflow('later', '{}', ARRAY['x'])")
    app = create_app(operator_dsn, recent_rows=2)
    try:
        runs = section(text(app.test_client(), f"/?run={seeded.failed_run}"), "runs")
    finally:
        dashboard_of(app).close()
    assert '<div class="open-run">' in runs and "<td>charge</td>" in runs


@pytest.mark.parametrize(
    ("query", "status", "message"),
    [
        ("?run=abc", 400, "run must be a workflow run id"),
        ("?run=-1", 400, "run must be a workflow run id"),
        ("?run=99999999999999999999", 400, "run must be a workflow run id"),
        ("?run=424242", 404, "There is no workflow run 424242."),
    ],
)
def test_overview_refuses_a_bad_run(client: FlaskClient, seeded: Seeded, query: str, status: int, message: str) -> None:
    assert message in text(client, "/" + query, status)


def test_overview_lists_live_workers(client: FlaskClient, seeded: Seeded) -> None:
    workers = section(text(client, "/"), "workers")
    assert "<td>worker-a</td>" in workers and "<td>host-a</td>" in workers
    assert '<td class="num">1 / 4</td>' in workers  # worker-a holds the running job


def test_empty_database_says_so(client: FlaskClient) -> None:
    html = text(client, "/")
    for empty in ("No jobs yet.", "No failures on record.", "No workflow runs yet.", "No worker has reported"):
        assert empty in html


def test_job_page_shows_everything_about_a_job(client: FlaskClient, seeded: Seeded) -> None:
    running = text(client, f"/jobs/{seeded.running}")
    assert '<progress max="1" value="0.4"></progress> 40%' in running
    assert "resizing" in running and "Lease until" in running and "worker-a" in running
    assert f'action="/jobs/{seeded.running}/cancel"' in running
    assert f'action="/jobs/{seeded.running}/retry"' not in running

    completed = text(client, f"/jobs/{seeded.completed}")
    assert "<h2>Result</h2>" in completed and "&#34;rows&#34;: 42" in completed
    assert "/cancel" not in completed and "/retry" not in completed

    retryable = text(client, f"/jobs/{seeded.retryable}")
    attempts = retryable.split('<table class="attempts" id="attempts">')[1]
    assert '<td class="num">1</td>' in attempts and "<pre>ConnectionError: timed out\n  at sync_crm()</pre>" in attempts
    assert (
        f'action="/jobs/{seeded.retryable}/retry"' in retryable
        and f'action="/jobs/{seeded.retryable}/cancel"' in retryable
    )

    step = text(client, f"/jobs/{seeded.failed_step}")
    assert f'<a href="/runs/{seeded.failed_run}">#{seeded.failed_run}</a>, step charge' in step


def test_job_page_never_shows_a_lease_token(client: FlaskClient, conn: psycopg.Connection, seeded: Seeded) -> None:
    running = text(client, f"/jobs/{seeded.running}")
    assert "Lease until" in running and lease_token(conn, seeded.running) not in running


def test_payloads_too_deep_to_decode_are_shown_as_their_text(client: FlaskClient, conn: psycopg.Connection) -> None:
    deep = deep_rows(conn)
    job = text(client, f"/jobs/{deep.job}")
    assert job.count(f'<pre class="json">{DEEP_JSON}</pre>') == 2  # args and result
    assert '<pre class="json">[{&#34;at&#34;: ' in job and DEEP_JSON in job.split("<h2>Attempts</h2>")[1]
    run = text(client, f"/runs/{deep.run}")
    assert f'<pre class="json">{DEEP_JSON}</pre>' in run  # the input
    assert f'<code class="result">{DEEP_JSON[:199]}…</code>' in run  # the first step's result, cut
    assert DEEP_JSON[:199] in text(client, f"/?run={deep.run}")  # and opened on the overview


def test_job_page_shows_a_periodic_series(client: FlaskClient, conn: psycopg.Connection) -> None:
    job_id = one(conn, "SELECT treadle.enqueue('tick', every => interval '5 minutes')")
    assert "<dt>Repeats every</dt><dd>5 min" in text(client, f"/jobs/{job_id}")


@pytest.mark.parametrize(
    "path", ["/jobs/424242", "/jobs/0", "/jobs/99999999999999999999", "/runs/424242", "/jobs/abc", "/nowhere"]
)
def test_unknown_pages_are_404(client: FlaskClient, seeded: Seeded, path: str) -> None:
    html = text(client, path, 404)
    assert '<p class="error-message">' in html


def test_run_page_shows_steps_input_and_actions(client: FlaskClient, seeded: Seeded) -> None:
    failed = text(client, f"/runs/{seeded.failed_run}")
    assert 'order <span class="muted">workflow run #' in failed
    assert "&#34;order&#34;: 7" in failed
    assert f'action="/jobs/{seeded.failed_step}/retry"' in failed and "Cancel run" not in failed
    running = text(client, f"/runs/{seeded.running_run}")
    assert f'action="/runs/{seeded.running_run}/cancel"' in running


def ids_on(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<a href="/jobs/(\d+)">[^<]*</a> <span class="muted">#\d+</span>', html)]


def test_search_filters_by_name_queue_and_state(client: FlaskClient, seeded: Seeded) -> None:
    assert ids_on(text(client, "/jobs?queue=mail")) == [seeded.available]
    assert ids_on(text(client, "/jobs?state=discarded")) == sorted(
        [seeded.discarded, seeded.xss, seeded.failed_step], reverse=True
    )
    assert ids_on(text(client, "/jobs?name=workflow%3Aorder")) == sorted(
        [seeded.failed_step, seeded.failed_step - 1], reverse=True
    )
    assert ids_on(text(client, "/jobs?name=charge&queue=billing&state=discarded")) == [seeded.discarded]
    assert "No job matches." in text(client, "/jobs?queue=nowhere")


def test_search_by_id_opens_the_job(client: FlaskClient, seeded: Seeded) -> None:
    response = client.get(f"/jobs?id={seeded.completed}")
    assert response.status_code == 303 and response.headers["Location"] == f"/jobs/{seeded.completed}"
    assert "There is no job 424242." in text(client, "/jobs?id=424242", 404)


def test_search_pages_by_keyset(operator_dsn: str, conn: psycopg.Connection) -> None:
    ids = [enqueue(conn, "page_me", "paging") for _ in range(5)]
    app = create_app(operator_dsn, page_size=2)
    try:
        client = app.test_client()
        first = text(client, "/jobs?queue=paging")
        assert ids_on(first) == [ids[4], ids[3]]
        older = re.search(r'href="(/jobs\?[^"]+)" rel="next"', first)
        assert older and f"before={ids[3]}" in older.group(1)
        second = text(client, older.group(1).replace("&amp;", "&"))
        assert ids_on(second) == [ids[2], ids[1]] and "Newest</a>" in second
        last = text(client, f"/jobs?queue=paging&before={ids[1]}")
        assert ids_on(last) == [ids[0]] and 'rel="next"' not in last
    finally:
        dashboard_of(app).close()


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("id=abc", "id must be a job id"),
        ("id=1.5", "id must be a job id"),
        ("before=-3", "before must be a job id"),
        ("state=finished", "state must be one of available, running, retryable, completed, discarded, cancelled"),
        ("queue=" + "q" * 201, "queue must be printable text of at most 200 characters"),
        ("name=a%00b", "name must be printable text"),
    ],
)
def test_search_refuses_bad_input(client: FlaskClient, query: str, message: str) -> None:
    assert message in text(client, "/jobs?" + query, 400)


def test_health_answers_without_a_session(client: FlaskClient) -> None:
    response = client.get("/health")
    assert response.status_code == 200 and response.get_data(as_text=True) == f"ok treadle {EXTENSION_VERSION}\n"


def test_static_files_are_served(client: FlaskClient) -> None:
    script = client.get("/static/dashboard.js", buffered=True)  # read and closed
    assert script.status_code == 200 and script.mimetype in ("text/javascript", "application/javascript")
    assert "DOMParser" in script.get_data(as_text=True)
    assert client.get("/static/dashboard.css", buffered=True).mimetype == "text/css"


def test_pages_refresh_themselves_but_search_does_not(client: FlaskClient, seeded: Seeded) -> None:
    assert 'data-refresh="5000"' in text(client, "/")
    assert 'data-refresh="5000"' in text(client, f"/jobs/{seeded.running}")
    assert 'data-refresh="0"' in text(client, "/jobs")


def test_a_page_read_changes_nothing(app: Flask, client: FlaskClient, conn: psycopg.Connection, seeded: Seeded) -> None:
    before = conn.execute("SELECT id, state, attempt, run_at FROM treadle.jobs ORDER BY id").fetchall()
    for path in (
        "/",
        f"/?run={seeded.failed_run}",
        "/jobs",
        f"/jobs/{seeded.running}",
        f"/runs/{seeded.failed_run}",
        f"/jobs/{seeded.discarded}/retry",
        f"/jobs/{seeded.available}/cancel",
    ):
        client.get(path)
    assert conn.execute("SELECT id, state, attempt, run_at FROM treadle.jobs ORDER BY id").fetchall() == before


def test_run_page_shows_a_graph_and_its_sleep(client: FlaskClient, conn: psycopg.Connection) -> None:
    run_id = one(
        conn,
        "SELECT treadle.start_workflow('digest', steps => ARRAY['fetch_a', 'fetch_b', 'pause', 'send'],"
        ' after => \'{"pause": ["fetch_a", "fetch_b"], "send": ["pause"]}\', sleeps => \'{"pause": "1 hour"}\','
        " queue => 'digest')",
    )
    for job_id, token in conn.execute(
        "SELECT id, lease_token FROM treadle.claim('w', ARRAY['digest'], batch => 10)"
    ).fetchall():
        conn.execute("SELECT treadle.complete(%s, %s)", (job_id, token))
    steps = conn.execute(
        "SELECT step, state, after, sleeps_until IS NOT NULL FROM treadle.workflow_run_steps"
        " WHERE run_id = %s ORDER BY position",
        (run_id,),
    ).fetchall()
    assert steps == [
        ("fetch_a", "completed", [], False),
        ("fetch_b", "completed", [], False),
        ("pause", "sleeping", ["fetch_a", "fetch_b"], True),
        ("send", "pending", ["pause"], False),
    ]
    page = text(client, f"/runs/{run_id}")
    assert '<td class="after">fetch_a, fetch_b</td>' in page
    assert '<span class="state state-sleeping">sleeping</span> <span class="muted">until ' in page
    assert "<th>After</th>" in page
    listed = one(conn, "SELECT treadle.start_workflow('plain', steps => ARRAY['a', 'b'], queue => 'digest')")
    assert "<th>After</th>" not in text(client, f"/runs/{listed}")  # a list needs no After column
