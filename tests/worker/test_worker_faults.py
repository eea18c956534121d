"""Fault tests: terminated connections, a paused worker whose lease was taken over, a server restart."""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.worker.worker_support import PATIENCE, effects, enqueue, job, until_state, wait_for
from treadle import JobContext, Worker, WorkerEvent

MakeWorker = Callable[..., Worker]
PGCLUSTER = Path(__file__).resolve().parents[2] / "scripts" / "pgcluster"


def backends(conn: psycopg.Connection[Any], worker_id: str) -> dict[int, str]:
    """The worker's backends (pid -> last query), found by their application_name."""
    rows = conn.execute(
        "SELECT pid, query FROM pg_stat_activity WHERE application_name = %s", [f"treadle-worker:{worker_id}"]
    ).fetchall()
    return {pid: query for pid, query in rows}


def listener_pid(conn: psycopg.Connection[Any], worker_id: str) -> int | None:
    return next((pid for pid, query in backends(conn, worker_id).items() if query == "LISTEN treadle_jobs"), None)


def until_lease_expired(conn: psycopg.Connection[Any], job_id: int) -> None:
    wait_for(
        lambda: (
            conn.execute("SELECT lease_until < now() FROM treadle.jobs WHERE id = %s", [job_id]).fetchone() == (True,)
        ),
        f"job {job_id}'s lease to expire",
    )


