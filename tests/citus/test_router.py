"""Every statement of the Python worker's loop is a single-shard router query on Citus.

EXPLAIN of a function call shows the call only, and auto_explain, which would show the
statements inside, breaks Citus's planning (a "cache lookup failed for type" error) so
cannot be used. Citus itself tells instead: with citus.multi_task_query_log_level =
error, any statement inside the call that would run on more than one shard raises
before it runs, and citus.log_remote_commands lists the commands each statement sent
(each names one shard). Each test runs one of the worker's own SQL texts (treadle._sql)
that way, on a job made ready for it; the statements that still fan out or fail are
marked with the reason (docs/citus.md).
"""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.citus.test_citus import (
    Conn,
    enqueue,
    hand_lease,
    job,
)
from treadle import _sql


def router_only(conn: Conn) -> list[str]:
    """Make every multi-shard statement on conn raise; return the list that fills with the
    commands Citus then sends (each shard's table is named with its shard id)."""
    sent: list[str] = []
    conn.add_notice_handler(lambda d: sent.append(d.message_primary or ""))
    conn.execute("SET citus.multi_task_query_log_level = 'error'")
    conn.execute("SET citus.log_remote_commands = on")
    return sent


def shards_named(sent: list[str]) -> set[str]:
    """The shards of treadle's distributed tables that the commands name."""
    return set(
        re.findall(
            r"treadle\.(?:jobs|workflow_runs|workflow_signals|key_slots|job_history(?:_\d\d)?)_\d+", " ".join(sent)
        )
    )


def leased(conn: Conn, queue: str) -> tuple[int, uuid.UUID]:
    job_id = enqueue(conn, queue)
    return job_id, hand_lease(conn, queue, job_id)


def test_the_detector_refuses_a_statement_over_every_shard(conn: Conn, queue: str) -> None:
    enqueue(conn, queue)
    router_only(conn)
    with pytest.raises(psycopg.Error, match="multi-task"):
        conn.execute("SELECT count(*) FROM treadle.jobs")
    # while a statement that names one queue runs on its shard alone
    sent = router_only(conn)
    conn.execute("SELECT count(*) FROM treadle.jobs WHERE queue = %s", [queue])
    assert len(shards_named(sent)) == 1, sent


def test_enqueue_is_a_router_insert(conn: Conn, queue: str) -> None:
    sent = router_only(conn)
    enqueue(conn, queue)
    assert len(shards_named(sent)) == 1, sent


def test_worker_seen_stays_on_the_coordinator(conn: Conn, queue: str) -> None:
    sent = router_only(conn)
    params = {"worker_id": f"w-{queue}", "host": "h", "pid": 1, "queues": [queue], "concurrency": 1, "running": 0}
    conn.execute(_sql.WORKER_SEEN, {**params, "names": None})
    assert shards_named(sent) == set(), sent


def test_claim_is_router_only(conn: Conn, queue: str) -> None:
    enqueue(conn, queue)
    sent = router_only(conn)
    rows = conn.execute(
        _sql.CLAIM,
        {
            "worker_id": "w",
            "queues": [queue],
            "names": None,
            "batch": 5,
            "lease": timedelta(seconds=30),
            "lease_token": None,
        },
    ).fetchall()
    assert len(rows) == 1
    assert len(shards_named(sent)) == 1, sent


def test_complete_and_claim_is_router_only(conn: Conn, queue: str) -> None:
    job_id, token = leased(conn, queue)
    enqueue(conn, queue)
    sent = router_only(conn)
    conn.execute(
        _sql.COMPLETE_AND_CLAIM,
        {"job_ids": [job_id], "lease_tokens": [token], "results": [Jsonb(None)], "worker_id": "w",
         "queues": [queue], "names": None, "batch": 1, "lease": timedelta(seconds=30), "lease_token": None,
         "job_queues": [queue]},
    ).fetchall()  # fmt: skip
    assert len(shards_named(sent)) == 1, sent


def test_complete_many_is_router_only(conn: Conn, queue: str) -> None:
    job_id, token = leased(conn, queue)
    sent = router_only(conn)
    params = {"job_ids": [job_id], "lease_tokens": [token], "results": [Jsonb({"ok": 1})], "job_queues": [queue]}
    assert conn.execute(_sql.COMPLETE_MANY, params).fetchall() == [{"job_id": job_id, "state": "completed"}]
    assert len(shards_named(sent)) == 1, sent


