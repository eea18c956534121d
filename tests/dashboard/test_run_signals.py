"""The run page shows a wait step: the signal it waits for, then its payload, or its timeout."""

from __future__ import annotations

import psycopg
from flask.testing import FlaskClient

from tests.dashboard.seeding import one


def page(client: FlaskClient, run_id: int) -> str:
    response = client.get(f"/runs/{run_id}")
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_data(as_text=True)


def test_run_page_shows_what_a_wait_step_waits_for(client: FlaskClient, conn: psycopg.Connection) -> None:
    run_id = one(
        conn,
        "SELECT treadle.start_workflow('approval', steps => ARRAY['approve', 'ship'],"
        ' waits => \'{"approve": {"signal": "approved", "timeout": "1 hour"}}\', queue => \'approvals\')',
    )
    html = page(client, run_id)
    assert '<span class="state state-waiting">waiting</span> <span class="muted">for signal approved</span>' in html
    assert one(conn, "SELECT treadle.signal(%s, 'approved', '{\"by\": \"ann\"}')", run_id) == "delivered"
    html = page(client, run_id)
    assert "for signal approved" not in html
    assert '<span class="state state-completed">completed</span>' in html


def test_run_page_shows_a_wait_that_timed_out(client: FlaskClient, conn: psycopg.Connection) -> None:
    run_id = one(
        conn,
        "SELECT treadle.start_workflow('approval', steps => ARRAY['approve'],"
        ' waits => \'{"approve": {"signal": "approved", "timeout": "1 hour"}}\', queue => \'approvals\')',
    )
    conn.execute("SET treadle.now = '2999-01-01 00:00:00+00'")
    conn.execute("SELECT treadle.rescue()")
    conn.execute("RESET treadle.now")
    html = page(client, run_id)
    assert '<span class="state state-timed_out">timed_out</span>' in html
    # and its box in the drawing, and the box's title
    assert '<g class="node state-timed_out kind-signal" data-position="1">' in html
    assert "<title>approve: timed_out, timed out waiting for signal approved</title>" in html
