"""The version is written once, in treadle.control; everything else reads it or is pinned to it here."""

from __future__ import annotations

import re
import subprocess

import pytest

import treadle
from tests.conftest import EXTENSION_VERSION, ROOT
from treadle import _compat, install


def test_the_python_package_has_the_extensions_version() -> None:
    project = (ROOT / "pyproject.toml").read_text().split("[project]\n", 1)[1]
    version = re.search(r'^version = "([^"]+)"', project, re.MULTILINE)
    assert version is not None and version[1] == EXTENSION_VERSION
    assert treadle.__version__ == EXTENSION_VERSION
    assert install.VERSION == EXTENSION_VERSION


def test_the_client_speaks_the_version_it_installs() -> None:
    assert EXTENSION_VERSION in _compat.SUPPORTED_VERSIONS


@pytest.mark.subprocess
def test_build_sql_reads_the_control_file() -> None:
    built = subprocess.run([ROOT / "scripts" / "build-sql", "version"], check=True, capture_output=True, text=True)
    assert built.stdout.strip() == EXTENSION_VERSION


def test_the_package_ships_the_plain_script_of_its_version() -> None:
    script = install.plain_script(f"treadle-{EXTENSION_VERSION}.sql")
    assert f"SELECT '{EXTENSION_VERSION}'::text;" in script  # treadle.version()'s body


def test_no_source_writes_the_version_again() -> None:
    """Code names the version only through the control file (@EXTVERSION@, metadata): no
    string literal holds it (prose may speak of a release). _compat.SUPPORTED_VERSIONS is
    another fact (what the client speaks), pinned above."""
    literal = re.compile(f"[\"']{re.escape(EXTENSION_VERSION)}[\"']")
    sources = [*(ROOT / "sql" / "src").glob("*.sql"), *(ROOT / "python" / "src" / "treadle").rglob("*.py")]
    copies = [
        str(path.relative_to(ROOT))
        for path in sources
        if path.name != "_compat.py" and literal.search(path.read_text())
    ]
    assert copies == []