def test_heartbeat_is_router_only(conn: Conn, queue: str) -> None:
    job_id, token = leased(conn, queue)
    sent = router_only(conn)
    conn.execute(
        _sql.HEARTBEAT, {"job_id": job_id, "lease_token": token, "lease": timedelta(seconds=30), "queue": queue}
    )
    assert len(shards_named(sent)) == 1, sent


def test_heartbeat_many_is_router_only(conn: Conn, queue: str) -> None:
    job_id, token = leased(conn, queue)
    sent = router_only(conn)
    params = {"job_ids": [job_id], "lease_tokens": [token], "lease": timedelta(seconds=30), "job_queues": [queue]}
    assert conn.execute(_sql.HEARTBEAT_MANY, params).fetchall() == [{"answer": "held"}]
    assert len(shards_named(sent)) == 1, sent


def test_complete_is_router_only(conn: Conn, queue: str) -> None:
    job_id, token = leased(conn, queue)
    sent = router_only(conn)
    conn.execute(_sql.COMPLETE, {"job_id": job_id, "lease_token": token, "result": Jsonb({"ok": 1}), "queue": queue})
    assert len(shards_named(sent)) == 1, sent


def test_fail_is_router_only(conn: Conn, queue: str) -> None:
    job_id, token = leased(conn, queue)
    sent = router_only(conn)
    params = {"job_id": job_id, "lease_token": token, "error": "e", "retry_in": None, "retryable": True}
    conn.execute(_sql.FAIL, {**params, "queue": queue})
    assert len(shards_named(sent)) == 1, sent


def test_snooze_is_router_only(conn: Conn, queue: str) -> None:
    job_id, token = leased(conn, queue)
    sent = router_only(conn)
    conn.execute(_sql.SNOOZE, {"job_id": job_id, "lease_token": token, "delay": timedelta(minutes=1), "queue": queue})
    assert len(shards_named(sent)) == 1, sent


def test_release_is_router_only(conn: Conn, queue: str) -> None:
    job_id, token = leased(conn, queue)
    sent = router_only(conn)
    conn.execute(_sql.RELEASE, {"job_id": job_id, "lease_token": token, "queue": queue})
    assert len(shards_named(sent)) == 1, sent


def test_a_claim_from_a_limited_queue_is_router_only(conn: Conn, queue: str) -> None:
    """The room of a queue with a concurrency and a rate limit is read and spent queue by queue."""
    conn.execute("SELECT treadle.set_queue(%s, concurrency => 2, rate_limit => 10, rate_period => '1 minute')", [queue])
    for _ in range(3):
        enqueue(conn, queue)
    sent = router_only(conn)
    params = {"worker_id": "w", "queues": [queue], "names": None, "batch": 5, "lease": timedelta(seconds=30)}
    rows = conn.execute(_sql.CLAIM, {**params, "lease_token": None}).fetchall()
    assert len(rows) == 2, "the concurrency limit holds"
    assert len(shards_named(sent)) == 1, sent


def queue_on_another_shard(conn: Conn, queue: str) -> str:
    """A queue named after queue whose jobs land on another shard (names are random, and two
    of them share a shard often enough to matter)."""
    for suffix in "bcdefghijklmnopqrstuvwxyz":
        other = queue + suffix
        shards = conn.execute(
            """SELECT count(DISTINCT pg_catalog.get_shard_id_for_distribution_column('treadle.jobs', q)) AS n
                 FROM unnest(%s::text[]) AS q""",
            [[queue, other]],
        ).fetchone()
        assert shards is not None
        if shards["n"] == 2:
            return other
    raise AssertionError(f"no queue named after {queue} on another shard")


def test_complete_many_finishes_jobs_of_two_queues_one_shard_at_a_time(conn: Conn, queue: str) -> None:
    other = queue_on_another_shard(conn, queue)
    a, token_a = leased(conn, queue)
    b, token_b = leased(conn, other)
    sent = router_only(conn)
    params = {"job_ids": [a, b], "lease_tokens": [token_a, token_b], "results": [Jsonb({"a": 1}), Jsonb({"b": 2})]}
    rows = conn.execute(_sql.COMPLETE_MANY, {**params, "job_queues": [queue, other]}).fetchall()
    assert rows == [{"job_id": a, "state": "completed"}, {"job_id": b, "state": "completed"}]
    assert len(shards_named(sent)) == 2, sent  # (each statement on one shard: none raised)
    assert job(conn, queue, a)["result"] == {"a": 1}
    assert job(conn, other, b)["result"] == {"b": 2}


