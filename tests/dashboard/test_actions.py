"""Retry, cancel and cancel-run: as the page's script sends them (JSON) and as plain forms."""

from __future__ import annotations

import psycopg
import pytest
from flask.testing import FlaskClient

from tests.dashboard.seeding import Seeded, csrf_from, job_state

JSON = {"Accept": "application/json"}


def post(client: FlaskClient, path: str, *, json: bool = True, **form: str) -> tuple[int, dict[str, object] | str]:
    data = {"csrf_token": csrf_from(client), **form}
    response = client.post(path, data=data, headers=JSON if json else {})
    body = response.get_json() if json else response.get_data(as_text=True)
    return response.status_code, body


def test_retry_makes_a_discarded_job_available(client: FlaskClient, conn: psycopg.Connection, seeded: Seeded) -> None:
    status, body = post(client, f"/jobs/{seeded.discarded}/retry")
    assert (status, body) == (200, {"ok": True, "message": f"Job {seeded.discarded} will run again now."})
    assert job_state(conn, seeded.discarded) == "available"


def test_retry_of_a_failed_step_resumes_its_run(client: FlaskClient, conn: psycopg.Connection, seeded: Seeded) -> None:
    status, _ = post(client, f"/jobs/{seeded.failed_step}/retry")
    assert status == 200
    assert conn.execute("SELECT state FROM treadle.workflow_runs WHERE id = %s", (seeded.failed_run,)).fetchone() == (
        "running",
    )


def test_retry_of_a_step_of_a_compensated_run_says_why_it_is_refused(
    client: FlaskClient, conn: psycopg.Connection
) -> None:
    started = conn.execute(
        "SELECT treadle.start_workflow('wd', steps => array['reserve', 'send'], queue => 'undo', max_attempts => 1,"
        ' compensations => \'{"reserve": "release"}\')'
    ).fetchone()
    assert started is not None
    run_id = started[0]
    send_id = 0
    for step in ("reserve", "send", "release"):
        claimed = conn.execute("SELECT id, lease_token FROM treadle.claim('w', array['undo'])").fetchone()
        assert claimed is not None
        job_id, token = claimed
        if step == "send":
            conn.execute("SELECT treadle.fail(%s, %s, 'refused', retryable => false)", (job_id, token))
            send_id = job_id
        else:
            conn.execute("SELECT treadle.complete(%s, %s)", (job_id, token))
    assert conn.execute("SELECT state FROM treadle.workflow_runs WHERE id = %s", (run_id,)).fetchone() == (
        "compensated",
    )
    status, body = post(client, f"/jobs/{send_id}/retry")
    assert status == 409 and "its workflow run undid its steps" in str(body)
    assert job_state(conn, send_id) == "discarded"


def test_cancel_of_a_waiting_job_finishes_it(client: FlaskClient, conn: psycopg.Connection, seeded: Seeded) -> None:
    status, body = post(client, f"/jobs/{seeded.available}/cancel")
    assert (status, body) == (200, {"ok": True, "message": f"Job {seeded.available} cancelled."})
    assert job_state(conn, seeded.available) == "cancelled"


def test_cancel_of_a_running_job_requests_it_once(
    client: FlaskClient, conn: psycopg.Connection, seeded: Seeded
) -> None:
    status, body = post(client, f"/jobs/{seeded.running}/cancel")
    assert status == 200 and "Cancel requested" in str(body)
    assert conn.execute(
        "SELECT state, cancel_requested FROM treadle.jobs WHERE id = %s", (seeded.running,)
    ).fetchone() == (
        "running",
        True,
    )
    status, body = post(client, f"/jobs/{seeded.running}/cancel")
    assert (status, body) == (409, {"ok": False, "message": f"Job {seeded.running} already has a cancel request."})


