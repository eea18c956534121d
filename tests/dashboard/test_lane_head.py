"""A failed head blocking an ordered lane: its page says why and offers Cancel (CSRF, read-only)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.dashboard.seeding import Seeded, csrf_from, job_state, one
from treadle.dashboard import create_app, dashboard_of

JSON = {"Accept": "application/json"}


@dataclass(frozen=True)
class Lane:
    head: int  # discarded, holding the key's slot
    behind: int  # blocked behind it


@pytest.fixture
def lane(conn: psycopg.Connection) -> Lane:
    conn.execute("SELECT treadle.set_queue('lanes', key_ordered => true)")
    head = one(conn, "SELECT treadle.enqueue('hook', queue => 'lanes', concurrency_key => 'cust-1', max_attempts => 1)")
    behind = one(conn, "SELECT treadle.enqueue('hook', queue => 'lanes', concurrency_key => 'cust-1')")
    row = conn.execute("SELECT id, lease_token FROM treadle.claim('w', ARRAY['lanes'])").fetchone()
    assert row is not None and row[0] == head
    assert one(conn, "SELECT treadle.fail(%s, %s, 'endpoint down')", head, row[1]) == "discarded"
    assert job_state(conn, behind) == "blocked"
    return Lane(head=int(head), behind=int(behind))


def cancel_form(job_id: int) -> str:
    return f'action="/jobs/{job_id}/cancel"'


def test_a_failed_lane_head_shows_why_and_can_be_cancelled(
    client: FlaskClient, conn: psycopg.Connection, lane: Lane
) -> None:
    page = client.get(f"/jobs/{lane.head}").get_data(as_text=True)
    assert 'id="lane-head"' in page and "blocks its ordered lane" in page
    assert "<code>lane_blocked</code>" in page and "cust-1" in page
    assert cancel_form(lane.head) in page
    response = client.post(f"/jobs/{lane.head}/cancel", data={"csrf_token": csrf_from(client)}, headers=JSON)
    assert (response.status_code, response.get_json()) == (200, {"ok": True, "message": f"Job {lane.head} cancelled."})
    assert job_state(conn, lane.head) == "cancelled"
    assert job_state(conn, lane.behind) == "available"  # the lane moves on
    page = client.get(f"/jobs/{lane.head}").get_data(as_text=True)
    assert 'id="lane-head"' not in page and cancel_form(lane.head) not in page


def test_a_discarded_job_outside_a_lane_offers_no_cancel(
    client: FlaskClient, conn: psycopg.Connection, seeded: Seeded
) -> None:
    page = client.get(f"/jobs/{seeded.discarded}").get_data(as_text=True)
    assert 'id="lane-head"' not in page and cancel_form(seeded.discarded) not in page
    response = client.post(f"/jobs/{seeded.discarded}/cancel", data={"csrf_token": csrf_from(client)}, headers=JSON)
    assert response.status_code == 409 and "it is discarded" in response.get_json()["message"]
    assert job_state(conn, seeded.discarded) == "discarded"


def test_cancelling_a_lane_head_without_the_token_changes_nothing(
    client: FlaskClient, conn: psycopg.Connection, lane: Lane
) -> None:
    client.get("/")
    for data in ({}, {"csrf_token": "guess"}):
        response = client.post(f"/jobs/{lane.head}/cancel", data=data, headers=JSON)
        assert response.status_code == 400 and "CSRF token is missing or wrong" in response.get_json()["message"]
    assert (job_state(conn, lane.head), job_state(conn, lane.behind)) == ("discarded", "blocked")


@pytest.fixture
def read_only_app(reader_dsn: str) -> Iterator[Flask]:
    app = create_app(reader_dsn, secret_key="test-secret", read_only=True)
    yield app
    dashboard_of(app).close()


def test_a_read_only_dashboard_shows_the_lane_head_but_refuses_its_cancel(
    read_only_app: Flask, conn: psycopg.Connection, lane: Lane
) -> None:
    client = read_only_app.test_client()
    page = client.get(f"/jobs/{lane.head}").get_data(as_text=True)
    assert 'id="lane-head"' in page and '<form class="action"' not in page
    with client.session_transaction() as session:
        session["treadle_csrf"] = token = "known-token"
    response = client.post(f"/jobs/{lane.head}/cancel", data={"csrf_token": token}, headers=JSON)
    assert response.status_code == 403 and "read-only" in response.get_json()["message"]
    assert (job_state(conn, lane.head), job_state(conn, lane.behind)) == ("discarded", "blocked")
