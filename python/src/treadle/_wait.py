"""`wait` and `wait_workflow`: block until a job or a workflow run finishes.

The row is the truth. The loop reads it, and between reads sleeps up to
`poll_interval`, waking early when a notification names the row's queue. Finishes
notify only sessions that wait (treadle.listen_done): a listening connection
registers for the row's queue, then LISTENs, and only then reads, so a finish
either notifies it or is seen by that read. The
logic lives in one generator per kind of row (`outcome`, `run_outcome`) that
asks for "read the row" or "pause"; small drivers answer those requests for each
kind of connection, synchronous or asynchronous, given a `Watched` (the
statement that reads the row, and the notification that wakes the wait), so
every way of waiting decides the same way.

How the connection is used:
- with `listen_dsn`: LISTEN on a connection of our own to that server (a direct
  one, when reads go through a pooler), opened for the wait; reads as below;
- a DSN: a connection of our own (autocommit) that LISTENs when it reaches the
  server directly (polling through a pooler), opened again if it breaks; closed
  when the wait ends;
- an autocommit connection outside a transaction that listens to nothing else
  and reaches the server directly: LISTEN on it for the wait, UNLISTEN afterwards;
- a connection inside a transaction: reads in that transaction, polling only (it
  must be READ COMMITTED, or it would never see the row change);
- a non-autocommit connection outside a transaction: each read is followed by a
  rollback of the transaction that read opened, so the connection is left idle.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import Notify, sql
from psycopg.pq import TransactionStatus

from . import _conn, _sql
from ._json import from_json
from ._notifier import Notifier, is_direct, listen, listen_async
from .errors import (
    InvalidArgument,
    JobCancelled,
    JobFailed,
    JobNotFound,
    WaitTimeout,
    WorkflowCancelled,
    WorkflowFailed,
    WorkflowNotFound,
)

if TYPE_CHECKING:
    from psycopg.abc import Query
    from typing_extensions import LiteralString

log = logging.getLogger("treadle")


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


READ = "read"  # the loop asks for the row
UNKNOWN = _Marker("UNKNOWN")  # the row could not be read this time (our own connection was lost)
PENDING = _Marker("PENDING")  # the row was read and has not finished yet
_VISIBLE_ISOLATIONS = frozenset({"read committed", "read uncommitted"})

Row = dict[str, Any]


@dataclass(frozen=True)
class Pause:
    """The loop asks to sleep up to `seconds`, waking on a notification for `queue`."""

    seconds: float
    queue: str | None


@dataclass(frozen=True)
class Watched:
    """What a driver reads each time, and which notification makes it read early.

    `query` returns at most one row, with a `queue` column whenever it returns one.
    """

    query: LiteralString
    params: Mapping[str, Any]
    channel: str  # a notification here whose payload is the row's queue wakes the wait
    listen: LiteralString
    unlisten: LiteralString
    register: Query  # before `listen`: this session waits for finishes on the row's queue
    waiter: str  # the public function, and what it waits for, to name in messages
    subject: str


Loop = Generator["Pause | str", Any, Any]


def job(job_id: int) -> Watched:
    # built per call, so the statements in _sql are looked up when a wait starts
    return Watched(
        _sql.JOB_OUTCOME,
        {"job_id": job_id},
        _sql.CHANNEL_DONE,
        _sql.LISTEN_DONE,
        _sql.UNLISTEN_DONE,
        sql.SQL(_sql.WAIT_FOR_JOB).format(sql.Literal(job_id)),
        "wait",
        "the job",
    )


def workflow_run(run_id: int) -> Watched:
    # step jobs run in their run's queue, so treadle_done naming that queue covers every step
    return Watched(
        _sql.RUN_OUTCOME,
        {"run_id": run_id},
        _sql.CHANNEL_DONE,
        _sql.LISTEN_DONE,
        _sql.UNLISTEN_DONE,
        sql.SQL(_sql.WAIT_FOR_RUN).format(sql.Literal(run_id)),
        "wait_workflow",
        "the workflow run",
    )


def outcome(job_id: int, timeout: float | None, poll_interval: float) -> Loop:
    """The job's result, or raises how the job ended."""

    def settle(row: Row | None) -> Any:
        if row is None:
            raise JobNotFound(job_id)
        if row["state"] == "completed":
            return from_json(row["result"], f"job {job_id}'s result")
        if row["state"] == "discarded":
            raise JobFailed(job_id, row["last_error"])
        if row["state"] == "cancelled":
            raise JobCancelled(job_id)
        return PENDING

    return _loop(settle, timeout, poll_interval, lambda limit: WaitTimeout(job_id, limit))