def test_cancel_run_cancels_its_waiting_step(client: FlaskClient, conn: psycopg.Connection, seeded: Seeded) -> None:
    status, body = post(client, f"/runs/{seeded.running_run}/cancel")
    assert (status, body) == (200, {"ok": True, "message": f"Workflow run {seeded.running_run} cancelled."})
    assert conn.execute("SELECT state FROM treadle.workflow_runs WHERE id = %s", (seeded.running_run,)).fetchone() == (
        "cancelled",
    )


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/jobs/{completed}/retry", "Job {completed} was not retried: it is completed"),
        ("/jobs/{running}/retry", "Job {running} was not retried: it is running"),
        ("/jobs/{completed}/cancel", "Job {completed} was not cancelled: it is completed."),
        ("/jobs/{discarded}/cancel", "Job {discarded} was not cancelled: it is discarded."),
        ("/runs/{failed_run}/cancel", "Workflow run {failed_run} was not cancelled: it is failed."),
    ],
)
def test_an_action_that_does_not_apply_says_why_and_changes_nothing(
    client: FlaskClient, conn: psycopg.Connection, seeded: Seeded, path: str, message: str
) -> None:
    before = conn.execute(
        "SELECT id, state, attempt, run_at, cancel_requested FROM treadle.jobs ORDER BY id"
    ).fetchall()
    status, body = post(client, path.format(**vars(seeded)))
    assert status == 409 and isinstance(body, dict) and body["ok"] is False
    assert str(body["message"]).startswith(message.format(**vars(seeded)))
    assert (
        conn.execute("SELECT id, state, attempt, run_at, cancel_requested FROM treadle.jobs ORDER BY id").fetchall()
        == before
    )


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/jobs/424242/retry", "There is no job 424242."),
        ("/jobs/424242/cancel", "There is no job 424242."),
        ("/runs/424242/cancel", "There is no workflow run 424242."),
        ("/jobs/99999999999999999999/retry", "There is no job 99999999999999999999."),
    ],
)
def test_an_action_on_an_unknown_id_is_404(client: FlaskClient, seeded: Seeded, path: str, message: str) -> None:
    status, body = post(client, path)
    assert (status, body) == (404, {"ok": False, "message": message})


def test_a_plain_form_post_redirects_back_with_a_message(
    client: FlaskClient, conn: psycopg.Connection, seeded: Seeded
) -> None:
    token = csrf_from(client, f"/jobs/{seeded.discarded}")
    response = client.post(
        f"/jobs/{seeded.discarded}/retry", data={"csrf_token": token, "next": f"/jobs/{seeded.discarded}"}
    )
    assert response.status_code == 303 and response.headers["Location"] == f"/jobs/{seeded.discarded}"
    page = client.get(response.headers["Location"]).get_data(as_text=True)
    assert f'<p class="done">Job {seeded.discarded} will run again now.</p>' in page
    assert job_state(conn, seeded.discarded) == "available"

    again = client.post(f"/jobs/{seeded.discarded}/retry", data={"csrf_token": token, "next": "/"})
    assert again.status_code == 303
    assert "was not retried: it is available" in client.get("/").get_data(as_text=True)


@pytest.mark.parametrize("target", ["//evil.example/", "https://evil.example/", "/\\evil", "javascript:alert(1)"])
def test_a_form_post_never_redirects_off_the_dashboard(client: FlaskClient, seeded: Seeded, target: str) -> None:
    response = client.post(f"/jobs/{seeded.discarded}/retry", data={"csrf_token": csrf_from(client), "next": target})
    assert response.status_code == 303 and response.headers["Location"] == "/"


def test_an_unknown_id_in_a_plain_form_post_is_a_404_page(client: FlaskClient, seeded: Seeded) -> None:
    response = client.post("/jobs/424242/cancel", data={"csrf_token": csrf_from(client)})
    assert response.status_code == 404 and "There is no job 424242." in response.get_data(as_text=True)


@pytest.mark.parametrize("path", ["/jobs/1/retry", "/jobs/1/cancel", "/runs/1/cancel"])
def test_actions_refuse_get(client: FlaskClient, conn: psycopg.Connection, seeded: Seeded, path: str) -> None:
    before = conn.execute("SELECT id, state FROM treadle.jobs ORDER BY id").fetchall()
    response = client.get(path)
    assert response.status_code == 405 and "POST" in response.headers["Allow"]
    assert conn.execute("SELECT id, state FROM treadle.jobs ORDER BY id").fetchall() == before


def test_retry_run_resumes_a_failed_run(client: FlaskClient, conn: psycopg.Connection, seeded: Seeded) -> None:
    run = seeded.failed_run
    status, body = post(client, f"/runs/{run}/retry")
    assert (status, body) == (200, {"ok": True, "message": f"Workflow run {run} retried: it is running."})
    assert job_state(conn, seeded.failed_step) == "available"
    status, body = post(client, f"/runs/{run}/retry")
    assert (status, body) == (
        409,
        {"ok": False, "message": f"Workflow run {run} is running: only a failed or cancelled run is retried."},
    )
    status, body = post(client, "/runs/424242/retry")
    assert (status, body) == (404, {"ok": False, "message": "There is no workflow run 424242."})


