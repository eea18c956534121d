"""The caller's connection: what producer calls accept, and the extension check made once per connection.

A call runs one statement on the caller's connection, inside whatever transaction
that connection is in; treadle never commits or rolls it back. Accepted:

- a psycopg `Connection`: the statement runs now;
- a psycopg `AsyncConnection`: the call returns a coroutine that runs it;
- a SQLAlchemy `Connection` or `Session` on the psycopg driver
  (`postgresql+psycopg://`): SQLAlchemy's transaction is begun if it has not
  begun yet (as its autobegin would), then the statement runs on the DBAPI
  connection underneath, so SQLAlchemy's commit or rollback covers it.

The statement and its parameters are built once by the caller of `execute`; only
the way they are sent differs.

`execute_scalar` (enqueue's common call) runs on a cursor kept per connection: a fresh
psycopg cursor looks its parameters' dumpers and its result's loader up again at every
call, which costs a single enqueue about a quarter of its client time. The kept cursor
is treadle's own (its own row factory, its own copy of the connection's adapters, made
with the connection's `cursor_factory`), so nothing of it shows on the caller's
connection; it is used by one thread at a time (a thread that finds it in use takes a
fresh cursor), and it is made anew when the connection's `cursor_factory` or client
encoding changes. It holds the connection through a weak proxy, and the cache is keyed
weakly: a connection the application drops is freed as it would be without treadle.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar, overload

import psycopg
from psycopg.rows import dict_row, tuple_row

from ._compat import read_extension_version, read_extension_version_async
from .errors import mapped_errors, translate

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.orm import Session
    from typing_extensions import LiteralString

    SyncConnection: TypeAlias = psycopg.Connection[Any] | SAConnection | Session
    AnyConnection: TypeAlias = SyncConnection | psycopg.AsyncConnection[Any]

T = TypeVar("T")
Rows = list[dict[str, Any]]

# connections whose extension version was found supported; weak, so a closed
# and dropped connection leaves nothing behind
_verified: weakref.WeakSet[psycopg.Connection[Any] | psycopg.AsyncConnection[Any]] = weakref.WeakSet()


class _KeptCursor:
    """`execute_scalar`'s cursor for one connection, and what it was made for."""

    __slots__ = ("cursor", "encoding", "factory", "lock")

    def __init__(self, conn: psycopg.Connection[Any], encoding: bytes | None) -> None:
        self.factory = conn.cursor_factory
        self.encoding = encoding  # its dumpers encode text as the connection did when they were made
        # a proxy: the cursor must not keep its connection alive, nor make a cycle with it
        self.cursor: psycopg.Cursor[tuple[Any, ...]] = self.factory(weakref.proxy(conn), row_factory=tuple_row)
        self.lock = threading.Lock()


# verified connections' kept cursors (execute_scalar); weak keys, and the cursor holds
# its connection through a weak proxy, so an entry goes with its connection
_kept: weakref.WeakKeyDictionary[psycopg.Connection[Any], _KeptCursor] = weakref.WeakKeyDictionary()

_ASYNC_SQLALCHEMY_HINT = (
    "pass the psycopg connection underneath: "
    "raw = await (await session.connection()).get_raw_connection(); "
    "treadle.enqueue(raw.driver_connection, ...)"
)


@overload
def execute(
    conn: psycopg.AsyncConnection[Any], query: LiteralString, params: Mapping[str, Any], read: Callable[[Rows], T]
) -> Coroutine[Any, Any, T]: ...
@overload
def execute(conn: SyncConnection, query: LiteralString, params: Mapping[str, Any], read: Callable[[Rows], T]) -> T: ...
def execute(
    conn: AnyConnection, query: LiteralString, params: Mapping[str, Any], read: Callable[[Rows], T]
) -> T | Coroutine[Any, Any, T]:
    """Run one statement on `conn` and return `read(rows)`, or a coroutine of it for async."""
    if isinstance(conn, psycopg.AsyncConnection):
        return _execute_async(conn, query, params, read)
    target = sync_connection(conn)
    ensure_extension(target)
    with mapped_errors(), target.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return read(cur.fetchall())


