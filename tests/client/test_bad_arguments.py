"""Bad arguments: a clear InvalidArgument, and nothing changed.

Values Python can judge (types, ranges, time zones, JSON) are refused before
anything is sent, so the caller's transaction is exactly as it was. Values the SQL
layer judges arrive as InvalidArgument carrying the database's SQLSTATE.
"""

# The calls here pass wrong types on purpose: the type checker would refuse them.
# mypy: disable-error-code="call-overload, dict-item, list-item"

from __future__ import annotations

from collections.abc import Callable
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any, cast

import psycopg
import pytest
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

import treadle
from tests.client.producer_support import transaction_status

Call = Callable[[psycopg.Connection[Any]], Any]

REFUSED_BY_SQL: list[tuple[str, Call, str, str]] = [
    ("empty name", lambda c: treadle.enqueue(c, ""), "22023", "name must be 1 to 200 characters, not only spaces"),
    ("blank name", lambda c: treadle.enqueue(c, "   "), "22023", "name must be 1 to 200 characters, not only spaces"),
    (
        "empty queue",
        lambda c: treadle.enqueue(c, "x", queue=""),
        "22023",
        "queue must be 1 to 200 characters, not only spaces",
    ),
    ("max_attempts 0", lambda c: treadle.enqueue(c, "x", max_attempts=0), "22023", "max_attempts must be at least 1"),
    ("every of 0", lambda c: treadle.enqueue(c, "x", every=timedelta(0)), "22023", "every must be positive"),
    (
        "negative every",
        lambda c: treadle.enqueue(c, "x", every=timedelta(seconds=-1)),
        "22023",
        "every must be positive",
    ),
    ("timeout of 0", lambda c: treadle.enqueue(c, "x", timeout=timedelta(0)), "22023", "timeout must be positive"),
    (
        "timeout over 7 days",
        lambda c: treadle.enqueue(c, "x", timeout=timedelta(days=7, seconds=1)),
        "22023",
        "timeout must be positive and at most 7 days",
    ),
    ("empty backoff", lambda c: treadle.enqueue(c, "x", backoff=[]), "22023", "backoff must be a list of 1 to 100"),
    (
        "negative backoff delay",
        lambda c: treadle.enqueue(c, "x", backoff=[timedelta(seconds=1), timedelta(seconds=-1)]),
        "22023",
        "backoff must hold delays of zero or more",
    ),
    (
        "backoff of 101 delays",
        lambda c: treadle.enqueue(c, "x", backoff=[timedelta(seconds=1)] * 101),
        "22023",
        "backoff must be a list of 1 to 100",
    ),
    (
        "enqueue_many timeout of 0",
        lambda c: treadle.enqueue_many(c, [{"name": "x", "timeout": timedelta(0)}]),
        "22023",
        "timeout",
    ),
    ("scalar args", lambda c: treadle.enqueue(c, "x", 5), "22023", "args must be a JSON object or array"),
    ("string args", lambda c: treadle.enqueue(c, "x", "text"), "22023", "args must be a JSON object or array"),
    (
        "workflow empty name",
        lambda c: treadle.start_workflow(c, "", steps=["a"]),
        "22023",
        "name must be 1 to 200 characters, not only spaces",
    ),
    (
        "workflow bad queue",
        lambda c: treadle.start_workflow(c, "w", steps=["a"], queue=" "),
        "22023",
        "queue must be 1 to 200 characters, not only spaces",
    ),
    (
        "workflow max_attempts 0",
        lambda c: treadle.start_workflow(c, "w", steps=["a"], max_attempts=0),
        "22023",
        "max_attempts must be at least 1",
    ),
    (
        "scalar input",
        lambda c: treadle.start_workflow(c, "w", 1.5, steps=["a"]),
        "22023",
        "input must be a JSON object or array",
    ),
    (
        "duplicate steps",
        lambda c: treadle.start_workflow(c, "w", steps=["a", "b", "a"]),
        "22023",
        "steps must not repeat a name",
    ),
    (
        "a cycle",
        lambda c: treadle.start_workflow(c, "w", steps=["a", "b"], after={"a": ["b"], "b": ["a"]}),
        "22023",
        'step "a" is in a dependency cycle: a after b after a',
    ),
    (
        "a zero sleep",
        lambda c: treadle.start_workflow(c, "w", steps=["a"], sleeps={"a": timedelta(0)}),
        "22023",
        'sleep step "a" must wait more than 0 and at most 366 days',
    ),
    (
        "a map over a step it does not run after",
        lambda c: treadle.start_workflow(c, "w", steps=["a", "b", "c"], maps={"c": "a"}),
        "22023",
        'map step "c" maps over step "a", which it does not run after',
    ),
    (
        "a map over an input key that is no name",
        lambda c: treadle.start_workflow(c, "w", steps=["a"], maps={"a": {"input": ""}}),
        "22023",
        'map step "a" maps over a step name or {"input": key}, not {"input": ""}',
    ),
    (
        "an unknown dependency",
        lambda c: treadle.start_workflow(c, "w", steps=["a", "b"], after={"b": ["c"]}),
        "22023",
        'step "b" runs after "c", which is not one of the steps',
    ),
    (
        "no steps",
        lambda c: treadle.start_workflow(c, "w", steps=[]),
        "22023",
        "steps must be a list of 1 to 1000 names",
    ),
    (
        "empty step name",
        lambda c: treadle.start_workflow(c, "w", steps=["a", ""]),
        "22023",
        "steps must hold names of 1 to 200 characters, not only spaces",
    ),
    ("unknown workflow", lambda c: treadle.start_workflow(c, "never_defined"), "22023", "unknown workflow"),
    (
        "enqueue_many without name",
        lambda c: treadle.enqueue_many(c, [{"args": {}}]),
        "22023",
        'jobs element 0 needs a "name" of 1 to 200 characters, not only spaces',
    ),
]


