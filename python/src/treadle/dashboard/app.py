"""The dashboard's application factory: configuration, auth, headers, errors."""

from __future__ import annotations

import secrets
from typing import Any

import psycopg
from flask import Flask, abort, g, jsonify, render_template, request
from psycopg_pool import ConnectionPool
from werkzeug.exceptions import HTTPException, MethodNotAllowed
from werkzeug.wrappers import Response as BaseResponse

from treadle import __version__
from treadle._dsn import Redactor
from treadle._dsn import check as check_dsn

from . import formatting, security
from .queries import Store
from .state import EXTENSION_KEY, Dashboard, Settings, current
from .views import GRANT_HINT, blueprint, wants_json


def create_app(
    dsn_or_pool: str | ConnectionPool[Any],
    *,
    auth: security.AuthHook | None = None,
    basic_auth: tuple[str, str] | None = None,
    read_only: bool = False,
    secret_key: str | bytes | None = None,
    refresh_seconds: float = 5.0,
    statement_timeout_ms: int = 5000,
    exact_counts_up_to: int = 100_000,
    page_size: int = 50,
    recent_rows: int = 20,
    secure_cookies: bool = False,
    trusted_hosts: list[str] | None = None,
    search_window: int = 100_000,
    bulk_limit: int = 10_000,
    top_queues: int = 50,
) -> Flask:
    """A Flask app showing the treadle database behind `dsn_or_pool`.

    dsn_or_pool: a connection string (the app opens a small pool of its own) or
        the host application's psycopg_pool.ConnectionPool.
    auth: a callable given each request (all but /health); it returns True or
        "operate" to let it through, "read" to let it through without actions,
        False or None to refuse it (403), or a Response to send instead.
    basic_auth: (username, password) for HTTP basic auth, checked before `auth`.
    read_only: hide every action and refuse them with 403.
    secret_key: signs the session cookie that holds the CSRF token; random per
        process when not given (give one when several processes serve the app).
    refresh_seconds: how often an open page refreshes itself (1 to 3600).
    statement_timeout_ms: the longest any one query may take.
    exact_counts_up_to: above this many jobs, counts that would read the whole
        table are estimated from statistics, and marked as estimates.
    page_size: jobs per page of a search (1 to 500); recent_rows: failures and
        workflow runs on the front page (1 to 500).
    secure_cookies: mark the session cookie Secure (serve over HTTPS then).
    trusted_hosts: when given, the only host names (any port) a request may be
        addressed to; others get 400. `treadle dashboard` without auth trusts only
        the loopback names, so a web page that rebinds its own name to 127.0.0.1
        cannot reach the dashboard.
    search_window: a search by args, worker, error text or (without a queue)
        idempotency key has no index to use, so each page of it reads at most this
        many jobs, newest first (1 to 10,000,000); the page says so.
    bulk_limit: the most jobs one bulk retry or cancel acts on (1 to 1,000,000).
    top_queues: queues per page of the overview, and the queues /metrics names
        (the rest summed under one label), the busiest first (1 to 10,000).
    """
    _check_arguments(
        auth=auth,
        basic_auth=basic_auth,
        refresh_seconds=refresh_seconds,
        statement_timeout_ms=statement_timeout_ms,
        exact_counts_up_to=exact_counts_up_to,
        page_size=page_size,
        recent_rows=recent_rows,
        trusted_hosts=trusted_hosts,
        search_window=search_window,
        bulk_limit=bulk_limit,
        top_queues=top_queues,
    )
    redactor: Redactor | None = None
    if isinstance(dsn_or_pool, str):
        if not dsn_or_pool.strip():
            raise ValueError("dsn_or_pool must not be an empty connection string")
        check_dsn(dsn_or_pool)  # read once: a string libpq cannot read stops here, not at every retry
        redactor = Redactor(dsn_or_pool)
        redactor.install()  # the pool's retries log libpq's messages: never with the password
        pool: ConnectionPool[Any] = ConnectionPool(
            dsn_or_pool,
            min_size=1,
            max_size=4,
            timeout=5.0,
            open=True,
            name="treadle-dashboard",
            # no prepared statements: a transaction-mode pooler (PgBouncer) cannot keep them
            kwargs={"autocommit": True, "application_name": "treadle-dashboard", "prepare_threshold": None},
        )
        owns_pool = True
    elif isinstance(dsn_or_pool, ConnectionPool):
        pool, owns_pool = dsn_or_pool, False
    else:
        raise TypeError(
            "dsn_or_pool must be a connection string or a psycopg_pool.ConnectionPool, "
            f"not {type(dsn_or_pool).__name__}"
        )

    app = Flask(__name__)
    app.config.update(
        SECRET_KEY=secret_key if secret_key is not None else secrets.token_bytes(32),
        SESSION_COOKIE_NAME="treadle_dashboard",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=secure_cookies,
    )
    app.jinja_env.filters.update(formatting.FILTERS)
    app.jinja_env.tests.update(formatting.TESTS)
    app.jinja_env.globals.update(formatting.GLOBALS)
    app.jinja_env.trim_blocks = True
    app.jinja_env.lstrip_blocks = True
    settings = Settings(
        read_only=read_only,
        refresh_ms=int(refresh_seconds * 1000),
        page_size=page_size,
        recent_rows=recent_rows,
        auth=auth,
        basic_auth=basic_auth,
        trusted_hosts=frozenset(name.lower() for name in trusted_hosts) if trusted_hosts is not None else None,
        search_window=search_window,
        bulk_limit=bulk_limit,
        top_queues=top_queues,
    )
    store = Store(
        pool,
        owns_pool=owns_pool,
        statement_timeout_ms=statement_timeout_ms,
        exact_counts_up_to=exact_counts_up_to,
        redactor=redactor,
    )
    app.extensions[EXTENSION_KEY] = Dashboard(store=store, settings=settings)
    app.register_blueprint(blueprint)
    app.before_request(_authenticate)
    app.before_request(_check_version)
    app.after_request(security.add_security_headers)
    app.context_processor(_template_globals)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(psycopg.Error, _database_error)
    return app


