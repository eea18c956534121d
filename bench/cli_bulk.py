"""The treadle command's bulk work beside the same work done in one place without it.

Three pairs, each on the same rows, side by side in every run:

- enqueue: `treadle enqueue bench --from FILE` (a process: start-up, reading and checking
  every line, then enqueue_many in batches of 1,000, one transaction each) beside the
  Python client's enqueue_many with the same batches in this process;
- retry: `treadle jobs retry --state discarded --yes` (a count, then batches of 500, one
  transaction each) beside one statement, SELECT treadle.retry(id) over every discarded job;
- prune: `treadle prune --older-than 1d` (windows of 10,000 jobs, one treadle.prune call each) beside
  one treadle.prune call.

What the CLI adds is its process, its checks and the transactions it splits the work into,
so that no bulk action holds one long transaction; the ratio is what that costs.

    .build/venv/bin/python bench/cli_bulk.py [--jobs 20000] [--runs 3]
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from harness import PYTHON, database, paired_ratio, parser, print_settings, progress, reset_tables, runs_text, server
from harness import median, spread, table
from treadle.client import enqueue_many

TITLE = "The treadle command's bulk actions beside the same work in one place"
TREADLE = str(Path(PYTHON).with_name("treadle"))
ENQUEUE_BATCH = 1000


def cli(url: str, *args: str, stdin: str | None = None) -> None:
    subprocess.run([TREADLE, *args, "--dsn", url], check=True, input=stdin, capture_output=True, text=True)


def fill(conn: psycopg.Connection[Any], jobs: int) -> None:
    reset_tables(conn)
    for start in range(0, jobs, 10_000):
        enqueue_many(conn, [{"name": "bench", "args": {"i": i}} for i in range(start, min(start + 10_000, jobs))])


def discard_all(conn: psycopg.Connection[Any]) -> None:
    """Every job discarded, as its owner may write it directly (the state the retry starts from)."""
    conn.execute(
        "UPDATE treadle.jobs SET state = 'discarded', attempt = 1, finished_at = now(), failed_at = now(),"
        " last_error = 'bench'"
    )
    conn.execute("VACUUM ANALYZE treadle.jobs")


def finish_all_days_ago(conn: psycopg.Connection[Any]) -> None:
    """Every job completed, finished between 2 and 30 days ago."""
    conn.execute(
        "UPDATE treadle.jobs SET state = 'completed', attempt = 1,"
        " finished_at = now() - interval '2 days' - (id % 28) * interval '1 day'"
    )
    conn.execute("VACUUM ANALYZE treadle.jobs")


def timed(work: Callable[[], None]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def measure(url: str, jobs: int, runs: int, lines: Path) -> dict[str, tuple[list[float], list[float]]]:
    """Seconds per run for each pair: (the command, the one-place baseline)."""
    seconds: dict[str, tuple[list[float], list[float]]] = {
        "enqueue": ([], []), "retry": ([], []), "prune": ([], []), "start-up": ([], []),
    }
    specs = [json.loads(line) for line in lines.read_text().splitlines()]
    with psycopg.connect(url, autocommit=True) as conn:
        for run in range(runs):
            progress(f"run {run + 1}/{runs}, {jobs:,} jobs")
            seconds["start-up"][0].append(timed(lambda: cli(url, "--version")))  # a process that connects once
            cli_first = run % 2 == 0  # alternate which side goes first
            for side in ((True, False) if cli_first else (False, True)):
                reset_tables(conn)
                if side:
                    took = timed(lambda: cli(url, "enqueue", "bench", "--from", str(lines)))
                else:
                    batches = [specs[i : i + ENQUEUE_BATCH] for i in range(0, len(specs), ENQUEUE_BATCH)]
                    took = timed(lambda: [enqueue_many(conn, [{"name": "bench", "args": s} for s in b]) for b in batches])
                seconds["enqueue"][0 if side else 1].append(took)

                fill(conn, jobs)
                discard_all(conn)
                if side:
                    took = timed(lambda: cli(url, "jobs", "retry", "--state", "discarded", "--yes"))
                else:
                    took = timed(lambda: conn.execute(
                        "SELECT count(treadle.retry(id)) FROM treadle.jobs WHERE state = 'discarded'"))
                seconds["retry"][0 if side else 1].append(took)

                fill(conn, jobs)
                finish_all_days_ago(conn)
                if side:
                    took = timed(lambda: cli(url, "prune", "--older-than", "1d"))
                else:
                    took = timed(lambda: conn.execute("SELECT treadle.prune(interval '1 day')"))
                seconds["prune"][0 if side else 1].append(took)
                left = conn.execute("SELECT count(*) FROM treadle.jobs").fetchone()
                assert left == (0,), f"prune left {left} jobs"
    return seconds


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--jobs", type=int, default=20_000, help="jobs per action, run and side (default 20,000)")
    args = p.parse_args()
    jobs = 300 if args.smoke else args.jobs
    with tempfile.TemporaryDirectory() as folder, server() as url, database(url, "cli") as db:
        lines = Path(folder) / "jobs.jsonl"
        lines.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(jobs)))
        print_settings(db)
        seconds = measure(db, jobs, args.runs, lines)
    rows = []
    labels = {
        "enqueue": ("treadle enqueue --from FILE", "enqueue_many in-process, same batches"),
        "retry": ("treadle jobs retry --state discarded --yes", "one SELECT treadle.retry(id) statement"),
        "prune": ("treadle prune --older-than 1d (windows of 10,000)", "one treadle.prune call"),
    }
    for key, (command, baseline) in labels.items():
        with_cli, alone = seconds[key]
        rates_cli = [jobs / s for s in with_cli]
        rates_alone = [jobs / s for s in alone]
        rows.append([command, spread(rates_cli, 0), baseline, spread(rates_alone, 0),
                     paired_ratio(rates_cli, rates_alone)])
    startup = median(seconds["start-up"][0])
    table(
        TITLE,
        ["command", "jobs/s", "baseline", "jobs/s", "ratio to baseline"],
        rows,
        notes=[f"{runs_text(args.runs)} of {jobs:,} jobs per action and side: median (range). The command's "
               "figures include starting its process: `treadle --version --dsn` alone took "
               f"{startup:.2f} s (median). The machine is shared: compare the ratios, not the rates."],
    )


if __name__ == "__main__":
    main()
