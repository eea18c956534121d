"""The package's build: pyproject.toml says everything but this one step. The SQL scripts the
package ships (python/src/treadle/plain_sql: the plain install and upgrades, the pg_tle
registration) are built from sql/ by scripts/build-sql, as `make` builds them; they are not
committed. A build from an sdist, which carries them already built, skips the step."""

from __future__ import annotations

import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
BUILD_SQL = ROOT / "scripts" / "build-sql"
PLAIN_SQL = ROOT / "python" / "src" / "treadle" / "plain_sql"


class BuildWithSql(build_py):
    def run(self) -> None:
        if BUILD_SQL.exists():
            subprocess.run([str(BUILD_SQL), "package", str(PLAIN_SQL)], check=True)
        elif not any(PLAIN_SQL.glob("treadle-*.sql")):
            raise SystemExit(f"no SQL scripts in {PLAIN_SQL} and no {BUILD_SQL} to build them")
        super().run()


setup(cmdclass={"build_py": BuildWithSql})
