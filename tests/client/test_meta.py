"""Metadata on jobs (meta): enqueue and enqueue_many store it, refuse what is not an object, write nothing then."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

import treadle


def meta_of(conn: psycopg.Connection[Any], job_id: int) -> Any:
    found = conn.execute("SELECT meta FROM treadle.jobs WHERE id = %s", [job_id]).fetchone()
    assert found is not None
    return found[0]


def count(conn: psycopg.Connection[Any]) -> int:
    found = conn.execute("SELECT count(*) FROM treadle.jobs").fetchone()
    assert found is not None
    return int(found[0])


def test_enqueue_stores_meta_and_none_is_null(conn: psycopg.Connection[Any]) -> None:
    meta = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tenant": "acme", "n": [1, 2]}
    assert meta_of(conn, treadle.enqueue(conn, "send", {"to": "x"}, meta=meta)) == meta
    assert meta_of(conn, treadle.enqueue(conn, "send")) is None
    assert meta_of(conn, treadle.enqueue(conn, "send", meta=None)) is None


def test_enqueue_many_stores_each_elements_meta(conn: psycopg.Connection[Any]) -> None:
    ids = treadle.enqueue_many(
        conn,
        [
            {"name": "a", "meta": {"i": 0}},
            {"name": "b"},
            {"name": "c", "meta": {"i": 2}, "run_at": timedelta(seconds=5)},
        ],
    )
    assert [meta_of(conn, job_id) for job_id in ids] == [{"i": 0}, None, {"i": 2}]


@pytest.mark.parametrize("bad", [[1, 2], "trace", 7, True])
def test_meta_that_is_not_an_object_is_refused_and_nothing_is_written(conn: psycopg.Connection[Any], bad: Any) -> None:
    with pytest.raises(treadle.InvalidArgument, match="meta must be a dict"):
        treadle.enqueue(conn, "send", meta=bad)
    with pytest.raises(treadle.InvalidArgument, match=r"jobs\[1\]\['meta'\] must be a dict"):
        treadle.enqueue_many(conn, [{"name": "a"}, {"name": "b", "meta": bad}])
    assert count(conn) == 0


def test_meta_over_the_size_limit_is_refused_by_the_database(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT treadle.configure(max_payload_bytes => 2048)")
    big = {"blob": "x" * 5000 + "".join(str(i) for i in range(2000))}
    with pytest.raises(
        treadle.InvalidArgument, match=r"meta is \d+ bytes, more than the limit of 2048 bytes"
    ) as refused:
        treadle.enqueue(conn, "send", meta=big)
    assert refused.value.sqlstate == "22023"
    with pytest.raises(treadle.InvalidArgument, match='has a "meta" larger than the limit'):
        treadle.enqueue_many(conn, [{"name": "b", "meta": big}])
    assert count(conn) == 0


def test_meta_that_json_cannot_hold_is_refused(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(treadle.InvalidArgument):
        treadle.enqueue(conn, "send", meta={"at": object()})
    assert count(conn) == 0


def test_a_claimed_job_carries_meta(conn: psycopg.Connection[Any]) -> None:
    job_id = treadle.enqueue(conn, "send", meta={"who": "claimer"})
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    claimed = cur.execute("SELECT * FROM treadle.claim('w')").fetchone()
    assert claimed is not None and claimed["id"] == job_id
    assert treadle.Job.from_row(claimed).meta == {"who": "claimer"}


@pytest.mark.parametrize("bad", [[1], "x", 5])
def test_start_workflows_meta_that_is_not_an_object_is_refused(conn: psycopg.Connection[Any], bad: Any) -> None:
    with pytest.raises(treadle.InvalidArgument, match="meta must be a dict"):
        treadle.start_workflow(conn, "flow", steps=["a"], meta=bad)
    assert conn.execute("SELECT count(*) FROM treadle.workflow_runs").fetchone() == (0,)


def test_start_workflow_stores_meta_on_the_run_and_its_steps(conn: psycopg.Connection[Any]) -> None:
    run_id = treadle.start_workflow(conn, "flow", steps=["a"], meta={"tenant": "acme"})
    assert (
        conn.execute(
            "SELECT r.meta, j.meta FROM treadle.workflow_runs AS r JOIN treadle.jobs AS j ON j.workflow_run_id = r.id"
            " WHERE r.id = %s",
            [run_id],
        ).fetchone()
        == ({"tenant": "acme"},) * 2
    )
