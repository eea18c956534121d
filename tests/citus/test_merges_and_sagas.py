"""Four calls on a Citus cluster (make test-citus) that need a form Citus routes:
treadle.workflow_results (a read of a run by its id alone), enqueue's merges into a held
idempotency key (on_conflict 'replace', 'replace_args', 'append'), a running run
with compensations that fails (its compensations start, on the coordinator), and a child
run that ends (its parent moves from the coordinator, by id and queue, on any node)."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from tests.citus.conftest import CITUS_URL

Conn = psycopg.Connection[dict[str, Any]]


def claim(conn: Conn, queue: str) -> list[dict[str, Any]]:
    return conn.execute("SELECT * FROM treadle.claim('w', ARRAY[%s])", [queue]).fetchall()


def one(conn: Conn, sql: str, params: list[Any]) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return next(iter(row.values()))


def job(conn: Conn, queue: str, job_id: int) -> dict[str, Any]:
    row = conn.execute("SELECT * FROM treadle.jobs WHERE queue = %s AND id = %s", [queue, job_id]).fetchone()
    assert row is not None, f"no job {job_id} in {queue}"
    return row


def run_state(conn: Conn, queue: str, run_id: int) -> str:
    return str(one(conn, "SELECT state FROM treadle.workflow_runs WHERE queue = %s AND id = %s", [queue, run_id]))


def on_another_node(conn: Conn, queue: str) -> str:
    """A queue name whose runs' shard is on another node than those of queue."""

    def node(name: str) -> Any:
        return one(
            conn,
            """SELECT n.nodeport FROM pg_dist_placement AS p JOIN pg_dist_node AS n USING (groupid)
                WHERE p.shardid = get_shard_id_for_distribution_column('treadle.workflow_runs', %s::text)""",
            [name],
        )

    for i in range(100):
        if node(f"{queue}k{i}") != node(queue):
            return f"{queue}k{i}"
    raise AssertionError("every queue name tried is on the node of " + queue)


# -- workflow_results ------------------------------------------------------------------------


def test_workflow_results_reads_a_run_by_its_id(conn: Conn, queue: str) -> None:
    run_id = one(
        conn,
        "SELECT treadle.start_workflow('citus5_results', '{}', steps => ARRAY['one', 'two'], queue => %s)",
        [queue],
    )
    assert one(conn, "SELECT treadle.workflow_results(%s)", [run_id]) == {}
    (step,) = claim(conn, queue)
    conn.execute("SELECT treadle.complete(%s, %s, '{\"one\": 1}')", [step["id"], step["lease_token"]])
    assert one(conn, "SELECT treadle.workflow_results(%s)", [run_id]) == {"one": {"one": 1}}
    assert one(conn, "SELECT treadle.workflow_results(-1)", []) is None


# -- enqueue's merges ------------------------------------------------------------------------


def enqueue_keyed(conn: Conn, queue: str, key: str, args: dict[str, Any], mode: str, run_at: datetime) -> int:
    return int(
        one(
            conn,
            "SELECT treadle.enqueue('merged', %s, queue => %s, idempotency_key => %s, on_conflict => %s, run_at => %s)",
            [Jsonb(args), queue, key, mode, run_at],
        )
    )


@pytest.mark.parametrize(
    ("mode", "args", "later_run_at"),
    [
        ("replace", {"items": [2], "last": "b"}, True),
        ("replace_args", {"items": [2], "last": "b"}, False),
        ("append", {"items": [1, 2], "first": "a", "last": "b"}, False),
    ],
)
def test_a_merge_into_a_waiting_holder_changes_it_in_place(
    conn: Conn, queue: str, mode: str, args: dict[str, Any], later_run_at: bool
) -> None:
    first_at = datetime.now(timezone.utc) + timedelta(hours=1)
    second_at = first_at + timedelta(hours=1)
    held = enqueue_keyed(conn, queue, "k", {"items": [1], "first": "a"}, mode, first_at)
    again = enqueue_keyed(conn, queue, "k", {"items": [2], "last": "b"}, mode, second_at)
    assert again == held
    row = job(conn, queue, held)
    assert row["args"] == args
    assert row["run_at"] == (second_at if later_run_at else first_at)
    count = one(conn, "SELECT count(*) FROM treadle.jobs WHERE queue = %s AND idempotency_key = 'k'", [queue])
    assert count == 1