@pytest.mark.parametrize(
    ("call", "sqlstate", "message"), [case[1:] for case in REFUSED_BY_SQL], ids=[case[0] for case in REFUSED_BY_SQL]
)
def test_refused_by_the_sql_layer(
    module_conn: psycopg.Connection[Any], call: Call, sqlstate: str, message: str
) -> None:
    conn = module_conn
    with pytest.raises(treadle.InvalidArgument, match=message) as refused:
        call(conn)
    assert refused.value.sqlstate == sqlstate
    assert isinstance(refused.value.__cause__, psycopg.Error)
    assert isinstance(refused.value, ValueError)  # InvalidArgument is a ValueError too
    assert conn.execute(
        "SELECT (SELECT count(*) FROM treadle.jobs), (SELECT count(*) FROM treadle.workflow_runs)"
    ).fetchone() == (0, 0)


def test_negative_priority_is_fine(conn: psycopg.Connection[Any]) -> None:
    job_id = treadle.enqueue(conn, "urgent", priority=-100)
    assert conn.execute("SELECT priority FROM treadle.jobs WHERE id = %s", [job_id]).fetchone() == (-100,)


class Opaque:
    pass


circular: list[Any] = [1]
circular.append(circular)

REFUSED_BY_CLIENT: list[tuple[str, Call, str]] = [
    ("name None", lambda c: treadle.enqueue(c, None), "name must be a string, not NoneType"),
    ("name bytes", lambda c: treadle.enqueue(c, b"x"), "name must be a string, not bytes"),
    ("name with NUL", lambda c: treadle.enqueue(c, "a\x00b"), "name contains a NUL character"),
    ("queue int", lambda c: treadle.enqueue(c, "x", queue=1), "queue must be a string"),
    ("priority float", lambda c: treadle.enqueue(c, "x", priority=1.5), "priority must be an integer"),
    ("priority bool", lambda c: treadle.enqueue(c, "x", priority=True), "priority must be an integer, not bool"),
    ("priority too big", lambda c: treadle.enqueue(c, "x", priority=2**31), "priority must be between"),
    ("max_attempts str", lambda c: treadle.enqueue(c, "x", max_attempts="3"), "max_attempts must be an integer"),
    ("naive run_at", lambda c: treadle.enqueue(c, "x", run_at=datetime(2030, 1, 1)), "aware datetime"),
    ("date run_at", lambda c: treadle.enqueue(c, "x", run_at=date(2030, 1, 1)), "not date"),
    ("seconds run_at", lambda c: treadle.enqueue(c, "x", run_at=5), "not int"),
    ("every seconds", lambda c: treadle.enqueue(c, "x", every=60), "every must be a datetime.timedelta"),
    ("timeout seconds", lambda c: treadle.enqueue(c, "x", timeout=60), "timeout must be a datetime.timedelta"),
    ("backoff one delay", lambda c: treadle.enqueue(c, "x", backoff=timedelta(1)), "backoff must be a list of"),
    ("backoff string", lambda c: treadle.enqueue(c, "x", backoff=cast(Any, "1 minute")), "backoff must be a list of"),
    ("backoff of seconds", lambda c: treadle.enqueue(c, "x", backoff=[1, 2]), r"backoff\[0\] must be a datetime"),
    (
        "enqueue_many backoff of seconds",
        lambda c: treadle.enqueue_many(c, [{"name": "x", "backoff": [timedelta(1), 5]}]),
        r"jobs\[0\]\['backoff'\]\[1\] must be a datetime",
    ),
    ("key int", lambda c: treadle.enqueue(c, "x", idempotency_key=1), "idempotency_key must be a string"),
    ("args NaN", lambda c: treadle.enqueue(c, "x", {"v": float("nan")}), r"args\['v'\] is nan"),
    ("args infinity", lambda c: treadle.enqueue(c, "x", {"v": [float("inf")]}), r"args\['v'\]\[0\] is inf"),
    ("args -infinity", lambda c: treadle.enqueue(c, "x", [float("-inf")]), r"args\[0\] is -inf"),
    ("args set", lambda c: treadle.enqueue(c, "x", {"s": {1, 2}}), r"args\['s'\] is a set.*use a list"),
    ("args bytes", lambda c: treadle.enqueue(c, "x", {"b": b"\x01"}), r"args\['b'\] is a bytes"),
    ("args circular", lambda c: treadle.enqueue(c, "x", circular), "contains itself"),
    ("args int key", lambda c: treadle.enqueue(c, "x", {1: "one"}), "key 1 of type int"),
    ("args datetime", lambda c: treadle.enqueue(c, "x", {"at": datetime(2030, 1, 1)}), "isoformat"),
    ("args Decimal", lambda c: treadle.enqueue(c, "x", {"d": Decimal("1.5")}), "Decimal"),
    ("args object", lambda c: treadle.enqueue(c, "x", {"o": Opaque()}), "is a Opaque"),
    ("args set at top", lambda c: treadle.enqueue(c, "x", {1, 2}), "args is a set"),
    ("input NaN", lambda c: treadle.start_workflow(c, "w", {"v": float("nan")}, steps=["a"]), r"input\['v'\] is nan"),
    ("steps as a string", lambda c: treadle.start_workflow(c, "w", steps="abc"), "steps must be a list of names"),
    ("steps not names", lambda c: treadle.start_workflow(c, "w", steps=["a", 2]), r"steps\[1\] must be a string"),
    ("after a list", lambda c: treadle.start_workflow(c, "w", steps=["a"], after=["a"]), "after must be a mapping"),
    ("sleeps a list", lambda c: treadle.start_workflow(c, "w", steps=["a"], sleeps=["a"]), "sleeps must be a mapping"),
    ("maps a list", lambda c: treadle.start_workflow(c, "w", steps=["a", "b"], maps=["b"]), "maps must be a mapping"),
    (
        "sleeps of seconds",
        lambda c: treadle.start_workflow(c, "w", steps=["a"], sleeps={"a": 60}),
        r"sleeps\['a'\] must be a datetime.timedelta",
    ),
    (
        "after not names",
        lambda c: treadle.start_workflow(c, "w", steps=["a", "b"], after={"b": "a"}),
        "after\\['b'\\] must be a list of names",
    ),
    ("job_id None", lambda c: treadle.cancel(c, None), "job_id must be an integer"),
    ("job_id str", lambda c: treadle.retry(c, "1"), "job_id must be an integer"),
    ("job_id too big", lambda c: treadle.get_job(c, 2**63), "job_id must be between"),
    ("run_id float", lambda c: treadle.cancel_workflow(c, 1.0), "run_id must be an integer"),
    ("run_id None", lambda c: treadle.workflow_results(c, None), "run_id must be an integer"),
    ("step run_id None", lambda c: treadle.workflow_step_results(c, None, "a"), "run_id must be an integer"),
    ("step None", lambda c: treadle.workflow_step_results(c, 1, None), "step must be a string"),
    ("step NUL", lambda c: treadle.workflow_step_results(c, 1, "a\x00"), "step contains a NUL"),
]


