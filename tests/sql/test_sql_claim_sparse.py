"""A claim over many queues of which few hold work: it finds them in turn order.

A queue that gives nothing sends the claim to a probe that finds, in one statement,
the next queue (in the session's turn order) holding a due row; these tests hold it
to what reading the queues one by one gives: the turn, the names, run_at, rows other
claimers hold, and a batch spread over several queues.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

from tests.sql.sqlcalls import Connect, claim_plainly

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


def claim(
    conn: psycopg.Connection[Any], names: list[str] | None = None, batch: int = 1, plain: bool = True
) -> list[tuple[str, int]]:
    """One claim over QUEUES. `plain`: by the plain path these tests are about, even after slow
    claims (a cursor keeps the turn but has no probe; tests/sql/test_sql_claim_cursor.py covers it)."""
    if plain:
        claim_plainly(conn, QUEUES, names)
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
    assert len(claim(conn, names, plain=False)) == 1
    # the claim read 'sweep' and swept: the setting now holds a cursor, or nothing after a quick sweep
    after = conn.execute("select current_setting(%s)", (setting,)).fetchone()
    assert after is not None and after[0] != "sweep"
    assert after[0] == "" or str(after[0]).startswith("(1,")


# -- the queues a probe passed (treadle.claim_passed) -------------------------------------


def passed(conn: psycopg.Connection[Any]) -> list[str]:
    row = conn.execute("select coalesce(current_setting('treadle.claim_passed', true), '')").fetchone()
    assert row is not None
    return str(row[0]).split("/")


def claim_from(conn: psycopg.Connection[Any], first: int, names: list[str] | None = None) -> list[tuple[str, int]]:
    conn.execute("select set_config('treadle.claim_turn', %s, false)", (str(first),))
    return claim(conn, names)


def hold_clock(conn: psycopg.Connection[Any], at: Any) -> None:
    conn.execute("select set_config('treadle.now', %s, false)", (at.isoformat(),))


@pytest.mark.parametrize("names", [None, ["work"], ["work", "other"]])
def test_queues_a_probe_passed_are_gone_past_for_a_second_of_the_servers_time(
    connect: Connect, names: list[str] | None
) -> None:
    """With treadle's clock held still, the memory holds for a second of the server's time, not for ever.

    (Rows made due here by hand, without a new ready_txid: what the memory is blind to.)"""
    conn = connect()
    t = conn.execute("select clock_timestamp() + interval '1 minute'").fetchone()[0]  # type: ignore[index]
    hold_clock(conn, t)
    first, second, third = put(conn, "sparse-150", 3)
    (later,) = put(conn, "sparse-100", due=False)
    assert claim_from(conn, 0, names) == [("sparse-150", first)]
    setting = conn.execute("select treadle._claim_setting(%s::text[], %s::text[])", (QUEUES, names)).fetchone()
    memory = passed(conn)
    assert memory[0] == setting[0] and memory[4:6] == ["1", "149"], memory  # type: ignore[index]
    conn.execute("update treadle.jobs set run_at = %s::timestamptz - interval '1 second' where id = %s", (t, later))
    # the clock held, well inside the second: the memory holds and the claim goes past sparse-100
    assert claim_from(conn, 0, names) == [("sparse-150", second)]
    # the clock still held, but the server's second over: probed again, and found
    conn.execute("select pg_sleep(1.05)")
    assert claim_from(conn, 0, names) == [("sparse-100", later)]
    assert claim_from(conn, 0, names) == [("sparse-150", third)]


@pytest.mark.parametrize("step", ["1 microsecond", "600 milliseconds", "-1 second"])
def test_a_clock_moved_ends_the_memory(connect: Connect, step: str) -> None:
    """A test that moves treadle's clock can claim at once every job due by the moved clock.

    (Moved back, a job is made due by hand, without a new ready_txid: none could become due
    by the clock alone.)"""
    conn = connect()
    t = conn.execute("select clock_timestamp() + interval '1 minute'").fetchone()[0]  # type: ignore[index]
    moved = t + (timedelta(microseconds=1) if step == "1 microsecond" else timedelta(milliseconds=600))
    if step == "-1 second":
        moved = t - timedelta(seconds=1)
    hold_clock(conn, t)
    first, _ = put(conn, "sparse-150", 2)
    (soon,) = conn.execute(
        "select treadle.enqueue('work', '{}'::jsonb, queue => 'sparse-100', run_at => %s::timestamptz)",
        (max(moved, t + timedelta(microseconds=1)),),
    ).fetchone()  # type: ignore[misc]
    assert claim_from(conn, 0) == [("sparse-150", first)]
    assert passed(conn)[4:6] == ["1", "149"]
    if moved < t:
        conn.execute("update treadle.jobs set run_at = %s where id = %s", (moved, soon))
    hold_clock(conn, moved)
    assert claim_from(conn, 0) == [("sparse-100", soon)]


def test_a_row_made_claimable_since_the_probe_ends_the_memory(connect: Connect) -> None:
    conn = connect()
    first, _ = put(conn, "sparse-150", 2)
    assert claim_from(conn, 0) == [("sparse-150", first)]
    assert passed(conn)[4:6] == ["1", "149"]
    (late,) = put(conn, "sparse-100")
    assert claim_from(conn, 0) == [("sparse-100", late)]


def test_a_row_the_claims_own_transaction_makes_claimable_ends_the_memory(connect: Connect) -> None:
    conn = connect(autocommit=False)
    first, _ = put(conn, "sparse-150", 2)
    conn.commit()
    put(conn, "elsewhere")  # this transaction has an id before the probe's snapshot
    assert claim_from(conn, 0) == [("sparse-150", first)]
    own = conn.execute("select pg_current_xact_id()::text").fetchone()
    assert own is not None and passed(conn)[3].split(",")[-1] == own[0]
    (late,) = put(conn, "sparse-100")
    assert claim_from(conn, 0) == [("sparse-100", late)]
    conn.commit()


@pytest.mark.parametrize(
    "value",
    [
        "",
        "x",
        "/////",
        "//////",
        "{key}/{now}/{xmax}//999/5",
        "{key}/{now}/{xmax}//0/201",
        "{key}/{now}/{xmax}/x/0/5",
        "{key}/{now}/99999999999999999999/0/0/5",
        "{key}/-1/{xmax}//0/5",
        "{key}/{now}/{xmax}/,/0/5",
        "treadle.claim_0/{now}/{xmax}//0/200",
        "{key}/{now}/{xmax}//0/200/1",
        "{key}/{now}/{xmax}//0/5/{now}/1",
        "{key}/{now}/{xmax}//0/5/x",
        "{key}/{now}/{xmax}//0/5/99999999999999999999",
    ],
)
def test_a_setting_changed_by_hand_never_raises(connect: Connect, value: str) -> None:
    conn = connect()
    (job,) = put(conn, "sparse-150")
    key = conn.execute("select treadle._claim_setting(%s::text[], null)", (QUEUES,)).fetchone()[0]  # type: ignore[index]
    now, xmax = conn.execute(  # type: ignore[misc]
        "select treadle._us(treadle.now()), pg_snapshot_xmax(pg_current_snapshot())"
    ).fetchone()
    conn.execute("select set_config('treadle.claim_passed', %s, false)", (value.format(key=key, now=now, xmax=xmax),))
    assert claim_from(conn, 0) == [("sparse-150", job)]


def test_a_memory_set_by_hand_delays_only_its_own_session(connect: Connect) -> None:
    conn, other = connect(), connect()
    (job,) = put(conn, "sparse-150")
    key = conn.execute("select treadle._claim_setting(%s::text[], null)", (QUEUES,)).fetchone()[0]  # type: ignore[index]
    conn.execute(
        "select set_config('treadle.claim_passed', concat_ws('/', %s::text, treadle._us(treadle.now()),"
        " pg_snapshot_xmax(pg_current_snapshot()), '', 1, 199, treadle._us(statement_timestamp())), false)",
        (key,),
    )
    assert claim_from(conn, 0) == []  # every queue but sparse-0 counted as passed
    assert claim_from(other, 0) == [("sparse-150", job)]


def take(conn: psycopg.Connection[Any], queue: str, lease: str = "30 seconds") -> tuple[int, Any]:
    """Another session's claim of one job of `queue`: its id and lease token."""
    row = conn.execute(
        "select id, lease_token from treadle.claim('other', array[%s], lease => %s::interval)", (queue, lease)
    ).fetchone()
    assert row is not None
    return int(row[0]), row[1]