def execute_scalar(conn: AnyConnection, query: LiteralString, params: Mapping[str, Any]) -> Any:
    """`execute` of a statement that returns one value, read from the first row's first column.

    On a psycopg Connection the row is read as a tuple and the errors mapped inline: a hot
    call (enqueue) pays for no dict row and no context manager.
    """
    if isinstance(conn, psycopg.AsyncConnection):
        return _execute_async(conn, query, params, _first_value)
    target = sync_connection(conn)
    kept = _kept.get(target)
    with target.lock:  # libpq's parameters change while a statement's results are read
        encoding = target.pgconn.parameter_status(b"client_encoding")
    if kept is None or kept.encoding != encoding or kept.factory is not target.cursor_factory:
        ensure_extension(target)
        kept = _kept[target] = _KeptCursor(target, encoding)
    if kept.lock.acquire(blocking=False):
        cur = kept.cursor
        fresh = False
    else:  # another thread runs on this connection's kept cursor now
        cur = target.cursor(row_factory=tuple_row)
        fresh = True
    try:
        cur.execute(query, params)
        row = cur.fetchone()
    except psycopg.Error as error:
        mapped = translate(error)
        if mapped is error:
            raise
        raise mapped from error
    finally:
        if fresh:
            cur.close()
        else:
            kept.lock.release()
    return None if row is None else row[0]


def _first_value(rows: Rows) -> Any:
    return next(iter(rows[0].values()))


async def _execute_async(
    conn: psycopg.AsyncConnection[Any], query: LiteralString, params: Mapping[str, Any], read: Callable[[Rows], T]
) -> T:
    await ensure_extension_async(conn)
    with mapped_errors():
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, params)
            return read(await cur.fetchall())


def sync_connection(conn: object) -> psycopg.Connection[Any]:
    """The psycopg connection to run on; SQLAlchemy objects are unwrapped inside their transaction."""
    if isinstance(conn, psycopg.Connection):
        return conn
    driver = _from_sqlalchemy(conn)
    if driver is not None:
        return driver
    if isinstance(conn, psycopg.AsyncConnection):
        raise TypeError("this call needs a synchronous psycopg Connection, not an AsyncConnection")
    pool = sys.modules.get("psycopg_pool")
    if pool is not None and isinstance(conn, (pool.ConnectionPool, pool.AsyncConnectionPool)):
        raise TypeError(
            "treadle runs in a connection's transaction, so it needs a connection, not a pool: "
            "with pool.connection() as conn: treadle.enqueue(conn, ...)"
        )
    raise TypeError(
        "treadle needs a psycopg Connection or AsyncConnection, or a SQLAlchemy Connection or Session "
        f"on the psycopg driver; got {type(conn).__module__}.{type(conn).__qualname__}"
    )


def _from_sqlalchemy(conn: object) -> psycopg.Connection[Any] | None:
    # An object of a module that was never imported cannot be one of its instances,
    # so SQLAlchemy is only looked at when the application uses it.
    orm = sys.modules.get("sqlalchemy.orm")
    engine = sys.modules.get("sqlalchemy.engine")
    asyncio_ext = sys.modules.get("sqlalchemy.ext.asyncio")
    if asyncio_ext is not None and isinstance(conn, (asyncio_ext.AsyncConnection, asyncio_ext.AsyncSession)):
        raise TypeError(f"SQLAlchemy's asyncio objects cannot be used directly: {_ASYNC_SQLALCHEMY_HINT}")
    if orm is not None and isinstance(conn, orm.Session):
        sa_conn = conn.connection()  # begins the session's transaction when none is open
    elif engine is not None and isinstance(conn, engine.Connection):
        sa_conn = conn
        if not sa_conn.in_transaction():
            sa_conn.begin()  # what SQLAlchemy's autobegin does, so its commit() covers our statement
    else:
        return None
    driver = sa_conn.connection.driver_connection
    if not isinstance(driver, psycopg.Connection):
        raise TypeError(
            "treadle needs SQLAlchemy's psycopg driver (a postgresql+psycopg:// URL); "
            f"this engine uses {type(driver).__module__}"
        )
    return driver


def ensure_extension(conn: psycopg.Connection[Any]) -> None:
    """Raise unless the database has a supported treadle; one query per connection.

    The query reads pg_catalog and cannot fail, so it never puts the caller's
    transaction into an error state, whatever the answer.
    """
    if conn in _verified:
        return
    read_extension_version(conn)
    _verified.add(conn)


async def ensure_extension_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """`ensure_extension` for an AsyncConnection."""
    if conn in _verified:
        return
    await read_extension_version_async(conn)
    _verified.add(conn)