@pytest.mark.parametrize("mode", ["replace", "replace_args", "append"])
def test_a_running_holder_gives_its_key_up_to_a_new_job(conn: Conn, queue: str, mode: str) -> None:
    now = datetime.now(timezone.utc) - timedelta(seconds=1)
    held = enqueue_keyed(conn, queue, "k", {"items": [1]}, mode, now)
    (running,) = claim(conn, queue)
    assert running["id"] == held
    new = enqueue_keyed(conn, queue, "k", {"items": [2]}, mode, now)
    assert new != held
    assert job(conn, queue, held)["args"] == {"items": [1]}
    assert job(conn, queue, held)["key_scope"] == "released"
    assert job(conn, queue, new)["args"] == {"items": [2]}


def test_concurrent_replaces_of_one_key_make_one_job(distributed: str, queue: str) -> None:
    start = threading.Barrier(8)
    ids: list[int] = []
    errors: list[BaseException] = []

    def producer(n: int) -> None:
        try:
            with psycopg.connect(CITUS_URL, autocommit=True, row_factory=dict_row) as c:
                start.wait()
                for i in range(10):
                    ids.append(
                        enqueue_keyed(c, queue, "storm", {"n": n, "i": i}, "replace", datetime.now(timezone.utc))
                    )
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with psycopg.connect(CITUS_URL, autocommit=True, row_factory=dict_row) as c:
        rows = c.execute("SELECT id FROM treadle.jobs WHERE queue = %s", [queue]).fetchall()
    assert len(rows) == 1
    assert set(ids) == {rows[0]["id"]}


def test_enqueue_many_merges_into_a_held_key(conn: Conn, queue: str) -> None:
    jobs = [
        {"name": "m", "queue": queue, "args": {"items": [i]}, "idempotency_key": "k", "on_conflict": "append"}
        for i in range(3)
    ]
    ids = [r["id"] for r in conn.execute("SELECT id FROM treadle.enqueue_many(%s) AS id", [Jsonb(jobs)]).fetchall()]
    assert len(set(ids)) == 1
    assert job(conn, queue, ids[0])["args"] == {"items": [0, 1, 2]}


# -- a failing run with compensations ----------------------------------------------------------


def test_a_failing_run_with_compensations_compensates(conn: Conn, queue: str) -> None:
    run_id = one(
        conn,
        """SELECT treadle.start_workflow('citus5_saga', '{}', steps => ARRAY['debit', 'credit', 'notify'],
                                         queue => %s, max_attempts => 1,
                                         compensations => '{"debit": "refund"}')""",
        [queue],
    )
    (debit,) = claim(conn, queue)
    conn.execute("SELECT treadle.complete(%s, %s, '{\"id\": 1}')", [debit["id"], debit["lease_token"]])
    (credit,) = claim(conn, queue)
    state = one(
        conn, "SELECT treadle.fail(%s, %s, 'declined', queue => %s)", [credit["id"], credit["lease_token"], queue]
    )
    assert state == "discarded"
    assert run_state(conn, queue, run_id) == "compensating"
    (refund,) = claim(conn, queue)
    assert refund["name"] == "workflow:citus5_saga/refund"
    assert refund["args"] == {"compensates": "debit", "result": {"id": 1}}
    conn.execute("SELECT treadle.complete(%s, %s, '{}', %s)", [refund["id"], refund["lease_token"], queue])
    assert run_state(conn, queue, run_id) == "compensated"
    assert claim(conn, queue) == []


