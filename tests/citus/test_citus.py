"""treadle distributed on a real Citus cluster: a coordinator and two worker nodes.

Every call goes through the coordinator, as docs/citus.md says a deployment should.
What does not hold yet is marked xfail (strict) with the reason: once it holds, the
test passes, strict xfail fails the run, and the mark must go.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from tests.citus.conftest import CITUS_DIR, CITUS_URL, node_url
from tests.conftest import ROOT
from treadle import Worker

Conn = psycopg.Connection[dict[str, Any]]

DISTRIBUTED = ["treadle.workflow_runs", "treadle.jobs", "treadle.workflow_signals", "treadle.job_history"]
REFERENCE = [
    "treadle.queues", "treadle.workflows", "treadle.cron_schedules",
    "treadle.settings", "treadle.tenants", "treadle.history_slots",
]  # fmt: skip
LOCAL = ["treadle.workers", "treadle.done_waiters"]

# the errors Citus raises for what it does not support (never a lost connection)
CITUS_REFUSES = (psycopg.errors.FeatureNotSupported, psycopg.errors.InternalError_)


def not_yet(reason: str, *raises: type[BaseException]) -> pytest.MarkDecorator:
    """Strict xfail, for Citus's refusal (or the given errors) only: any other failure fails."""
    return pytest.mark.xfail(strict=True, raises=raises or CITUS_REFUSES, reason=reason)


def enqueue(conn: Conn, queue: str, name: str = "job", **options: Any) -> int:
    names = "".join(f", {k} => %({k})s" for k in options)
    row = conn.execute(
        f"SELECT treadle.enqueue(%(name)s, '{{}}'{names}, queue => %(queue)s) AS id",
        {"name": name, "queue": queue, **options},
    ).fetchone()
    assert row is not None
    return int(row["id"])


def job(conn: Conn, queue: str, job_id: int) -> dict[str, Any]:
    row = conn.execute("SELECT * FROM treadle.jobs WHERE queue = %s AND id = %s", [queue, job_id]).fetchone()
    assert row is not None, f"no job {job_id} in {queue}"
    return row


def hand_lease(conn: Conn, queue: str, job_id: int) -> uuid.UUID:
    """Make a job running as a claim would, by hand (owner's SQL): tests of the finishes
    that do not depend on treadle.claim."""
    token = uuid.uuid4()
    until = datetime.now(timezone.utc) + timedelta(seconds=30)
    conn.execute(
        """UPDATE treadle.jobs SET state = 'running', attempt = attempt + 1, lease_until = %s,
                  lease_token = %s, worker_id = 'w', started_at = %s
            WHERE queue = %s AND id = %s""",
        [until, token, datetime.now(timezone.utc), queue, job_id],
    )
    return token


def claim(conn: Conn, queue: str, batch: int = 1) -> list[dict[str, Any]]:
    return conn.execute("SELECT * FROM treadle.claim('w', ARRAY[%s], batch => %s)", [queue, batch]).fetchall()


# -- distribute ---------------------------------------------------------------------------


def test_distribute_spreads_the_queue_tables_copies_the_small_ones_and_keeps_the_local(
    conn: Conn, distributed: str
) -> None:
    assert distributed.startswith("treadle: distributed by queue in 32 shards"), distributed
    rows = {
        r["rel"]: r
        for r in conn.execute(
            """SELECT logicalrelid::regclass::text AS rel, partmethod::text AS method, repmodel::text AS model,
                      colocationid, pg_catalog.column_to_column_name(logicalrelid, partkey) AS column
                 FROM pg_catalog.pg_dist_partition
                WHERE logicalrelid::regclass::text LIKE 'treadle.%'"""
        )
    }
    for rel in DISTRIBUTED:
        assert (rows[rel]["method"], rows[rel]["column"]) == ("h", "queue"), rel
    assert len({rows[rel]["colocationid"] for rel in DISTRIBUTED}) == 1, "co-located"
    for rel in REFERENCE:
        assert (rows[rel]["method"], rows[rel]["model"]) == ("n", "t"), rel
    for rel in LOCAL:
        assert rel not in rows, f"{rel} stays local to the coordinator"
    # the history's partitions go with it, each co-located
    partitions = [r for name, r in rows.items() if re.fullmatch(r"treadle\.job_history_\d\d", name)]
    assert len(partitions) == 41
    assert {r["colocationid"] for r in partitions} == {rows["treadle.jobs"]["colocationid"]}


