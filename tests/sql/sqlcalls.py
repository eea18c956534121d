"""What the SQL tests share: connection types, and one row or one value from a statement."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

Connect = Callable[..., psycopg.Connection]
WaitBlocked = Callable[[int], None]


def row(conn: psycopg.Connection, sql: str, params: tuple[Any, ...] | list[Any] = ()) -> tuple[Any, ...]:
    """The row a statement returns (the first, when it returns more); fails when there is none."""
    found = conn.execute(sql, params).fetchone()
    assert found is not None, f"no row from: {sql}"
    return found


def value(conn: psycopg.Connection, sql: str, params: tuple[Any, ...] | list[Any] = ()) -> Any:
    """The first column of the row a statement returns."""
    return row(conn, sql, params)[0]


def claim_plainly(conn: psycopg.Connection, queues: list[str], names: list[str] | None = None) -> None:
    """Put the session's next claim from `queues` (and `names`) on the plain path: three
    claims over 2 ms in a row, as a loaded machine makes them, switch a session to a cursor."""
    conn.execute("select set_config(treadle._claim_setting(%s::text[], %s::text[]), '', false)", (queues, names))
