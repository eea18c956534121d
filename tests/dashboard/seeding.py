"""A database with jobs in every state, for the dashboard tests, and small helpers.

Jobs are put in their states by the extension's own functions (enqueue, claim,
fail, complete, cancel, start_workflow), never by writing rows, so what the
dashboard shows is what a real queue would hold. Some carry markup in their
name, args and error text, to prove the pages show it as text.
"""

from __future__ import annotations

import json
import re
import traceback
from dataclasses import dataclass
from typing import Any

import psycopg
from flask.testing import FlaskClient

# markup that would run, or show, if a page ever put data into HTML unescaped
XSS_NAME = "<img src=x onerror=window.__xss_name=1>"
XSS_ARGS = {"html": "</pre><script>window.__xss_args=1</script>"}
XSS_ERROR = '<script>window.__xss_error=1</script>"><img src=x onerror="window.__xss_error=2">\nTraceback line two'


@dataclass(frozen=True)
class Seeded:
    available: int
    running: int
    retryable: int
    discarded: int
    completed: int
    cancelled: int
    xss: int  # discarded, with markup in its name, args and error
    failed_run: int  # a three-step run whose second step was discarded
    failed_step: int
    running_run: int  # a run whose first step waits


def one(conn: psycopg.Connection, sql: str, *params: object) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def enqueue(
    conn: psycopg.Connection, name: str, queue: str = "default", args: str = "{}", max_attempts: int = 3
) -> int:
    return int(
        one(conn, "SELECT treadle.enqueue(%s, %s::jsonb, %s, max_attempts => %s)", name, args, queue, max_attempts)
    )


def start_workflow(
    conn: psycopg.Connection, name: str, steps: list[str], queue: str, run_input: str = "{}", max_attempts: int = 3
) -> int:
    return int(
        one(
            conn,
            "SELECT treadle.start_workflow(%s, %s::jsonb, %s, %s, max_attempts => %s)",
            name,
            run_input,
            steps,
            queue,
            max_attempts,
        )
    )


def claim(conn: psycopg.Connection, queue: str, worker: str = "worker-a") -> tuple[int, str]:
    row = conn.execute("SELECT id, lease_token FROM treadle.claim(%s, ARRAY[%s])", (worker, queue)).fetchone()
    assert row is not None, f"nothing to claim in {queue}"
    return int(row[0]), str(row[1])


def fail(conn: psycopg.Connection, queue: str, error: str) -> int:
    job_id, token = claim(conn, queue)
    conn.execute("SELECT treadle.fail(%s, %s::uuid, %s, interval '1 hour')", (job_id, token, error))
    return job_id


def complete(conn: psycopg.Connection, queue: str, result: str = '{"ok": true}') -> int:
    job_id, token = claim(conn, queue)
    conn.execute("SELECT treadle.complete(%s, %s::uuid, %s::jsonb)", (job_id, token, result))
    return job_id


def seed(conn: psycopg.Connection) -> Seeded:
    """Jobs in every state, each in a queue of its own so claims pick exactly it."""
    available = enqueue(conn, "send_email", "mail", '{"to": "ada@example.com"}')
    enqueue(conn, "resize_image", "media")
    running, _ = claim(conn, "media")
    conn.execute(
        "SELECT treadle.progress(%s, lease_token, 0.4, 'resizing') FROM treadle.jobs WHERE id = %s", (running, running)
    )
    enqueue(conn, "sync_crm", "flaky")
    retryable = fail(conn, "flaky", "ConnectionError: timed out\n  at sync_crm()")
    enqueue(conn, "charge_card", "billing", max_attempts=1)
    discarded = fail(conn, "billing", "CardDeclined: insufficient funds")
    enqueue(conn, "build_report", "reports")
    completed = complete(conn, "reports", '{"rows": 42}')
    cancelled = enqueue(conn, "cleanup", "default")
    conn.execute("SELECT treadle.cancel(%s)", (cancelled,))
    enqueue(conn, XSS_NAME, "hostile", json.dumps(XSS_ARGS), max_attempts=1)
    xss = fail(conn, "hostile", XSS_ERROR)

    failed_run = start_workflow(conn, "order", ["reserve", "charge", "ship"], "orders", '{"order": 7}', max_attempts=1)
    complete(conn, "orders", '{"hold": "h-1"}')
    failed_step = fail(conn, "orders", "PaymentError: card expired")
    running_run = start_workflow(conn, "signup", ["create", "welcome"], "signups")

    conn.execute("SELECT treadle.worker_seen('worker-a', 'host-a', 4242, ARRAY['media'], 4, 1)")
    return Seeded(
        available, running, retryable, discarded, completed, cancelled, xss, failed_run, failed_step, running_run
    )


def csrf_from(client: FlaskClient, path: str = "/") -> str:
    """The CSRF token of this client's session, as a page hands it out."""
    response = client.get(path)
    match = re.search(r'name="csrf_token" value="([^"]+)"', response.get_data(as_text=True))
    assert match, f"no action form on {path}"
    return match.group(1)


def job_state(conn: psycopg.Connection, job_id: int) -> str:
    return str(one(conn, "SELECT state FROM treadle.jobs WHERE id = %s", job_id))


# JSON nested deeper than Python's json module decodes (it raises RecursionError);
# 0.2.0 refuses such payloads, but rows written by 0.1.0 may hold them
DEEP_JSON = "[" * 1500 + "]" * 1500


@dataclass(frozen=True)
class DeepRows:
    job: int  # a finished step job whose args, result and error history are DEEP_JSON
    run: int  # its workflow run, whose input and step result are DEEP_JSON


def deep_rows(conn: psycopg.Connection) -> DeepRows:
    """Rows as 0.1.0 could have written them, put there directly by the superuser."""
    run = start_workflow(conn, "legacy", ["first", "second"], "legacy")
    job = complete(conn, "legacy")
    conn.execute(
        "UPDATE treadle.workflow_runs"
        " SET input = %(deep)s::jsonb, results = jsonb_build_object('first', %(deep)s::jsonb)"
        " WHERE id = %(run)s",
        {"deep": DEEP_JSON, "run": run},
    )
    conn.execute(
        "UPDATE treadle.jobs SET args = %(deep)s::jsonb, result = %(deep)s::jsonb,"
        " errors = jsonb_build_array(jsonb_build_object('attempt', 1, 'at', now(), 'error', %(deep)s::jsonb))"
        " WHERE id = %(job)s",
        {"deep": DEEP_JSON, "job": job},
    )
    return DeepRows(job=job, run=run)


def lease_token(conn: psycopg.Connection, job_id: int) -> str:
    """A running job's lease token, read as the superuser."""
    return str(one(conn, "SELECT lease_token FROM treadle.jobs WHERE id = %s", job_id))


def python_traceback() -> str:
    """The traceback of a real exception raised while handling another, as a worker records it."""
    feed: dict[str, list[str]] = {}
    try:
        try:
            feed["items"]
        except KeyError as missing:
            raise ValueError("feed 7 has no items") from missing
    except ValueError:
        return traceback.format_exc()
    raise AssertionError("unreachable")


def fail_with_traceback(conn: psycopg.Connection) -> int:
    """A retryable job whose error is a Python traceback (python_traceback())."""
    enqueue(conn, "parse_feed", "feeds")
    return fail(conn, "feeds", python_traceback())
