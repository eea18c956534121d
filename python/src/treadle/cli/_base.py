"""What every command shares: exit codes, errors, the database connection, output and parsing."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any, TypeAlias
from uuid import UUID

import psycopg
from psycopg.rows import DictRow, dict_row

from treadle import _display, _dsn
from treadle._compat import read_extension_version
from treadle._display import DURATION_HINT, DURATION_PATTERN
from treadle.errors import InvalidArgument

OK, ERROR, USAGE, NOT_FOUND, REFUSED = 0, 1, 2, 3, 4
EXIT_CODES = """exit codes:
  0  done
  1  error: the database is unreachable, treadle is not installed, a statement failed
  2  usage: a bad option or value (JSON, a time, a duration); nothing was written
  3  not found: a job id that no job has
  4  refused: a job's state does not allow it, a tenant's limit, a bulk action not confirmed,
     or an install or upgrade of a treadle another role owns"""
DSN_ENV = "DATABASE_URL"

Connection: TypeAlias = "psycopg.Connection[DictRow]"


class CommandError(Exception):
    """A problem the command reports in one line; `exit_code` says which kind."""

    exit_code = ERROR


class UsageError(CommandError):
    exit_code = USAGE


class NotFound(CommandError):
    exit_code = NOT_FOUND


class Refused(CommandError):
    exit_code = REFUSED


def error_line(message: str) -> None:
    """One line on stderr; never with the password of a connection string the command was given."""
    print(f"treadle: error: {_dsn.redact(message, given_dsns())}", file=sys.stderr)


_argv_dsns: list[str] = []


def remember_dsns(args: Sequence[str]) -> None:
    """Note the --dsn values in `args`, whose passwords error lines cut out (with $DATABASE_URL's)."""
    _argv_dsns.clear()
    for index, arg in enumerate(args):
        if arg == "--dsn" and index + 1 < len(args):
            _argv_dsns.append(args[index + 1])
        elif arg.startswith("--dsn="):
            _argv_dsns.append(arg.removeprefix("--dsn="))


def given_dsns() -> list[str | None]:
    return [os.environ.get(DSN_ENV), *_argv_dsns]


# -- the command line ------------------------------------------------------------------------


def command(
    commands: Any, name: str, help_text: str, examples: Sequence[str] = (), description: str | None = None
) -> argparse.ArgumentParser:
    """A subcommand whose --help ends with examples, as git's and kubectl's do."""
    epilog = "examples:\n" + "\n".join(f"  {line}" for line in examples) if examples else None
    return commands.add_parser(  # type: ignore[no-any-return]
        name,
        help=help_text,
        description=description or help_text[:1].upper() + help_text[1:] + ".",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_dsn(parser: argparse.ArgumentParser, note: str = "") -> None:
    parser.add_argument("--dsn", help=f"the database URL (default: ${DSN_ENV}){'; ' + note if note else ''}")


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON for scripts instead of a table")


def dsn_of(options: argparse.Namespace) -> str:
    dsn = options.dsn or os.environ.get(DSN_ENV)
    if not dsn:
        raise CommandError(f"no database: pass --dsn or set {DSN_ENV}")
    try:
        _dsn.check(str(dsn), f"the connection string in {where_from(options)}")
    except InvalidArgument as error:
        raise UsageError(str(error)) from None
    return str(dsn)


def where_from(options: argparse.Namespace) -> str:
    return "--dsn" if options.dsn else DSN_ENV


def describe_dsn(dsn: str) -> str:
    """The connection's target as libpq reads it, without its password."""
    try:
        parts = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "an unreadable connection string"
    shown = [f"{key}={parts[key]}" for key in ("host", "port", "dbname", "user") if parts.get(key)]
    return " ".join(shown) or "libpq's defaults (PGHOST, PGPORT, PGDATABASE, PGUSER)"


def _readable(dsn: str) -> bool:
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return False
    return True


@contextmanager
def connect(options: argparse.Namespace, *, check_installed: bool = True) -> Iterator[Connection]:
    """An autocommit connection to the command's database, with treadle checked to be installed."""
    dsn = dsn_of(options)
    if "connect_timeout" not in dsn:  # a server that does not answer: say so after 10 s, not never
        dsn = psycopg.conninfo.make_conninfo(dsn, connect_timeout=10) if _readable(dsn) else dsn
    try:
        conn = psycopg.connect(dsn, autocommit=True, row_factory=dict_row)
    except (psycopg.OperationalError, psycopg.ProgrammingError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CommandError(
            f"cannot connect to the database from {where_from(options)} ({describe_dsn(dsn)}): {reason}"
        ) from None
    with conn:
        if check_installed:
            read_extension_version(conn)  # ExtensionMissing, UnsupportedVersion: say which command fixes it
        yield conn


# -- values on the command line ---------------------------------------------------------------


def duration(text: str, what: str) -> timedelta:
    """A duration such as 90s, 10m, 2h, 7d or 1h30m; UsageError otherwise."""
    try:
        return _display.duration(text, what)
    except _display.DurationError as error:
        raise UsageError(str(error)) from None


def moment(text: str, what: str) -> datetime | timedelta:
    """An ISO 8601 time with its zone (Z for UTC), or a duration from now; UsageError otherwise."""
    if DURATION_PATTERN.match(text.strip().lower()):
        return duration(text, what)
    stamp = text.strip()
    try:
        value = datetime.fromisoformat(stamp[:-1] + "+00:00" if stamp.endswith(("Z", "z")) else stamp)
    except ValueError:
        raise UsageError(
            f"{what}: {text!r} is neither a time such as 2026-12-01T09:30:00+01:00 (Z for UTC) "
            f"nor a delay from now ({DURATION_HINT})"
        ) from None
    if value.tzinfo is None:
        raise UsageError(f"{what}: {text!r} has no time zone: add one, such as +01:00, or Z for UTC")
    return value


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer between low and high."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {value}")
        return value

    return parse


def positive_id(text: str) -> int:
    return bounded_int(1, 2**63 - 1)(text)


# -- output -------------------------------------------------------------------------------------


def json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def either(words: Sequence[str]) -> str:
    """a, b or c"""
    return " or ".join([", ".join(words[:-1]), words[-1]]) if len(words) > 1 else "".join(words)


def print_json(value: Any) -> None:
    print(json.dumps(value, default=json_value, indent=2, ensure_ascii=False))


def one_line(text: str | None, width: int = 60) -> str:
    """An error as a table cell: its last non-empty line (a traceback's exception), cut to width."""
    if not text:
        return "-"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[-1] if lines else "-"
    printable = "".join(c if c.isprintable() else "?" for c in line)
    return printable if len(printable) <= width else printable[: width - 3] + "..."


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: frozenset[int] = frozenset()) -> list[str]:
    """Aligned columns two spaces apart; the columns in `right` aligned right (numbers)."""
    grid = [list(headers), *[list(row) for row in rows]]
    widths = [max(len(row[i]) for row in grid) for i in range(len(headers))]
    lines = []
    for row in grid:
        cells = [cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    return lines


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: frozenset[int] = frozenset()) -> None:
    print("\n".join(table(headers, rows, right)))


# -- progress -----------------------------------------------------------------------------------


@dataclass
class Progress:
    """Progress of long work on stderr: a rich bar on a terminal, else one line per step."""

    what: str
    total: int | None
    done: int = 0
    _bar: Any = None
    _task: Any = None

    def __enter__(self) -> Progress:
        if sys.stderr.isatty():
            try:
                from rich.console import Console
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
            except ImportError:
                return self  # plain lines: the bar is the cli extra's
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.what, total=self.total)
        return self

    def advance(self, count: int, note: str = "") -> None:
        self.done += count
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, description=f"{self.what} {note}".rstrip())
        else:
            of = f"/{self.total:,}" if self.total is not None else ""
            print(f"{self.what}: {self.done:,}{of}{' ' + note if note else ''}", file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


def confirm(question: str, assume_yes: bool, how: str) -> None:
    """Go on when --yes was given or a person at a terminal says yes; Refused otherwise."""
    if assume_yes:
        return
    if not sys.stdin.isatty():
        raise Refused(f"{question}: not asked, as stdin is not a terminal; {how}")
    print(f"{question}? [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    if answer.strip().lower() not in ("y", "yes"):
        raise Refused("not confirmed: nothing was changed")