def test_a_graph_run_whose_step_fails_compensates(conn: Conn, queue: str) -> None:
    run_id = one(
        conn,
        """SELECT treadle.start_workflow('citus5_graph_saga', '{}', steps => ARRAY['a', 'b', 'c'], queue => %s,
                                         max_attempts => 1, after => '{"b": ["a"], "c": ["a"]}',
                                         compensations => '{"a": "undo_a"}')""",
        [queue],
    )
    (a,) = claim(conn, queue)
    conn.execute("SELECT treadle.complete(%s, %s, '{}', %s)", [a["id"], a["lease_token"], queue])
    b, c = sorted(claim(conn, queue) + claim(conn, queue), key=lambda r: r["step"])
    conn.execute("SELECT treadle.fail(%s, %s, 'no', queue => %s)", [b["id"], b["lease_token"], queue])
    # c still runs: the compensation waits for it
    assert run_state(conn, queue, run_id) == "compensating"
    assert claim(conn, queue) == []
    conn.execute("SELECT treadle.complete(%s, %s, '{}', %s)", [c["id"], c["lease_token"], queue])
    (undo,) = claim(conn, queue)
    assert undo["step"] == "undo_a"
    conn.execute("SELECT treadle.complete(%s, %s, '{}', %s)", [undo["id"], undo["lease_token"], queue])
    assert run_state(conn, queue, run_id) == "compensated"


def test_an_expired_step_on_its_last_attempt_compensates_its_run(conn: Conn, queue: str) -> None:
    run_id = one(
        conn,
        """SELECT treadle.start_workflow('citus5_rescue_saga', '{}', steps => ARRAY['debit', 'credit'],
                                         queue => %s, max_attempts => 1, compensations => '{"debit": "refund"}')""",
        [queue],
    )
    (debit,) = claim(conn, queue)
    conn.execute("SELECT treadle.complete(%s, %s, '{}', %s)", [debit["id"], debit["lease_token"], queue])
    (credit,) = claim(conn, queue)
    conn.execute(
        "UPDATE treadle.jobs SET lease_until = %s WHERE queue = %s AND id = %s",
        [datetime.now(timezone.utc) - timedelta(minutes=1), queue, credit["id"]],
    )
    conn.execute("SELECT treadle.rescue()")
    assert job(conn, queue, credit["id"])["state"] == "discarded"
    assert run_state(conn, queue, run_id) == "compensating"
    (refund,) = claim(conn, queue)
    assert refund["step"] == "refund"


def test_a_child_step_starts_its_child_run(conn: Conn, queue: str) -> None:
    """Its depth is read up the run tree a run at a time, by id."""
    conn.execute("SELECT treadle.define_workflow('citus5_charge', ARRAY['one'])")
    run_id = one(
        conn,
        """SELECT treadle.start_workflow('citus5_parent', '{}', steps => ARRAY['kid', 'after'], queue => %s,
                                         children => '{"kid": {"workflow": "citus5_charge"}}')""",
        [queue],
    )
    child = one(conn, "SELECT id FROM treadle.workflow_runs WHERE queue = %s AND parent_run_id = %s", [queue, run_id])
    assert run_state(conn, queue, child) == "running"
    (step,) = claim(conn, queue)
    assert step["name"] == "workflow:citus5_charge/one"
    assert step["workflow_run_id"] == child


def test_a_child_run_that_completes_moves_its_parent_on(conn: Conn, queue: str) -> None:
    conn.execute("SELECT treadle.define_workflow('citus5_charge', ARRAY['one'])")
    run_id = one(
        conn,
        """SELECT treadle.start_workflow('citus5_parent', '{}', steps => ARRAY['kid', 'after'], queue => %s,
                                         children => '{"kid": {"workflow": "citus5_charge"}}')""",
        [queue],
    )
    (step,) = claim(conn, queue)
    conn.execute("SELECT treadle.complete(%s, %s, '{\"paid\": 1}', %s)", [step["id"], step["lease_token"], queue])
    (after,) = claim(conn, queue)
    assert after["name"] == "workflow:citus5_parent/after"
    assert one(conn, "SELECT treadle.workflow_results(%s)", [run_id]) == {"kid": {"one": {"paid": 1}}}


def test_a_child_run_in_another_queue_moves_its_parent(conn: Conn, queue: str) -> None:
    kids = on_another_node(conn, queue)
    conn.execute("SELECT treadle.define_workflow('citus6_charge', ARRAY['one'])")
    run_id = one(
        conn,
        """SELECT treadle.start_workflow('citus6_parent', '{}', steps => ARRAY['kid', 'after'], queue => %s,
                                         children => jsonb_build_object('kid', jsonb_build_object(
                                             'workflow', 'citus6_charge', 'queue', %s::text)))""",
        [queue, kids],
    )
    assert claim(conn, queue) == []
    (step,) = claim(conn, kids)
    conn.execute("SELECT treadle.complete(%s, %s, '{\"paid\": 2}', %s)", [step["id"], step["lease_token"], kids])
    (after,) = claim(conn, queue)
    assert after["name"] == "workflow:citus6_parent/after"
    assert one(conn, "SELECT treadle.workflow_results(%s)", [run_id]) == {"kid": {"one": {"paid": 2}}}
    conn.execute("SELECT treadle.complete(%s, %s, '{}', %s)", [after["id"], after["lease_token"], queue])
    assert run_state(conn, queue, run_id) == "completed"


