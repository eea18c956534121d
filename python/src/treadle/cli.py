"""The `treadle` command.

    treadle worker MODULE[:ATTR]      run the Worker a module defines (ATTR defaults to `worker`)
    treadle enqueue NAME [JSON]       enqueue a job and print its id
    treadle status                    jobs per queue and state (the queue_stats view)
    treadle dashboard [ARGS...]       serve the dashboard (see `treadle dashboard --help`)
    treadle install | upgrade         install or upgrade treadle's SQL (see treadle.install)

The database is `--dsn`, or the environment variable DATABASE_URL.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import os
import sys
from datetime import timedelta
from types import ModuleType
from typing import Any

import psycopg

from treadle import _sql
from treadle.errors import TreadleError
from treadle.logs import configure_logging

DSN_ENV = "DATABASE_URL"


class CommandError(Exception):
    """A problem the command reports in one line, exiting with status 1."""


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["dashboard"]:
        # its options are the dashboard's own: hand them over untouched
        from treadle.dashboard import run_cli

        return run_cli(args[1:])
    options = _parser().parse_args(args)
    try:
        return int(options.command(options))
    except (CommandError, TreadleError, psycopg.Error, ImportError) as error:
        message = str(error).strip().removeprefix("treadle: ")  # the SQL layer's messages carry it too
        print(f"treadle: error: {message}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="treadle", description="Jobs and workflows inside PostgreSQL.")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")

    worker = commands.add_parser("worker", help="run a Worker defined in a module")
    worker.add_argument(
        "target",
        metavar="MODULE[:ATTR]",
        help="a module (dotted name or .py file) and the attribute holding the Worker, or a "
        "function returning one given the DSN (default attribute: worker)",
    )
    worker.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    worker.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="text lines, or one JSON object per line (default: text)",
    )
    worker.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (needs the metrics extra)",
    )
    worker.add_argument(
        "--metrics-host",
        default="0.0.0.0",
        metavar="HOST",
        help="the address the metrics listen on (default: every interface)",
    )
    worker.add_argument(
        "--metrics-database",
        action="store_true",
        help="serve the database's metrics too (jobs per queue and state, live workers)",
    )
    _add_dsn(worker, "exported as DATABASE_URL before the module is imported")
    worker.set_defaults(command=_worker)

    enqueue = commands.add_parser("enqueue", help="enqueue a job and print its id")
    enqueue.add_argument("name", help="the job's name")
    enqueue.add_argument("args", nargs="?", default="{}", metavar="JSON", help="its arguments (default: {})")
    enqueue.add_argument("--queue", help="the queue (default: default)")
    enqueue.add_argument("--priority", type=int, help="lower runs first (default: 0)")
    enqueue.add_argument("--max-attempts", type=int, help="attempts before it is discarded (default: 25)")
    enqueue.add_argument("--idempotency-key", help="enqueue once per key")
    _add_dsn(enqueue)
    enqueue.set_defaults(command=_enqueue)

    status = commands.add_parser("status", help="jobs per queue and state")
    _add_dsn(status)
    status.set_defaults(command=_status)

    commands.add_parser("dashboard", help="serve the dashboard (its options: treadle dashboard --help)")

    from treadle import install

    for name, (_, help_text) in install.COMMANDS.items():
        sub = commands.add_parser(name, help=help_text)
        install.add_arguments(sub)
        _add_dsn(sub)
        sub.set_defaults(command=_install, install_command=name)
    return parser


def _add_dsn(parser: argparse.ArgumentParser, note: str = "") -> None:
    parser.add_argument("--dsn", help=f"the database URL (default: ${DSN_ENV}){'; ' + note if note else ''}")


def _dsn(options: argparse.Namespace) -> str:
    dsn = options.dsn or os.environ.get(DSN_ENV)
    if not dsn:
        raise CommandError(f"no database: pass --dsn or set {DSN_ENV}")
    return str(dsn)


# treadle worker
def _worker(options: argparse.Namespace) -> int:
    if options.dsn:
        os.environ[DSN_ENV] = options.dsn  # the module may build its Worker from it
    configure_logging(options.log_level, options.log_format)
    worker = load_worker(options.target, options.dsn or os.environ.get(DSN_ENV))
    if options.metrics_port is not None:
        worker.serve_metrics(options.metrics_port, host=options.metrics_host, database=options.metrics_database)
    elif options.metrics_database:
        raise CommandError("--metrics-database needs --metrics-port")
    worker.run()
    return 0


def load_worker(target: str, dsn: str | None) -> Any:
    """The Worker that `target` (MODULE[:ATTR]) names, calling ATTR(dsn) when it is a factory."""
    from treadle.worker import Worker

    module_name, _, attr = target.partition(":")
    if not module_name:
        raise CommandError(f"{target!r} names no module: give MODULE or MODULE:ATTR")
    module = _import(module_name)
    attr = attr or "worker"
    if not hasattr(module, attr):
        raise CommandError(f"module {module_name!r} has no attribute {attr!r}")
    found = getattr(module, attr)
    if callable(found) and not isinstance(found, Worker):
        found = found(dsn) if _takes_an_argument(found) else found()
    if not isinstance(found, Worker):
        raise CommandError(f"{target} is not a treadle Worker but a value of type {type(found).__name__}")
    return found


def _import(name: str) -> ModuleType:
    try:
        if name.endswith(".py") or os.sep in name:
            if not os.path.isfile(name):
                raise CommandError(f"no such file: {name}")
            spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(name))[0], name)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # like `python -m`: modules of the current directory
        return importlib.import_module(name)
    except CommandError:
        raise
    except Exception as error:
        raise CommandError(f"cannot import {name!r}: {type(error).__name__}: {error}") from error


def _takes_an_argument(fn: Any) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in parameters)


# treadle install, treadle upgrade
def _install(options: argparse.Namespace) -> int:
    from treadle import install

    return install.run_command(options.install_command, _dsn(options), options.mode, options.dry_run)


# treadle enqueue
def _enqueue(options: argparse.Namespace) -> int:
    try:
        args = json.loads(options.args)
    except json.JSONDecodeError as error:
        raise CommandError(f"JSON is not valid JSON: {error}") from error
    settings = {
        "queue": options.queue,
        "priority": options.priority,
        "max_attempts": options.max_attempts,
        "idempotency_key": options.idempotency_key,
    }
    from treadle.client import enqueue

    with psycopg.connect(_dsn(options)) as conn:
        job_id = enqueue(conn, options.name, args, **{k: v for k, v in settings.items() if v is not None})
    print(job_id)
    return 0


# treadle status
def _status(options: argparse.Namespace) -> int:
    with psycopg.connect(_dsn(options), autocommit=True) as conn:
        rows = conn.execute(_sql.QUEUE_STATS).fetchall()
    if not rows:
        print("no jobs")
        return 0
    table = [("QUEUE", "STATE", "JOBS", "OLDEST WAITING")]
    table += [(queue, state, str(jobs), _age(age)) for queue, state, jobs, age in rows]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    for row in table:
        print(f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:>{widths[2]}}  {row[3]}".rstrip())
    return 0


def _age(age: timedelta | None) -> str:
    """A wait as people read it: 4.2 s, 3 min 5 s, 2 h 10 min, 3 d 4 h."""
    if age is None:
        return "-"
    seconds = max(age.total_seconds(), 0.0)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


if __name__ == "__main__":
    sys.exit(main())
