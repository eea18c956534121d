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
