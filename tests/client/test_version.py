"""The extension check made by the first call on each connection."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import psycopg
import psycopg.rows
import pytest
from psycopg.pq import TransactionStatus

import treadle
from tests.conftest import EXTENSION_VERSION, INSTALL
from tests.pgtle_install import create_extension
from treadle import _compat


@pytest.mark.extension_only  # drops or replaces the extension
def test_missing_extension_names_the_fix(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("DROP EXTENSION treadle")
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE mine (v int)")
        conn.execute("INSERT INTO mine VALUES (1)")
        with pytest.raises(treadle.ExtensionMissing, match="CREATE EXTENSION treadle") as missing:
            treadle.enqueue(conn, "x")
        assert "treadle_t_" in str(missing.value)  # names the database
        # the check cannot fail, so the caller's transaction is still good and commits
        assert conn.info.transaction_status == TransactionStatus.INTRANS
        conn.commit()
        assert conn.execute("SELECT count(*) FROM mine").fetchone() == (1,)
        with pytest.raises(treadle.ExtensionMissing):
            treadle.version(conn)


@pytest.mark.extension_only  # drops or replaces the extension
def test_a_missing_extension_is_not_remembered(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP EXTENSION treadle")
        with pytest.raises(treadle.ExtensionMissing):
            treadle.get_job(conn, 1)
        create_extension(conn)
        assert treadle.get_job(conn, 1) is None


def test_unsupported_version_names_the_fix(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_compat, "SUPPORTED_VERSIONS", frozenset({"9.9.9"}))
    with psycopg.connect(dsn) as conn:
        with pytest.raises(treadle.UnsupportedVersion, match="ALTER EXTENSION treadle UPDATE") as unsupported:
            treadle.start_workflow(conn, "w", steps=["a"])
        message = str(unsupported.value)
        assert f"has treadle {EXTENSION_VERSION}" in message and "speaks 9.9.9" in message
        assert conn.info.transaction_status == TransactionStatus.INTRANS  # not in error
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM treadle.workflow_runs").fetchone() == (0,)


@pytest.mark.extension_only  # drops or replaces the extension
def test_async_check(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_compat, "SUPPORTED_VERSIONS", frozenset({"0.0.1"}))

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            with pytest.raises(treadle.UnsupportedVersion):
                await treadle.enqueue(aconn, "x")
            await aconn.execute("DROP EXTENSION treadle")
            with pytest.raises(treadle.ExtensionMissing):
                await treadle.version(aconn)

    asyncio.run(scenario())


def test_checked_once_per_connection(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with psycopg.connect(dsn, autocommit=True) as checked:
        treadle.enqueue(checked, "x")
        # the answer is kept for this connection: no further check sees the new rule
        monkeypatch.setattr(_compat, "SUPPORTED_VERSIONS", frozenset())
        assert treadle.enqueue(checked, "y") > 0
        with psycopg.connect(dsn, autocommit=True) as fresh, pytest.raises(treadle.UnsupportedVersion):
            treadle.enqueue(fresh, "z")


def test_the_check_does_not_keep_connections_alive(dsn: str) -> None:
    conn = psycopg.connect(dsn, autocommit=True)
    treadle.enqueue(conn, "x")
    gone = weakref.ref(conn)
    conn.close()
    del conn
    gc.collect()
    assert gone() is None


def test_version_reads_the_sql_api(conn: psycopg.Connection[Any]) -> None:
    assert treadle.version(conn) in _compat.SUPPORTED_VERSIONS


@pytest.mark.parametrize("row_factory", [psycopg.rows.dict_row, psycopg.rows.namedtuple_row])
def test_connections_with_their_own_row_factory(dsn: str, row_factory: Any) -> None:
    with psycopg.connect(dsn, autocommit=True, row_factory=row_factory) as conn:
        job_id = treadle.enqueue(conn, "x")
        assert treadle.version(conn) == EXTENSION_VERSION
        job = treadle.get_job(conn, job_id)
        assert job is not None and job.name == "x"


@pytest.mark.extension_only  # drops or replaces the extension
@pytest.mark.skipif(INSTALL == "pgtle", reason="0.1.0 had no pg_tle form: it installs from the server's files")
def test_a_0_1_0_database_is_refused_naming_the_upgrade(dsn: str) -> None:
    # the released 0.1.0 script is installable as it was; its functions differ from this version's
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("DROP EXTENSION treadle")
        admin.execute("CREATE EXTENSION treadle VERSION '0.1.0'")
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(treadle.UnsupportedVersion) as refused:
            treadle.enqueue(conn, "x")
        message = str(refused.value)
        assert "has treadle 0.1.0" in message and f"speaks {EXTENSION_VERSION}" in message
        assert "treadle upgrade" in message and "ALTER EXTENSION treadle UPDATE" in message
        assert conn.execute("SELECT count(*) FROM treadle.jobs").fetchone() == (0,)
        conn.execute("ALTER EXTENSION treadle UPDATE")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert treadle.version(conn) == EXTENSION_VERSION


@pytest.mark.parametrize("encoding", ["LATIN1", "WIN1252", "EUC_JP"])
def test_a_connection_not_in_utf8_is_refused_before_it_writes_anything(dsn: str, encoding: str) -> None:
    """Under any client_encoding but UTF8 psycopg still sends JSON as UTF-8, so {"a": "é"} would be
    stored as {"a": "Ã©"} under LATIN1: the first call raises InvalidArgument naming the fix and
    writes nothing; the same database through UTF8 stores the args unchanged."""
    with psycopg.connect(dsn, autocommit=True, client_encoding=encoding) as conn:
        with pytest.raises(treadle.InvalidArgument, match=f"client_encoding {encoding}, .*client_encoding=UTF8"):
            treadle.enqueue(conn, "job", {"a": "é"})
        with pytest.raises(treadle.InvalidArgument):
            treadle.enqueue(conn, "job", {"a": "é"})  # not remembered as passed
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM treadle.jobs").fetchone() == (0,)
        job_id = treadle.enqueue(conn, "job", {"a": "é"})
        assert conn.execute("SELECT args FROM treadle.jobs WHERE id = %s", (job_id,)).fetchone() == ({"a": "é"},)
