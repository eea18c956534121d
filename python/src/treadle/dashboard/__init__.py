"""treadle.dashboard: a Flask app over the extension's views.

    from treadle.dashboard import create_app
    app = create_app("postgresql://...", basic_auth=("admin", password))

It reads only the extension's views and read functions, and changes jobs and runs
only through treadle's functions (cancel, retry, cancel_workflow, retry_run,
compensate_run, fork_run). `run_cli`
serves it from the command line (`treadle dashboard --dsn ...`).
"""

from __future__ import annotations

from .app import create_app
from .cli import run_cli
from .security import Access, AuthHook
from .state import Dashboard, dashboard_of

__all__ = ["Access", "AuthHook", "Dashboard", "create_app", "dashboard_of", "run_cli"]