def _by_fail(conn: psycopg.Connection[Any], other: psycopg.Connection[Any]) -> Any:
    job, token = take(other, "sparse-100")
    return lambda: other.execute("select treadle.fail(%s, %s, 'again', retry_in => '0 seconds')", (job, token)), job


def _by_release(conn: psycopg.Connection[Any], other: psycopg.Connection[Any]) -> Any:
    job, token = take(other, "sparse-100")
    return lambda: other.execute("select treadle.release(%s, %s)", (job, token)), job


def _by_snooze(conn: psycopg.Connection[Any], other: psycopg.Connection[Any]) -> Any:
    job, token = take(other, "sparse-100")
    return lambda: other.execute("select treadle.snooze(%s, %s, '0 seconds')", (job, token)), job


def _by_rescue(conn: psycopg.Connection[Any], other: psycopg.Connection[Any]) -> Any:
    job, _ = take(other, "sparse-100", lease="1 millisecond")
    return lambda: other.execute("select pg_sleep(0.01), treadle.rescue()"), job


def _by_retry(conn: psycopg.Connection[Any], other: psycopg.Connection[Any]) -> Any:
    conn.execute("update treadle.jobs set max_attempts = 1 where queue = 'sparse-100'")
    job, token = take(other, "sparse-100")
    other.execute("select treadle.fail(%s, %s, 'no more')", (job, token))
    return lambda: other.execute("select treadle.retry(%s)", (job,)), job


