"""treadle jobs list | show | retry | cancel, run as the command."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from tests.cli.support import Terminal, enqueue, expect, fail_jobs, states, treadle

pytestmark = pytest.mark.subprocess

TRACEBACK = 'Traceback (most recent call last):\n  File "tasks.py", line 3, in send\nConnectionError: smtp down {id}'


@pytest.fixture
def failed(conn: psycopg.Connection[Any]) -> dict[str, list[int]]:
    """mail: 3 discarded and 2 retryable send jobs; reports: 2 available; one completed."""
    discarded = enqueue(conn, "send", "mail", 3)
    fail_jobs(conn, "mail", 3, TRACEBACK, discard=True)
    retryable = enqueue(conn, "send", "mail", 2)
    fail_jobs(conn, "mail", 2, TRACEBACK, discard=False)
    waiting = enqueue(conn, "report", "reports", 2)
    done = enqueue(conn, "tick", "ticks")
    (job, token), *_ = conn.execute("SELECT id, lease_token FROM treadle.claim('w', queues => array['ticks'])")
    conn.execute("SELECT treadle.complete(%s, %s, '{\"ok\": true}')", [job, token])
    return {"discarded": discarded, "retryable": retryable, "available": waiting, "completed": done}


def test_list_is_newest_first_with_the_errors_last_line(dsn: str, failed: dict[str, list[int]]) -> None:
    lines = expect(treadle("jobs", "list", "--dsn", dsn), 0).out.splitlines()
    assert lines[0].split() == ["ID", "QUEUE", "NAME", "STATE", "ATTEMPT", "RUN", "AT", "LAST", "ERROR"]
    ids = [int(line.split()[0]) for line in lines[1:]]
    assert ids == sorted((job for jobs in failed.values() for job in jobs), reverse=True)
    first_discarded = next(line for line in lines if line.split()[0] == str(failed["discarded"][0]))
    assert first_discarded.split()[1:5] == ["mail", "send", "discarded", "1/1"]
    assert first_discarded.endswith(f"ConnectionError: smtp down {failed['discarded'][0]}")


def test_list_filters_and_json(dsn: str, failed: dict[str, list[int]]) -> None:
    done = expect(treadle("jobs", "list", "--queue", "mail", "--state", "discarded", "--json", "--dsn", dsn), 0)
    rows = done.json()
    assert [row["id"] for row in rows] == sorted(failed["discarded"], reverse=True)
    assert {(row["queue"], row["state"], row["name"]) for row in rows} == {("mail", "discarded", "send")}
    assert rows[0]["last_error"].endswith(f"smtp down {failed['discarded'][-1]}")  # the whole traceback
    two_states = treadle("jobs", "list", "--state", "retryable", "--state", "available", "--json", "--dsn", dsn)
    assert {row["id"] for row in expect(two_states, 0).json()} == set(failed["retryable"] + failed["available"])
    by_name = expect(treadle("jobs", "list", "--name", "report", "--limit", "1", "--json", "--dsn", dsn), 0)
    assert [row["id"] for row in by_name.json()] == [max(failed["available"])]
    nothing = expect(treadle("jobs", "list", "--queue", "nope", "--dsn", dsn), 0)
    assert nothing.out == "no jobs\n"
    assert expect(treadle("jobs", "list", "--queue", "nope", "--json", "--dsn", dsn), 0).json() == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--state", "finished"], "invalid choice: 'finished'"),
        (["--limit", "0"], "must be between 1 and 10000, got 0"),
        (["--limit", "lots"], "'lots' is not an integer"),
        (["--queue", "a\x01b"], None),  # a control character is a queue nobody has: no jobs
    ],
)
def test_list_refuses_bad_filters(dsn: str, args: list[str], message: str | None) -> None:
    done = treadle("jobs", "list", *args, "--dsn", dsn)
    if message is None:
        assert expect(done, 0).out == "no jobs\n"
    else:
        expect(done, 2, err=message)


def test_show_prints_every_field_and_the_history_of_errors(dsn: str, failed: dict[str, list[int]]) -> None:
    job = failed["discarded"][0]
    out = expect(treadle("jobs", "show", str(job), "--dsn", dsn), 0).out
    assert out.startswith(f"job {job}\n")
    fields = dict(re.findall(r"^  (\S.*?)\s{2,}(.*)$", out, re.M))
    assert (fields["queue"], fields["name"], fields["state"], fields["attempt"]) == ("mail", "send", "discarded", "1")
    assert (fields["max attempts"], fields["worker id"], fields["args"]) == ("1", "test-worker", "{}")
    assert fields["failed at"].startswith("20") and fields["lease until"] == "-"
    assert "errors (1)\n  attempt 1 at " in out
    assert f'    File "tasks.py", line 3, in send\n    ConnectionError: smtp down {job}\n' in out

    shown = expect(treadle("jobs", "show", str(job), "--json", "--dsn", dsn), 0).json()
    assert (shown["id"], shown["state"], shown["attempt"], shown["args"]) == (job, "discarded", 1, {})
    assert [e["attempt"] for e in shown["errors"]] == [1]
    assert shown["errors"][0]["error"].endswith(f"smtp down {job}")
    assert "lease_token" not in shown


@pytest.mark.parametrize(
    ("job_id", "code", "message"),
    [
        ("999999", 3, "no job with id 999999"),
        ("0", 2, "must be between 1 and"),
        ("-4", 2, "must be between 1 and 9223372036854775807, got -4"),
        ("seven", 2, "'seven' is not an integer"),
        ("99999999999999999999", 2, "must be between 1 and"),
    ],
)
def test_show_refuses_an_unknown_or_bad_id(dsn: str, job_id: str, code: int, message: str) -> None:
    expect(treadle("jobs", "show", job_id, "--dsn", dsn), code, err=message)


def test_retry_and_cancel_by_id_say_what_each_did(
    dsn: str, conn: psycopg.Connection[Any], failed: dict[str, list[int]]
) -> None:
    discarded, completed = failed["discarded"][0], failed["completed"][0]
    done = expect(treadle("jobs", "retry", str(discarded), "--dsn", dsn), 0)
    assert done.out == f"job {discarded}: retried\n"
    assert states(conn, [discarded]) == ["available"]

    refused = expect(treadle("jobs", "retry", str(completed), "--dsn", dsn), 4)
    assert f"job {completed}: not retried: it is completed; retry applies to discarded, cancelled or retryable" in (
        refused.err
    )
    missing = expect(treadle("jobs", "cancel", str(discarded), "424242", "--dsn", dsn), 3)
    assert missing.out == f"job {discarded}: cancelled\n"
    assert "job 424242: not cancelled: not found" in missing.err
    assert states(conn, [discarded]) == ["cancelled"]

    outcomes = expect(
        treadle("jobs", "cancel", *map(str, failed["available"]), str(completed), "--json", "--dsn", dsn), 4
    )
    assert [(o["id"], o["done"], o["state"]) for o in outcomes.json()] == [
        *((job, True, "cancelled") for job in failed["available"]),
        (completed, False, "completed"),
    ]


def test_filtered_retry_counts_asks_and_works_in_batches(
    dsn: str, conn: psycopg.Connection[Any], failed: dict[str, list[int]]
) -> None:
    select = ("--state", "discarded", "--queue", "mail")
    dry = expect(treadle("jobs", "retry", *select, "--dry-run", "--dsn", dsn), 0)
    assert dry.out == "3 jobs (state discarded, queue mail) would be retried\n"

    unasked = expect(treadle("jobs", "retry", *select, "--dsn", dsn), 4, err="pass --yes to retry them")
    assert "retry 3 jobs (state discarded, queue mail): not asked, as stdin is not a terminal" in unasked.err
    assert states(conn, failed["discarded"]) == ["discarded"] * 3

    done = expect(treadle("jobs", "retry", *select, "--yes", "--batch-size", "2", "--dsn", dsn), 0)
    assert done.out == "retried 3 of 3 jobs\n"
    assert done.err.splitlines() == ["retrying: 2/3", "retrying: 3/3"]  # one line per batch off a terminal
    assert states(conn, failed["discarded"]) == ["available"] * 3
    assert states(conn, failed["retryable"]) == ["retryable"] * 2, "the filter's other states are left alone"

    every_failed = expect(treadle("jobs", "retry", "--queue", "mail", "--yes", "--json", "--dsn", dsn), 0)
    assert every_failed.json() == {"selected": 2, "retried": 2}  # the retryable two; available ones are no match
    assert expect(treadle("jobs", "retry", "--queue", "mail", "--yes", "--dsn", dsn), 0).out == "no jobs match\n"


def test_filtered_cancel_asks_a_person_at_a_terminal(
    dsn: str, conn: psycopg.Connection[Any], failed: dict[str, list[int]]
) -> None:
    declined = Terminal("jobs", "cancel", "--queue", "reports", "--dsn", dsn)
    declined.read_until(lambda seen: "[y/N]" in seen, "the question")
    assert "cancel 2 jobs (state available, retryable or running, queue reports)? [y/N]" in declined.seen
    declined.type("n\n")
    assert declined.exit_code() == 4
    assert "not confirmed: nothing was changed" in declined.seen
    assert states(conn, failed["available"]) == ["available"] * 2

    agreed = Terminal("jobs", "cancel", "--queue", "reports", "--dsn", dsn)
    agreed.read_until(lambda seen: "[y/N]" in seen, "the question")
    agreed.type("y\n")
    assert agreed.exit_code() == 0
    assert "cancelled 2 of 2 jobs" in agreed.seen
    assert states(conn, failed["available"]) == ["cancelled"] * 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "name the jobs to retry: job ids, or --state, --queue or --name"),
        (["5", "--queue", "mail"], "give job ids or filters (--state, --queue, --name), not both"),
        (["--state", "completed"], "invalid choice: 'completed'"),
        (["--queue", "mail", "--batch-size", "0"], "must be between 1 and 10000"),
    ],
)
def test_retry_refuses_what_names_no_jobs(
    dsn: str, conn: psycopg.Connection[Any], args: list[str], message: str
) -> None:
    jobs = enqueue(conn, "send", "mail")
    fail_jobs(conn, "mail", 1, "boom", discard=True)
    expect(treadle("jobs", "retry", *args, "--yes", "--dsn", dsn), 2, err=message)
    assert states(conn, jobs) == ["discarded"]
