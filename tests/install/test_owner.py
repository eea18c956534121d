"""Whoever installs treadle first owns it. `treadle install` and `treadle upgrade` name the
owner and refuse (exit 4, nothing changed) a treadle the connecting role may not act as;
the owner, a member of it and a superuser go on; `treadle status` names the owner.

As real roles: A, with CREATE on the database, installs first; B, the application's role
(CREATE on the database too, as on a managed server), comes second."""

from __future__ import annotations

import json
from collections.abc import Callable

import psycopg
import pytest

from tests.catalog import describe_difference, snapshot
from tests.conftest import EXTENSION_VERSION, NewDatabase, as_role
from tests.install.test_cli_install import treadle
from treadle import install

pytestmark = pytest.mark.subprocess  # the treadle command

REFUSED = 4


@pytest.fixture
def roles(new_database: NewDatabase, make_role: Callable[[str], str]) -> tuple[str, str, str]:
    """An empty database and two roles with CREATE on it: (database URL, A, B)."""
    url = new_database(None)
    first, app = make_role("first"), make_role("app")
    with psycopg.connect(url, autocommit=True) as conn:
        for role in (first, app):
            conn.execute(f'GRANT CREATE ON DATABASE "{url.rsplit("/", 1)[1]}" TO "{role}"')
    return url, first, app


def refused_without_change(url: str, app: str, command: str, first: str, *, extension: bool) -> str:
    """`treadle COMMAND` as B: exit 4, a message naming A and B, nothing changed."""
    with psycopg.connect(url) as conn:
        before = snapshot(conn, extension=extension)
    done = treadle(command, "--dsn", as_role(url, app), ok=False)
    assert done.returncode == REFUSED, done.stderr
    message = done.stderr
    assert f"owned by role {first}, not by {app}, the role connecting" in message
    assert f"run this as {first}" in message and "drop it" in message and "docs/operations.md" in message
    with psycopg.connect(url) as conn:
        assert describe_difference(before, snapshot(conn, extension=extension), "before", "after") == ""
    return message


def test_an_extension_another_role_made_first_is_refused_and_named(roles: tuple[str, str, str]) -> None:
    url, first, app = roles
    with psycopg.connect(as_role(url, first), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION treadle")
    message = refused_without_change(url, app, "install", first, extension=True)
    assert f"treadle {EXTENSION_VERSION} (extension)" in message and "DROP EXTENSION treadle CASCADE" in message
    refused_without_change(url, app, "upgrade", first, extension=True)
    # the dry run is refused alike: it prints no SQL
    dry = treadle("install", "--dry-run", "--dsn", as_role(url, app), ok=False)
    assert dry.returncode == REFUSED and dry.stdout == ""


def test_an_old_extension_another_role_made_is_not_upgraded(roles: tuple[str, str, str]) -> None:
    url, first, app = roles
    with psycopg.connect(as_role(url, first), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION treadle VERSION '0.3.0'")
    message = refused_without_change(url, app, "upgrade", first, extension=True)
    assert "treadle 0.3.0 (extension)" in message
    refused_without_change(url, app, "install", first, extension=True)
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'treadle'").fetchone() == ("0.3.0",)


def test_a_plain_install_another_role_made_first_is_refused_and_named(roles: tuple[str, str, str]) -> None:
    url, first, app = roles
    with psycopg.connect(as_role(url, first), autocommit=True) as conn:
        install.apply(conn, install.plan_install(conn, mode="plain"))
        conn.execute("SELECT treadle.grant_reader(%s)", (app,))  # B may use the schema: still not its own
    message = refused_without_change(url, app, "install", first, extension=False)
    assert f"treadle {EXTENSION_VERSION} (plain)" in message and "DROP SCHEMA treadle CASCADE" in message
    refused_without_change(url, app, "upgrade", first, extension=False)


def test_the_owner_a_member_of_it_and_a_superuser_go_on(
    roles: tuple[str, str, str], make_role: Callable[[str], str]
) -> None:
    url, first, _ = roles
    member, outsider = make_role("member"), make_role("outsider")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'GRANT "{first}" TO "{member}"')  # it inherits A's privileges
        conn.execute(f'ALTER ROLE "{outsider}" NOINHERIT')  # it could SET ROLE to A, but has not A's privileges
        conn.execute(f'GRANT "{first}" TO "{outsider}"')
    installed = treadle("install", "--dsn", as_role(url, first)).stdout
    assert f"done: install treadle {EXTENSION_VERSION} as an extension (owned by {first})" in installed
    for role, says in ((first, first), (member, first), ("postgres", first)):
        again = treadle("install", "--dsn", as_role(url, role)).stdout
        assert f"already installed (extension, owned by {says}): nothing to do" in again
        assert "nothing to upgrade" in treadle("upgrade", "--dsn", as_role(url, role)).stdout
    done = treadle("install", "--dsn", as_role(url, outsider), ok=False)
    assert done.returncode == REFUSED and f"owned by role {first}, not by {outsider}" in done.stderr


def test_status_names_the_owner(roles: tuple[str, str, str]) -> None:
    url, first, app = roles
    with psycopg.connect(as_role(url, first), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION treadle")
        conn.execute("SELECT treadle.grant_reader(%s)", (app,))
    lines = treadle("status", "--dsn", as_role(url, app)).stdout.splitlines()
    assert lines[-1] == f"treadle {EXTENSION_VERSION} (extension), owned by role {first}"
    status = json.loads(treadle("status", "--json", "--dsn", as_role(url, app)).stdout)
    assert status["treadle"] == {
        "version": EXTENSION_VERSION,
        "form": "extension",
        "owner": first,
        "user": app,
        "user_may_act_as_owner": False,
    }
    mine = json.loads(treadle("status", "--json", "--dsn", as_role(url, first)).stdout)
    assert mine["treadle"]["user_may_act_as_owner"] is True
