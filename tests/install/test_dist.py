"""`make dist` writes what a managed server needs, from the same sources as the extension."""

from __future__ import annotations

import importlib.resources
import shutil
import subprocess
import sys
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


@pytest.mark.subprocess
def test_the_package_build_makes_the_scripts_it_ships(tmp_path: Path) -> None:
    """The scripts are not committed: the package's build (setup.py) makes them from sql/,
    in a copy of what git tracks, as a build from a fresh clone does."""
    tracked = subprocess.run(
        ["git", "-C", ROOT, "ls-files", "-z"], check=True, capture_output=True, text=True
    ).stdout.split("\0")
    source = tmp_path / "source"
    for name in [*filter(None, tracked), "setup.py"]:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)  # modes too: scripts/build-sql runs
    assert not list((source / "python" / "src" / "treadle" / "plain_sql").glob("*.sql")), "none is committed"
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "--build-lib", tmp_path / "lib"],
        cwd=source,
        check=True,
        capture_output=True,
    )
    built = tmp_path / "lib" / "treadle" / "plain_sql"
    shipped = importlib.resources.files("treadle") / "plain_sql"
    names = sorted(p.name for p in built.glob("*.sql"))
    assert names == sorted(p.name for p in shipped.iterdir() if p.name.endswith(".sql"))
    for name in names:
        assert (built / name).read_text() == install.plain_script(name)
