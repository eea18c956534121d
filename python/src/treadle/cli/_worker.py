"""treadle worker MODULE[:ATTR]: run the Worker a module defines."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import sys
from types import ModuleType
from typing import Any

from treadle.errors import InvalidArgument
from treadle.logs import configure_logging

from ._base import DSN_ENV, CommandError, add_dsn, command, dsn_of


def add_command(commands: Any) -> None:
    worker = command(
        commands,
        "worker",
        "run a Worker defined in a module",
        examples=[
            "treadle worker tasks                      # the Worker in tasks.worker",
            "treadle worker app/jobs.py:make_worker    # a function returning one, given the DSN",
            "treadle worker tasks --metrics-port 9181 --log-format json",
        ],
    )
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
        default="127.0.0.1",
        metavar="HOST",
        help="the address the metrics listen on (default: 127.0.0.1, this machine only; "
        "0.0.0.0 serves every interface, without authentication)",
    )
    worker.add_argument(
        "--metrics-database",
        action="store_true",
        help="serve the database's metrics too (jobs per queue and state, live workers)",
    )
    worker.add_argument(
        "--metrics-top-queues",
        type=int,
        default=50,
        metavar="N",
        help="with --metrics-database: the queues named, the busiest first; the rest are summed (default: 50)",
    )
    add_dsn(worker, "exported as DATABASE_URL before the module is imported")
    worker.set_defaults(command=run)


def run(options: argparse.Namespace) -> int:
    if options.dsn or os.environ.get(DSN_ENV):
        dsn_of(options)  # a connection string libpq cannot read stops here, before the module is imported
    if options.dsn:
        os.environ[DSN_ENV] = options.dsn  # the module may build its Worker from it
    configure_logging(options.log_level, options.log_format)
    worker = load_worker(options.target, options.dsn or os.environ.get(DSN_ENV))
    if options.metrics_database and options.metrics_port is None:
        raise CommandError("--metrics-database needs --metrics-port")
    try:
        if options.metrics_port is not None:
            worker.serve_metrics(
                options.metrics_port,
                host=options.metrics_host,
                database=options.metrics_database,
                top_queues=options.metrics_top_queues,
            )
        worker.run()
    except InvalidArgument as error:  # such as a metrics port in use: the machine's state, not a bad option
        raise CommandError(str(error)) from None
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