def test_a_second_distribute_changes_nothing_and_says_so(conn: Conn, distributed: str) -> None:
    before = conn.execute("SELECT count(*) AS n FROM pg_catalog.pg_dist_shard").fetchone()
    row = conn.execute("SELECT treadle.distribute() AS answer").fetchone()
    assert row is not None
    assert row["answer"] == "treadle: already distributed by queue in 32 shards; nothing changed"
    row = conn.execute("SELECT treadle.distribute(shard_count => 32) AS answer").fetchone()
    assert row is not None and "nothing changed" in row["answer"]
    assert conn.execute("SELECT count(*) AS n FROM pg_catalog.pg_dist_shard").fetchone() == before


@pytest.mark.parametrize(("shard_count", "sqlstate"), [(8, "22023"), (0, "22023"), (5000, "22023")])
def test_distribute_refuses_another_shard_count(conn: Conn, shard_count: int, sqlstate: str) -> None:
    with pytest.raises(psycopg.Error) as raised:
        conn.execute("SELECT treadle.distribute(shard_count => %s)", [shard_count])
    assert raised.value.sqlstate == sqlstate


def test_distribute_refuses_on_a_worker_node(distributed: str) -> None:
    with psycopg.connect(node_url("w1"), autocommit=True) as worker_node:
        with pytest.raises(psycopg.Error) as raised:
            worker_node.execute("SELECT treadle.distribute()")
    assert raised.value.sqlstate == "55000"
    assert "not it" in str(raised.value)


def test_queues_land_on_both_worker_nodes(conn: Conn) -> None:
    queues = [f"spread{i}" for i in range(8)]
    nodes = {
        r["nodeport"]
        for r in conn.execute(
            """SELECT n.nodeport FROM unnest(%s::text[]) AS q(q)
                 JOIN pg_catalog.pg_dist_placement AS p
                   ON p.shardid = pg_catalog.get_shard_id_for_distribution_column('treadle.jobs', q.q)
                 JOIN pg_catalog.pg_dist_node AS n ON n.groupid = p.groupid""",
            [queues],
        )
    }
    assert len(nodes) == 2, nodes


# -- ids and notifications ----------------------------------------------------------------


def test_ids_never_collide_across_queues_and_connections(conn: Conn) -> None:
    queues = [f"ids{uuid.uuid4().hex[:6]}{i}" for i in range(8)]
    got: list[int] = []
    lock = threading.Lock()

    def produce(n: int) -> None:
        with psycopg.connect(CITUS_URL, autocommit=True, row_factory=dict_row) as c:
            for i in range(40):
                job_id = enqueue(c, queues[(n + i) % 8])
                with lock:
                    got.append(job_id)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 160 and len(set(got)) == 160
    stored = conn.execute(
        "SELECT count(DISTINCT id) AS n FROM treadle.jobs WHERE queue = ANY (%s)", [queues]
    ).fetchone()
    assert stored == {"n": 160}


def test_notify_reaches_a_listener_on_the_coordinator(conn: Conn, queue: str) -> None:
    with psycopg.connect(CITUS_URL, autocommit=True) as listener:
        listener.execute("LISTEN treadle_jobs")
        enqueue(conn, queue)
        heard = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert heard == [queue]


# -- round trips: the finishes on a job leased by hand ------------------------------------


def test_complete_by_id_finishes_a_running_job(conn: Conn, queue: str) -> None:
    job_id = enqueue(conn, queue)
    token = hand_lease(conn, queue, job_id)
    row = conn.execute("SELECT treadle.complete(%s, %s, '{\"ok\": 1}') AS state", [job_id, token]).fetchone()
    assert row == {"state": "completed"}
    assert job(conn, queue, job_id)["result"] == {"ok": 1}
    # a stale token matches nothing
    row = conn.execute("SELECT treadle.complete(%s, %s) AS state", [job_id, uuid.uuid4()]).fetchone()
    assert row == {"state": None}