def _check_arguments(
    *,
    auth: object,
    basic_auth: object,
    refresh_seconds: float,
    statement_timeout_ms: int,
    exact_counts_up_to: int,
    page_size: int,
    recent_rows: int,
    trusted_hosts: object,
    search_window: int,
    bulk_limit: int,
    top_queues: int,
) -> None:
    if auth is not None and not callable(auth):
        raise TypeError("auth must be a callable taking the request, or None")
    if basic_auth is not None and not (
        isinstance(basic_auth, tuple)
        and len(basic_auth) == 2
        and all(isinstance(part, str) and part for part in basic_auth)
    ):
        raise ValueError("basic_auth must be a (username, password) tuple of two non-empty strings")
    if isinstance(basic_auth, tuple) and ":" in basic_auth[0]:
        raise ValueError("basic_auth's username must not contain ':'")
    if not 1 <= refresh_seconds <= 3600:
        raise ValueError(f"refresh_seconds must be between 1 and 3600, got {refresh_seconds}")
    if not 1 <= statement_timeout_ms <= 600_000:
        raise ValueError(f"statement_timeout_ms must be between 1 and 600000, got {statement_timeout_ms}")
    if exact_counts_up_to < 0:
        raise ValueError(f"exact_counts_up_to must not be negative, got {exact_counts_up_to}")
    if not 1 <= page_size <= 500:
        raise ValueError(f"page_size must be between 1 and 500, got {page_size}")
    if not 1 <= recent_rows <= 500:
        raise ValueError(f"recent_rows must be between 1 and 500, got {recent_rows}")
    if not 1 <= search_window <= 10_000_000:
        raise ValueError(f"search_window must be between 1 and 10000000, got {search_window}")
    if not 1 <= bulk_limit <= 1_000_000:
        raise ValueError(f"bulk_limit must be between 1 and 1000000, got {bulk_limit}")
    if isinstance(top_queues, bool) or not isinstance(top_queues, int) or not 1 <= top_queues <= 10_000:
        raise ValueError(f"top_queues must be an integer between 1 and 10000, got {top_queues!r}")
    if trusted_hosts is not None and not (
        isinstance(trusted_hosts, (list, tuple, set, frozenset))
        and trusted_hosts
        and all(isinstance(name, str) and name for name in trusted_hosts)
    ):
        raise ValueError("trusted_hosts must be a non-empty list of host names, or None")


