"""SQLAlchemy on the psycopg driver: treadle joins SQLAlchemy's transaction."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Engine, Integer, String, create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import treadle


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    item: Mapped[str] = mapped_column(String)


def sqlalchemy_url(dsn: str, driver: str = "psycopg") -> str:
    return dsn.replace("postgresql://", f"postgresql+{driver}://", 1)


@pytest.fixture
def engine(dsn: str) -> Iterator[Engine]:
    engine = create_engine(sqlalchemy_url(dsn))
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


def committed(dsn: str) -> tuple[int, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM treadle.jobs)").fetchone()
    assert row is not None
    return row


def test_session_commit_keeps_both(engine: Engine, dsn: str) -> None:
    with Session(engine) as session:
        session.add(Order(id=1, item="book"))
        session.flush()
        job_id = treadle.enqueue(session, "ship", {"order": 1})
        assert committed(dsn) == (0, 0)
        session.commit()
    assert committed(dsn) == (1, 1)
    with Session(engine) as session:
        job = treadle.get_job(session, job_id)
        assert job is not None and job.args == {"order": 1}


def test_session_rollback_keeps_neither(engine: Engine, dsn: str) -> None:
    with Session(engine) as session:
        session.add(Order(id=1, item="book"))
        treadle.enqueue(session, "ship", {"order": 1})  # first in the session: treadle begins its transaction
        session.flush()
        treadle.enqueue_many(session, [{"name": "audit"}])
        session.rollback()
    assert committed(dsn) == (0, 0)


def test_enqueue_first_then_the_session_commits_it(engine: Engine, dsn: str) -> None:
    with Session(engine) as session:
        treadle.start_workflow(session, "fulfil", steps=["pick", "pack"])
        session.add(Order(id=2, item="lamp"))
        session.commit()
    assert committed(dsn) == (1, 1)


def test_connection_commit_and_rollback(engine: Engine, dsn: str) -> None:
    with engine.connect() as conn:
        treadle.enqueue(conn, "a")  # autobegin happens for treadle too, so commit() covers it
        conn.execute(text("INSERT INTO orders VALUES (1, 'x')"))
        conn.commit()
        treadle.enqueue(conn, "b")
        conn.execute(text("INSERT INTO orders VALUES (2, 'y')"))
        conn.rollback()
    with engine.begin() as conn:
        treadle.enqueue(conn, "c")
        conn.execute(text("INSERT INTO orders VALUES (3, 'z')"))
    with psycopg.connect(dsn, autocommit=True) as check:
        assert check.execute("SELECT name FROM treadle.jobs ORDER BY id").fetchall() == [("a",), ("c",)]
        assert check.execute("SELECT id FROM orders ORDER BY id").fetchall() == [(1,), (3,)]


def test_a_refused_argument_is_a_failed_statement_for_sqlalchemy_too(engine: Engine, dsn: str) -> None:
    with Session(engine) as session:
        session.add(Order(id=1, item="book"))
        session.flush()
        with pytest.raises(treadle.InvalidArgument) as refused:
            treadle.enqueue(session, "x", max_attempts=0)
        assert refused.value.sqlstate == "22023"
        session.rollback()
    assert committed(dsn) == (0, 0)


def test_another_driver_is_refused() -> None:
    engine = create_engine("sqlite://")
    with engine.connect() as conn, pytest.raises(TypeError, match=r"postgresql\+psycopg://"):
        treadle.enqueue(conn, "x")
    with Session(engine) as session, pytest.raises(TypeError, match="sqlite3"):
        treadle.get_job(session, 1)


def test_asyncio_sessions_use_the_connection_underneath(dsn: str) -> None:
    async def scenario() -> None:
        engine = create_async_engine(sqlalchemy_url(dsn))
        try:
            async with engine.begin() as conn:
                await conn.run_sync(Base.metadata.create_all)
            async with AsyncSession(engine) as session:
                with pytest.raises(TypeError, match="get_raw_connection"):
                    treadle.enqueue(session, "x")  # type: ignore[call-overload]
                session.add(Order(id=1, item="book"))
                # the one-liner the client documents
                raw = await (await session.connection()).get_raw_connection()
                assert raw.driver_connection is not None
                job_id = await treadle.enqueue(raw.driver_connection, "ship", {"order": 1})
                assert job_id > 0
                await session.commit()
            async with AsyncSession(engine) as session:
                session.add(Order(id=2, item="pen"))
                raw = await (await session.connection()).get_raw_connection()
                assert raw.driver_connection is not None
                await treadle.enqueue(raw.driver_connection, "ship", {"order": 2})
                await session.rollback()
        finally:
            await engine.dispose()

    asyncio.run(scenario())
    assert committed(dsn) == (1, 1)


def test_wait_reads_in_the_session(engine: Engine, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        job_id = treadle.enqueue(conn, "x")
        token = conn.execute("SELECT lease_token FROM treadle.claim('w')").fetchone()
        assert token is not None
        conn.execute("SELECT treadle.complete(%s, %s, '{\"ok\": 1}')", [job_id, token[0]])
    with Session(engine) as session:
        assert treadle.wait(session, job_id, timeout=0) == {"ok": 1}


def test_cancel_many_in_a_session_is_the_sessions_to_commit(engine: Engine, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = [treadle.enqueue(conn, "ship") for _ in range(3)]

    def cancelled() -> int:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM treadle.jobs WHERE state = 'cancelled'").fetchone()
        assert row is not None
        return int(row[0])

    with Session(engine) as session:
        assert treadle.cancel_many(session, ids, batch_size=2) == 3  # the batches are statements of its transaction
        assert cancelled() == 0
        session.rollback()
    assert cancelled() == 0
    with Session(engine) as session:
        assert treadle.cancel_many(session, ids, batch_size=2) == 3
        session.commit()
    assert cancelled() == 3
