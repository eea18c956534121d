"""`wait`: block until a job finishes and hand back its result.

The job row is the truth. The loop reads it, and between reads sleeps up to
`poll_interval`, waking early when a treadle_done notification names the job's
queue. The logic lives in one generator (`outcome`) that asks for "read the row"
or "pause"; small drivers answer those requests for each kind of connection,
synchronous or asynchronous, so every way of waiting decides the same way.

How the connection is used:
- a DSN: a connection of our own (autocommit) that LISTENs, opened again if it
  breaks; closed when the wait ends;
- an autocommit connection outside a transaction that listens to nothing else:
  LISTEN on it for the wait, UNLISTEN afterwards;
- a connection inside a transaction: reads in that transaction, polling only (it
  must be READ COMMITTED, or it would never see the job change);
- a non-autocommit connection outside a transaction: each read is followed by a
  rollback of the transaction that read opened, so the connection is left idle.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import Notify
from psycopg.pq import TransactionStatus

from . import _conn, _listen, _sql
from .errors import InvalidArgument, JobCancelled, JobFailed, JobNotFound, WaitTimeout

READ = "read"  # the loop asks for the job row
UNKNOWN: Any = object()  # the row could not be read this time (our own connection was lost)
_VISIBLE_ISOLATIONS = frozenset({"read committed", "read uncommitted"})


@dataclass(frozen=True)
class Pause:
    """The loop asks to sleep up to `seconds`, waking on a notification for `queue`."""

    seconds: float
    queue: str | None


Loop = Generator["Pause | str", Any, Any]


def outcome(job_id: int, timeout: float | None, poll_interval: float) -> Loop:
    """Read, decide, pause, again: returns the result or raises how the job ended."""
    deadline = None if timeout is None else time.monotonic() + timeout
    queue: str | None = None
    while True:
        row = yield READ
        if row is None:
            raise JobNotFound(job_id)
        if row is not UNKNOWN:
            queue = row["queue"]
            if row["state"] == "completed":
                return row["result"]
            if row["state"] == "discarded":
                raise JobFailed(job_id, row["last_error"])
            if row["state"] == "cancelled":
                raise JobCancelled(job_id)
        pause = poll_interval
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                assert timeout is not None
                raise WaitTimeout(job_id, timeout)
            pause = min(pause, left)
        yield Pause(pause, queue)


def wakes(notify: Notify, pause: Pause) -> bool:
    return notify.channel == _sql.CHANNEL_DONE and (pause.queue is None or notify.payload == pause.queue)


def _first(rows: _conn.Rows) -> dict[str, Any] | None:
    return rows[0] if rows else None


def drive(loop: Loop, read: Callable[[], Any], pause: Callable[[Pause], None]) -> Any:
    try:
        request = next(loop)
        while True:
            if isinstance(request, Pause):
                pause(request)
                request = loop.send(None)
            else:
                request = loop.send(read())
    except StopIteration as finished:
        return finished.value
    finally:
        loop.close()


async def drive_async(loop: Loop, read: Callable[[], Awaitable[Any]], pause: Callable[[Pause], Awaitable[None]]) -> Any:
    try:
        request = next(loop)
        while True:
            if isinstance(request, Pause):
                await pause(request)
                request = loop.send(None)
            else:
                request = loop.send(await read())
    except StopIteration as finished:
        return finished.value
    finally:
        loop.close()


def _sleep(pause: Pause) -> None:
    time.sleep(pause.seconds)


async def _sleep_async(pause: Pause) -> None:
    await asyncio.sleep(pause.seconds)


# -- a DSN: a listening connection of our own -------------------------------------------------


def wait_dsn(dsn: str, job_id: int, loop: Loop, listen: bool) -> Any:
    listener = _listen.Listener(dsn, [_sql.LISTEN_DONE] if listen else [])
    listener.open()

    def read() -> Any:
        try:
            conn = listener.connection()
        except psycopg.OperationalError:
            return UNKNOWN
        try:
            return _conn.execute(conn, _sql.JOB_OUTCOME, {"job_id": job_id}, _first)
        except psycopg.OperationalError as error:
            listener.lost(error)
            return UNKNOWN

    def pause(request: Pause) -> None:
        end = time.monotonic() + request.seconds
        while (left := end - time.monotonic()) > 0:
            if any(wakes(notify, request) for notify in listener.receive(left)):
                return

    try:
        return drive(loop, read, pause)
    finally:
        listener.close()


# -- the caller's synchronous connection ------------------------------------------------------


def wait_connection(conn: psycopg.Connection[Any], job_id: int, loop: Loop, listen: bool) -> Any:
    params = {"job_id": job_id}

    def read() -> Any:
        return _conn.execute(conn, _sql.JOB_OUTCOME, params, _first)

    if listen and _listen.can_borrow(conn):
        if not _listen.listen(conn, [_sql.LISTEN_DONE]):
            return drive(loop, read, _sleep)

        def pause(request: Pause) -> None:
            for notify in conn.notifies(timeout=request.seconds):
                if wakes(notify, request):
                    return

        try:
            return drive(loop, read, pause)
        finally:
            if not conn.broken:
                conn.execute(_sql.UNLISTEN_DONE)
                for _ in conn.notifies(timeout=0):
                    pass  # drop hints that arrived before UNLISTEN: the caller listens to nothing

    status = conn.info.transaction_status
    if status != TransactionStatus.IDLE:
        _require_visible(_conn.execute(conn, _sql.TRANSACTION_ISOLATION, {}, _isolation))
        return drive(loop, read, _sleep)
    if conn.autocommit:
        return drive(loop, read, _sleep)

    def read_and_end() -> Any:
        try:
            return read()
        finally:
            conn.rollback()  # ends only the transaction this read opened

    return drive(loop, read_and_end, _sleep)


# -- the caller's asynchronous connection -----------------------------------------------------


async def wait_async(conn: psycopg.AsyncConnection[Any], job_id: int, loop: Loop, listen: bool) -> Any:
    params = {"job_id": job_id}

    async def read() -> Any:
        return await _conn.execute(conn, _sql.JOB_OUTCOME, params, _first)

    if listen and await _listen.can_borrow_async(conn):
        if not await _listen.listen_async(conn, [_sql.LISTEN_DONE]):
            return await drive_async(loop, read, _sleep_async)

        async def pause(request: Pause) -> None:
            async for notify in conn.notifies(timeout=request.seconds):
                if wakes(notify, request):
                    return

        try:
            return await drive_async(loop, read, pause)
        finally:
            if not conn.broken:
                await conn.execute(_sql.UNLISTEN_DONE)
                async for _ in conn.notifies(timeout=0):
                    pass  # drop hints that arrived before UNLISTEN: the caller listens to nothing

    status = conn.info.transaction_status
    if status != TransactionStatus.IDLE:
        _require_visible(await _conn.execute(conn, _sql.TRANSACTION_ISOLATION, {}, _isolation))
        return await drive_async(loop, read, _sleep_async)
    if conn.autocommit:
        return await drive_async(loop, read, _sleep_async)

    async def read_and_end() -> Any:
        try:
            return await read()
        finally:
            await conn.rollback()  # ends only the transaction this read opened

    return await drive_async(loop, read_and_end, _sleep_async)


def _isolation(rows: _conn.Rows) -> str:
    return str(rows[0]["isolation"])


def _require_visible(isolation: str) -> None:
    if isolation not in _VISIBLE_ISOLATIONS:
        raise InvalidArgument(
            f"wait cannot see other transactions finish the job from inside a {isolation} transaction: "
            "pass a DSN, or a connection outside a transaction"
        )