def test_fork_run_starts_a_new_run_from_a_step(client: FlaskClient, conn: psycopg.Connection, seeded: Seeded) -> None:
    run = seeded.failed_run
    status, body = post(client, f"/runs/{run}/fork", step="charge")
    assert status == 200 and isinstance(body, dict)
    fork = body["run"]
    assert body["message"] == f"Workflow run {fork} forked from run {run} at step charge."
    assert conn.execute(
        "SELECT forked_from, forked_step, results FROM treadle.workflow_runs WHERE id = %s", (fork,)
    ).fetchone() == (run, "charge", {"reserve": {"hold": "h-1"}})
    page = client.get(f"/runs/{fork}").get_data(as_text=True)
    assert f'href="/runs/{run}">#{run}</a> <span class="muted">at step charge' in page
    assert f'class="fork" href="/runs/{fork}"' in client.get(f"/runs/{run}").get_data(as_text=True)

    runs = conn.execute("SELECT count(*) FROM treadle.workflow_runs").fetchone()
    status, body = post(client, f"/runs/{run}/fork", step="zz")
    assert (status, body) == (400, {"ok": False, "message": f'Workflow run {run} has no step "zz".'})
    status, body = post(client, f"/runs/{run}/fork")
    assert (status, body) == (400, {"ok": False, "message": "Name the step to fork the run from."})
    status, body = post(client, "/runs/424242/fork", step="charge")
    assert (status, body) == (404, {"ok": False, "message": "There is no workflow run 424242."})
    assert conn.execute("SELECT count(*) FROM treadle.workflow_runs").fetchone() == runs


def test_a_plain_form_fork_opens_the_new_run(client: FlaskClient, conn: psycopg.Connection, seeded: Seeded) -> None:
    response = client.post(f"/runs/{seeded.failed_run}/fork", data={"csrf_token": csrf_from(client), "step": "reserve"})
    assert response.status_code == 303
    row = conn.execute(
        "SELECT max(id) FROM treadle.workflow_runs WHERE forked_from = %s", (seeded.failed_run,)
    ).fetchone()
    assert row is not None and response.headers["Location"].endswith(f"/runs/{row[0]}")


def test_the_run_page_shows_step_times_and_run_actions(client: FlaskClient, seeded: Seeded) -> None:
    page = client.get(f"/runs/{seeded.failed_run}").get_data(as_text=True)
    assert "<th>Started</th><th>Finished</th>" in page
    assert f'action="/runs/{seeded.failed_run}/retry"' in page
    assert page.count(f'action="/runs/{seeded.failed_run}/fork"') == 3  # one per step
    running = client.get(f"/runs/{seeded.running_run}").get_data(as_text=True)
    assert "/retry" not in running.split("<h2>Steps</h2>")[0]  # a running run is cancelled, not retried


def test_compensate_run_undoes_a_cancelled_run(client: FlaskClient, conn: psycopg.Connection, seeded: Seeded) -> None:
    row = conn.execute(
        "SELECT treadle.start_workflow('saga', steps => array['debit', 'credit'], queue => 'saga',"
        ' compensations => \'{"debit": "refund"}\')'
    ).fetchone()
    assert row is not None
    run = row[0]
    status, body = post(client, f"/runs/{run}/compensate")
    assert status == 409 and isinstance(body, dict)
    assert body["message"] == f"Workflow run {run} is running: only a cancelled run is compensated on request."
    conn.execute("SELECT treadle.cancel_workflow(%s)", (run,))
    assert f'action="/runs/{run}/compensate"' in client.get(f"/runs/{run}").get_data(as_text=True)
    status, body = post(client, f"/runs/{run}/compensate")
    assert (status, body) == (200, {"ok": True, "message": f"Workflow run {run} is compensated."})  # nothing to undo
    status, body = post(client, f"/runs/{seeded.failed_run}/compensate")
    assert (status, body) == (409, {"ok": False, "message": f"Workflow run {seeded.failed_run} has no compensations."})
    assert "/compensate" not in client.get(f"/runs/{seeded.failed_run}").get_data(as_text=True)
