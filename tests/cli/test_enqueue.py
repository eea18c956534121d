"""treadle enqueue: one job from the command line, many from a file or stdin."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from tests.cli.support import expect, treadle

pytestmark = pytest.mark.subprocess


def jobs(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT id, name, args, queue, priority, max_attempts, idempotency_key, run_at, every, created_at"
            " FROM treadle.jobs ORDER BY id"
        ).fetchall()


def test_one_job_with_every_option(dsn: str, conn: psycopg.Connection[Any]) -> None:
    done = treadle(
        "enqueue", "cleanup", '{"older": 7}', "--queue", "ops", "--priority", "-3", "--max-attempts", "2",
        "--idempotency-key", "cleanup-1", "--run-at", "1h30m", "--every", "1d", "--dsn", dsn,
    )  # fmt: skip
    job_id = int(expect(done, 0).out)
    (job,) = jobs(conn)
    assert job["id"] == job_id
    assert (job["name"], job["args"], job["queue"], job["priority"], job["max_attempts"]) == (
        "cleanup", {"older": 7}, "ops", -3, 2,
    )  # fmt: skip
    assert (job["idempotency_key"], job["every"]) == ("cleanup-1", timedelta(days=1))
    assert timedelta(minutes=89) < job["run_at"] - job["created_at"] < timedelta(minutes=91)

    again = expect(treadle("enqueue", "cleanup", "--queue", "ops", "--idempotency-key", "cleanup-1", "--dsn", dsn), 0)
    assert int(again.out) == job_id, "the same key in the same queue is the same job"
    (other,) = expect(treadle("enqueue", "tick", "--json", "--dsn", dsn), 0).json().values()
    assert other > job_id and len(jobs(conn)) == 2


@pytest.mark.parametrize(
    ("run_at", "expected"),
    [
        ("2030-01-02T03:04:05Z", datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)),
        ("2030-01-02T04:04:05+01:00", datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)),
        ("2030-01-02 03:04:05.5+00:00", datetime(2030, 1, 2, 3, 4, 5, 500000, tzinfo=timezone.utc)),
    ],
)
def test_run_at_takes_a_time_with_its_zone(
    dsn: str, conn: psycopg.Connection[Any], run_at: str, expected: datetime
) -> None:
    expect(treadle("enqueue", "later", "--run-at", run_at, "--dsn", dsn), 0)
    assert jobs(conn)[0]["run_at"] == expected


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{to: 1}"], "JSON is not valid JSON: Expecting property name enclosed in double quotes"),
        (["5"], "args must be a JSON object or array, not number"),
        (["[" * 5000 + "]" * 5000], "JSON is nested too deeply"),
        (["--run-at", "2030-01-02T03:04:05"], "has no time zone: add one, such as +01:00, or Z for UTC"),
        (["--run-at", "tomorrow"], "'tomorrow' is neither a time such as 2026-12-01T09:30:00+01:00"),
        (["--run-at", "2030-13-02T03:04:05Z"], "is neither a time"),
        (["--every", "1 fortnight"], "'1 fortnight' is not a duration: write it like 30s, 10m, 2h, 7d, 1w or 1h30m"),
        (["--every", ""], "'' is not a duration"),
        (["--every", "0s"], "every must be"),
        (["--priority", "3000000000"], "must be between -2147483648 and 2147483647"),
        (["--max-attempts", "0"], "must be between 1 and 2147483647, got 0"),
        (["--queue", ""], "queue must"),
        (["{}", "--from", "jobs.jsonl"], "give the args as JSON or --from, not both"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_written(
    dsn: str, conn: psycopg.Connection[Any], args: list[str], message: str
) -> None:
    expect(treadle("enqueue", "send", *args, "--dsn", dsn), 2, err=message)
    assert jobs(conn) == []


def test_many_jobs_from_a_file_in_batches(dsn: str, conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    lines = tmp_path / "emails.jsonl"
    lines.write_text("".join(f'{{"to": "user{i}@example.org"}}\n' for i in range(5)) + "\n[1, 2]\n")
    done = expect(
        treadle("enqueue", "send", "--from", str(lines), "--queue", "mail", "--batch-size", "2", "--dsn", dsn), 0
    )
    made = jobs(conn)
    assert [int(line) for line in done.out.split()] == [job["id"] for job in made]
    assert [job["args"] for job in made] == [{"to": f"user{i}@example.org"} for i in range(5)] + [[1, 2]]
    assert {(job["name"], job["queue"]) for job in made} == {("send", "mail")}
    assert done.err.splitlines() == [
        "enqueueing: 2/6",
        "enqueueing: 4/6",
        "enqueueing: 6/6",
        f"enqueued 6 jobs from {lines}",
    ]


def test_job_specs_from_stdin(dsn: str, conn: psycopg.Connection[Any]) -> None:
    stdin = (
        '{"name": "send", "args": {"to": "a"}, "queue": "mail", "idempotency_key": "a"}\n'
        '{"name": "send", "args": {"to": "a"}, "queue": "mail", "idempotency_key": "a"}\n'
        '{"name": "report", "run_at": "2030-01-01T00:00:00Z", "every": "1w"}\n'
        '{"name": "late", "run_at": "2h", "priority": 4}\n'
    )
    done = treadle("enqueue", "--from", "-", "--json", "--priority", "1", "--dsn", dsn, stdin=stdin)
    expect(done, 0, err="enqueued 4 jobs from stdin")
    ids = done.json()["ids"]
    assert ids[0] == ids[1], "a repeated key is one job"
    made = {job["name"]: job for job in jobs(conn)}
    assert len(made) == 3 and made["send"]["queue"] == "mail" and made["send"]["priority"] == 1
    assert made["report"]["run_at"] == datetime(2030, 1, 1, tzinfo=timezone.utc)
    assert made["report"]["every"] == timedelta(weeks=1)
    assert made["late"]["priority"] == 4, "a line's own value wins over the option"
    assert timedelta(minutes=119) < made["late"]["run_at"] - made["late"]["created_at"] < timedelta(minutes=121)


@pytest.mark.parametrize(
    ("name", "stdin", "message"),
    [
        ("send", '{"to": 1}\n{"to": 2\n', "stdin line 2 is not valid JSON"),
        ("send", '{"to": 1}\n"just text"\n', "stdin line 2: args must be a JSON object or array, not a string"),
        (None, '{"args": {}}\n', 'stdin line 1: without NAME, each line is a job: {"name": "...", "args": {...}, ...}'),
        (None, '{"name": "x", "run_at": "soon"}\n', "stdin line 1: run_at: 'soon' is neither a time"),
        (None, '{"name": "x"}\n{"name": "y", "colour": "red"}\n', "stdin line 2: the job has 'colour', which enqueue"),
        (None, '{"name": "x"}\n{"name": "y", "priority": "high"}\n', "stdin line 2: priority must be an integer"),
        (None, '{"name": "x"}\n{"name": ""}\n', 'stdin line 2: the job needs a "name" of 1 to 200 characters'),
        (None, '{"name": "x"}\n{"name": "y", "queue": "a\\u0000b"}\n', "stdin line 2: queue contains a NUL character"),
        (None, "\n\n", "stdin has no job: expected one JSON document per line"),
    ],
)
def test_a_bad_line_is_named_and_nothing_is_written(
    dsn: str, conn: psycopg.Connection[Any], name: str | None, stdin: str, message: str
) -> None:
    args = ["enqueue", *([name] if name else []), "--from", "-", "--dsn", dsn]
    expect(treadle(*args, stdin=stdin), 2, err=message)
    assert jobs(conn) == []


def test_a_batch_the_database_refuses_after_others_committed(dsn: str, conn: psycopg.Connection[Any]) -> None:
    stdin = '{"name": "a"}\n{"name": "b"}\n{"name": "c"}\n{"name": "' + "x" * 300 + '"}\n'
    done = expect(treadle("enqueue", "--from", "-", "--batch-size", "2", "--dsn", dsn, stdin=stdin), 1)
    assert 'stdin line 4: the job needs a "name" of 1 to 200 characters' in done.err
    assert "the 2 jobs before line 3 were enqueued, none after" in done.err
    assert [job["name"] for job in jobs(conn)] == ["a", "b"]

    atomic = treadle("enqueue", "--from", "-", "--batch-size", "2", "--atomic", "--dsn", dsn, stdin=stdin)
    expect(atomic, 2, err="stdin line 4: ")
    assert "nothing was enqueued" in atomic.err
    assert [job["name"] for job in jobs(conn)] == ["a", "b"], "--atomic: the first batch rolled back too"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from", "/no/such/file.jsonl"], "--from /no/such/file.jsonl: No such file or directory"),
        (["--from", "-", "--idempotency-key", "k"], "--idempotency-key would make one job of every line"),
        ([], "name the job to enqueue, or give --from FILE"),
    ],
)
def test_from_refuses_what_it_cannot_read(
    dsn: str, conn: psycopg.Connection[Any], args: list[str], message: str
) -> None:
    expect(treadle("enqueue", *(["send"] if args[:1] == ["--from"] else []), *args, "--dsn", dsn), 2, err=message)
    assert jobs(conn) == []


def test_from_refuses_text_that_is_not_utf8(dsn: str, conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes('{"who": "Zoë"}\n'.encode("latin-1"))
    expect(treadle("enqueue", "send", "--from", str(latin), "--dsn", dsn), 2, err="is not UTF-8 text")
    assert jobs(conn) == []
