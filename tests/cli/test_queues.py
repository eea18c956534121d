"""treadle queues list | pause | resume | set and treadle jobs explain, run as the command."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.cli.support import enqueue, expect, treadle
from tests.conftest import as_role
from treadle.models import JOB_STATES

pytestmark = pytest.mark.subprocess

SETTINGS = (
    "SELECT paused, concurrency, rate_limit, extract(epoch FROM rate_period)::int AS rate_period, max_depth,"
    " extract(epoch FROM retain_completed)::int AS retain_completed,"
    " extract(epoch FROM retain_failed)::int AS retain_failed FROM treadle.queue_settings WHERE queue = %s"
)


def settings(conn: psycopg.Connection[Any], queue: str) -> tuple[Any, ...] | None:
    return conn.execute(SETTINGS, [queue]).fetchone()


def test_pause_and_resume_say_whether_they_changed_anything(dsn: str, conn: psycopg.Connection[Any]) -> None:
    assert expect(treadle("queues", "pause", "mail", "--dsn", dsn), 0).out == "queue mail: paused\n"
    assert settings(conn, "mail") == (True, None, None, None, None, None, None)
    assert expect(treadle("queues", "pause", "mail", "--dsn", dsn), 0).out == "queue mail: already paused\n"
    again = expect(treadle("queues", "pause", "mail", "--json", "--dsn", dsn), 0).json()
    assert again == {"queue": "mail", "paused": True, "changed": False}
    (job,) = enqueue(conn, "send", "mail")  # a paused queue still takes jobs; claims take none
    assert conn.execute("SELECT count(*) FROM treadle.claim('w', queues => array['mail'])").fetchone() == (0,)
    resumed = expect(treadle("queues", "resume", "mail", "--json", "--dsn", dsn), 0).json()
    assert resumed == {"queue": "mail", "paused": False, "changed": True}
    assert expect(treadle("queues", "resume", "mail", "--dsn", dsn), 0).out == "queue mail: already not paused\n"
    assert conn.execute("SELECT id FROM treadle.claim('w', queues => array['mail'])").fetchone() == (job,)


def test_set_changes_only_the_settings_given(dsn: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT treadle.pause('api')")
    done = expect(treadle("queues", "set", "api", "--concurrency", "2", "--dsn", dsn), 0)
    assert done.out == "queue api: concurrency 2 (paused)\n"
    expect(treadle("queues", "set", "api", "--rate-limit", "10", "--rate-period", "1s", "--dsn", dsn), 0)
    expect(treadle("queues", "set", "api", "--max-depth", "100", "--retain-completed", "7d", "--dsn", dsn), 0)
    shown = expect(treadle("queues", "set", "api", "--retain-failed", "30d", "--json", "--dsn", dsn), 0).json()
    assert shown == {
        "queue": "api",
        "paused": True,
        "concurrency": 2,
        "rate_limit": 10,
        "rate_period": 1.0,
        "max_depth": 100,
        "retain_completed": 7 * 86400.0,
        "retain_failed": 30 * 86400.0,
        "key_limit": None,
        "key_ordered": False,
    }
    assert settings(conn, "api") == (True, 2, 10, 1, 100, 7 * 86400, 30 * 86400)
    # removing one, either way, keeps the rest
    expect(treadle("queues", "set", "api", "--concurrency", "none", "--dsn", dsn), 0)
    expect(treadle("queues", "set", "api", "--clear-max-depth", "--dsn", dsn), 0)
    assert settings(conn, "api") == (True, None, 10, 1, None, 7 * 86400, 30 * 86400)


def test_list_marks_paused_queues_and_shows_limits(dsn: str, conn: psycopg.Connection[Any]) -> None:
    enqueue(conn, "send", "mail", 3)
    enqueue(conn, "report", "reports")
    conn.execute("SELECT treadle.pause('mail')")
    conn.execute("SELECT treadle.set_queue('partner-api', concurrency => 2, rate_limit => 3, rate_period => '1m')")
    lines = expect(treadle("queues", "list", "--dsn", dsn), 0).out.splitlines()
    assert lines[0].split()[:3] == ["QUEUE", "PAUSED", "AVAILABLE"]
    by_queue = {line.split()[0]: line for line in lines[1:]}
    assert set(by_queue) == {"mail", "partner-api", "reports"}  # a queue with settings and no job is listed
    assert by_queue["mail"].split()[1:3] == ["paused", "3"]
    assert by_queue["reports"].split()[1:3] == ["-", "1"]
    assert by_queue["partner-api"].endswith("concurrency 2, rate 3/1m")
    rows = {row["queue"]: row for row in expect(treadle("queues", "list", "--json", "--dsn", dsn), 0).json()}
    assert rows["mail"]["paused"] is True and rows["mail"]["available"] == 3
    assert rows["partner-api"]["concurrency"] == 2 and rows["partner-api"]["rate_period"] == 60.0
    assert rows["reports"]["paused"] is False and rows["reports"]["concurrency"] is None


def test_list_counts_every_state_of_each_queue_in_sql(dsn: str, conn: psycopg.Connection[Any]) -> None:
    enqueue(conn, "send", "b", 2)
    enqueue(conn, "send", "a")
    enqueue(conn, "send", "Z")
    conn.execute("SELECT treadle.set_queue('y-settings-only', max_depth => 5)")
    claimed = conn.execute("SELECT id FROM treadle.claim('w', queues => array['b'], batch => 1)").fetchall()
    assert len(claimed) == 1
    listed = expect(treadle("queues", "list", "--json", "--dsn", dsn), 0).json()
    assert [row["queue"] for row in listed] == ["Z", "a", "b", "y-settings-only"]  # by code point, as sorted() did
    settings_names = [
        "concurrency",
        "rate_limit",
        "rate_period",
        "max_depth",
        "retain_completed",
        "retain_failed",
        "key_limit",
        "key_ordered",
    ]
    assert [list(row) for row in listed] == [
        ["queue", *JOB_STATES, "oldest_waiting_seconds", "paused", *settings_names]
    ] * 4
    b = listed[2]
    assert {state: b[state] for state in JOB_STATES} == dict.fromkeys(JOB_STATES, 0) | {"available": 1, "running": 1}
    assert isinstance(b["oldest_waiting_seconds"], float) and b["oldest_waiting_seconds"] >= 0
    only = listed[3]
    assert {state: only[state] for state in JOB_STATES} == dict.fromkeys(JOB_STATES, 0)
    assert (only["oldest_waiting_seconds"], only["paused"], only["max_depth"]) == (None, False, 5)


def test_set_changes_the_key_settings(dsn: str, conn: psycopg.Connection[Any]) -> None:
    done = expect(treadle("queues", "set", "hooks", "--key-limit", "3", "--dsn", dsn), 0)
    assert done.out == "queue hooks: 3 per key\n"
    shown = expect(treadle("queues", "set", "hooks", "--key-limit", "none", "--key-ordered", "on", "--json",
                           "--dsn", dsn), 0).json()  # fmt: skip
    assert (shown["key_limit"], shown["key_ordered"]) == (None, True)
    assert conn.execute("SELECT key_limit, key_ordered FROM treadle.queues WHERE queue = 'hooks'").fetchone() == (
        None,
        True,
    )
    listed = expect(treadle("queues", "list", "--dsn", dsn), 0).out
    assert "ordered lanes" in listed
    expect(treadle("queues", "set", "hooks", "--key-ordered", "off", "--dsn", dsn), 0)
    assert conn.execute("SELECT count(*) FROM treadle.queues WHERE queue = 'hooks'").fetchone() == (0,)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "0"], "concurrency"),
        (["--concurrency", "two"], "--concurrency: 'two' is not a whole number"),
        (["--concurrency", "99999999999"], "--concurrency: 99999999999 is out of range"),
        (["--concurrency", "100001"], "concurrency"),
        (["--rate-limit", "5"], "rate"),  # a rate limit needs its period
        (["--rate-limit", "5", "--rate-period", "0s"], "rate_period"),
        (["--rate-limit", "5", "--rate-period", "2d"], "rate_period"),
        (["--retain-completed", "soon"], "--retain-completed: 'soon' is not a duration"),
        (["--retain-failed", "6000w"], "retain_failed"),
        (["--max-depth", "-1"], "max_depth"),
        (["--concurrency", "2", "--clear-concurrency"], "contradict"),
        (["--key-limit", "0"], "key_limit"),
        (["--key-ordered", "maybe"], "--key-ordered: 'maybe' is not on or off"),
        (["--key-ordered", "on", "--key-limit", "2"], "key_limit"),
        ([], "name a setting to change"),
    ],
)
def test_set_refuses_bad_values_with_exit_2_and_writes_nothing(
    dsn: str, conn: psycopg.Connection[Any], args: list[str], message: str
) -> None:
    conn.execute("SELECT treadle.set_queue('api', max_depth => 7)")
    expect(treadle("queues", "set", "api", *args, "--dsn", dsn), 2, err=message)
    assert settings(conn, "api") == (False, None, None, None, 7, None, None)


@pytest.mark.parametrize("queue", ["", " ", "a\x01b", "q" * 201])
def test_bad_queue_names_are_usage_errors(dsn: str, conn: psycopg.Connection[Any], queue: str) -> None:
    for args in (["pause", queue], ["resume", queue], ["set", queue, "--concurrency", "1"]):
        expect(treadle("queues", *args, "--dsn", dsn), 2, err="queue")
    assert conn.execute("SELECT count(*) FROM treadle.queue_settings").fetchone() == (0,)


def test_a_tenant_controls_only_its_own_queues(
    dsn: str, conn: psycopg.Connection[Any], make_role: Callable[[str], str]
) -> None:
    tenant = make_role("tenant")
    conn.execute("SELECT treadle.grant_dashboard(%s)", (tenant,))
    conn.execute("SELECT treadle.set_tenant(%s, 'billing')", (tenant,))
    conn.execute("SELECT treadle.set_queue('mail', concurrency => 5)")
    theirs = as_role(dsn, tenant)
    expect(treadle("queues", "pause", "mail", "--dsn", theirs), 4, err="may not use queue")
    expect(treadle("queues", "set", "mail", "--concurrency", "1", "--dsn", theirs), 4, err="may not use queue")
    assert settings(conn, "mail") == (False, 5, None, None, None, None, None)
    expect(treadle("queues", "pause", "billing", "--dsn", theirs), 0)
    expect(treadle("queues", "set", "billing", "--max-depth", "9", "--dsn", theirs), 0)
    assert settings(conn, "billing") == (True, None, None, None, 9, None, None)
    listed = expect(treadle("queues", "list", "--json", "--dsn", theirs), 0).json()
    assert [row["queue"] for row in listed] == ["billing"]


def test_a_read_only_dashboard_role_is_refused_with_exit_4(
    dsn: str, conn: psycopg.Connection[Any], make_role: Callable[[str], str]
) -> None:
    reader = make_role("reader")
    conn.execute("SELECT treadle.grant_dashboard(%s, read_only => true)", (reader,))
    expect(treadle("queues", "pause", "mail", "--dsn", as_role(dsn, reader)), 4, err="permission denied")
    assert settings(conn, "mail") is None


def test_explain_says_why_a_job_waits(dsn: str, conn: psycopg.Connection[Any]) -> None:
    (job,) = enqueue(conn, "send", "mail")
    conn.execute("SELECT treadle.pause('mail')")
    done = expect(treadle("jobs", "explain", str(job), "--dsn", dsn), 0)
    assert done.out.splitlines()[0] == f"job {job}"
    reasons = expect(treadle("explain", str(job), "--json", "--dsn", dsn), 0).json()
    assert "paused" in [row["reason"] for row in reasons]
    paused = next(row for row in reasons if row["reason"] == "paused")
    assert "mail" in paused["message"]
    assert any(line.split()[0] == "paused" for line in done.out.splitlines()[1:])
    assert set(reasons[0]) == {"reason", "message", "at"}


def test_explain_of_a_missing_or_bad_id(dsn: str) -> None:
    expect(treadle("jobs", "explain", "999999", "--dsn", dsn), 3, err="no job with id 999999")
    expect(treadle("explain", "0", "--dsn", dsn), 2, err="must be between 1")
    expect(treadle("explain", "x", "--dsn", dsn), 2, err="is not an integer")
