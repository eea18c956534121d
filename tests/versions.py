"""The extension's version, read from its one source (treadle.control's default_version), and the
releases it upgrades from: those with a migration in sql/upgrade."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _control_version() -> str:
    match = re.search(r"^default_version\s*=\s*'([^']+)'", (ROOT / "treadle.control").read_text(), re.MULTILINE)
    assert match, "treadle.control has no default_version"
    return match.group(1)


EXTENSION_VERSION = _control_version()

# oldest first
UPGRADES_FROM = sorted(
    (p.name.split("--")[0] for p in (ROOT / "sql" / "upgrade").glob(f"*--{EXTENSION_VERSION}.sql")),
    key=lambda v: tuple(int(n) for n in v.split(".")),
)