def run_outcome(run_id: int, timeout: float | None, poll_interval: float) -> Loop:
    """The run's results keyed by step name, or raises how the run ended."""

    def settle(row: Row | None) -> Any:
        if row is None:
            raise WorkflowNotFound(run_id)
        if row["children_running"]:
            return PENDING  # a run that ended before a child of it (cancelled, failed) waits for the child
        if row["state"] == "completed":
            return from_json(row["results"], f"workflow run {run_id}'s results")
        if row["state"] in ("failed", "compensated"):  # compensated: failed, and its completed steps undone
            raise WorkflowFailed(run_id, row["step"], row["last_error"])
        if row["state"] == "cancelled":
            raise WorkflowCancelled(run_id)
        return PENDING

    return _loop(settle, timeout, poll_interval, lambda limit: WaitTimeout(None, limit, run_id=run_id))


def _loop(
    settle: Callable[[Row | None], Any],
    timeout: float | None,
    poll_interval: float,
    expired: Callable[[float], WaitTimeout],
) -> Loop:
    """Read, settle, pause, again: returns what `settle` returns once it is not PENDING."""
    deadline = None if timeout is None else time.monotonic() + timeout
    queue: str | None = None
    while True:
        row = yield READ
        if row is not UNKNOWN:
            settled = settle(row)
            if settled is not PENDING:
                return settled
            queue = row["queue"]
        pause = poll_interval
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                assert timeout is not None
                raise expired(timeout)
            pause = min(pause, left)
        yield Pause(pause, queue)


def wakes(notify: Notify, pause: Pause, watched: Watched) -> bool:
    return notify.channel == watched.channel and (pause.queue is None or notify.payload == pause.queue)


def _first(rows: _conn.Rows) -> Row | None:
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


def _direct(dsn: str) -> Callable[[], psycopg.Connection[Any]]:
    return lambda: psycopg.connect(dsn, autocommit=True)


def hints_from(listen_dsn: str, watched: Watched) -> Notifier:
    """A notifier on the connection the caller named for LISTEN (trusted: it reaches the server)."""
    hints = Notifier(_direct(listen_dsn), _listening(watched), log, trusted=True, closing=[_sql.STOP_WAITING])
    hints.open()
    return hints


def _listening(watched: Watched) -> list[Query]:
    """Register, then LISTEN: the statements that make finishes on the row's queue notify this session."""
    return [watched.register, watched.listen]


def pause_on(hints: Notifier, watched: Watched) -> Callable[[Pause], None]:
    def pause(request: Pause) -> None:
        end = time.monotonic() + request.seconds
        while (left := end - time.monotonic()) > 0:
            if any(wakes(notify, request, watched) for notify in hints.receive(left)):
                return

    return pause


def wait_dsn(dsn: str, watched: Watched, loop: Loop, listen: bool, listen_dsn: str | None) -> Any:
    reader = Notifier(
        _direct(dsn), _listening(watched) if listen and listen_dsn is None else [], log, closing=[_sql.STOP_WAITING]
    )
    reader.open()
    hints = hints_from(listen_dsn, watched) if listen and listen_dsn is not None else reader

    def read() -> Any:
        try:
            conn = reader.connection()
        except psycopg.OperationalError:
            return UNKNOWN
        try:
            return _conn.execute(conn, watched.query, watched.params, _first)
        except psycopg.OperationalError as error:
            reader.lost(error)
            return UNKNOWN

    try:
        return drive(loop, read, pause_on(hints, watched))
    finally:
        reader.close()
        hints.close()


# -- the caller's synchronous connection ------------------------------------------------------


def can_borrow(conn: psycopg.Connection[Any]) -> bool:
    """Whether `wait` may LISTEN on the caller's connection and undo it afterwards.

    Only an autocommit connection outside a transaction that listens to nothing
    else and reaches the server directly: LISTEN there touches no transaction, no
    notification of the caller's can be consumed by mistake, and no pooler hands
    the LISTEN on to another client.
    """
    if not conn.autocommit or conn.info.transaction_status != TransactionStatus.IDLE:
        return False
    return not _conn.execute(conn, _sql.LISTENING_CHANNELS, {}, bool) and is_direct(conn, log)


def wait_connection(
    conn: psycopg.Connection[Any], watched: Watched, loop: Loop, listen_on: bool, listen_dsn: str | None
) -> Any:
    def read() -> Any:
        return _conn.execute(conn, watched.query, watched.params, _first)

    if listen_on and listen_dsn is not None:
        hints = hints_from(listen_dsn, watched)
        try:
            return _drive_polling(conn, watched, loop, read, pause_on(hints, watched))
        finally:
            hints.close()

    if listen_on and can_borrow(conn):
        if not listen(conn, _listening(watched), log):
            return drive(loop, read, _sleep)

        def pause(request: Pause) -> None:
            for notify in conn.notifies(timeout=request.seconds):
                if wakes(notify, request, watched):
                    return

        try:
            return drive(loop, read, pause)
        finally:
            if not conn.broken:
                conn.execute(watched.unlisten)
                conn.execute(_sql.STOP_WAITING)
                for _ in conn.notifies(timeout=0):
                    pass  # drop hints that arrived before UNLISTEN: the caller listens to nothing

    return _drive_polling(conn, watched, loop, read, _sleep)


