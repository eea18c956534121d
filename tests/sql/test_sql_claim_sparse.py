"""A claim over many queues of which few hold work: it finds them in turn order.

A queue that gives nothing sends the claim to a probe that finds, in one statement,
the next queue (in the session's turn order) holding a due row; these tests hold it
to what reading the queues one by one gives: the turn, the names, run_at, rows other
claimers hold, and a batch spread over several queues.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.sql.sqlcalls import Connect

QUEUES = [f"sparse-{i}" for i in range(200)]


def put(conn: psycopg.Connection[Any], queue: str, count: int = 1, name: str = "work", due: bool = True) -> list[int]:
    return [
        r[0]
        for r in conn.execute(
            "select treadle.enqueue(%s, '{}'::jsonb, queue => %s, run_at => now() + %s::interval)"
            " from generate_series(1, %s)",
            (name, queue, "0 seconds" if due else "1 hour", count),
        ).fetchall()
    ]


def claim(conn: psycopg.Connection[Any], names: list[str] | None = None, batch: int = 1) -> list[tuple[str, int]]:
    return [
        (r[0], r[1])
        for r in conn.execute(
            "select queue, id from treadle.claim('w', %s::text[], %s::text[], %s)", (QUEUES, names, batch)
        ).fetchall()
    ]


def turn(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("select current_setting('treadle.claim_turn', true)").fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.parametrize("names", [None, ["work"], ["work", "other"]])
def test_the_one_queue_with_due_work_is_found_past_empty_and_not_due_ones(
    connect: Connect, names: list[str] | None
) -> None:
    conn = connect()
    put(conn, "sparse-10", due=False)  # not due: passed by
    if names is not None:
        put(conn, "sparse-20", name="elsewhere")  # a name the claim does not handle: passed by
    (job,) = put(conn, "sparse-150")
    assert claim(conn, names) == [("sparse-150", job)]
    assert turn(conn) == "151"
    assert claim(conn, names) == []
    assert conn.execute("select count(*) from treadle.jobs where state = 'available'").fetchone() == (
        1 if names is None else 2,
    )


def test_the_turn_is_kept_over_sparse_queues(connect: Connect) -> None:
    conn = connect()
    early, late = put(conn, "sparse-5", 3), put(conn, "sparse-170", 3)
    conn.execute("set treadle.claim_turn = '100'")
    got = [claim(conn, ["work"]) for _ in range(6)]
    # from turn 100 the next queue with work is 170, then 5 (round the end), then 170 again
    assert got == [
        [("sparse-170", late[0])],
        [("sparse-5", early[0])],
        [("sparse-170", late[1])],
        [("sparse-5", early[1])],
        [("sparse-170", late[2])],
        [("sparse-5", early[2])],
    ]


def test_a_batch_is_filled_from_the_sparse_queues_in_turn_order(connect: Connect) -> None:
    conn = connect()
    a, b, c = put(conn, "sparse-10"), put(conn, "sparse-120"), put(conn, "sparse-190", 5)
    conn.execute("set treadle.claim_turn = '0'")
    assert claim(conn, None, batch=3) == [("sparse-10", a[0]), ("sparse-120", b[0]), ("sparse-190", c[0])]
    assert turn(conn) == "191"


def test_a_queue_whose_due_rows_another_claimer_holds_is_passed(connect: Connect) -> None:
    conn, other = connect(), connect()
    (held,) = put(conn, "sparse-40")
    (free,) = put(conn, "sparse-60")
    conn.execute("set treadle.claim_turn = '0'")
    with other.transaction():
        other.execute("select 1 from treadle.jobs where id = %s for update", (held,))
        assert claim(conn, ["work"]) == [("sparse-60", free)]
        assert claim(conn, ["work"]) == []
    assert claim(conn, ["work"]) == [("sparse-40", held)]


@pytest.mark.parametrize("names", [None, ["work"], ["work", "other"]])
def test_the_claim_reads_its_mode_from_the_setting_that_claim_setting_names(
    connect: Connect, names: list[str] | None
) -> None:
    """The claim builds the mode setting's name from the hash it checks the list by:
    the same name treadle._claim_setting gives, names or none."""
    conn = connect()
    put(conn, "sparse-150")
    row = conn.execute("select treadle._claim_setting(%s::text[], %s::text[])", (QUEUES, names)).fetchone()
    assert row is not None
    setting = str(row[0])
    conn.execute("select set_config(%s, 'sweep', false)", (setting,))
    assert len(claim(conn, names)) == 1
    # the claim read 'sweep' and swept: the setting now holds a cursor, or nothing after a quick sweep
    after = conn.execute("select current_setting(%s)", (setting,)).fetchone()
    assert after is not None and after[0] != "sweep"
    assert after[0] == "" or str(after[0]).startswith("(1,")