def test_fail_makes_a_running_job_retryable_then_discarded(conn: Conn, queue: str) -> None:
    job_id = enqueue(conn, queue, max_attempts=2)
    token = hand_lease(conn, queue, job_id)
    row = conn.execute("SELECT treadle.fail(%s, %s, 'boom') AS state", [job_id, token]).fetchone()
    assert row == {"state": "retryable"}
    token = hand_lease(conn, queue, job_id)
    row = conn.execute(
        "SELECT treadle.fail(%s, %s, 'boom again', retry_in => '1 s') AS state", [job_id, token]
    ).fetchone()
    assert row == {"state": "discarded"}
    assert [e["error"] for e in job(conn, queue, job_id)["errors"]] == ["boom", "boom again"]


def test_heartbeat_extends_the_lease(conn: Conn, queue: str) -> None:
    job_id = enqueue(conn, queue)
    token = hand_lease(conn, queue, job_id)
    before = job(conn, queue, job_id)["lease_until"]
    row = conn.execute("SELECT treadle.heartbeat(%s, %s, lease => '10 minutes') AS answer", [job_id, token]).fetchone()
    assert row is not None and row["answer"] != "lost"
    assert job(conn, queue, job_id)["lease_until"] > before + timedelta(minutes=5)


def test_snooze_puts_a_running_job_back_for_later(conn: Conn, queue: str) -> None:
    job_id = enqueue(conn, queue)
    token = hand_lease(conn, queue, job_id)
    conn.execute("SELECT treadle.snooze(%s, %s, '1 hour')", [job_id, token])
    row = job(conn, queue, job_id)
    assert row["state"] == "available" and row["run_at"] > datetime.now(timezone.utc) + timedelta(minutes=50)


def test_cancel_and_retry(conn: Conn, queue: str) -> None:
    job_id = enqueue(conn, queue)
    assert conn.execute("SELECT treadle.cancel(%s) AS done", [job_id]).fetchone() == {"done": True}
    assert job(conn, queue, job_id)["state"] == "cancelled"
    assert conn.execute("SELECT treadle.retry(%s) AS done", [job_id]).fetchone() == {"done": True}
    assert job(conn, queue, job_id)["state"] == "available"


def test_rescue_takes_back_an_expired_lease(conn: Conn, queue: str) -> None:
    job_id = enqueue(conn, queue)
    hand_lease(conn, queue, job_id)
    conn.execute(
        "UPDATE treadle.jobs SET lease_until = %s WHERE queue = %s AND id = %s",
        [datetime.now(timezone.utc) - timedelta(minutes=1), queue, job_id],
    )
    conn.execute("SELECT treadle.rescue()")
    assert job(conn, queue, job_id)["state"] == "retryable"


def test_rescue_moves_each_queue_and_skips_a_held_job(conn: Conn, queue: str) -> None:
    other = f"{queue}b"
    expired = [enqueue(conn, q) for q in (queue, queue, other)]
    overdue = enqueue(conn, other, timeout="1 second", max_attempts=1)
    held = enqueue(conn, queue)
    running = enqueue(conn, other)
    for q, job_id in [(queue, expired[0]), (queue, expired[1]), (other, expired[2]), (other, overdue),
                      (queue, held), (other, running)]:  # fmt: skip
        hand_lease(conn, q, job_id)
    past = datetime.now(timezone.utc) - timedelta(minutes=1)
    conn.execute("UPDATE treadle.jobs SET lease_until = %s WHERE queue = %s AND id = ANY (%s)",
                 [past, queue, [expired[0], expired[1], held]])  # fmt: skip
    conn.execute("UPDATE treadle.jobs SET lease_until = %s WHERE queue = %s AND id = %s", [past, other, expired[2]])
    conn.execute("UPDATE treadle.jobs SET started_at = %s WHERE queue = %s AND id = %s", [past, other, overdue])
    with psycopg.connect(CITUS_URL, row_factory=dict_row) as holder:
        holder.execute("SELECT 1 FROM treadle.jobs WHERE queue = %s AND id = %s FOR UPDATE", [queue, held])
        assert conn.execute("SELECT treadle.rescue() AS n").fetchone() == {"n": 4}
        holder.rollback()
    for q, job_id in [(queue, expired[0]), (queue, expired[1]), (other, expired[2])]:
        row = job(conn, q, job_id)
        assert (row["state"], row["lease_token"]) == ("retryable", None)
        assert row["last_error"] == "lease expired: worker w stopped heartbeating"
    row = job(conn, other, overdue)
    assert row["state"] == "discarded" and row["last_error"].startswith("timed out: attempt 1")
    assert job(conn, queue, held)["state"] == "running"  # another session held it: a later rescue takes it
    assert job(conn, other, running)["state"] == "running"
    assert conn.execute("SELECT treadle.rescue() AS n").fetchone() == {"n": 1}
    assert job(conn, queue, held)["state"] == "retryable"


