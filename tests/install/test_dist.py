"""`make dist` writes what a managed server needs, from the same sources as the extension."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import EXTENSION_VERSION, ROOT, UPGRADES_FROM
from treadle import install


@pytest.mark.subprocess
def test_make_dist_writes_the_plain_and_pg_tle_scripts(tmp_path: Path) -> None:
    subprocess.run(["make", "-s", "-C", ROOT, "dist", f"DIST={tmp_path}"], check=True, capture_output=True)
    packaged = sorted(p.name for p in (ROOT / "python" / "src" / "treadle" / "plain_sql").glob("*.sql"))
    pgtle = f"treadle-{EXTENSION_VERSION}.pgtle.sql"
    assert f"treadle-{EXTENSION_VERSION}.sql" in packaged
    assert pgtle in packaged
    assert sorted(p.name for p in tmp_path.iterdir()) == packaged
    for name in packaged:  # the plain install, the plain upgrades and the pg_tle registration, as shipped
        assert (tmp_path / name).read_text() == install.plain_script(name)
    built = subprocess.run(
        [ROOT / "scripts" / "build-sql", "pgtle", *UPGRADES_FROM], check=True, capture_output=True, text=True
    ).stdout
    assert (tmp_path / pgtle).read_text() == built