def test_terminated_connections_are_replaced_and_the_job_finishes(
    conn: psycopg.Connection[Any], make_worker: MakeWorker, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[WorkerEvent] = []
    worker = make_worker(worker_id="terminated", on_event=events.append)
    started = threading.Event()
    go_on = threading.Event()

    @worker.register
    def hold(args: Any, ctx: JobContext) -> int:
        started.set()
        go_on.wait(PATIENCE)
        return ctx.attempt

    first = enqueue(conn, "hold")
    worker.start()
    assert started.wait(PATIENCE)
    old_listener = wait_for(lambda: listener_pid(conn, "terminated"), "the listener")
    killed = conn.execute(
        "SELECT count(*) FROM pg_stat_activity, pg_terminate_backend(pid) "
        "WHERE application_name = 'treadle-worker:terminated' AND datname = current_database()"
    ).fetchone()
    assert killed is not None and killed[0] >= 2, "the pool's connections and the listener's"
    with caplog.at_level(logging.WARNING, logger="treadle.worker"):
        go_on.set()
        row = until_state(conn, first, "completed")
    assert (row["result"], row["attempt"], row["errors"]) == (1, 1, []), "finished under its first claim"
    new_listener = wait_for(lambda: listener_pid(conn, "terminated"), "the listener to listen again")
    assert new_listener != old_listener
    second = enqueue(conn, "hold")
    assert until_state(conn, second, "completed")["result"] == 1
    assert "lease_lost" not in [event.kind for event in events]
    assert "AdminShutdown: terminating connection due to administrator command" in caplog.text


def test_a_paused_worker_resumed_after_a_takeover_aborts_its_handler(
    effects_conn: psycopg.Connection[Any], spawn: Any
) -> None:
    conn = effects_conn
    job_id = enqueue(conn, "record", {"seconds": {"zombie": 3600}})
    zombie = spawn("zombie")
    wait_for(lambda: effects(conn, "ran", job_id=job_id), "the zombie's handler to start")
    zombie.signal(signal.SIGSTOP)
    wait_for(zombie.stopped, "the zombie to stop")
    until_lease_expired(conn, job_id)

    spawn("rescuer")
    row = until_state(conn, job_id, "completed")
    assert row["result"] == {"by": "rescuer", "attempt": 2}
    zombie.signal(signal.SIGCONT)
    # its next heartbeat is refused ('lost'): the handler sees ctx.cancelled and stops
    wait_for(lambda: effects(conn, "aborted", worker="zombie"), "the zombie's handler to abort")
    wait_for(lambda: effects(conn, "lease_lost", worker="zombie"), "the zombie to report its lost lease")
    after = job(conn, job_id)
    assert (after["state"], after["result"], after["attempt"], len(after["errors"])) == (
        "completed",
        {"by": "rescuer", "attempt": 2},
        2,
        1,
    ), "nothing from the zombie was written"
    zombie.signal(signal.SIGTERM)
    assert zombie.wait_exit() == 0, zombie.log()


def test_a_late_completion_from_a_paused_worker_is_refused(effects_conn: psycopg.Connection[Any], spawn: Any) -> None:
    conn = effects_conn
    job_id = enqueue(conn, "record")
    zombie = spawn("zombie", "stop_before_complete")  # stops itself after the handler returned
    wait_for(zombie.stopped, "the zombie to stop before writing its completion")
    until_lease_expired(conn, job_id)

    spawn("rescuer")
    assert until_state(conn, job_id, "completed")["result"] == {"by": "rescuer", "attempt": 2}
    zombie.signal(signal.SIGCONT)
    # complete_many answers null for the stale token: a lost lease, not a second completion
    wait_for(lambda: effects(conn, "lease_lost", worker="zombie"), "the zombie to report its lost lease")
    after = job(conn, job_id)
    assert (after["result"], after["attempt"]) == ({"by": "rescuer", "attempt": 2}, 2)
    assert [e["worker"] for e in effects(conn, "ran")] == ["zombie", "rescuer"]
    zombie.signal(signal.SIGTERM)
    assert zombie.wait_exit() == 0, zombie.log()


def pgcluster(*args: Any) -> str:
    done = subprocess.run([PGCLUSTER, *map(str, args)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"pgcluster {' '.join(map(str, args))} failed:\n{done.stderr}"
    return done.stdout.strip()


def start_cluster(folder: Path) -> str:
    """A new cluster's URL. The free port pgcluster picks can be taken by another process
    before the server binds it (other suites share this machine), so it tries thrice."""
    for attempt in range(3):
        done = subprocess.run([PGCLUSTER, "start", str(folder)], capture_output=True, text=True, timeout=120)
        if done.returncode == 0:
            return done.stdout.strip()
        print(f"pgcluster start failed (attempt {attempt + 1}):\n{done.stderr}")
    raise AssertionError(f"pgcluster could not start a cluster in {folder}")


@pytest.mark.subprocess
def test_the_worker_outlives_a_server_restart(tmp_path: Path, make_worker: MakeWorker) -> None:
    cluster = tmp_path / "restarted"
    url = start_cluster(cluster)
    port = url.rsplit(":", 1)[1].split("/")[0]
    try:
        with psycopg.connect(url, autocommit=True) as setup:
            setup.execute("CREATE EXTENSION treadle")
        worker = make_worker(dsn=url)
        worker.register("ping", lambda args, ctx: "pong")
        worker.start()
        with psycopg.connect(url, autocommit=True) as conn:
            until_state(conn, enqueue(conn, "ping"), "completed")

        pgcluster("stop", cluster)
        pgcluster("start", cluster, port)

        with psycopg.connect(url, autocommit=True) as conn:
            assert until_state(conn, enqueue(conn, "ping"), "completed")["result"] == "pong"
        worker.stop()
    finally:
        subprocess.run([PGCLUSTER, "stop", cluster], check=False, timeout=120)


def test_without_listen_the_worker_still_polls(
    conn: psycopg.Connection[Any], make_worker: MakeWorker, caplog: pytest.LogCaptureFixture
) -> None:
    # a listen_dsn nothing answers on stands in for a LISTEN connection that never works
    worker = make_worker(poll_interval=0.2, listen_dsn="postgresql://nobody@127.0.0.1:1/nowhere")
    worker.register("ping", lambda args, ctx: "pong")
    with caplog.at_level(logging.INFO, logger="treadle.worker"):
        worker.start()
        job_id = enqueue(conn, "ping")
        assert until_state(conn, job_id, "completed")["result"] == "pong"
    assert "LISTEN unavailable (OperationalError: " in caplog.text


def test_the_worker_listens_before_start_returns(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    # start() returns once the worker claims: its LISTEN is in place by then, so a cancel of
    # the first job it runs is heard (its notifier thread connected after the first claims)
    for round_ in range(5):
        worker = make_worker(worker_id=f"listens-first-{round_}")
        worker.register("ping", lambda args, ctx: "pong")
        worker.start()
        assert listener_pid(conn, f"listens-first-{round_}") is not None, "no LISTEN when start() returned"
        worker.stop()
