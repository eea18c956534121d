"""The worker sends its per-batch arrays and its lease as literals (_literals.py): every
value must reach the server as the value itself, whatever characters a queue or job name holds."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import treadle
from tests.worker.worker_support import until_state
from treadle import Worker
from treadle._literals import bigint_array, interval, text_array, uuid_array

HOSTILE = [
    'a"b',
    "back\\slash",
    "{braces}",
    "comma,sep",
    " spaced ",
    "NULL",
    "null",
    "",
    "quote'single",
    '\\"both',
    "ünïcødé ✓",
    "tab\tand\nnewline",
    "}",
    '"',
    "\\",
]


def test_text_arrays_reach_the_server_as_they_were(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute("SELECT %s::text[], %s::text[]", [text_array(HOSTILE), text_array([])]).fetchone()
    assert row is not None
    assert row[0] == HOSTILE, "every element the same, NULL-looking and empty ones included"
    assert row[1] == []


def test_bigint_uuid_and_interval_literals(conn: psycopg.Connection[Any]) -> None:
    ids = [1, 0, -5, 2**63 - 1]
    tokens = [uuid.uuid4() for _ in range(3)]
    lease = timedelta(seconds=30.000001)
    row = conn.execute(
        "SELECT %s::bigint[], %s::uuid[], %s::interval, %s::interval",
        [bigint_array(ids), uuid_array(tokens), interval(lease), interval(timedelta(hours=30))],
    ).fetchone()
    assert row == (ids, tokens, lease, timedelta(hours=30))


def test_a_text_array_with_nul_is_refused(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(psycopg.DataError):
        conn.execute("SELECT %s::text[]", [text_array(["a\x00b"])])


@pytest.mark.parametrize("queue", ['q"1', "q\\2", "q,3", "{q4}", "NULL"])
def test_a_worker_serves_queues_and_names_that_need_quoting(
    conn: psycopg.Connection[Any], make_worker: Any, queue: str
) -> None:
    name = f"job {queue}"
    ran: list[Any] = []
    worker: Worker = make_worker(queues=[queue], concurrency=3)

    def handler(args: Any, ctx: Any) -> Any:
        ran.append((ctx.queue, args))
        return {"seen": args}

    worker.register(name, handler)
    ids = [treadle.enqueue(conn, name, {"i": i}, queue=queue) for i in range(7)]
    other = treadle.enqueue(conn, name, {"i": -1}, queue=queue + "x")  # a queue the worker does not serve
    worker.start()
    for i, job_id in enumerate(ids):
        row = until_state(conn, job_id, "completed")
        assert row["result"] == {"seen": {"i": i}}
    assert sorted(ran, key=lambda r: r[1]["i"]) == [(queue, {"i": i}) for i in range(7)]
    found = conn.execute("SELECT state FROM treadle.jobs WHERE id = %s", [other]).fetchone()
    assert found == ("available",)