# -- round trips through the claim ---------------------------------------------------------


def test_enqueue_claim_complete(conn: Conn, queue: str) -> None:
    job_id = enqueue(conn, queue)
    (claimed,) = claim(conn, queue)
    assert claimed["id"] == job_id
    conn.execute("SELECT treadle.complete(%s, %s)", [job_id, claimed["lease_token"]])
    assert job(conn, queue, job_id)["state"] == "completed"


def test_a_claim_without_a_token_gives_each_job_its_own(conn: Conn, queue: str) -> None:
    ids = {enqueue(conn, queue) for _ in range(3)}
    rows = claim(conn, queue, batch=3)
    assert {r["id"] for r in rows} == ids
    assert len({r["lease_token"] for r in rows}) == 3
    # the claim plans as Citus needs only while it runs
    assert conn.execute("SHOW plan_cache_mode").fetchone() == {"plan_cache_mode": "auto"}
    assert conn.execute("SHOW treadle.distributed").fetchone() == {"treadle.distributed": "on"}


def test_two_claimers_skip_each_others_rows(queue: str, conn: Conn) -> None:
    ids = {enqueue(conn, queue) for _ in range(6)}
    with psycopg.connect(CITUS_URL, row_factory=dict_row) as a, psycopg.connect(CITUS_URL, row_factory=dict_row) as b:
        got_a = {r["id"] for r in claim(a, queue, batch=3)}
        got_b = {r["id"] for r in claim(b, queue, batch=3)}
        a.commit()
        b.commit()
    assert got_a | got_b == ids and not got_a & got_b


def test_a_workflow_run_goes_end_to_end(conn: Conn, queue: str) -> None:
    row = conn.execute(
        "SELECT treadle.start_workflow('citus_flow', '{}', steps => ARRAY['one', 'two'], queue => %s) AS id", [queue]
    ).fetchone()
    assert row is not None
    run_id = row["id"]
    for _ in range(2):
        (step,) = claim(conn, queue)
        conn.execute("SELECT treadle.complete(%s, %s, '{\"done\": true}')", [step["id"], step["lease_token"]])
    run = conn.execute(
        "SELECT state FROM treadle.workflow_runs WHERE queue = %s AND id = %s", [queue, run_id]
    ).fetchone()
    assert run == {"state": "completed"}


def test_a_rescued_step_and_a_step_in_another_queue_move_their_run_on(conn: Conn, queue: str) -> None:
    """Each statement that moves a run names its queue (a step in another queue names it
    in run_queue): one shard each, where Citus refuses a SELECT FOR UPDATE over all."""
    other = f"{queue}x"
    row = conn.execute(
        """SELECT treadle.start_workflow(
                      'citus_rq', '{}', steps => ARRAY['one', 'two', 'three'], queue => %s,
                      step_options => jsonb_build_object('two', jsonb_build_object('queue', %s::text))) AS id""",
        [queue, other],
    ).fetchone()
    assert row is not None
    run_id = row["id"]
    (step,) = claim(conn, queue)
    conn.execute(
        "UPDATE treadle.jobs SET lease_until = %s WHERE queue = %s AND id = %s",
        [datetime.now(timezone.utc) - timedelta(minutes=1), queue, step["id"]],
    )
    conn.execute("SELECT treadle.rescue()")
    assert job(conn, queue, step["id"])["state"] == "retryable"
    conn.execute("UPDATE treadle.jobs SET run_at = now() WHERE queue = %s AND id = %s", [queue, step["id"]])
    (again,) = claim(conn, queue)
    assert again["id"] == step["id"]
    conn.execute("SELECT treadle.complete(%s, %s, '{}')", [again["id"], again["lease_token"]])
    (two,) = claim(conn, other)
    assert job(conn, other, two["id"])["run_queue"] == queue
    conn.execute("SELECT treadle.complete(%s, %s, '{}')", [two["id"], two["lease_token"]])
    (three,) = claim(conn, queue)
    assert three["name"] == "workflow:citus_rq/three"
    conn.execute("SELECT treadle.complete(%s, %s, '{}')", [three["id"], three["lease_token"]])
    run = conn.execute(
        "SELECT state, results ? 'two' AS two FROM treadle.workflow_runs WHERE queue = %s AND id = %s", [queue, run_id]
    ).fetchone()
    assert run == {"state": "completed", "two": True}


