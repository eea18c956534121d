"""Map steps under concurrent completion: a step that maps over 10,000 elements becomes
10,000 jobs, and however the element jobs are completed across connections, the map
step completes once, with the results in element order, and the step after it is
enqueued exactly once. Each completion counts down on the locked run row."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
from psycopg.types.json import Jsonb

from tests.sql.sqlcalls import Connect, WaitBlocked, value

ELEMENTS = 10_000
CONNECTIONS = 4


def start(conn: psycopg.Connection, queue: str) -> int:
    run_id: int = value(
        conn,
        "select treadle.start_workflow('thumbs', '{}', steps => array['load', 'resize', 'report'],"
        ' maps => \'{"resize": "load"}\', queue => %s)',
        (queue,),
    )
    return run_id


def claim_all(conn: psycopg.Connection, queue: str) -> list[tuple[int, str, dict[str, int], str]]:
    """Claim every available job of the queue: (job id, step, args, lease token)."""
    held: list[tuple[int, str, dict[str, int], str]] = []
    while True:
        rows = conn.execute(
            "select id, step, args, lease_token from treadle.claim('w', array[%s], batch => 1000)", (queue,)
        ).fetchall()
        if not rows:
            return held
        held.extend(rows)


def steps(conn: psycopg.Connection, run_id: int) -> dict[str, int]:
    rows = conn.execute(
        "select step, count(*) from treadle.jobs where workflow_run_id = %s group by step", (run_id,)
    ).fetchall()
    return dict(rows)


def test_ten_thousand_elements_completed_from_four_connections_join_once(connect: Connect) -> None:
    setup = connect()
    run_id = start(setup, "map-many")
    [(load_id, _, _, load_token)] = claim_all(setup, "map-many")
    elements = list(range(ELEMENTS))
    assert value(setup, "select treadle.complete(%s, %s, %s)", (load_id, load_token, Jsonb(elements))) == "completed"
    assert steps(setup, run_id) == {"load": 1, "resize": ELEMENTS}

    held = claim_all(setup, "map-many")
    assert len(held) == ELEMENTS
    assert sorted(args["element"] for _, step, args, _ in held if step == "resize") == elements
    assert all(args["element"] == args["index"] for _, _, args, _ in held)
    conns = [connect() for _ in range(CONNECTIONS)]
    barrier = threading.Barrier(CONNECTIONS)

    def complete_share(i: int) -> list[str]:
        # connection i completes every CONNECTIONS-th element, 100 at a time, so the
        # batches of the four cross on the run row until the last element
        share = held[i::CONNECTIONS]
        answers: list[str] = []
        barrier.wait(60)
        for start_at in range(0, len(share), 100):
            batch = share[start_at : start_at + 100]
            rows = (
                conns[i]
                .execute(
                    "select state from treadle.complete_many(%s, %s, %s::jsonb[])",
                    (
                        [job_id for job_id, _, _, _ in batch],
                        [token for _, _, _, token in batch],
                        [Jsonb(2 * args["element"]) for _, _, args, _ in batch],
                    ),
                )
                .fetchall()
            )
            answers.extend(state for (state,) in rows)
        return answers

    with ThreadPoolExecutor(CONNECTIONS) as pool:
        answers = [a for f in [pool.submit(complete_share, i) for i in range(CONNECTIONS)] for a in f.result()]
    assert answers == ["completed"] * ELEMENTS
    assert steps(setup, run_id) == {"load": 1, "resize": ELEMENTS, "report": 1}
    results, left = setup.execute(
        "select results -> 'resize', map_left from treadle.workflow_runs where id = %s", (run_id,)
    ).fetchone() or (None, None)
    assert results == [2 * e for e in elements]
    assert left is None
    report = value(setup, "select treadle.workflow_step_results(%s, 'report') -> 'resize'", (run_id,))
    assert report == [2 * e for e in elements]


def test_the_last_two_elements_completed_at_once_join_once(connect: Connect, wait_until_blocked: WaitBlocked) -> None:
    """The last two element jobs complete on two connections at the same time: the second
    waits on the run row, sees the first's count, and enqueues the step after the map."""
    first, second = connect(autocommit=False), connect()
    run_id = start(second, "map-pair")
    [(load_id, _, _, load_token)] = claim_all(second, "map-pair")
    assert value(second, 'select treadle.complete(%s, %s, \'["a", "b"]\')', (load_id, load_token)) == "completed"
    (a_id, _, _, a_token), (b_id, _, _, b_token) = sorted(claim_all(second, "map-pair"), key=lambda h: h[2]["index"])
    assert value(first, "select treadle.complete(%s, %s, '\"A\"')", (a_id, a_token)) == "completed"
    answer: list[str] = []
    thread = threading.Thread(
        target=lambda: answer.append(value(second, "select treadle.complete(%s, %s, '\"B\"')", (b_id, b_token)))
    )
    thread.start()
    wait_until_blocked(second.info.backend_pid)  # on the run row that `first` holds
    first.commit()
    thread.join(60)
    assert answer == ["completed"]
    assert steps(second, run_id) == {"load": 1, "resize": 2, "report": 1}
    assert value(second, "select results -> 'resize' from treadle.workflow_runs where id = %s", (run_id,)) == ["A", "B"]


def test_an_element_rolled_back_leaves_the_join_to_its_retry(connect: Connect, wait_until_blocked: WaitBlocked) -> None:
    first, second = connect(autocommit=False), connect()
    run_id = start(second, "map-back")
    [(load_id, _, _, load_token)] = claim_all(second, "map-back")
    assert value(second, "select treadle.complete(%s, %s, '[1, 2]')", (load_id, load_token)) == "completed"
    (a_id, _, _, a_token), (b_id, _, _, b_token) = sorted(claim_all(second, "map-back"), key=lambda h: h[2]["index"])
    assert value(first, "select treadle.complete(%s, %s, '10')", (a_id, a_token)) == "completed"
    answer: list[str] = []
    thread = threading.Thread(
        target=lambda: answer.append(value(second, "select treadle.complete(%s, %s, '20')", (b_id, b_token)))
    )
    thread.start()
    wait_until_blocked(second.info.backend_pid)
    first.rollback()  # element 0 did not complete after all
    thread.join(60)
    assert answer == ["completed"]
    assert "report" not in steps(second, run_id)
    assert value(second, "select map_left from treadle.workflow_runs where id = %s", (run_id,)) == {"resize": 1}
    assert value(second, "select treadle.complete(%s, %s, '10')", (a_id, a_token)) == "completed"
    assert steps(second, run_id)["report"] == 1
    assert value(second, "select results -> 'resize' from treadle.workflow_runs where id = %s", (run_id,)) == [10, 20]
