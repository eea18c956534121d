"""treadle workflows signal, run as the command."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.cli.support import expect, treadle

pytestmark = pytest.mark.subprocess


def start(conn: psycopg.Connection[Any], **options: Any) -> int:
    row = conn.execute(
        "SELECT treadle.start_workflow('approval', steps => array['approve', 'ship'],"
        ' waits => \'{"approve": {"signal": "approved"}}\', idempotency_key => %(key)s)',
        {"key": options.get("key")},
    ).fetchone()
    assert row is not None
    return int(row[0])


def results(conn: psycopg.Connection[Any], run_id: int) -> Any:
    row = conn.execute("SELECT results FROM treadle.workflow_runs WHERE id = %s", [run_id]).fetchone()
    assert row is not None
    return row[0]


def test_a_signal_is_delivered_with_its_payload(dsn: str, conn: psycopg.Connection[Any]) -> None:
    run_id = start(conn)
    done = expect(
        treadle("workflows", "signal", str(run_id), "approved", "--payload", '{"by": "ann"}', "--dsn", dsn), 0
    )
    assert done.out == "delivered: the run's wait step completed with the payload\n"
    assert results(conn, run_id) == {"approve": {"by": "ann"}}
    again = expect(treadle("workflows", "signal", str(run_id), "approved", "--dsn", dsn), 4)
    assert "waits for no further signal" in again.err
    assert results(conn, run_id) == {"approve": {"by": "ann"}}


def test_a_signal_by_key_with_json_output(dsn: str, conn: psycopg.Connection[Any]) -> None:
    run_id = start(conn, key="order-7")
    done = expect(
        treadle("workflows", "signal", "approved", "--queue", "default", "--key", "order-7", "--json", "--dsn", dsn), 0
    )
    assert done.json() == {"run": "default/order-7", "signal": "approved", "outcome": "delivered"}
    assert results(conn, run_id) == {"approve": {}}


def test_a_signal_before_the_wait_is_kept_and_one_to_a_finished_run_is_refused(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    row = conn.execute(
        "SELECT treadle.start_workflow('approval', steps => array['prepare', 'approve', 'ship'],"
        ' waits => \'{"approve": {"signal": "approved"}}\')'
    ).fetchone()
    assert row is not None
    run_id = int(row[0])
    kept = expect(treadle("workflows", "signal", str(run_id), "approved", "--payload", '{"by": "bo"}', "--dsn", dsn), 0)
    assert kept.out == "kept: the run takes it when it reaches its wait step\n"
    assert conn.execute("SELECT count(*) FROM treadle.workflow_signals").fetchone() == (1,)
    conn.execute("SELECT treadle.cancel_workflow(%s)", [run_id])
    signals = conn.execute("SELECT count(*) FROM treadle.workflow_signals").fetchone()
    finished = expect(treadle("workflows", "signal", str(run_id), "approved", "--dsn", dsn), 4)
    assert "the run has finished; nothing was written" in finished.err
    assert conn.execute("SELECT count(*) FROM treadle.workflow_signals").fetchone() == signals
    assert results(conn, run_id) == {}


def test_bad_input_writes_nothing(dsn: str, conn: psycopg.Connection[Any]) -> None:
    run_id = start(conn)
    assert "no workflow run 999999" in expect(treadle("workflows", "signal", "999999", "approved", "--dsn", dsn), 3).err
    assert (
        "not valid JSON"
        in expect(treadle("workflows", "signal", str(run_id), "approved", "--payload", "{", "--dsn", dsn), 2).err
    )
    assert (
        "JSON object or array"
        in expect(treadle("workflows", "signal", str(run_id), "approved", "--payload", "3", "--dsn", dsn), 2).err
    )
    assert "name the run" in expect(treadle("workflows", "signal", "approved", "--dsn", dsn), 2).err
    assert "go together" in expect(treadle("workflows", "signal", "approved", "--key", "k", "--dsn", dsn), 2).err
    assert "run id" in expect(treadle("workflows", "signal", "abc", "approved", "--dsn", dsn), 2).err
    assert results(conn, run_id) == {}
    assert conn.execute("SELECT count(*) FROM treadle.workflow_signals").fetchone() == (0,)


def run_state(conn: psycopg.Connection[Any], run_id: int) -> Any:
    row = conn.execute("SELECT state FROM treadle.workflow_runs WHERE id = %s", [run_id]).fetchone()
    assert row is not None
    return row[0]


def test_list_with_filters_and_json(dsn: str, conn: psycopg.Connection[Any]) -> None:
    first, second = start(conn), start(conn)
    other = conn.execute(
        "SELECT treadle.start_workflow('report', steps => array['build'], queue => 'reports')"
    ).fetchone()
    assert other is not None
    conn.execute("SELECT treadle.cancel_workflow(%s)", [first])
    listed = expect(treadle("workflows", "list", "--dsn", dsn), 0)
    lines = listed.out.splitlines()
    assert lines[0].split() == ["ID", "WORKFLOW", "QUEUE", "STATE", "STEPS", "CREATED", "FINISHED"]
    assert [line.split()[:5] for line in lines[1:]] == [
        [str(other[0]), "report", "reports", "running", "0/1"],
        [str(second), "approval", "default", "running", "0/2"],
        [str(first), "approval", "default", "cancelled", "0/2"],
    ]
    running = expect(
        treadle("workflows", "list", "--state", "running", "--name", "approval", "--json", "--dsn", dsn), 0
    )
    assert [(r["id"], r["state"], r["steps_done"], r["steps_total"]) for r in running.json()] == [
        (second, "running", 0, 2)
    ]
    queued = expect(treadle("workflows", "list", "--queue", "reports", "--json", "--dsn", dsn), 0)
    assert [r["id"] for r in queued.json()] == [other[0]]
    both = expect(
        treadle(
            "workflows", "list", "--state", "cancelled", "--state", "running", "--limit", "1", "--json", "--dsn", dsn
        ),
        0,
    )
    assert [r["id"] for r in both.json()] == [other[0]]
    assert expect(treadle("workflows", "list", "--name", "nothing", "--dsn", dsn), 0).out == "no workflow runs\n"
    assert "invalid choice" in expect(treadle("workflows", "list", "--state", "done", "--dsn", dsn), 2).err
    assert "between 1 and" in expect(treadle("workflows", "list", "--limit", "0", "--dsn", dsn), 2).err


def test_show_names_each_step_and_why(dsn: str, conn: psycopg.Connection[Any]) -> None:
    run_id = start(conn)
    shown = expect(treadle("workflows", "show", str(run_id), "--dsn", dsn), 0)
    assert shown.out.startswith(f"workflow run {run_id}\n  name ")
    assert "  state            running\n" in shown.out
    steps = shown.out.split("\nsteps\n")[1].split("\nwhy\n")[0].splitlines()
    assert steps[0].split() == ["#", "STEP", "STATE", "ATTEMPT", "JOB", "STARTED", "FINISHED", "LAST", "ERROR"]
    assert [line.split()[:3] for line in steps[1:]] == [["1", "approve", "waiting"], ["2", "ship", "pending"]]
    why = shown.out.split("\nwhy\n")[1].splitlines()
    assert why[0].startswith(f"  (run): run: run {run_id} of workflow approval on queue default is running since ")
    assert why[1:] == [
        "  approve: signal: wait step approve waits for signal approved (no timeout)",
        "  ship: dependencies: step ship waits for its dependencies to complete: approve",
    ]
    as_json = expect(treadle("workflows", "show", str(run_id), "--json", "--dsn", dsn), 0).json()
    assert as_json["run"]["id"] == run_id and as_json["run"]["input"] == {}
    assert [(s["step"], s["state"], s["waits_for"]) for s in as_json["steps"]] == [
        ("approve", "waiting", "approved"),
        ("ship", "pending", None),
    ]
    assert [(e["step"], e["reason"]) for e in as_json["explain"]] == [
        (None, "run"),
        ("approve", "signal"),
        ("ship", "dependencies"),
    ]
    assert "no workflow run 999999" in expect(treadle("workflows", "show", "999999", "--dsn", dsn), 3).err
    assert "'abc' is not an integer" in expect(treadle("workflows", "show", "abc", "--dsn", dsn), 2).err
    assert "must be between 1 and" in expect(treadle("workflows", "show", "0", "--dsn", dsn), 2).err


def test_show_a_step_job_and_its_reasons(dsn: str, conn: psycopg.Connection[Any]) -> None:
    row = conn.execute("SELECT treadle.start_workflow('report', steps => array['build', 'mail'])").fetchone()
    assert row is not None
    conn.execute("SELECT treadle.pause('default')")
    shown = expect(treadle("workflows", "show", str(row[0]), "--dsn", dsn), 0)
    steps = shown.out.split("\nsteps\n")[1].split("\nwhy\n")[0].splitlines()
    assert steps[1].split()[:4] == ["1", "build", "available", "0/25"]
    assert "  build: paused: queue default is paused" in shown.out


def test_cancel_a_run(dsn: str, conn: psycopg.Connection[Any]) -> None:
    run_id = start(conn)
    done = expect(treadle("workflows", "cancel", str(run_id), "--dsn", dsn), 0)
    assert done.out == f"workflow run {run_id}: cancelled\n"
    assert run_state(conn, run_id) == "cancelled"
    again = expect(treadle("workflows", "cancel", str(run_id), "--dsn", dsn), 4)
    assert "it is cancelled, not running" in again.err
    assert "no workflow run 999999" in expect(treadle("workflows", "cancel", "999999", "--dsn", dsn), 3).err
    assert "must be between 1 and" in expect(treadle("workflows", "cancel", "-1", "--dsn", dsn), 2).err


def test_cancel_a_running_step_with_json(dsn: str, conn: psycopg.Connection[Any]) -> None:
    row = conn.execute("SELECT treadle.start_workflow('report', steps => array['build', 'mail'])").fetchone()
    assert row is not None
    conn.execute("SELECT treadle.claim('w', array['default'])")
    done = expect(treadle("workflows", "cancel", str(row[0]), "--json", "--dsn", dsn), 0)
    assert done.json() == {"run": row[0], "cancelled": True, "state": "running"}
    plain = expect(treadle("workflows", "cancel", str(row[0]), "--dsn", dsn), 4)
    assert "its cancel was already requested" in plain.err
    assert conn.execute(
        "SELECT cancel_requested FROM treadle.jobs WHERE workflow_run_id = %s", [row[0]]
    ).fetchall() == [(True,)]


def failed_run(conn: psycopg.Connection[Any]) -> int:
    """A run whose first step completed and whose second failed for good."""
    row = conn.execute(
        "SELECT treadle.start_workflow('order', '{\"n\": 1}', steps => array['reserve', 'charge'], max_attempts => 1)"
    ).fetchone()
    assert row is not None
    run_id = int(row[0])
    for step, result in (("reserve", '{"r": 1}'), ("charge", None)):
        claimed = conn.execute(
            "SELECT id, lease_token FROM treadle.claim('w', array['default'], names => array['workflow:order/' || %s])",
            [step],
        ).fetchone()
        assert claimed is not None
        if result is None:
            conn.execute("SELECT treadle.fail(%s, %s, 'declined', retryable => false)", claimed)
        else:
            conn.execute("SELECT treadle.complete(%s, %s, %s::jsonb)", [*claimed, result])
    return run_id


def state(conn: psycopg.Connection[Any], run_id: int) -> str:
    row = conn.execute("SELECT state FROM treadle.workflow_runs WHERE id = %s", [run_id]).fetchone()
    assert row is not None
    return str(row[0])


def test_retry_a_failed_run(dsn: str, conn: psycopg.Connection[Any]) -> None:
    run_id = failed_run(conn)
    assert state(conn, run_id) == "failed"
    done = expect(treadle("workflows", "retry", str(run_id), "--dsn", dsn), 0)
    assert done.out == f"workflow run {run_id}: retried: it is running\n"
    assert state(conn, run_id) == "running"
    again = expect(treadle("workflows", "retry", str(run_id), "--json", "--dsn", dsn), 4)
    assert f"workflow run {run_id}: not retried: workflow run {run_id} is running" in again.err
    assert "no workflow run 999999" in expect(treadle("workflows", "retry", "999999", "--dsn", dsn), 3).err


def test_fork_a_run_from_a_step(dsn: str, conn: psycopg.Connection[Any]) -> None:
    run_id = failed_run(conn)
    done = expect(treadle("workflows", "fork", str(run_id), "charge", "--json", "--dsn", dsn), 0)
    fork = done.json()["run"]
    assert done.json() == {"run": fork, "forked_from": run_id, "step": "charge"}
    row = conn.execute("SELECT results, forked_from, state FROM treadle.workflow_runs WHERE id = %s", [fork]).fetchone()
    assert row == ({"reserve": {"r": 1}}, run_id, "running")
    assert state(conn, run_id) == "failed"  # the source is not changed
    runs = conn.execute("SELECT count(*) FROM treadle.workflow_runs").fetchone()
    assert 'has no step "ship"' in expect(treadle("workflows", "fork", str(run_id), "ship", "--dsn", dsn), 2).err
    assert (
        "not valid JSON"
        in expect(treadle("workflows", "fork", str(run_id), "charge", "--input", "{", "--dsn", dsn), 2).err
    )
    assert "no workflow run 999999" in expect(treadle("workflows", "fork", "999999", "charge", "--dsn", dsn), 3).err
    assert conn.execute("SELECT count(*) FROM treadle.workflow_runs").fetchone() == runs
    text = expect(treadle("workflows", "fork", str(run_id), "reserve", "--input", '{"n": 2}', "--dsn", dsn), 0)
    assert text.out.endswith(f": forked from run {run_id} at step reserve\n")
    shown = expect(treadle("workflows", "show", str(fork), "--dsn", dsn), 0).out
    assert f"  forked from      {run_id}\n  forked step      charge\n" in shown


def test_compensate_a_cancelled_run(dsn: str, conn: psycopg.Connection[Any]) -> None:
    row = conn.execute(
        "SELECT treadle.start_workflow('saga', steps => array['debit', 'credit'], queue => 'saga',"
        ' compensations => \'{"debit": "refund"}\')'
    ).fetchone()
    assert row is not None
    run_id = int(row[0])
    refused = expect(treadle("workflows", "compensate", str(run_id), "--dsn", dsn), 4)
    assert f"workflow run {run_id} is running: only a cancelled run is compensated" in refused.err
    claimed = conn.execute("SELECT id, lease_token FROM treadle.claim('w', array['saga'])").fetchone()
    assert claimed is not None
    conn.execute("SELECT treadle.complete(%s, %s, '{\"id\": 1}')", claimed)
    expect(treadle("workflows", "cancel", str(run_id), "--dsn", dsn), 0)
    done = expect(treadle("workflows", "compensate", str(run_id), "--json", "--dsn", dsn), 0)
    assert done.json() == {"run": run_id, "state": "compensating"}
    assert state(conn, run_id) == "compensating"
    assert "no workflow run 999999" in expect(treadle("workflows", "compensate", "999999", "--dsn", dsn), 3).err


def test_cancel_with_compensate_starts_the_compensations_at_once(dsn: str, conn: psycopg.Connection[Any]) -> None:
    def start(compensations: str | None) -> int:
        row = conn.execute(
            "SELECT treadle.start_workflow('saga', steps => array['debit', 'credit'], queue => 'saga',"
            " compensations => %s::jsonb)",
            [compensations],
        ).fetchone()
        assert row is not None
        return int(row[0])

    run_id = start('{"debit": "refund"}')
    claimed = conn.execute("SELECT id, lease_token FROM treadle.claim('w', array['saga'])").fetchone()
    assert claimed is not None
    conn.execute("SELECT treadle.complete(%s, %s, '{\"id\": 1}')", claimed)
    done = expect(treadle("workflows", "cancel", str(run_id), "--compensate", "--json", "--dsn", dsn), 0)
    assert done.json() == {"run": run_id, "cancelled": True, "state": "compensating"}
    assert state(conn, run_id) == "compensating"
    refund = conn.execute(
        "SELECT args FROM treadle.jobs WHERE workflow_run_id = %s AND step = 'refund' AND state = 'available'", [run_id]
    ).fetchone()
    assert refund == ({"compensates": "debit", "result": {"id": 1}},)
    plain = start(None)
    refused = expect(treadle("workflows", "cancel", str(plain), "--compensate", "--dsn", dsn), 4)
    assert f"workflow run {plain} has no compensations" in refused.err
    assert state(conn, plain) == "running"
    missing = expect(treadle("workflows", "cancel", "999999", "--compensate", "--dsn", dsn), 3)
    assert "no workflow run 999999" in missing.err
