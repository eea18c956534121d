"""What the Python package states about the extension (defaults, bounds, caps), pinned to the extension.

Each constant below restates a fact that the SQL layer owns; each test asks the
installed extension and fails when the two disagree, so that neither can change
alone.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import treadle
from treadle import _args
from treadle._completer import ERROR_KEEP, MAX_ERROR_CHARS, describe
from treadle._options import MAX_CONCURRENCY, MAX_RETENTION_BATCH
from treadle._registry import MAX_SLEEP, MAX_TIMEOUT
from treadle.client import ENQUEUE_DEFAULTS, WORKFLOW_DEFAULTS
from treadle.errors import MAX_SNOOZE

ONE_MICROSECOND = timedelta(microseconds=1)
# the options stored in a column of the same name (run_at's default, now, is checked apart)
ENQUEUE_COLUMNS = {"queue", "priority", "max_attempts", "idempotency_key", "every", "timeout", "backoff"}
RUN_COLUMNS = {  # start_workflow's options stored in treadle.workflow_runs
    "queue",
    "priority",
    "max_attempts",
    "idempotency_key",
    "after",
    "sleeps",
    "maps",
    "waits",
}


def value(conn: psycopg.Connection[Any], query: Any, params: Any = None) -> Any:
    found = conn.execute(query, params).fetchone()
    assert found is not None
    return found[0]


def one(conn: psycopg.Connection[Any], query: Any, params: Any = None) -> dict[str, Any]:
    found = conn.cursor(row_factory=dict_row).execute(query, params).fetchone()
    assert found is not None
    return found


def test_enqueue_defaults_are_treadle_enqueue_defaults(conn: psycopg.Connection[Any]) -> None:
    query = "SELECT * FROM treadle.jobs WHERE id = %s"
    by_sql = one(conn, query, [value(conn, "SELECT treadle.enqueue('pinned')")])
    by_python = one(conn, query, [treadle.enqueue(conn, "pinned")])
    for column in ENQUEUE_COLUMNS:
        assert by_python[column] == by_sql[column] == ENQUEUE_DEFAULTS[column], column  # type: ignore[literal-required]
    assert ENQUEUE_DEFAULTS["run_at"] is None  # None: treadle.enqueue's default, now
    assert by_python["args"] == by_sql["args"] == {}
    assert by_python["run_at"] == by_python["created_at"] and by_sql["run_at"] == by_sql["created_at"]


def test_enqueue_without_options_stores_what_every_option_at_its_default_does(conn: psycopg.Connection[Any]) -> None:
    """A call without options sends two parameters and takes the function's defaults; one that
    names each option (at ENQUEUE_DEFAULTS) sends them all: the two jobs must not differ."""
    query = "SELECT * FROM treadle.jobs WHERE id = %s"
    short = one(conn, query, [treadle.enqueue(conn, "pinned", {"a": 1})])
    full = one(conn, query, [treadle.enqueue(conn, "pinned", {"a": 1}, **ENQUEUE_DEFAULTS)])
    differ = {c for c in short if short[c] != full[c]}
    assert differ == {"id", "run_at", "created_at", "ready_txid"}, differ
    assert short["run_at"] == short["created_at"] and full["run_at"] == full["created_at"]
    assert short["args"] == {"a": 1} and short["state"] == "available"


def test_enqueue_many_defaults_are_treadle_enqueue_many_defaults(conn: psycopg.Connection[Any]) -> None:
    [sql_id] = [row[0] for row in conn.execute('SELECT treadle.enqueue_many(\'[{"name": "pinned"}]\')')]
    [python_id] = treadle.enqueue_many(conn, [{"name": "pinned"}])
    query = "SELECT * FROM treadle.jobs WHERE id = %s"
    by_sql, by_python = one(conn, query, [sql_id]), one(conn, query, [python_id])
    for column in ENQUEUE_COLUMNS:
        assert by_python[column] == by_sql[column] == ENQUEUE_DEFAULTS[column], column  # type: ignore[literal-required]


def test_start_workflow_defaults_are_treadle_start_workflow_defaults(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT treadle.define_workflow('pinned', ARRAY['a', 'b'])")
    query = "SELECT * FROM treadle.workflow_runs WHERE id = %s"
    by_sql = one(conn, query, [value(conn, "SELECT treadle.start_workflow('pinned')")])
    by_python = one(conn, query, [treadle.start_workflow(conn, "pinned")])
    for column in RUN_COLUMNS:
        assert by_python[column] == by_sql[column] == WORKFLOW_DEFAULTS[column], column  # type: ignore[literal-required]
    assert WORKFLOW_DEFAULTS["steps"] is None  # None: the defined steps
    assert by_python["steps"] == by_sql["steps"] == ["a", "b"]


def test_the_error_cap_is_treadle_trim_errors(conn: psycopg.Connection[Any]) -> None:
    def trim(text: str) -> str:
        trimmed: str = value(conn, "SELECT treadle._trim_error(%s)", [text])
        return trimmed

    at_cap = "x" * MAX_ERROR_CHARS
    assert trim(at_cap) == at_cap
    over = "a" * ERROR_KEEP + "m" * (MAX_ERROR_CHARS + 1 - 2 * ERROR_KEEP) + "z" * ERROR_KEEP
    trimmed = trim(over)
    assert trimmed != over
    assert trimmed.startswith("a" * ERROR_KEEP + "\n") and trimmed.endswith("\n" + "z" * ERROR_KEEP)
    # what the worker keeps of a long traceback, the extension stores whole
    described = describe(ValueError("y" * 10 * MAX_ERROR_CHARS))
    assert len(described) <= MAX_ERROR_CHARS and trim(described) == described


@pytest.mark.parametrize(
    "call",
    [
        "SELECT count(*) FROM treadle.claim(worker_id => 'pinned', batch => %s)",
        "SELECT count(*) FROM treadle.complete_and_claim(job_ids => '{}', lease_tokens => '{}', results => NULL,"
        " worker_id => 'pinned', batch => %s)",
    ],
    ids=["claim", "complete_and_claim"],
)
def test_the_largest_concurrency_is_the_largest_claim(conn: psycopg.Connection[Any], call: str) -> None:
    assert value(conn, call, [MAX_CONCURRENCY]) == 0
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="batch must be between"):
        conn.execute(call, [MAX_CONCURRENCY + 1])


def test_the_largest_retention_batch_is_treadle_apply_retentions(conn: psycopg.Connection[Any]) -> None:
    assert value(conn, "SELECT treadle.apply_retention(%s)", [MAX_RETENTION_BATCH]) == 0
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="batch must be between"):
        conn.execute("SELECT treadle.apply_retention(%s)", [MAX_RETENTION_BATCH + 1])


def test_the_longest_handler_timeout_is_treadle_enqueues(conn: psycopg.Connection[Any]) -> None:
    longest = timedelta(seconds=MAX_TIMEOUT)
    assert value(conn, "SELECT treadle.enqueue('pinned', timeout => %s)", [longest]) > 0
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="timeout"):
        conn.execute("SELECT treadle.enqueue('pinned', timeout => %s)", [longest + ONE_MICROSECOND])


def test_the_longest_snooze_is_treadle_snoozes(conn: psycopg.Connection[Any]) -> None:
    job_id = treadle.enqueue(conn, "pinned")
    token = value(
        conn, "SELECT lease_token FROM treadle.claim(worker_id => 'pinned', lease_token => gen_random_uuid())"
    )
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="delay"):
        conn.execute("SELECT treadle.snooze(%s, %s, %s)", [job_id, token, MAX_SNOOZE + ONE_MICROSECOND])
    assert value(conn, "SELECT treadle.snooze(%s, %s, %s)", [job_id, token, MAX_SNOOZE]) == "available"


def test_the_longest_wait_timeout_is_treadle_define_workflows(conn: psycopg.Connection[Any]) -> None:
    define = "SELECT treadle.define_workflow('pinned', ARRAY['wait', 'after'], waits => %s::jsonb)"
    conn.execute(define, [json.dumps({"wait": {"signal": "go", "timeout": _args.interval_text(MAX_SLEEP)}})])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="wait step"):
        conn.execute(
            define,
            [json.dumps({"wait": {"signal": "go", "timeout": _args.interval_text(MAX_SLEEP + ONE_MICROSECOND)}})],
        )


def test_the_longest_sleep_step_is_treadle_define_workflows(conn: psycopg.Connection[Any]) -> None:
    define = "SELECT treadle.define_workflow('pinned', ARRAY['nap', 'after'], sleeps => %s::jsonb)"
    conn.execute(define, [json.dumps({"nap": _args.interval_text(MAX_SLEEP)})])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="sleep step"):
        conn.execute(define, [json.dumps({"nap": _args.interval_text(MAX_SLEEP + ONE_MICROSECOND)})])
