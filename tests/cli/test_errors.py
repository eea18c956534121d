"""What the command says when it cannot do what it was asked: one line, an exit code, no traceback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.cli.support import Terminal, enqueue, expect, states, treadle
from tests.conftest import NewDatabase, as_role

pytestmark = pytest.mark.subprocess

COMMANDS = [
    ["worker"],
    ["enqueue"],
    ["jobs"],
    ["jobs", "list"],
    ["jobs", "show"],
    ["jobs", "retry"],
    ["jobs", "cancel"],
    ["status"],
    ["queues"],
    ["queues", "list"],
    ["schedules"],
    ["schedules", "list"],
    ["prune"],
]


def without(tmp_path: Path, module: str) -> dict[str, str]:
    """An environment where importing `module` fails as it does when it is not installed."""
    shadow = tmp_path / "shadow" / module
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{module}'\", name='{module}')\n")
    return {"PYTHONPATH": str(shadow.parent)}


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_every_command_has_help_with_examples(command: list[str]) -> None:
    done = expect(treadle(*command, "--help"), 0)
    assert done.out.startswith(f"usage: treadle {' '.join(command)}")
    if command not in (["queues", "list"], ["schedules", "list"]):
        assert "\nexamples:\n  treadle " in done.out, done.out


def test_the_top_level_help_lists_commands_and_exit_codes() -> None:
    out = expect(treadle("--help"), 0).out
    for name in ("worker", "enqueue", "jobs", "status", "queues", "schedules", "prune", "dashboard", "install"):
        assert f"\n    {name}" in out
    assert "exit codes:\n  0  done\n  1  error" in out and "  4  refused" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "name a command (treadle --help lists them)"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["jobs"], "the following arguments are required: COMMAND"),
        (["status", "--interval", "0"], "must be between 0.1 and 3600 seconds"),
        (["status", "--interval", "often"], "'often' is not a number of seconds"),
    ],
)
def test_usage_errors_exit_2(args: list[str], message: str) -> None:
    expect(treadle(*args), 2, err=message)


def test_no_database() -> None:
    expect(treadle("status"), 1, err="treadle: error: no database: pass --dsn or set DATABASE_URL")


def test_a_database_without_treadle_names_the_command_that_installs_it(new_database: NewDatabase) -> None:
    bare = new_database(None)
    for command in (["status"], ["jobs", "list"], ["enqueue", "x"], ["prune"], ["schedules", "list"]):
        done = expect(treadle(*command, "--dsn", bare), 1, err="the treadle extension is not installed in database")
        assert "`treadle install`" in done.err and "CREATE EXTENSION treadle" in done.err
        assert len(done.err.splitlines()) == 1


@pytest.mark.parametrize(
    ("dsn", "said"),
    [
        ("postgresql://bob:hunter2@127.0.0.1:1/app", "(host=127.0.0.1 port=1 dbname=app user=bob): connection failed"),
        ("host=/no/such/dir dbname=app password=hunter2", "(host=/no/such/dir dbname=app): connection is bad"),
    ],
)
def test_a_connection_failure_says_what_it_tried_without_the_password(dsn: str, said: str) -> None:
    done = expect(treadle("jobs", "list", "--dsn", dsn), 1, err=f"cannot connect to the database from --dsn {said}")
    assert "hunter2" not in done.err
    from_env = expect(treadle("status", env={"DATABASE_URL": dsn}), 1)
    assert "cannot connect to the database from DATABASE_URL" in from_env.err


def test_an_unreadable_connection_string_is_a_usage_error() -> None:
    expect(
        treadle("jobs", "list", "--dsn", "not a connection string password=hunter2"),
        2,
        err='the connection string in --dsn cannot be read: missing "=" after "not"',
    )
    from_env = expect(treadle("status", env={"DATABASE_URL": "not a connection string"}), 2)
    assert "the connection string in DATABASE_URL cannot be read" in from_env.err


def test_the_dashboard_without_its_extra_says_which_pip_install(tmp_path: Path) -> None:
    done = treadle("dashboard", "--dsn", "postgresql://unused", env=without(tmp_path, "flask"))
    expect(done, 1, err="treadle: error: the dashboard needs Flask: pip install 'treadle[dashboard]'")


def test_worker_metrics_without_their_extra_say_which_pip_install(dsn: str, tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text("import os, treadle\nworker = treadle.Worker(os.environ['DATABASE_URL'])\n")
    done = treadle("worker", str(app), "--metrics-port", "0", "--dsn", dsn, env=without(tmp_path, "prometheus_client"))
    expect(done, 1, err="treadle: error: treadle's metrics need prometheus_client: pip install 'treadle[metrics]'")


def test_status_watch_without_rich_says_which_pip_install(dsn: str, tmp_path: Path) -> None:
    terminal = Terminal("status", "--watch", "--dsn", dsn, env=without(tmp_path, "rich"))
    assert terminal.exit_code() == 1
    assert "status --watch draws with rich: pip install 'treadle[cli]'" in terminal.text
    assert "Traceback" not in terminal.text


def test_a_tenant_is_refused_other_queues_with_exit_4(
    dsn: str, conn: psycopg.Connection[Any], make_role: Callable[[str], str]
) -> None:
    tenant = make_role("tenant")
    conn.execute("SELECT treadle.grant_dashboard(%s), treadle.grant_producer(%s)", (tenant, tenant))
    conn.execute("SELECT treadle.set_tenant(%s, 'billing')", (tenant,))
    (mail,) = enqueue(conn, "send", "mail")
    (bill,) = enqueue(conn, "charge", "billing")
    theirs = as_role(dsn, tenant)
    listed = expect(treadle("jobs", "list", "--json", "--dsn", theirs), 0).json()
    assert [job["id"] for job in listed] == [bill]
    refused = expect(treadle("jobs", "cancel", str(mail), "--dsn", theirs), 4, err=f"job {mail}: not cancelled:")
    assert "may not use queue" in refused.err
    expect(treadle("enqueue", "x", "--queue", "mail", "--dsn", theirs), 4, err="may not use queue")
    assert states(conn, [mail, bill]) == ["available", "available"]
    assert expect(treadle("jobs", "cancel", str(bill), "--dsn", theirs), 0).out == f"job {bill}: cancelled\n"
