"""treadle status [--watch], queues list, schedules list, prune and --version, run as the command."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from typing import Any

import psycopg
import pytest

from tests.cli.support import PATIENCE, TREADLE, Terminal, enqueue, expect, fail_jobs, treadle
from tests.conftest import EXTENSION_VERSION, INSTALL, NewDatabase
from tests.plain_install import PLAIN_OWNER
from treadle import __version__

pytestmark = pytest.mark.subprocess


@pytest.fixture
def mixed(conn: psycopg.Connection[Any]) -> None:
    """mail: 12 available, 2 discarded; reports-weekly: 1 cancelled."""
    enqueue(conn, "send", "mail", 2)
    fail_jobs(conn, "mail", 2, "boom", discard=True)
    enqueue(conn, "send", "mail", 12)
    (report,) = enqueue(conn, "report", "reports-weekly")
    conn.execute("SELECT treadle.cancel(%s)", [report])


def test_status_table_and_json(dsn: str, mixed: None) -> None:
    lines = expect(treadle("status", "--dsn", dsn), 0).out.splitlines()
    assert lines[0].split() == ["QUEUE", "STATE", "JOBS", "OLDEST", "WAITING"]
    form, owner = ("plain", PLAIN_OWNER) if INSTALL == "plain" else ("extension", "postgres")
    assert lines[-1] == f"treadle {EXTENSION_VERSION} ({form}), owned by role {owner}"
    assert [line.split()[:3] for line in lines[1:-1]] == [
        ["mail", "available", "12"],
        ["mail", "discarded", "2"],
        ["reports-weekly", "cancelled", "1"],
    ]
    assert re.fullmatch(r"\d+(\.\d)? s", " ".join(lines[1].split()[3:]))  # (whole tenths drop ".0": "2 s")
    status = expect(treadle("status", "--json", "--dsn", dsn), 0).json()
    assert [(r["queue"], r["state"], r["jobs"], r["estimated"]) for r in status["jobs"]] == [
        ("mail", "available", 12, False),
        ("mail", "discarded", 2, False),
        ("reports-weekly", "cancelled", 1, False),
    ]
    assert status["jobs"][0]["oldest_waiting_seconds"] >= 0 and status["jobs"][2]["oldest_waiting_seconds"] is None
    assert status["workers"] == []
    assert status["treadle"] == {
        "version": EXTENSION_VERSION,
        "form": form,
        "owner": owner,
        "user": "postgres",
        "user_may_act_as_owner": True,
    }


def test_status_watch_refreshes_in_place_until_ctrl_c(dsn: str, conn: psycopg.Connection[Any]) -> None:
    terminal = Terminal("status", "--watch", "--interval", "0.2", "--dsn", dsn)
    terminal.read_until(lambda seen: "no jobs" in seen and "0 live workers" in seen, "an empty table")
    enqueue(conn, "send", "mail", 3)
    terminal.read_until(lambda _: bool(re.search(r"│ mail +│ available +│ +3 │", terminal.text)), "3 mail jobs")
    assert "\x1b[" in terminal.seen, "drawn with a terminal's escape sequences"
    terminal.interrupt()
    assert terminal.exit_code() == 0
    assert "Traceback" not in terminal.seen


def test_status_watch_off_a_terminal_prints_a_snapshot_per_interval(dsn: str, conn: psycopg.Connection[Any]) -> None:
    enqueue(conn, "send", "mail", 2)
    process = subprocess.Popen(
        [TREADLE, "status", "--watch", "--json", "--interval", "0.1", "--dsn", dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    snapshots = [json.loads(process.stdout.readline()) for _ in range(3)]
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=PATIENCE)
    assert process.returncode == 0 and "Traceback" not in err
    assert all(s["jobs"][0]["queue"] == "mail" and s["jobs"][0]["jobs"] == 2 for s in snapshots)
    assert snapshots[0]["at"] < snapshots[2]["at"]


def test_queues_list(dsn: str, mixed: None) -> None:
    lines = expect(treadle("queues", "list", "--dsn", dsn), 0).out.splitlines()
    headers = ["QUEUE", "PAUSED", "AVAILABLE", "RETRYABLE", "RUNNING", "DISCARDED", "OLDEST", "WAITING", "LIMITS"]
    assert lines[0].split() == headers
    assert lines[1].split()[:6] == ["mail", "-", "12", "0", "0", "2"]
    assert lines[2].split() == ["reports-weekly", "-", "0", "0", "0", "0", "-", "-"]
    queues = expect(treadle("queues", "list", "--json", "--dsn", dsn), 0).json()
    assert [(q["queue"], q["available"], q["discarded"], q["cancelled"]) for q in queues] == [
        ("mail", 12, 2, 0),
        ("reports-weekly", 0, 0, 1),
    ]


def test_empty_listings(dsn: str) -> None:
    assert expect(treadle("status", "--dsn", dsn), 0).out.splitlines()[:-1] == ["no jobs"]
    assert (
        expect(treadle("queues", "list", "--dsn", dsn), 0).out
        == "no queues: no job has been enqueued and no queue has settings\n"
    )
    assert expect(treadle("schedules", "list", "--dsn", dsn), 0).out == "no schedules\n"
    assert expect(treadle("schedules", "list", "--json", "--dsn", dsn), 0).json() == []


def test_schedules_list_gives_the_next_run_on_the_zones_clock(dsn: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT set_config('treadle.now', '2026-06-01 12:00:00+00', false)")
    conn.execute("SELECT treadle.schedule('nightly', '0 3 * * *', 'report', tz => 'Europe/Paris', queue => 'ops')")
    conn.execute("SELECT treadle.schedule('hourly', '15 * * * *', 'tick', tz => 'America/New_York')")
    lines = expect(treadle("schedules", "list", "--dsn", dsn), 0).out.splitlines()
    assert lines[0].split()[:6] == ["NAME", "CRON", "TIME", "ZONE", "JOB", "QUEUE"]
    assert "2026-06-02 03:00" in lines[2] and lines[2].split()[:2] == ["nightly", "0"]
    assert "2026-06-01 08:15" in lines[1] and lines[1].startswith("hourly")
    schedules = {s["name"]: s for s in expect(treadle("schedules", "list", "--json", "--dsn", dsn), 0).json()}
    assert schedules["nightly"]["next_run_at"] == "2026-06-02T01:00:00+00:00"  # 03:00 in Paris, summer time
    assert schedules["nightly"]["next_run_local"] == "2026-06-02T03:00:00"
    assert (schedules["nightly"]["queue"], schedules["nightly"]["job_state"]) == ("ops", "available")


def test_prune_walks_to_the_cutoff_and_reports(dsn: str, conn: psycopg.Connection[Any]) -> None:
    done = enqueue(conn, "old", "q", 6)
    claimed = conn.execute("SELECT id, lease_token FROM treadle.claim('w', queues => array['q'], batch => 6)")
    for job, token in claimed.fetchall():
        conn.execute("SELECT treadle.complete(%s, %s)", [job, token])
    # job i finished i days ago
    conn.execute("UPDATE treadle.jobs SET finished_at = now() - make_interval(days => id::int - %s + 1)", [done[0]])
    waiting = enqueue(conn, "new", "q")

    dry = expect(treadle("prune", "--older-than", "3d12h", "--dry-run", "--dsn", dsn), 0)
    assert dry.out.startswith("3 jobs finished before ")
    assert conn.execute("SELECT count(*) FROM treadle.jobs").fetchone() == (7,)

    pruned = expect(treadle("prune", "--older-than", "3d12h", "--batch-size", "1", "--dsn", dsn), 0)
    assert pruned.out.startswith("deleted 3 jobs that finished before ")
    assert [line.split(" jobs, finished before ")[0] for line in pruned.err.splitlines()] == [
        "pruning: 1/3",
        "pruning: 2/3",
        "pruning: 3/3",
    ]
    left = conn.execute("SELECT id FROM treadle.jobs ORDER BY id").fetchall()
    assert [row[0] for row in left] == [*done[:3], *waiting]
    assert expect(treadle("prune", "--older-than", "0s", "--json", "--dsn", dsn), 0).json()["deleted"] == 3
    assert expect(treadle("prune", "--dsn", dsn), 0).out.startswith("deleted 0 jobs"), "the default: 7 days"


def test_prune_gets_past_more_jobs_finished_at_one_instant_than_a_batch(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    enqueue(conn, "many", "q", 7)
    claimed = conn.execute("SELECT id, lease_token FROM treadle.claim('w', queues => array['q'], batch => 7)")
    ids, tokens = zip(*claimed.fetchall(), strict=True)
    conn.execute("SELECT treadle.complete_many(%s, %s, array_fill(null::jsonb, array[7]))", [list(ids), list(tokens)])
    conn.execute("UPDATE treadle.jobs SET finished_at = '2020-01-01 00:00+00' WHERE id <> %s", [ids[-1]])
    conn.execute("UPDATE treadle.jobs SET finished_at = '2020-01-02 00:00+00' WHERE id = %s", [ids[-1]])
    done = expect(treadle("prune", "--older-than", "1d", "--batch-size", "2", "--json", "--dsn", dsn), 0)
    assert done.json()["deleted"] == 7
    assert conn.execute("SELECT count(*) FROM treadle.jobs").fetchone() == (0,)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--older-than", "a week"], "'a week' is not a duration"),
        (["--older-than=-1d"], "'-1d' is not a duration"),
        (["--older-than", "6000w"], "older_than must be zero or more and at most 100 years"),
        (["--batch-size", "0"], "must be between 1 and 1000000"),
    ],
)
def test_prune_refuses_a_bad_duration(dsn: str, conn: psycopg.Connection[Any], args: list[str], message: str) -> None:
    (job,) = enqueue(conn, "x", "q")
    conn.execute("SELECT treadle.cancel(%s)", [job])
    conn.execute("UPDATE treadle.jobs SET finished_at = now() - interval '1000 days'")
    done = expect(treadle("prune", *args, "--dsn", dsn), 2, err=message)
    assert "CONTEXT" not in done.err
    assert conn.execute("SELECT count(*) FROM treadle.jobs").fetchone() == (1,)


def test_version_of_the_package_and_of_the_database(dsn: str, new_database: NewDatabase) -> None:
    assert expect(treadle("--version"), 0).out == f"treadle {__version__}\n"
    both = expect(treadle("--version", "--dsn", dsn), 0).out
    assert both == f"treadle {__version__}\ndatabase: treadle {EXTENSION_VERSION} (extension)\n"
    assert expect(treadle("--version", "--json", "--dsn", dsn), 0).json() == {
        "package": __version__,
        "database": EXTENSION_VERSION,
        "form": "extension",
    }
    bare = expect(treadle("--version", "--dsn", new_database(None)), 0).out
    assert bare.endswith("database: treadle is not installed (treadle install, or CREATE EXTENSION treadle)\n")
