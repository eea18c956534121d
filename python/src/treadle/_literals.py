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

from collections.abc import Iterable
from datetime import timedelta
from functools import lru_cache
from uuid import UUID


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
