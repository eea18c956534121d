"""Array and interval parameters written as PostgreSQL literals, for the worker's per-batch statements.

psycopg dumps a Python list element by element, choosing a dumper for the list by
looking at its elements first: for the worker's finish-and-claim (ten ids, ten lease
tokens, ten queue names, the queues and job names it serves, the lease) that was
about 40 us of Python a statement, as much as the rest of the call. A literal is a
str, which psycopg sends as it is (an untyped parameter); every statement that takes
one casts it (`%(job_ids)s::bigint[]`), so the server reads it as that type, the same
values as before.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from functools import lru_cache
from typing import TYPE_CHECKING, Any
from uuid import UUID

if TYPE_CHECKING:
    import psycopg
    from typing_extensions import LiteralString


def bigint_array(values: Iterable[int]) -> str:
    """`{1,2,3}`: a bigint[] literal."""
    return "{" + ",".join([str(int(value)) for value in values]) + "}"


def uuid_array(values: Iterable[UUID]) -> str:
    """A uuid[] literal: each UUID's 32 hex digits, which PostgreSQL reads as they are (no quotes,
    no hyphens: UUID.hex is a third of the time of str(UUID))."""
    return "{" + ",".join([value.hex for value in values]) + "}"


def text_array(values: Iterable[str]) -> str:
    """A text[] literal, every element quoted (a backslash and a double quote escaped)."""
    return "{" + ",".join([_quoted(value) for value in values]) + "}"


@lru_cache(maxsize=1024)  # the queue names of a worker's jobs: a few, over and over
def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def interval(value: timedelta) -> str:
    """An interval literal, exact to the microsecond (as psycopg would send `value`)."""
    return f"{value // timedelta(microseconds=1)} microseconds"


def constant(value: str) -> str:
    """`value` as a string constant of a statement's text: E'...', each backslash and quote doubled.

    An escape string constant reads the same whatever standard_conforming_strings is, and
    each % is doubled, as psycopg reads % in a statement that takes parameters. ValueError
    for a NUL, which no statement's text can hold.
    """
    if "\x00" in value:
        raise ValueError("a string constant cannot hold a NUL character")
    return "E'" + value.replace("\\", "\\\\").replace("'", "''").replace("%", "%%") + "'"


def with_constants(statement: LiteralString, values: Mapping[str, str | None]) -> LiteralString:
    """`statement` with each of its placeholders `%(key)s` named in `values` written as a constant.

    A value is the text psycopg would have sent for that parameter (a literal of this
    module, or the text itself; None: NULL); the cast that follows the placeholder in
    `statement` reads it as before. The other placeholders stay parameters (the
    statement must still be run with parameters: its % are doubled). ValueError when
    a value holds a NUL.
    """
    written = {key: "NULL" if value is None else constant(value) for key, value in values.items()}
    # (built only from a LiteralString and constants quoted here)
    return re.sub(r"%\((\w+)\)s", lambda m: written.get(m[1], m[0]), statement)


@dataclass(frozen=True)
class Fixed:
    """A statement some of whose arguments are the same at every call (a worker's queues, job
    names, id and lease), and how to run it on a connection.

    Where the connection prepares statements, those arguments are written into its text
    (`written`): the prepared statement parses them once, where a list sent as a
    parameter is sent and parsed at every call (1,000 queue names: about a tenth of a
    millisecond of the server's time). Where it does not (through a pooler), they are
    sent as parameters: parsing a long constant in the statement's text costs the server
    more than reading the same parameter (1,000 names: about 35 us a call against 110).
    """

    template: LiteralString
    values: Mapping[str, str | None]
    written: LiteralString | None  # None: a value holds a NUL, which only a parameter can carry (and is refused)
    ascii: bool = False  # `written` is ASCII only: every client encoding carries it

    @classmethod
    def of(cls, template: LiteralString, values: Mapping[str, str | None]) -> Fixed:
        try:
            written: LiteralString | None = with_constants(template, values)
        except ValueError:
            written = None
        return cls(template, dict(values), written, written is not None and written.isascii())

    def query(
        self, prepared: bool, params: Mapping[str, Any], conn: psycopg.Connection[Any] | None = None
    ) -> tuple[LiteralString, Mapping[str, Any]]:
        """The statement and parameters to send on a connection that prepares statements or not.

        The text is written in only where `conn`'s client encoding carries it (None: one that
        carries any text, as UTF8 does). psycopg encodes a statement's text in the client
        encoding, and under SQL_ASCII as ASCII, where it sends a str parameter as UTF-8: a
        name outside ASCII there (or outside LATIN1 under LATIN1) is sent as a parameter, and
        the statement does what it does with parameters.
        """
        written = self.written
        if prepared and written is not None and (self.ascii or conn is None or _encodes(written, conn.info.encoding)):
            return written, params
        return self.template, {**self.values, **params}


@lru_cache(maxsize=16)  # a worker's two statements, on connections of one encoding
def _encodes(text: str, encoding: str) -> bool:
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        return False
    return True