@pytest.mark.parametrize(
    ("call", "message"), [case[1:] for case in REFUSED_BY_CLIENT], ids=[case[0] for case in REFUSED_BY_CLIENT]
)
def test_refused_before_anything_is_sent(module_dsn: str, call: Call, message: str) -> None:
    with psycopg.connect(module_dsn) as conn:
        # idle: any statement sent would open a transaction
        with pytest.raises(treadle.InvalidArgument, match=message) as refused:
            call(conn)
        assert refused.value.sqlstate is None
        assert conn.info.transaction_status == TransactionStatus.IDLE

        # inside a transaction: it stays usable, and the caller's own work still commits
        conn.execute("CREATE TEMP TABLE mine (v int)")
        conn.execute("INSERT INTO mine VALUES (1)")
        with pytest.raises(treadle.InvalidArgument, match=message):
            call(conn)
        assert transaction_status(conn) == TransactionStatus.INTRANS
        conn.commit()
        assert conn.execute("SELECT count(*) FROM mine").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM treadle.jobs").fetchone() == (0,)


def test_refused_by_sql_aborts_only_like_any_failed_statement(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        with pytest.raises(treadle.InvalidArgument):
            treadle.enqueue(conn, "")
        assert conn.info.transaction_status == TransactionStatus.INERROR
        conn.rollback()
        assert treadle.enqueue(conn, "fine") >= 1
        conn.commit()


def test_a_pool_is_not_a_connection(dsn: str) -> None:
    with ConnectionPool(dsn, min_size=1, open=True) as pool:
        with pytest.raises(TypeError, match=r"not a pool: with pool.connection\(\) as conn"):
            treadle.enqueue(pool, "x")
        with pool.connection() as conn:
            assert treadle.enqueue(conn, "x") > 0


def test_not_a_connection() -> None:
    with pytest.raises(TypeError, match="psycopg Connection or AsyncConnection"):
        treadle.enqueue("postgresql://nowhere", "x")
    with pytest.raises(TypeError, match="psycopg Connection or AsyncConnection"):
        treadle.get_job(object(), 1)
