"""Every benchmark script runs with --smoke against the test server and prints its table.

This keeps bench/ from rotting; it asserts nothing about speed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCENARIOS = [
    "claim_latency",
    "storm",
    "enqueue_rate",
    "load",
    "recovery",
    "pickup",
    "notify",
    "limits",
    "queues",
    "held_snapshot",
    "versions",
    "memory",
    "dashboard_search",
    "cli_bulk",
    "scale",
    "workflow_map",
    "workflows",
    "keys",
    "rescue_cost",
    "nokeys",
    "workflow_cost",
    "client_bulk",
    "enqueue_cost",
    "enqueue_many_cost",
    "cycle_cost",
    "check_cost",
    "workflow_instructions",
    "chain",
    "workflow_worker",
]


def title(script: Path) -> str:
    """The table title the script declares (TITLE = "...")."""
    found = re.search(r'^TITLE = "(.+)"$', script.read_text(), re.MULTILINE)
    assert found, f"{script.name} declares no TITLE"
    return found.group(1)


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.slow
@pytest.mark.subprocess
def test_scenario_runs_and_prints_its_table(pg_server: str, scenario: str) -> None:
    script = BENCH / f"{scenario}.py"
    done = subprocess.run(
        [sys.executable, str(script), "--smoke", "--runs", "1"],
        env={**os.environ, "DATABASE_URL": pg_server},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"### {title(script)}" in done.stdout
    assert "|---" in done.stdout  # the table itself, under its title


def test_every_script_is_smoke_tested() -> None:
    # (citus.py needs a Citus cluster: tests/citus runs it)
    scripts = {p.stem for p in BENCH.glob("*.py")} - {"harness", "run_all", "worker_treadle", "worker_raw", "citus"}
    assert scripts == set(SCENARIOS)
