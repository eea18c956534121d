"""The run page links a parent run and its child runs both ways."""

from __future__ import annotations

import psycopg
from flask.testing import FlaskClient

from tests.dashboard.seeding import one


def test_run_page_links_parent_and_child(client: FlaskClient, conn: psycopg.Connection) -> None:
    conn.execute("SELECT treadle.define_workflow('charge', ARRAY['authorize'])")
    parent = one(
        conn,
        "SELECT treadle.start_workflow('order', steps => ARRAY['pay', 'ship'], queue => 'shop',"
        ' children => \'{"pay": {"workflow": "charge"}}\')',
    )
    child = one(conn, "SELECT id FROM treadle.workflow_runs WHERE parent_run_id = %s", parent)
    steps = conn.execute(
        "SELECT step, state, job_id, child_run_id FROM treadle.workflow_run_steps WHERE run_id = %s ORDER BY position",
        (parent,),
    ).fetchall()
    assert steps == [("pay", "running", None, child), ("ship", "pending", None, None)]
    assert conn.execute(
        "SELECT parent_run_id, parent_step FROM treadle.workflow_run_overview WHERE id = %s", (child,)
    ).fetchone() == (parent, "pay")

    response = client.get(f"/runs/{parent}")
    assert response.status_code == 200
    page = response.get_data(as_text=True)
    assert f'<a class="child-run" href="/runs/{child}">run #{child}</a>' in page  # in the pay step's row
    assert f'<dt>Child runs</dt><dd><a class="child-run" href="/runs/{child}">#{child}</a></dd>' in page
    assert "Parent run" not in page

    response = client.get(f"/runs/{child}")
    assert response.status_code == 200
    page = response.get_data(as_text=True)
    assert f'<a class="parent-run" href="/runs/{parent}">#{parent}</a> <span class="muted">step pay</span>' in page
    assert "Child runs" not in page
