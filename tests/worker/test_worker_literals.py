"""The worker sends its per-batch arrays and its lease as literals (_literals.py): every
value must reach the server as the value itself, whatever characters a queue or job name holds."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

import treadle
from tests.worker.worker_support import until_state
from treadle import Worker, _sql
from treadle._literals import Fixed, bigint_array, constant, interval, text_array, uuid_array, with_constants
from treadle._pool import WorkerPool
from treadle._producer import claim_statements

HOSTILE = [
    'a"b',
    "back\\slash",
    "{braces}",
    "comma,sep",
    " spaced ",
    "NULL",
    "null",
    "",
    "quote'single",
    '\\"both',
    "ünïcødé ✓",
    "tab\tand\nnewline",
    "}",
    '"',
    "\\",
]


def test_text_arrays_reach_the_server_as_they_were(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute("SELECT %s::text[], %s::text[]", [text_array(HOSTILE), text_array([])]).fetchone()
    assert row is not None
    assert row[0] == HOSTILE, "every element the same, NULL-looking and empty ones included"
    assert row[1] == []


def test_bigint_uuid_and_interval_literals(conn: psycopg.Connection[Any]) -> None:
    ids = [1, 0, -5, 2**63 - 1]
    tokens = [uuid.uuid4() for _ in range(3)]
    lease = timedelta(seconds=30.000001)
    row = conn.execute(
        "SELECT %s::bigint[], %s::uuid[], %s::interval, %s::interval",
        [bigint_array(ids), uuid_array(tokens), interval(lease), interval(timedelta(hours=30))],
    ).fetchone()
    assert row == (ids, tokens, lease, timedelta(hours=30))


def test_a_text_array_with_nul_is_refused(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(psycopg.DataError):
        conn.execute("SELECT %s::text[]", [text_array(["a\x00b"])])


@pytest.mark.parametrize("queue", ['q"1', "q\\2", "q,3", "{q4}", "NULL", "q'6", "q%7", "%(batch)s", "E'q\\'8", "ü 9"])
def test_a_worker_serves_queues_and_names_that_need_quoting(
    conn: psycopg.Connection[Any], make_worker: Any, queue: str
) -> None:
    name = f"job {queue}"
    ran: list[Any] = []
    worker: Worker = make_worker(queues=[queue], concurrency=3)

    def handler(args: Any, ctx: Any) -> Any:
        ran.append((ctx.queue, args))
        return {"seen": args}

    worker.register(name, handler)
    ids = [treadle.enqueue(conn, name, {"i": i}, queue=queue) for i in range(7)]
    other = treadle.enqueue(conn, name, {"i": -1}, queue=queue + "x")  # a queue the worker does not serve
    worker.start()
    for i, job_id in enumerate(ids):
        row = until_state(conn, job_id, "completed")
        assert row["result"] == {"seen": {"i": i}}
    assert sorted(ran, key=lambda r: r[1]["i"]) == [(queue, {"i": i}) for i in range(7)]
    found = conn.execute("SELECT state FROM treadle.jobs WHERE id = %s", [other]).fetchone()
    assert found == ("available",)


# names a statement's text must carry through unchanged: quotes, backslashes, braces, commas,
# spaces, percent signs and psycopg placeholders, dollar quotes, unicode, control characters
WRITTEN = [
    *HOSTILE,
    "%",
    "%%",
    "%s",
    "%(batch)s",
    "%(queues)s",
    "E'\\'",
    "'; SELECT 1; --",
    "$$",
    "$a$",
    "\\'",
    "'\\",
    "\x01\x1f\x7f\r",
    "U&'\\0041'",
]


@pytest.mark.parametrize("conforming", ["on", "off"])
def test_constants_written_into_a_statement_reach_the_server_as_they_were(
    conn: psycopg.Connection[Any], conforming: str
) -> None:
    conn.execute(f"SET standard_conforming_strings = {conforming}")
    statement = with_constants(
        "SELECT %(one)s::text, %(list)s::text[], %(none)s::text[], %(kept)s::integer",
        {"list": text_array(WRITTEN), "none": None, "one": "x'%(kept)s\\"},
    )
    assert "%(kept)s" in statement, "a placeholder not named stays a parameter"
    row = conn.execute(statement, {"kept": 7}).fetchone()
    assert row == ("x'%(kept)s\\", WRITTEN, None, 7)
    for value in WRITTEN:
        row = conn.execute("SELECT " + constant(value) + "::text AS v, %(p)s::text", {"p": value}).fetchone()
        assert row == (value, value), f"{value!r} came back changed"


def test_a_constant_with_nul_is_refused() -> None:
    with pytest.raises(ValueError):
        constant("a\x00b")


def test_the_worker_writes_its_fixed_arguments_into_its_statements(conn: psycopg.Connection[Any]) -> None:
    valid = [f"q {value}" for value in WRITTEN if not re.search("[\x00-\x1f\x7f]", value)]
    queues = [*valid, "plain"]
    names = ["job %(batch)s", "job's", 'job "x"']
    claim, cycle = claim_statements("worker 'w' %s", queues, names, timedelta(seconds=12.5))
    assert claim.written is not None and cycle.written is not None
    for statement in (claim.written, cycle.written):
        left = set(re.findall(r"%\((\w+)\)s", statement.replace("%%", "")))
        assert left <= {"batch", "lease_token", "job_ids", "lease_tokens", "results", "job_queues"}, left
    for value in ["plain", *valid]:
        job = conn.execute("SELECT treadle.enqueue('job''s', queue => %s)", [value]).fetchone()
        assert job is not None
        rows = conn.execute(claim.written, {"batch": 1, "lease_token": str(uuid.uuid4())}).fetchall()
        assert [(r[0], r[1], r[2]) for r in rows] == [(job[0], value, "job's")]
        held = conn.execute("SELECT worker_id, lease_until - started_at FROM treadle.jobs WHERE id = %s", [job[0]])
        assert held.fetchone() == ("worker 'w' %s", timedelta(seconds=12.5))


@pytest.mark.parametrize("prepared", [True, False])
def test_the_pool_writes_fixed_arguments_in_only_where_it_prepares(dsn: str, prepared: bool) -> None:
    fixed = Fixed.of("SELECT current_query(), %(v)s::text, %(n)s::integer", {"v": "a'b%"})
    pool = WorkerPool(dsn, "literals test", 2, prepared_statements=prepared)
    pool.open()
    try:
        for _ in range(3):  # (psycopg prepares a statement on its second run)
            [(query, value, n)] = pool.tuples(fixed, {"n": 4})
            assert (value, n) == ("a'b%", 4)
            assert ("E'a''b%'" in query) == prepared and ("$2" in query) != prepared, query
    finally:
        pool.close()


BAD_QUEUES = [
    ["ok", "tab\tin"],
    ["ok", "\x01"],
    ["ok", "\x7f"],
    ["ok", ""],
    ["ok", "   "],
    ["ok", "x" * 201],
    [],
    [f"q{i}" for i in range(1001)],
]


@pytest.mark.parametrize("queues", BAD_QUEUES, ids=lambda q: repr(q)[:30])
def test_bad_queues_written_into_the_statement_are_refused_as_when_sent(
    conn: psycopg.Connection[Any], queues: list[str]
) -> None:
    claim, cycle = claim_statements("w", queues, ["job"], timedelta(seconds=30))
    cycle_args = {"job_ids": "{}", "lease_tokens": "{}", "results": None, "job_queues": None}
    states = []
    for fixed, args in [(claim, {}), (cycle, cycle_args)]:
        for prepared in (True, False):  # written into the text, and sent
            query, params = fixed.query(prepared, {**args, "batch": 1, "lease_token": None})
            assert (query == fixed.template) != prepared
            with pytest.raises(psycopg.Error) as caught:
                conn.execute(query, params)
            states.append(caught.value.sqlstate)
    assert states == ["22023"] * 4


def test_bad_names_and_worker_id_written_into_the_statement_are_refused(conn: psycopg.Connection[Any]) -> None:
    for worker_id, names in [("w\n", ["job"]), ("w", ["job", "\x02"]), ("w", []), ("", ["job"])]:
        claim, _ = claim_statements(worker_id, ["q"], names, timedelta(seconds=30))
        assert claim.written is not None
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(claim.written, {"batch": 1, "lease_token": None})
        assert caught.value.sqlstate == "22023", (worker_id, names)


def test_a_nul_in_a_queue_is_sent_as_a_parameter_and_refused_as_before(conn: psycopg.Connection[Any]) -> None:
    claim, _ = claim_statements("w", ["q\x00"], ["job"], timedelta(seconds=30))
    assert claim.written is None
    query, params = claim.query(True, {"batch": 1, "lease_token": None})
    assert query == _sql.CLAIM and params["queues"] == text_array(["q\x00"])
    with pytest.raises(psycopg.DataError):
        conn.execute(query, params)


@pytest.mark.parametrize("encoding", ["UTF8", "LATIN1", "WIN1252"])
def test_the_longest_list_of_the_longest_names_claims_the_same_written_in_or_sent(
    conn: psycopg.Connection[Any], encoding: str
) -> None:
    """1,000 queues of 200 characters, each made of what a constant and an array literal escape
    (and in a client encoding other than UTF8), written into the statement and sent as a
    parameter: the same job claimed from the last queue both ways."""
    pieces = "'\\\"%{},(ü) $"
    queues = [(f"{i:04d}" + pieces * 20)[:200] for i in range(1000)]
    assert all(len(queue) == 200 for queue in queues) and len(set(queues)) == 1000
    conn.execute(f"SET client_encoding = '{encoding}'")
    claim, _ = claim_statements("w", queues, ["job"], timedelta(seconds=30))
    assert claim.written is not None and len(claim.written) > 200_000
    for prepared in (True, False, True):  # (the first statement again, once more: psycopg prepares it)
        (job,) = conn.execute("SELECT treadle.enqueue('job', queue => %s)", [queues[-1]]).fetchone()  # type: ignore[misc]
        query, params = claim.query(prepared, {"batch": 1, "lease_token": str(uuid.uuid4())})
        rows = conn.execute(query, params).fetchall()
        assert [(r[0], r[1]) for r in rows] == [(job, queues[-1])]


@pytest.fixture
def sql_ascii_dsn(pg_server: str) -> Iterator[str]:
    """A database whose encoding is SQL_ASCII (so is a connection's client_encoding), treadle installed."""
    name = f"treadle_t_ascii_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as server:
        server.execute(
            sql.SQL("CREATE DATABASE {} ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0").format(
                sql.Identifier(name)
            )
        )
    try:
        url = pg_server.rsplit("/", 1)[0] + "/" + name
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION treadle")
        yield url
    finally:
        with psycopg.connect(pg_server, autocommit=True) as server:
            server.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.mark.extension_only
@pytest.mark.parametrize("queue", ["plain", "ünïcødé", "q'ü"])
def test_under_sql_ascii_names_the_text_cannot_carry_are_sent_as_parameters(sql_ascii_dsn: str, queue: str) -> None:
    """psycopg writes a statement's text in ASCII under SQL_ASCII, but sends a str parameter as
    UTF-8: the worker's claim written in raised UnicodeEncodeError for a name outside ASCII. It is
    sent as parameters there, and claims what it claims with parameters."""
    with psycopg.connect(sql_ascii_dsn, autocommit=True) as conn:
        assert conn.info.encoding == "ascii"
        claim, cycle = claim_statements("w", [queue, "other"], ["job"], timedelta(seconds=30))
        pool = WorkerPool(sql_ascii_dsn, "literals test", 1, prepared_statements=True)
        pool.open()
        try:
            for prepared_now in (False, True, True):  # (psycopg prepares a statement on its second run)
                (job,) = conn.execute("SELECT treadle.enqueue('job', queue => %s)", [queue]).fetchone()  # type: ignore[misc]
                [row] = pool.tuples(claim, {"batch": 1, "lease_token": None})
                assert (row[0], row[1]) == (job, queue.encode()), "the same queue, its UTF-8 bytes stored as sent"
                assert row[2] == b"job"
                (token,) = conn.execute("SELECT lease_token FROM treadle.jobs WHERE id = %s", [job]).fetchone()  # type: ignore[misc]
                args: dict[str, Any] = {"job_ids": bigint_array([job]), "lease_tokens": uuid_array([token])}
                args |= {"results": None, "job_queues": text_array([queue]), "batch": 1, "lease_token": None}
                assert [r[:2] for r in pool.tuples(cycle, args)] == [(job, b"completed")]
                (state,) = conn.execute("SELECT state FROM treadle.jobs WHERE id = %s", [job]).fetchone()  # type: ignore[misc]
                assert state == b"completed", prepared_now
            written, _ = claim.query(True, {}, conn)
            assert (written == claim.written) == queue.isascii()
        finally:
            pool.close()


@pytest.mark.extension_only
def test_under_sql_ascii_a_name_treadle_refuses_is_refused_as_when_sent(sql_ascii_dsn: str) -> None:
    """✓'s UTF-8 bytes hold one that a SQL_ASCII server reads as a control character: refused with
    22023 written in or sent, never a UnicodeEncodeError of the client."""
    claim, _ = claim_statements("w", ["ok ✓"], ["job"], timedelta(seconds=30))
    for prepared in (False, True):
        pool = WorkerPool(sql_ascii_dsn, "literals test", 1, prepared_statements=prepared)
        pool.open()
        try:
            with pytest.raises(psycopg.Error) as caught:
                pool.tuples(claim, {"batch": 1, "lease_token": None})
            assert caught.value.sqlstate == "22023"
        finally:
            pool.close()


@pytest.mark.extension_only
def test_a_sql_ascii_connection_is_refused_with_the_fix_and_utf8_works(sql_ascii_dsn: str, make_worker: Any) -> None:
    """Under client_encoding SQL_ASCII psycopg returns text as bytes, which treadle does not read
    (the installed version came back as b'0.4.0', refused as a version): the client's first call
    and a worker's start raise InvalidArgument naming the fix, and write nothing. With
    client_encoding=UTF8, the same database runs a worker over a non-ASCII queue."""
    with psycopg.connect(sql_ascii_dsn, autocommit=True) as conn:
        with pytest.raises(treadle.InvalidArgument, match="client_encoding=UTF8"):
            treadle.enqueue(conn, "job", {}, queue="ü")
        broken: Worker = make_worker(dsn=sql_ascii_dsn, queues=["ü"])
        broken.register("job", lambda args, ctx: None)
        with pytest.raises(treadle.InvalidArgument, match="client_encoding SQL_ASCII"):
            broken.start()
        assert conn.execute("SELECT count(*) FROM treadle.jobs").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM treadle.workers").fetchone() == (0,)
    utf8 = sql_ascii_dsn + "?client_encoding=UTF8"
    with psycopg.connect(utf8, autocommit=True) as conn:
        job_id = treadle.enqueue(conn, "job", {"who": "ünï"}, queue="ü ï")
        worker: Worker = make_worker(dsn=utf8, queues=["ü ï"])
        worker.register("job", lambda args, ctx: {"queue": ctx.queue, "who": args["who"]})
        worker.start()
        assert until_state(conn, job_id, "completed")["result"] == {"queue": "ü ï", "who": "ünï"}
