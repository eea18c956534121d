"""Every ```sql block of every documentation page runs in psql, in page order.

See docblocks.py for the rules: one psql session per page on a fresh database, and a
```text block right after a sql block is its expected output.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import TEMPLATE, NewDatabase
from tests.docs.docblocks import Block, creates_extension, page_blocks, run_psql

PAGES = page_blocks("sql")


def roles_created(page: list[Block]) -> list[str]:
    return sorted({m.lower() for b in page for m in re.findall(r"create\s+role\s+(\w+)", b.code, re.I)})


def drop_roles(server: str, roles: list[str]) -> None:
    with psycopg.connect(server, autocommit=True) as conn:
        for role in roles:
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')


@pytest.fixture
def page_roles(pg_server: str) -> Iterator[list[str]]:
    """Roles are cluster-wide: drop the ones a page creates, before and after it runs."""
    holder: list[str] = []
    yield holder
    drop_roles(pg_server, holder)


def test_pages_have_sql() -> None:
    names = [name for name, _ in PAGES]
    assert "docs/sql-api.md" in names and "docs/getting-started.md" in names, names


@pytest.mark.parametrize("page", [blocks for _, blocks in PAGES], ids=[name for name, _ in PAGES])
@pytest.mark.subprocess
def test_sql_blocks_run(page: list[Block], pg_server: str, page_roles: list[str], new_database: NewDatabase) -> None:
    page_roles.extend(roles_created(page))
    drop_roles(pg_server, page_roles)
    # (page_roles comes first, so its roles are dropped after the database that holds their grants)
    url = new_database(template=None if creates_extension(page) else TEMPLATE)
    run_psql(url, page)