def test_a_step_rescued_on_its_last_attempt_fails_its_run(conn: Conn, queue: str) -> None:
    """Rescue discards the step, and the run is locked (SELECT FOR UPDATE) by its queue and id."""
    row = conn.execute(
        "SELECT treadle.start_workflow('citus_last', '{}', steps => ARRAY['one', 'two'], queue => %s,"
        " max_attempts => 1) AS id",
        [queue],
    ).fetchone()
    assert row is not None
    (step,) = claim(conn, queue)
    conn.execute(
        "UPDATE treadle.jobs SET lease_until = %s WHERE queue = %s AND id = %s",
        [datetime.now(timezone.utc) - timedelta(minutes=1), queue, step["id"]],
    )
    conn.execute("SELECT treadle.rescue()")
    assert job(conn, queue, step["id"])["state"] == "discarded"
    run = conn.execute(
        "SELECT state FROM treadle.workflow_runs WHERE queue = %s AND id = %s", [queue, row["id"]]
    ).fetchone()
    assert run == {"state": "failed"}


def test_cancel_run_with_compensate_starts_the_compensations(conn: Conn, queue: str) -> None:
    row = conn.execute(
        """SELECT treadle.start_workflow('citus_saga', '{}', steps => ARRAY['debit', 'credit'], queue => %s,
                                         compensations => '{"debit": "refund"}') AS id""",
        [queue],
    ).fetchone()
    assert row is not None
    run_id = row["id"]
    (debit,) = claim(conn, queue)
    conn.execute("SELECT treadle.complete(%s, %s, '{\"id\": 1}')", [debit["id"], debit["lease_token"]])
    state = conn.execute("SELECT treadle.cancel_run(%s, compensate => true) AS s", [run_id]).fetchone()
    assert state == {"s": "compensating"}
    (refund,) = claim(conn, queue)
    assert refund["name"] == "workflow:citus_saga/refund"
    conn.execute("SELECT treadle.complete(%s, %s, '{}')", [refund["id"], refund["lease_token"]])
    run = conn.execute(
        "SELECT state FROM treadle.workflow_runs WHERE queue = %s AND id = %s", [queue, run_id]
    ).fetchone()
    assert run == {"state": "compensated"}


def test_rescue_ends_a_sleep_that_is_due(conn: Conn, queue: str) -> None:
    conn.execute("""SELECT treadle.define_workflow('citus_nap', ARRAY['one', 'nap', 'two'],
                                                   sleeps => '{"nap": "1 second"}')""")
    row = conn.execute("SELECT treadle.start_workflow('citus_nap', '{}', queue => %s) AS id", [queue]).fetchone()
    assert row is not None
    (step,) = claim(conn, queue)
    conn.execute("SELECT treadle.complete(%s, %s, '{}')", [step["id"], step["lease_token"]])
    assert claim(conn, queue) == []  # asleep
    time.sleep(1.2)
    conn.execute("SELECT treadle.rescue()")
    (step,) = claim(conn, queue)
    assert step["name"] == "workflow:citus_nap/two"


# -- flow control ------------------------------------------------------------------------


def test_backpressure_refuses_past_max_depth(conn: Conn, queue: str) -> None:
    conn.execute("SELECT treadle.set_queue(%s, max_depth => 2)", [queue])
    enqueue(conn, queue)
    enqueue(conn, queue)
    with pytest.raises(psycopg.Error) as raised:
        enqueue(conn, queue)
    assert raised.value.sqlstate == "TQ001"
    assert conn.execute("SELECT count(*) AS n FROM treadle.jobs WHERE queue = %s", [queue]).fetchone() == {"n": 2}


def test_a_paused_queue_gives_nothing_until_resumed(conn: Conn, queue: str) -> None:
    job_id = enqueue(conn, queue)
    conn.execute("SELECT treadle.pause(%s)", [queue])
    assert claim(conn, queue) == []
    conn.execute("SELECT treadle.resume(%s)", [queue])
    assert [r["id"] for r in claim(conn, queue)] == [job_id]


