"""`treadle dashboard`: serve the dashboard from the command line.

Without authentication it serves the loopback address only, and says so.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import sys
import threading
from typing import Any

from werkzeug.exceptions import NotFound
from werkzeug.middleware.dispatcher import DispatcherMiddleware
from werkzeug.serving import make_server

from .app import create_app
from .security import LOOPBACK_NAMES
from .state import dashboard_of

PASSWORD_ENV = "TREADLE_DASHBOARD_PASSWORD"
SECRET_ENV = "TREADLE_DASHBOARD_SECRET_KEY"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="treadle dashboard",
        description="Serve the treadle dashboard (a Flask app over the extension's views).",
    )
    parser.add_argument("--dsn", default=os.environ.get("DATABASE_URL"), help="database URL (default: $DATABASE_URL)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=5000, help="port to listen on; 0 picks a free one (default: 5000)")
    parser.add_argument(
        "--basic-auth",
        metavar="USER",
        help=f"require HTTP basic auth as USER, with the password in ${PASSWORD_ENV}",
    )
    parser.add_argument("--read-only", action="store_true", help="hide and refuse every action")
    parser.add_argument("--prefix", default="", help="serve under this path, e.g. /admin/jobs")
    parser.add_argument("--refresh", type=float, default=5.0, help="seconds between page refreshes (default: 5)")
    parser.add_argument(
        "--top-queues",
        type=int,
        default=50,
        metavar="N",
        help="queues per page of the overview, and named by /metrics, the rest summed (default: 50)",
    )
    return parser


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _fail(message: str, code: int = 2) -> int:
    print(f"treadle dashboard: {message}", file=sys.stderr)
    return code


def run_cli(args: list[str]) -> int:
    """Serve the dashboard until SIGINT or SIGTERM; returns the exit status."""
    try:
        options = _parser().parse_args(args)
    except SystemExit as stop:  # --help, or a usage error argparse already printed
        return stop.code if isinstance(stop.code, int) else 2

    if not options.dsn:
        return _fail("give --dsn or set DATABASE_URL")
    if not 0 <= options.port <= 65535:
        return _fail(f"--port must be between 0 and 65535, got {options.port}")
    prefix = options.prefix.rstrip("/")
    if prefix and (not prefix.startswith("/") or "//" in prefix):
        return _fail(f"--prefix must be a path such as /admin/jobs, got {options.prefix!r}")

    basic_auth = None
    if options.basic_auth is not None:
        password = os.environ.get(PASSWORD_ENV, "")
        if not options.basic_auth or not password:
            return _fail(f"--basic-auth needs a user name, and the password in ${PASSWORD_ENV}")
        basic_auth = (options.basic_auth, password)
    elif not _is_loopback(options.host):
        return _fail(
            f"refusing to serve {options.host} without authentication; "
            f"pass --basic-auth USER (password in ${PASSWORD_ENV}) or serve 127.0.0.1"
        )
    else:
        print(
            f"treadle dashboard: no authentication, so serving {options.host} only "
            f"(pass --basic-auth USER to serve other hosts)",
            file=sys.stderr,
        )

    try:
        app = create_app(
            options.dsn,
            basic_auth=basic_auth,
            read_only=options.read_only,
            secret_key=os.environ.get(SECRET_ENV) or None,
            refresh_seconds=options.refresh,
            trusted_hosts=None if basic_auth else LOOPBACK_NAMES,
            top_queues=options.top_queues,
        )
    except (TypeError, ValueError) as error:
        return _fail(str(error))

    wsgi: Any = DispatcherMiddleware(NotFound(), {prefix: app}) if prefix else app
    try:
        server = make_server(options.host, options.port, wsgi, threaded=True)
    except (OSError, SystemExit) as error:  # werkzeug exits, having said why, when the port is taken
        dashboard_of(app).close()
        reason = f": {error}" if isinstance(error, OSError) else ""
        return _fail(f"cannot listen on {options.host}:{options.port}{reason}", 1)

    host = f"[{options.host}]" if ":" in options.host else options.host
    print(f"treadle dashboard: http://{host}:{server.server_port}{prefix}/", flush=True)
    if threading.current_thread() is threading.main_thread():
        # shutdown() waits for serve_forever to return, so it must run on another thread
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        dashboard_of(app).close()
    return 0
