"""One structured line per failed attempt, read from a real worker process's standard error."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.metrics.worker_process import one_row, wait_for_jobs, worker_process
from treadle.logs import JsonFormatter, logfmt

FAILED_LINE = r"WARNING treadle\.worker: job failed job_id={id} .*"


@pytest.mark.subprocess
def test_each_failed_attempt_is_one_line_with_its_fields(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    (job_id,) = one_row(conn, "SELECT treadle.enqueue('boom', queue => 'mail', max_attempts => 2)")
    with worker_process(dsn, tmp_path) as worker:
        wait_for_jobs(conn, "discarded", 1)
        worker.stop()
    failed = [line for line in worker.stderr.splitlines() if "job failed" in line]
    assert len(failed) == 2, worker.stderr
    # Each attempt's line is written by the thread that recorded its failure, after the
    # commit: on a busy machine the second attempt's thread may write first.
    failed.sort(key=lambda line: " attempt=2 " in line)
    for attempt, state, line in zip((1, 2), ("retryable", "discarded"), failed, strict=True):
        assert " WARNING treadle.worker: job failed " in line
        assert (
            f"job_id={job_id} job_name=boom queue=mail attempt={attempt} max_attempts=2 state={state} "
            'error_type=ValueError error="no such mailbox"'
        ) in line, line


@pytest.mark.subprocess
def test_json_logs_one_object_per_line(dsn: str, conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    (job_id,) = one_row(conn, "SELECT treadle.enqueue('boom', queue => 'mail', max_attempts => 1)")
    conn.execute("SELECT treadle.enqueue('send', queue => 'mail')")
    with worker_process(dsn, tmp_path, "--log-format", "json") as worker:
        wait_for_jobs(conn, "discarded", 1)
        wait_for_jobs(conn, "completed", 1)
        assert worker.stop() == 0
    lines = [json.loads(line) for line in worker.stderr.splitlines()]
    assert lines and all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    failed = [line for line in lines if line["message"].startswith("job failed")]
    assert len(failed) == 1
    assert {key: failed[0][key] for key in ("level", "logger", "job_id", "job_name", "queue", "attempt")} == {
        "level": "WARNING",
        "logger": "treadle.worker",
        "job_id": job_id,
        "job_name": "boom",
        "queue": "mail",
        "attempt": 1,
    }
    assert failed[0]["state"] == "discarded" and failed[0]["error_type"] == "ValueError"
    assert any("started" in line["message"] for line in lines)


def test_logfmt_quotes_what_would_split_a_value() -> None:
    assert logfmt({"a": 1, "b": "two words", "c": 'say "hi"', "d": None, "e": "x=y", "f": ""}) == (
        'a=1 b="two words" c="say \\"hi\\"" e="x=y" f=""'
    )


def test_json_formatter_keeps_exceptions() -> None:
    try:
        raise KeyError("gone")
    except KeyError:
        record = logging.LogRecord("treadle.worker", logging.ERROR, __file__, 1, "oops %s", ("now",), sys.exc_info())
    record.job_id = 7
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "oops now" and line["job_id"] == 7
    assert line["exception"].splitlines()[-1] == "KeyError: 'gone'"