def test_a_child_run_that_fails_fails_its_parent(conn: Conn, queue: str) -> None:
    kids = on_another_node(conn, queue)
    conn.execute("SELECT treadle.define_workflow('citus6_charge', ARRAY['one'])")
    run_id = one(
        conn,
        """SELECT treadle.start_workflow('citus6_parent', '{}', steps => ARRAY['kid', 'after'], queue => %s,
                                         max_attempts => 1,
                                         children => jsonb_build_object('kid', jsonb_build_object(
                                             'workflow', 'citus6_charge', 'queue', %s::text)))""",
        [queue, kids],
    )
    (step,) = claim(conn, kids)
    conn.execute(
        "SELECT treadle.fail(%s, %s, 'no', retryable => false, queue => %s)", [step["id"], step["lease_token"], kids]
    )
    child_state = one(
        conn, "SELECT state FROM treadle.workflow_runs WHERE queue = %s AND parent_run_id = %s", [kids, run_id]
    )
    assert child_state == "failed"
    assert run_state(conn, queue, run_id) == "failed"
    assert claim(conn, queue) == []


def test_a_chain_of_ten_child_runs_ends_up_to_its_root_across_nodes(conn: Conn, queue: str) -> None:
    """Each level of the chain in a queue of its own, on the other node than its parent's:
    the leaf's end moves every run above it, each named by id and queue."""
    queues = [queue]
    while len(queues) < 10:
        queues.append(on_another_node(conn, queues[-1]))
    conn.execute("SELECT treadle.define_workflow('citus7_level10', ARRAY['leaf'])")
    for n in range(1, 10):
        conn.execute(
            """SELECT treadle.define_workflow(%s, ARRAY['kid'], children => jsonb_build_object(
                   'kid', jsonb_build_object('workflow', %s::text, 'queue', %s::text)))""",
            [f"citus7_level{n}", f"citus7_level{n + 1}", queues[n]],
        )

    def chain(root: int) -> list[tuple[str, int, str]]:
        runs = [(queue, root)]
        for q in queues[1:]:
            child = one(
                conn,
                "SELECT id FROM treadle.workflow_runs WHERE queue = %s AND parent_run_id = %s",
                [q, runs[-1][1]],
            )
            runs.append((q, child))
        return [(q, r, run_state(conn, q, r)) for q, r in runs]

    root = one(conn, "SELECT treadle.start_workflow('citus7_level1', '{}', queue => %s)", [queue])
    assert [s for _, _, s in chain(root)] == ["running"] * 10
    (leaf,) = claim(conn, queues[-1])
    conn.execute("SELECT treadle.complete(%s, %s, '{\"v\": 7}', %s)", [leaf["id"], leaf["lease_token"], queues[-1]])
    assert [s for _, _, s in chain(root)] == ["completed"] * 10
    results = one(conn, "SELECT treadle.workflow_results(%s)", [root])
    for _ in range(9):
        results = results["kid"]
    assert results == {"leaf": {"v": 7}}

    root = one(conn, "SELECT treadle.start_workflow('citus7_level1', '{}', queue => %s, max_attempts => 1)", [queue])
    (leaf,) = claim(conn, queues[-1])
    conn.execute(
        "SELECT treadle.fail(%s, %s, 'no', retryable => false, queue => %s)",
        [leaf["id"], leaf["lease_token"], queues[-1]],
    )
    assert [s for _, _, s in chain(root)] == ["failed"] * 10
    assert conn.execute("SELECT treadle.retry(%s, %s)", [leaf["id"], queues[-1]]).fetchone() == {"retry": True}
    assert [s for _, _, s in chain(root)] == ["running"] * 10