def _by_a_key_slot(conn: psycopg.Connection[Any], other: psycopg.Connection[Any]) -> Any:
    conn.execute("delete from treadle.jobs where queue = 'sparse-100'")
    conn.execute("select treadle.set_queue('sparse-100', key_limit => 1)")
    (first,) = conn.execute("select treadle.enqueue('work', queue => 'sparse-100', concurrency_key => 'k')").fetchone()  # type: ignore[misc]
    (second,) = conn.execute("select treadle.enqueue('work', queue => 'sparse-100', concurrency_key => 'k')").fetchone()  # type: ignore[misc]
    job, token = take(other, "sparse-100")
    assert job == first
    return lambda: other.execute("select treadle.complete(%s, %s)", (job, token)), second


def _by_a_late_commit(conn: psycopg.Connection[Any], other: psycopg.Connection[Any]) -> Any:
    """A transaction that has its id before the probe's snapshot and commits after the probe."""
    conn.execute("delete from treadle.jobs where queue = 'sparse-100'")
    other.autocommit = False
    other.execute("select pg_current_xact_id()")
    made: list[int] = []

    def commit() -> None:
        made.extend(put(other, "sparse-100"))
        other.commit()

    return commit, made


def _by_resume(conn: psycopg.Connection[Any], other: psycopg.Connection[Any]) -> Any:
    conn.execute("select treadle.pause('sparse-100')")
    (job,) = conn.execute("select id from treadle.jobs where queue = 'sparse-100'").fetchone()  # type: ignore[misc]
    return lambda: other.execute("select treadle.resume('sparse-100')"), job


def _by_a_limit_raised(conn: psycopg.Connection[Any], other: psycopg.Connection[Any]) -> Any:
    put(conn, "sparse-100")
    conn.execute("select treadle.set_queue('sparse-100', concurrency => 1)")
    take(other, "sparse-100")
    (job,) = conn.execute("select id from treadle.jobs where queue = 'sparse-100' and state = 'available'").fetchone()  # type: ignore[misc]
    return lambda: other.execute("select treadle.set_queue('sparse-100', concurrency => 2)"), job


@pytest.mark.parametrize(
    "route",
    [
        _by_fail,
        _by_release,
        _by_snooze,
        _by_rescue,
        _by_retry,
        _by_a_key_slot,
        _by_a_late_commit,
        _by_resume,
        _by_a_limit_raised,
    ],
    ids=lambda f: f.__name__.removeprefix("_by_"),
)
def test_a_row_made_claimable_again_by_any_route_is_claimed_at_once(connect: Connect, route: Any) -> None:
    """A job of sparse-100 that could not be claimed when the probe passed it is made claimable
    by another session (a failure due at once, a release, a snooze, a rescue, a retry, a key's
    slot, a commit of a transaction older than the probe, a queue resumed, a limit raised):
    the next claim takes it, inside the memory's second."""
    conn, other = connect(), connect()
    put(conn, "sparse-100")
    bait = put(conn, "sparse-150", 2)
    made_claimable, job = route(conn, other)
    assert claim_from(conn, 0) == [("sparse-150", bait[0])]
    if route not in (_by_resume, _by_a_limit_raised):  # (a paused or limited queue: no probe memory)
        assert passed(conn)[4:6] == ["1", "149"], "the probe passed sparse-100"
    made_claimable()
    (expected,) = job if isinstance(job, list) else [job]
    assert claim_from(conn, 0) == [("sparse-100", expected)]
