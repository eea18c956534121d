"""Connection strings: read once before anything connects, and never shown with their password.

libpq quotes what it cannot read: a password holding a stray `%` comes back whole in
"invalid percent-encoded token", and a pool that retries logs that message on every
try. So the worker, the dashboard and the CLI read their connection string once
(`check`) and stop at once, with the password cut out (`redact`), when it cannot be
read; and the loggers that print libpq's messages pass them through `Redactor` first.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from urllib.parse import unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict

from .errors import InvalidArgument

HIDDEN = "***"

# the loggers that may print libpq's messages: the pools', the worker's, the dashboard's
REDACTED_LOGGERS = ("psycopg", "psycopg.pool", "treadle", "treadle.worker", "treadle.metrics", "treadle.dashboard")

# how libpq finds a URI's user:password@ (up to the first @ or /), and a password given as a value
_URI_USERINFO = re.compile(r"^\s*postgres(?:ql)?://([^@/]*)@", re.IGNORECASE)
_URI_PARAMETER = re.compile(r"[?&]password=([^&#]*)", re.IGNORECASE)
_KEYWORD_VALUE = re.compile(r"(?:^|\s)password\s*=\s*('(?:[^'\\]|\\.)*'?|\S+)", re.IGNORECASE)
# what libpq quotes from a URI it cannot decode
_UNDECODABLE = re.compile(r'(percent-encoded token: )"[^"]*"')


def passwords(dsn: str | None) -> list[str]:
    """The parts of `dsn` never to show: its password as written, quoted and decoded; longest first."""
    if not dsn:
        return []
    found: set[str] = set()
    try:
        value = conninfo_to_dict(dsn).get("password")
        if value:
            found.add(str(value))
    except psycopg.Error:
        pass  # unreadable: what is written is all there is
    userinfo = _URI_USERINFO.match(dsn)
    if userinfo and ":" in userinfo.group(1):
        found.add(userinfo.group(1).split(":", 1)[1])
    found.update(match.group(1) for match in _URI_PARAMETER.finditer(dsn))
    for match in _KEYWORD_VALUE.finditer(dsn):
        written = match.group(1)
        found.update({written, written.strip("'"), written.strip("'").replace("\\'", "'").replace("\\\\", "\\")})
    found.update({unquote(secret) for secret in found})
    return sorted((secret for secret in found if secret), key=len, reverse=True)


def redact(text: str, dsns: Iterable[str | None]) -> str:
    """`text` with every password of `dsns` replaced by ***."""
    for dsn in dsns:
        for secret in passwords(dsn):
            text = text.replace(secret, HIDDEN)
    return text


def check(dsn: str, what: str = "the connection string") -> None:
    """Raise InvalidArgument, the password cut out of libpq's reason, unless libpq can read `dsn`."""
    if not dsn.strip():
        raise InvalidArgument(f"{what} must not be empty")
    try:
        conninfo_to_dict(dsn)
    except psycopg.Error as error:
        lines = str(error).strip().splitlines()
        reason = _UNDECODABLE.sub(rf'\1"{HIDDEN}"', lines[0] if lines else type(error).__name__)
        raise InvalidArgument(f"{what} cannot be read: {redact(reason, [dsn])}") from None


class Redactor(logging.Filter):
    """Cuts the passwords of the connection strings it was given out of each record's message."""

    def __init__(self, *dsns: str | None) -> None:
        super().__init__()
        self._secrets = sorted({secret for dsn in dsns for secret in passwords(dsn)}, key=len, reverse=True)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._secrets:
            return True
        message = record.getMessage()
        hidden = message
        for secret in self._secrets:
            hidden = hidden.replace(secret, HIDDEN)
        if record.exc_info and record.exc_info[1] is not None:
            # the traceback is formatted later, by the handler: when it holds a password,
            # it goes into the message, redacted, instead
            trace = logging.Formatter().formatException(record.exc_info)
            if any(secret in trace for secret in self._secrets):
                for secret in self._secrets:
                    trace = trace.replace(secret, HIDDEN)
                record.exc_info, record.exc_text = None, None
                hidden = f"{hidden}\n{trace}"
        if hidden != message:
            record.msg, record.args = hidden, None
        return True

    def install(self) -> None:
        """Filter what the loggers that may print libpq's messages log from now on."""
        if self._secrets:
            for name in REDACTED_LOGGERS:
                logging.getLogger(name).addFilter(self)

    def remove(self) -> None:
        for name in REDACTED_LOGGERS:
            logging.getLogger(name).removeFilter(self)
