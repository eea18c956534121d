"""Every ```python block of every documentation page runs, in page order, in one process.

See docblocks.py for the rules: DATABASE_URL names a fresh database with the extension,
and a ```text block right after a python block is what it must print.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import NewDatabase
from tests.docs.docblocks import Block, page_blocks, run_python

PAGES = page_blocks("python")


def test_pages_have_python() -> None:
    names = [name for name, _ in PAGES]
    assert "docs/python-api.md" in names and "docs/getting-started.md" in names, names


@pytest.mark.parametrize("page", [blocks for _, blocks in PAGES], ids=[name for name, _ in PAGES])
@pytest.mark.subprocess
def test_python_blocks_run(page: list[Block], new_database: NewDatabase, tmp_path: Path) -> None:
    url = new_database()
    run_python(url, page, tmp_path)