def test_a_concurrency_limit_holds_across_claimers(conn: Conn, queue: str) -> None:
    for _ in range(4):
        enqueue(conn, queue)
    conn.execute("SELECT treadle.set_queue(%s, concurrency => 2)", [queue])
    assert len(claim(conn, queue, batch=4)) == 2
    with psycopg.connect(CITUS_URL, autocommit=True, row_factory=dict_row) as other:
        assert claim(other, queue, batch=4) == []


# -- the Python worker -------------------------------------------------------------------


def test_a_python_worker_drains_eight_queues(conn: Conn) -> None:
    queues = [f"drain{uuid.uuid4().hex[:6]}{i}" for i in range(8)]
    ids = [enqueue(conn, queues[i % 8], name="citus_echo") for i in range(80)]
    ran: list[int] = []
    lock = threading.Lock()
    worker = Worker(CITUS_URL, queues=queues, concurrency=4, poll_interval=0.2, stop_timeout=5.0)

    @worker.register
    def citus_echo(args: Any, ctx: Any) -> None:
        with lock:
            ran.append(ctx.job_id)

    worker.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) AS n FROM treadle.jobs WHERE queue = ANY (%s) AND state = 'completed'", [queues]
            ).fetchone()
            if row == {"n": 80}:
                break
            time.sleep(0.2)
    finally:
        worker.stop()
    assert sorted(ran) == sorted(ids), "each job ran once"


# -- a worker node stopped and started again ----------------------------------------------


def node_of(conn: Conn, queue: str) -> str:
    """The worker node (w1, w2) that holds a queue's shard."""
    row = conn.execute(
        """SELECT n.nodeport FROM pg_catalog.pg_dist_placement AS p
             JOIN pg_catalog.pg_dist_node AS n ON n.groupid = p.groupid
            WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column('treadle.jobs', %s::text)""",
        [queue],
    ).fetchone()
    assert row is not None
    ports = {node: (Path(CITUS_DIR) / node / "port").read_text().strip() for node in ("w1", "w2")}
    return next(node for node, port in ports.items() if port == str(row["nodeport"]))


def cluster(*args: str) -> None:
    subprocess.run([str(ROOT / "scripts" / "citus-cluster"), args[0], CITUS_DIR, *args[1:]], check=True, timeout=120)


@pytest.mark.subprocess
def test_queues_on_the_other_node_keep_flowing_while_a_worker_node_is_down(conn: Conn) -> None:
    queues = [f"fault{uuid.uuid4().hex[:6]}{i}" for i in range(16)]
    by_node: dict[str, str] = {}
    for q in queues:
        by_node.setdefault(node_of(conn, q), q)
    assert set(by_node) == {"w1", "w2"}
    up, down = by_node["w1"], by_node["w2"]
    before = {q: enqueue(conn, q) for q in (up, down)}
    cluster("stop-node", "w2")
    try:
        # the queue on the node that runs: enqueue, and a finish naming the queue
        job_id = enqueue(conn, up)
        token = hand_lease(conn, up, job_id)
        row = conn.execute("SELECT treadle.fail(%s, %s, 'e', queue => %s) AS state", [job_id, token, up]).fetchone()
        assert row == {"state": "retryable"}
        # the queue on the stopped node: refused with a connection error, nothing written
        with pytest.raises(psycopg.OperationalError):
            enqueue(conn, down)
    finally:
        cluster("start-node", "w2")
    with psycopg.connect(CITUS_URL, autocommit=True, row_factory=dict_row) as again:
        assert job(again, down, before[down])["state"] == "available", "the stopped node's job is there as it was"
        assert again.execute("SELECT count(*) AS n FROM treadle.jobs WHERE queue = %s", [down]).fetchone() == {"n": 1}
        assert enqueue(again, down) > before[down]


# -- bench/citus.py -------------------------------------------------------------------------


@pytest.mark.subprocess
def test_the_citus_benchmark_runs_and_finds_the_loop_router_only(distributed: str) -> None:
    """bench/citus.py --smoke: the coordinator's own instance serves as the single server
    (a database of its own, where treadle is not distributed)."""
    single = CITUS_URL.rsplit("/", 1)[0] + "/postgres"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "citus.py"), "--smoke", "--runs", "1", "--citus", CITUS_URL],
        env={**os.environ, "DATABASE_URL": single},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "### Citus: the worker's claim and finish" in done.stdout
    assert "Statements of the loop run on more than one shard: 0 in 20 cycles." in done.stdout
