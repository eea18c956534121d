"""On a database whose treadle is older than the package, every page and `treadle status` name
the installed version and the command that upgrades it; after the upgrade, the pages work at once.
"""

from __future__ import annotations

import psycopg
import pytest

from tests.cli.support import treadle
from tests.conftest import EXTENSION_VERSION, NewDatabase
from treadle.dashboard import create_app, dashboard_of

pytestmark = pytest.mark.extension_only  # installs an older extension version

PAGES = ["/", "/jobs", "/jobs/1", "/queues/default", "/schedules", "/runs/1", "/metrics", "/jobs/bulk/retry"]
OLD = "0.3.0"


def pages(dsn: str) -> dict[str, tuple[int, str]]:
    app = create_app(dsn)
    try:
        client = app.test_client()
        found: dict[str, tuple[int, str]] = {}
        for page in PAGES:
            response = client.get(page)
            found[page] = (response.status_code, response.get_data(as_text=True))
        answer = client.get("/jobs", headers={"Accept": "application/json"})
        found["/jobs (json)"] = (answer.status_code, answer.get_data(as_text=True))
        return found
    finally:
        dashboard_of(app).close()


@pytest.mark.subprocess  # treadle status
def test_every_page_names_an_older_version_and_the_upgrade(new_database: NewDatabase) -> None:
    dsn = new_database(None)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE EXTENSION treadle VERSION '{OLD}'")
        for page, (status, body) in pages(dsn).items():
            assert status == 503, (page, status, body[:300])
            assert f"has treadle {OLD}, older than this package, which speaks {EXTENSION_VERSION}" in body, page
            assert "treadle upgrade" in body and "ALTER EXTENSION treadle UPDATE" in body, page

        done = treadle("status", "--dsn", dsn)
        assert done.code == 1, done
        assert f"has treadle {OLD}, older than this package, which speaks {EXTENSION_VERSION}" in done.err
        assert "`treadle upgrade`" in done.err
        version = treadle("--version", env={"DATABASE_URL": dsn})
        assert version.code == 0, version
        lines = version.out.splitlines()
        assert lines[1] == f"database: treadle {OLD} (extension)"
        assert f"older than this package, which speaks {EXTENSION_VERSION}" in lines[2]
        assert "treadle upgrade" in lines[2]
        # the package's version comes first, whatever the database answers
        down = treadle("--version", env={"DATABASE_URL": "postgresql://app@127.0.0.1:1/app"})
        assert down.code == 1 and down.out.startswith("treadle ") and "cannot connect" in down.err

        conn.execute("ALTER EXTENSION treadle UPDATE")
        after = pages(dsn)
        assert after["/"][0] == 200 and after["/jobs"][0] == 200 and after["/schedules"][0] == 200
        assert after["/jobs/1"][0] == 404
        assert treadle("status", "--dsn", dsn).code == 0


def test_every_page_says_how_to_install_when_treadle_is_missing(new_database: NewDatabase) -> None:
    dsn = new_database(None)
    for page, (status, body) in pages(dsn).items():
        assert status == 503, (page, status)
        assert "not installed" in body and "treadle install" in body, page
