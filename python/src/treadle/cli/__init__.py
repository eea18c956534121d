"""The `treadle` command: subcommands in the manner of git and kubectl.

    treadle --version                 the package's version, and the database's treadle (when one is given)
    treadle worker MODULE[:ATTR]      run the Worker a module defines
    treadle enqueue NAME [JSON]       enqueue a job (or many, --from a file or stdin)
    treadle jobs list|show|explain|retry|cancel
    treadle explain ID                why a job is where it is (jobs explain)
    treadle status [--watch]          jobs per queue and state
    treadle queues list|pause|resume|set   the queues, their settings and controls
    treadle schedules list            the cron schedules
    treadle workflows signal RUN NAME send a signal to a workflow run
    treadle prune --older-than 7d     delete finished jobs
    treadle dashboard [ARGS...]       serve the dashboard (see `treadle dashboard --help`)
    treadle install | upgrade         install or upgrade treadle's SQL (see treadle.install)

The database is `--dsn`, or the environment variable DATABASE_URL. Every listing takes
--json; the exit codes are _base.EXIT_CODES (treadle --help prints them).
"""

from __future__ import annotations

import argparse
import os
import sys

import psycopg

from treadle._display import age
from treadle.errors import InvalidArgument, TreadleError, translate

from . import _enqueue, _jobs, _prune, _queues, _schedules, _status, _worker, _workflows
from ._base import (
    DSN_ENV,
    ERROR,
    EXIT_CODES,
    OK,
    REFUSED,
    USAGE,
    CommandError,
    Refused,
    add_dsn,
    add_json,
    command,
    connect,
    dsn_of,
    error_line,
    print_json,
    remember_dsns,
)
from ._worker import load_worker

__all__ = ["CommandError", "age", "load_worker", "main"]

DASHBOARD_HINT = "the dashboard needs Flask: pip install 'treadle[dashboard]'"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    remember_dsns(args)
    try:
        if args[:1] == ["dashboard"]:
            return _dashboard(args[1:])
        options = _parser().parse_args(args)
        if options.version:
            return _version(options)
        if getattr(options, "command", None) is None:
            _parser().print_usage(sys.stderr)
            error_line("name a command (treadle --help lists them)")
            return USAGE
        return int(options.command(options))
    except CommandError as error:
        error_line(str(error))
        return error.exit_code
    except InvalidArgument as error:
        error_line(_message(error))
        return USAGE
    except psycopg.Error as error:
        mapped = translate(error)  # the SQL layer's 22023 and 22004: a bad value, so usage
        error_line(_message(mapped) if mapped is not error else _primary(error))
        if isinstance(mapped, InvalidArgument):
            return USAGE
        return REFUSED if isinstance(error, psycopg.errors.InsufficientPrivilege) else ERROR
    except TreadleError as error:
        error_line(_message(error))
        return ERROR
    except ImportError as error:  # a missing extra: the message says which pip install gives it
        error_line(str(error))
        return ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader (head, less) went away: say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ERROR


def _message(error: BaseException) -> str:
    return str(error).strip().removeprefix("treadle: ")  # the SQL layer's messages carry it too


def _primary(error: psycopg.Error) -> str:
    """A database error's message without its CONTEXT lines."""
    return (error.diag.message_primary or str(error)).strip().removeprefix("treadle: ")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="treadle",
        description="Jobs and workflows inside PostgreSQL. The database is --dsn, or $DATABASE_URL.",
        epilog=EXIT_CODES + "\n\nexamples:\n  treadle status --watch\n  treadle jobs list --state discarded\n"
        "  treadle jobs retry --state discarded --queue mail --yes\n  DATABASE_URL=postgresql:///app treadle --version",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="store_true", help="print the version (with --dsn or $DATABASE_URL: the database's too)"
    )
    add_dsn(parser, "with --version: read the database's treadle version")
    add_json(parser)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    _worker.add_command(commands)
    _enqueue.add_command(commands)
    _jobs.add_commands(commands)
    _jobs.add_explain(commands)
    _status.add_commands(commands)
    _queues.add_commands(commands)
    _schedules.add_commands(commands)
    _workflows.add_commands(commands)
    _prune.add_command(commands)
    command(commands, "dashboard", "serve the dashboard (its options: treadle dashboard --help)")

    from treadle import install

    for name, (_, help_text) in install.COMMANDS.items():
        sub = command(commands, name, help_text)
        install.add_arguments(sub)
        add_dsn(sub)
        sub.set_defaults(command=_install, install_command=name)
    return parser


def _dashboard(args: list[str]) -> int:
    try:
        from treadle.dashboard import run_cli
    except ImportError as error:
        if getattr(error, "name", None) == "flask" or "flask" in str(error).lower():
            raise CommandError(DASHBOARD_HINT) from None
        raise
    return run_cli(args)  # its options are the dashboard's own: handed over untouched


def _version(options: argparse.Namespace) -> int:
    """treadle --version: the package's; with --dsn or $DATABASE_URL, the database's treadle too (and its form)."""
    from treadle import __version__
    from treadle._compat import EXTENSION_FORM_VERSION, EXTENSION_VERSION, version_problem

    found: dict[str, str | None] = {"package": __version__}
    problem: str | None = None
    if not options.json:
        print(f"treadle {__version__}", flush=True)  # first: whatever the database answers
    if options.dsn or os.environ.get(DSN_ENV):
        with connect(options, check_installed=False) as conn:
            installed = conn.execute(EXTENSION_VERSION).fetchone()
            extension = conn.execute(EXTENSION_FORM_VERSION).fetchone()
            dbname = conn.info.dbname
        found["database"] = None if installed is None else next(iter(installed.values()))
        found["form"] = None if found["database"] is None else "extension" if extension else "plain"
        problem = None if found["database"] is None else version_problem(found["database"], dbname)
    if options.json:
        print_json(found)
        return OK
    if "database" in found:
        if found["database"] is None:
            print("database: treadle is not installed (treadle install, or CREATE EXTENSION treadle)")
        else:
            print(f"database: treadle {found['database']} ({found['form']})")
            if problem is not None:
                print(f"  {problem}")
    return OK


# treadle install, treadle upgrade
def _install(options: argparse.Namespace) -> int:
    from treadle import install

    try:
        return install.run_command(options.install_command, dsn_of(options), options.mode, options.dry_run)
    except install.NotOwner as error:  # someone else's treadle: refused, exit 4
        raise Refused(str(error)) from None