def _drive_polling(
    conn: psycopg.Connection[Any], watched: Watched, loop: Loop, read: Callable[[], Any], pause: Callable[[Pause], None]
) -> Any:
    """Reads on the caller's connection without LISTEN on it, leaving its transaction as it was."""
    status = conn.info.transaction_status
    if status != TransactionStatus.IDLE:
        _require_visible(_conn.execute(conn, _sql.TRANSACTION_ISOLATION, {}, _isolation), watched)
        return drive(loop, read, pause)
    if conn.autocommit:
        return drive(loop, read, pause)

    def read_and_end() -> Any:
        try:
            return read()
        finally:
            conn.rollback()  # ends only the transaction this read opened

    return drive(loop, read_and_end, pause)


# -- the caller's asynchronous connection -----------------------------------------------------


async def can_borrow_async(conn: psycopg.AsyncConnection[Any]) -> bool:
    """`can_borrow` for an AsyncConnection."""
    if not conn.autocommit or conn.info.transaction_status != TransactionStatus.IDLE:
        return False
    if await _conn.execute(conn, _sql.LISTENING_CHANNELS, {}, bool):
        return False
    port = await _conn.execute(conn, _sql.SERVER_PORT, {}, _port)
    if port is not None and port != conn.info.port:
        log.info(
            "treadle: port %s is not the server's own (%s): polling instead of LISTEN through a pooler",
            conn.info.port,
            port,
        )
        return False
    return True


async def wait_async(
    conn: psycopg.AsyncConnection[Any], watched: Watched, loop: Loop, listen_on: bool, listen_dsn: str | None
) -> Any:
    async def read() -> Any:
        return await _conn.execute(conn, watched.query, watched.params, _first)

    if listen_on and listen_dsn is not None:
        hints = await psycopg.AsyncConnection.connect(listen_dsn, autocommit=True)
        try:
            if not await listen_async(hints, _listening(watched), log):
                return await _drive_polling_async(conn, watched, loop, read, _sleep_async)
            try:
                return await _drive_polling_async(conn, watched, loop, read, _pause_on_async(hints, watched))
            finally:
                if not hints.broken:
                    await hints.execute(_sql.STOP_WAITING)
        finally:
            await hints.close()

    if listen_on and await can_borrow_async(conn):
        if not await listen_async(conn, _listening(watched), log):
            return await drive_async(loop, read, _sleep_async)

        try:
            return await drive_async(loop, read, _pause_on_async(conn, watched))
        finally:
            if not conn.broken:
                await conn.execute(watched.unlisten)
                await conn.execute(_sql.STOP_WAITING)
                async for _ in conn.notifies(timeout=0):
                    pass  # drop hints that arrived before UNLISTEN: the caller listens to nothing

    return await _drive_polling_async(conn, watched, loop, read, _sleep_async)


def _pause_on_async(conn: psycopg.AsyncConnection[Any], watched: Watched) -> Callable[[Pause], Awaitable[None]]:
    async def pause(request: Pause) -> None:
        async for notify in conn.notifies(timeout=request.seconds):
            if wakes(notify, request, watched):
                return

    return pause


async def _drive_polling_async(
    conn: psycopg.AsyncConnection[Any],
    watched: Watched,
    loop: Loop,
    read: Callable[[], Awaitable[Any]],
    pause: Callable[[Pause], Awaitable[None]],
) -> Any:
    status = conn.info.transaction_status
    if status != TransactionStatus.IDLE:
        _require_visible(await _conn.execute(conn, _sql.TRANSACTION_ISOLATION, {}, _isolation), watched)
        return await drive_async(loop, read, pause)
    if conn.autocommit:
        return await drive_async(loop, read, pause)

    async def read_and_end() -> Any:
        try:
            return await read()
        finally:
            await conn.rollback()  # ends only the transaction this read opened

    return await drive_async(loop, read_and_end, pause)


def _port(rows: _conn.Rows) -> int | None:
    return None if not rows else next(iter(rows[0].values()))


def _isolation(rows: _conn.Rows) -> str:
    return str(rows[0]["isolation"])


def _require_visible(isolation: str, watched: Watched) -> None:
    if isolation not in _VISIBLE_ISOLATIONS:
        raise InvalidArgument(
            f"{watched.waiter} cannot see other transactions finish {watched.subject} from inside a {isolation} "
            "transaction: pass a DSN, or a connection outside a transaction"
        )