def _authenticate() -> BaseResponse | None:
    settings = current().settings
    g.can_act = False
    if settings.trusted_hosts is not None and security.host_name(request.host) not in settings.trusted_hosts:
        abort(400, description="This dashboard does not answer to that host name.")
    if request.endpoint == "treadle.health":
        return None
    if settings.basic_auth is not None:
        challenge = security.check_basic_auth(request, *settings.basic_auth)
        if challenge is not None:
            return challenge
    access: security.Access = True
    if settings.auth is not None:
        access = settings.auth(request)
        if isinstance(access, BaseResponse):
            return access
        if access is None or access is False:
            abort(403, description="You may not see this dashboard.")
        if access not in (True, "read", "operate"):
            raise TypeError(
                f"the dashboard's auth hook returned {access!r}; "
                "expected True, 'read', 'operate', False, None or a Response"
            )
    g.can_act = not settings.read_only and access != "read"
    if request.method == "POST":
        if not g.can_act:
            abort(403, description="This dashboard is read-only: actions are turned off.")
        security.check_csrf(request)
    return None


def _check_version() -> Any:
    """Every page, action and /metrics: a database whose treadle is not this package's says so, and how to fix it."""
    if request.endpoint in ("treadle.health", "static"):
        return None
    problem = current().version_problem()
    if problem is None:
        return None
    title = "treadle is not installed" if "not installed" in problem else "treadle needs an upgrade"
    if "older than" not in problem and "not installed" not in problem:
        title = "treadle's versions differ"
    return _error_page(503, title, f"This dashboard is treadle {__version__}; {problem}.")


def _template_globals() -> dict[str, Any]:
    settings = current().settings
    return {
        "csrf_token": security.csrf_token,
        "can_act": g.get("can_act", False),
        "refresh_ms": settings.refresh_ms,
    }


def _error_page(status: int, title: str, message: str) -> tuple[Any, int]:
    if wants_json():
        return jsonify(ok=False, message=message), status
    return render_template("error.html", title=title, message=message, status=status), status


def _http_error(error: HTTPException) -> Any:
    if error.code is None or error.code < 400:
        return error
    body, status = _error_page(error.code, error.name, error.description or error.name)
    if isinstance(error, MethodNotAllowed) and error.valid_methods:
        return body, status, {"Allow": ", ".join(error.valid_methods)}
    return body, status


def _database_error(error: psycopg.Error) -> Any:
    if isinstance(error, psycopg.errors.QueryCanceled):
        return _error_page(503, "Query timed out", "The database took too long to answer; try a narrower search.")
    missing = (psycopg.errors.InvalidSchemaName, psycopg.errors.UndefinedTable, psycopg.errors.UndefinedFunction)
    if isinstance(error, missing):
        return _error_page(
            503,
            "treadle is not installed",
            "This database lacks the treadle extension or its dashboard views: "
            "run CREATE EXTENSION treadle (or ALTER EXTENSION treadle UPDATE).",
        )
    message = (error.diag.message_primary if error.diag else None) or type(error).__name__
    if isinstance(error, psycopg.errors.InsufficientPrivilege):
        # a missing grant (permission denied for ...), or treadle's own refusal (a tenant's bounds)
        hint = f". {GRANT_HINT}" if message.startswith("permission denied") else "."
        return _error_page(403, "Not allowed", f"The database refused this to the dashboard's role: {message}{hint}")
    if isinstance(error, psycopg.OperationalError):
        return _error_page(503, "Database unreachable", "The dashboard cannot reach its database right now.")
    return _error_page(500, "Database error", f"The database refused a query: {message}")