def test_heartbeat_many_of_another_queue_is_lost(conn: Conn, queue: str) -> None:
    job_id, token = leased(conn, queue)
    params = {"job_ids": [job_id], "lease_tokens": [token], "lease": timedelta(seconds=30)}
    rows = conn.execute(_sql.HEARTBEAT_MANY, {**params, "job_queues": [queue + "x"]}).fetchall()
    assert rows == [{"answer": "lost"}]


# -- concurrency keys (treadle.key_slots, distributed with the jobs) ----------------------


def keyed(conn: Conn, queue: str, key: str) -> int:
    row = conn.execute(
        "SELECT treadle.enqueue('job', '{}', queue => %s, concurrency_key => %s) AS id", [queue, key]
    ).fetchone()
    assert row is not None
    return int(row["id"])


def shard_groups(conn: Conn, sent: list[str]) -> set[str]:
    """The co-located shard groups (hash ranges) of the shards the commands name: a queue's
    jobs and key_slots are two shards of one group, on one node."""
    ids = [int(name.rsplit("_", 1)[1]) for name in shards_named(sent)]
    rows = conn.execute("SELECT shardminvalue FROM pg_catalog.pg_dist_shard WHERE shardid = ANY (%s)", [ids])
    return {r["shardminvalue"] for r in rows}


def claim_all(conn: Conn, queue: str) -> list[dict[str, Any]]:
    params = {"worker_id": "w", "queues": [queue], "names": None, "batch": 10, "lease": timedelta(seconds=30)}
    return conn.execute(_sql.CLAIM, {**params, "lease_token": None}).fetchall()


def test_a_key_limit_of_two_holds_and_each_keyed_statement_is_router_only(conn: Conn, queue: str) -> None:
    conn.execute("SELECT treadle.set_queue(%s, key_limit => 2)", [queue])
    sent = router_only(conn)
    a = [keyed(conn, queue, "a") for _ in range(3)]
    b = keyed(conn, queue, "b")
    assert len(shard_groups(conn, sent)) == 1, sent
    first = claim_all(conn, queue)
    assert sorted(r["id"] for r in first) == sorted([a[0], a[1], b]), "two of key a, and key b"
    assert claim_all(conn, queue) == []
    done = next(r for r in first if r["id"] == a[0])
    params = {"job_id": a[0], "lease_token": done["lease_token"], "result": Jsonb(None), "queue": queue}
    conn.execute(_sql.COMPLETE, params)
    assert [r["id"] for r in claim_all(conn, queue)] == [a[2]], "a's slot given back releases its next job"
    assert len(shard_groups(conn, sent)) == 1, sent
    held = conn.execute("SELECT key, held FROM treadle.key_slots WHERE queue = %s ORDER BY key", [queue]).fetchall()
    assert held == [{"key": "a", "held": 2}, {"key": "b", "held": 1}]


def test_an_ordered_lane_runs_in_order_and_waits_for_a_failed_head(conn: Conn, queue: str) -> None:
    conn.execute("SELECT treadle.set_queue(%s, key_ordered => true)", [queue])
    sent = router_only(conn)
    lane = [keyed(conn, queue, "lane") for _ in range(3)]
    ran = []
    (head,) = claim_all(conn, queue)
    params = {"job_id": head["id"], "lease_token": head["lease_token"], "error": "e", "retry_in": None}
    conn.execute(_sql.FAIL, {**params, "retryable": False, "queue": queue})  # discarded: the lane waits
    assert claim_all(conn, queue) == []
    conn.execute("SELECT treadle.cancel(%s, queue => %s)", [head["id"], queue])
    for _ in range(2):
        (row,) = claim_all(conn, queue)
        ran.append(row["id"])
        params = {"job_id": row["id"], "lease_token": row["lease_token"], "result": Jsonb(None), "queue": queue}
        conn.execute(_sql.COMPLETE, params)
    assert ran == lane[1:], "in enqueue order, one at a time"
    assert len(shard_groups(conn, sent)) == 1, sent
    assert conn.execute("SELECT count(*) AS n FROM treadle.key_slots WHERE queue = %s", [queue]).fetchone() == {"n": 0}
