"""What every benchmark script shares: a server, a database, a bare baseline table,
timing, medians and tables.

A script runs against the server named by DATABASE_URL, or else starts a
throwaway cluster of its own with scripts/pgcluster and restarts it with the
settings below (PostgreSQL's defaults for durability, unlike the test clusters).
It makes a database of its own on that server, with treadle installed and a bare
copy of treadle.jobs (`bench_raw.jobs`: the same columns, checks and indexes,
no functions) for the raw SQL baselines, and drops it at the end.
"""

from __future__ import annotations

import argparse
import math
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
PYTHON = sys.executable

# Durable commits, as a production server runs; the test clusters turn these off.
SERVER_SETTINGS: dict[str, str] = {
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "max_connections": "200",
}
SHOWN_SETTINGS = (
    "server_version", "fsync", "synchronous_commit", "full_page_writes", "wal_level",
    "shared_buffers", "work_mem", "max_connections", "autovacuum", "jit",
)

# The raw baselines: the same claim, finish and insert, written by hand on a bare table.
RAW_SCHEMA = """
CREATE SCHEMA bench_raw;
CREATE TABLE bench_raw.jobs (LIKE treadle.jobs INCLUDING ALL);
"""
RAW_INSERT = """
INSERT INTO bench_raw.jobs (queue, name, args, run_at, created_at)
VALUES ('default', %(name)s, %(args)s, now(), now()) RETURNING id
"""
RAW_INSERT_SELECT = """
INSERT INTO bench_raw.jobs (queue, name, args, run_at, created_at)
SELECT 'default', %(name)s, a, now(), now() FROM unnest(%(args)s::jsonb[]) AS a
"""
# The raw claim in its fastest form: its one job name with `=` (`= ANY(array)` would make
# the planner walk the (queue, priority, ...) index past every other name), and the batch
# size as a literal, so that the server plans it once (with a LIMIT parameter a generic
# plan guesses a tenth of the table, so the server plans afresh at every call).
RAW_CLAIM = """
WITH c AS (
    SELECT id FROM bench_raw.jobs
     WHERE queue = %(queue)s AND name = %(name)s
       AND state = ANY('{{available,retryable}}') AND run_at <= now()
     ORDER BY priority, run_at, id
     LIMIT {batch:d}
       FOR UPDATE SKIP LOCKED)
UPDATE bench_raw.jobs AS j
   SET state = 'running', attempt = j.attempt + 1, lease_until = now() + %(lease)s::interval,
       lease_token = gen_random_uuid(), worker_id = %(worker_id)s, started_at = now()
  FROM c WHERE j.id = c.id
RETURNING j.*
"""
RAW_FINISH = """
UPDATE bench_raw.jobs
   SET state = 'completed', finished_at = now(), lease_until = NULL, lease_token = NULL
 WHERE id = ANY(%(ids)s)
"""
# The raw cycle in one statement, as the treadle worker's complete_and_claim: finish the
# jobs of the last batch and claim the next, one round trip and one commit per batch.
RAW_FINISH_AND_CLAIM = """
WITH done AS (
    UPDATE bench_raw.jobs
       SET state = 'completed', finished_at = now(), lease_until = NULL, lease_token = NULL
     WHERE id = ANY(%(ids)s::bigint[])
), c AS (
    SELECT id FROM bench_raw.jobs
     WHERE queue = %(queue)s AND name = %(name)s
       AND state = ANY('{{available,retryable}}') AND run_at <= now()
     ORDER BY priority, run_at, id
     LIMIT {batch:d}
       FOR UPDATE SKIP LOCKED)
UPDATE bench_raw.jobs AS j
   SET state = 'running', attempt = j.attempt + 1, lease_until = now() + %(lease)s::interval,
       lease_token = gen_random_uuid(), worker_id = %(worker_id)s, started_at = now()
  FROM c WHERE j.id = c.id
RETURNING j.*
"""
RAW_APPLICATION = "bench-raw-worker"  # the raw worker's connections, by application_name


def raw_finish_and_claim(batch: int) -> str:
    """The raw finish of the last batch and claim of `batch` more, in one statement."""
    return RAW_FINISH_AND_CLAIM.format(batch=batch)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time a process on this machine has used (/proc/PID/stat); None when gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def raw_claim(batch: int) -> str:
    """The raw claim of `batch` jobs."""
    return RAW_CLAIM.format(batch=batch)


TREADLE_CLAIM = """
SELECT * FROM treadle.claim(worker_id => %(worker_id)s, queues => ARRAY[%(queue)s], names => %(names)s,
                            batch => %(batch)s, lease => %(lease)s::interval)
"""


def progress(message: str) -> None:
    """A progress line on stderr, so that stdout holds only the tables."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--runs", type=int, default=3, help="repetitions; figures are the median and range (default 3)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: checks that the script works")
    return p


# --- server and database --------------------------------------------------------------------

@contextmanager
def server(extra_settings: dict[str, str] | None = None) -> Iterator[str]:
    """The URL of a server: DATABASE_URL, or a throwaway cluster started for this script
    (with extra_settings besides SERVER_SETTINGS)."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    folder = ROOT / ".build" / "bench-cluster" / f"{Path(sys.argv[0]).stem}-{os.getpid()}"
    script = str(ROOT / "scripts" / "pgcluster")
    progress(f"starting a throwaway cluster in {folder}")
    url = subprocess.run([script, "start", str(folder)], check=True, capture_output=True, text=True).stdout.strip()
    try:
        _restart_with_settings(folder, {**SERVER_SETTINGS, **(extra_settings or {})})
        yield url
    finally:
        subprocess.run([script, "stop", str(folder)], check=False)
        shutil.rmtree(folder, ignore_errors=True)


def _restart_with_settings(folder: Path, settings: dict[str, str]) -> None:
    # scripts/pgcluster starts test clusters without fsync; a benchmark runs durable.
    # Options given on the command line win over the configuration files, so restart with ours.
    port = (folder / "port").read_text().strip()
    options = [f"-p {port}", "-c listen_addresses=127.0.0.1", f"-c unix_socket_directories='{folder}'"]
    options += [f"-c {key}={value}" for key, value in settings.items()]
    pg_config = os.environ.get("PG_CONFIG", "pg_config")
    bindir = subprocess.run([pg_config, "--bindir"], check=True, capture_output=True, text=True).stdout.strip()
    pg_ctl = Path(bindir) / "pg_ctl"
    command = [str(pg_ctl), "-D", str(folder / "data"), "-l", str(folder / "server.log"), "-w", "-t", "60",
               "restart", "-m", "fast", "-o", " ".join(options)]
    if os.geteuid() == 0:
        command = ["runuser", "-u", "postgres", "--", *command]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def with_db(url: str, dbname: str) -> str:
    """The same server URL, naming another database."""
    base, _, tail = url.rpartition("/")
    query = tail.partition("?")[2]
    return f"{base}/{dbname}" + (f"?{query}" if query else "")


@contextmanager
def database(url: str, name: str) -> Iterator[str]:
    """A fresh database with treadle and the bare baseline table; dropped afterwards."""
    dbname = f"treadle_bench_{name}_{os.getpid()}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{dbname}"')
    db_url = with_db(url, dbname)
    try:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION treadle")
            conn.execute(RAW_SCHEMA)
        yield db_url
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def print_settings(url: str) -> None:
    with psycopg.connect(url) as conn:
        rows = [(name, conn.execute(f"SHOW {name}").fetchone()[0]) for name in SHOWN_SETTINGS]  # type: ignore[index]
    print("Server settings: " + ", ".join(f"{k}={v}" for k, v in rows))
    print(f"Machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start")
    print()


def reset_tables(conn: psycopg.Connection[Any]) -> None:
    """Empty both job tables (and what refers to them) between runs."""
    conn.execute("TRUNCATE treadle.jobs, treadle.workflow_runs, bench_raw.jobs CASCADE")
    conn.execute("VACUUM ANALYZE treadle.jobs")
    conn.execute("VACUUM ANALYZE bench_raw.jobs")


# --- figures --------------------------------------------------------------------------------

def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100) by the nearest-rank method."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(p / 100 * len(ordered))))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def fmt(value: float, digits: int = 2) -> str:
    if value != value:  # nan
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def spread(values: Sequence[float], digits: int = 2) -> str:
    """The median of several runs with their range: '4.10 (3.95–4.32)'."""
    if len(values) <= 1:
        return fmt(values[0], digits) if values else "-"
    return f"{fmt(median(values), digits)} ({fmt(min(values), digits)}–{fmt(max(values), digits)})"


def ratio(treadle: float, raw: float) -> str:
    if raw != raw or treadle != treadle or raw == 0:
        return "-"
    return f"{treadle / raw:.2f}"


def paired_ratio(treadle: Sequence[float], raw: Sequence[float]) -> str:
    """treadle / raw run by run (both sides ran side by side in each run): median and range."""
    pairs = [t / r for t, r in zip(treadle, raw, strict=True) if r]
    return spread(pairs) if pairs else "-"


def runs_text(runs: int) -> str:
    return f"{runs} run" if runs == 1 else f"{runs} runs"


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]], notes: Sequence[str] = ()) -> None:
    """A Markdown table under a '### title' line, so it can be pasted into the README."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"

    print(f"### {title}")
    print()
    print(line(cells[0]))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells[1:]:
        print(line(row))
    for note in notes:
        print(f"\n{note}")
    print(flush=True)


class Stopwatch:
    """Milliseconds of one block: `with Stopwatch() as s: ...; s.ms`."""

    def __enter__(self) -> Stopwatch:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.ms = (time.perf_counter() - self._start) * 1000


# --- worker processes -----------------------------------------------------------------------

class WorkerProcess:
    """bench/worker_<kind>.py (kind: treadle or raw) in a real process, driven over its pipes.

    It prints `ready`, then `start <job id> <unix time>` lines from the record and
    hang handlers; closing its stdin stops it, and it prints `maxrss <KiB>` last.
    """

    def __init__(self, kind: str, dsn: str, options: Sequence[str] = ()) -> None:
        self.kind = kind
        self.starts: list[tuple[int, float]] = []  # (job id, unix time) per handler start
        self.maxrss_kib: int | None = None
        self._lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self.proc = subprocess.Popen(
            [PYTHON, str(BENCH / f"worker_{kind}.py"), dsn, *options],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, cwd=ROOT)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            if line.startswith("start "):
                _, job_id, at = line.split()
                self.starts.append((int(job_id), float(at)))
            elif line.startswith("maxrss "):
                self.maxrss_kib = int(line.split()[1])
            self._lines.put(line)
        self._lines.put(None)

    def wait_for(self, prefix: str, timeout: float) -> str:
        """The next line of output that starts with `prefix`."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                break
            if line is None:
                raise RuntimeError(f"the {self.kind} worker exited (code {self.proc.wait()}) before '{prefix}'")
            if line.startswith(prefix):
                return line
        raise TimeoutError(f"the {self.kind} worker printed no '{prefix}' within {timeout:g} s")

    def rss_kib(self, field: str = "VmRSS") -> int:
        """The process's resident size now (VmRSS), or its peak so far (VmHWM)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
        return 0

    def stop(self, timeout: float = 30) -> None:
        """Close its stdin and wait for it to stop (killed if it does not)."""
        if self.proc.poll() is None and self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)

    def kill(self) -> None:
        """SIGKILL: the worker dies mid-whatever, as in a crash."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


@contextmanager
def worker_processes(kind: str, dsn: str, count: int, options: Sequence[str] = (),
                     ready_timeout: float = 60) -> Iterator[list[WorkerProcess]]:
    """`count` worker processes, each claiming already; stopped at the end."""
    procs = [WorkerProcess(kind, dsn, options) for _ in range(count)]
    try:
        for proc in procs:
            proc.wait_for("ready", ready_timeout)
        yield procs
    finally:
        for proc in procs:
            if proc.proc.poll() is None and proc.proc.stdin is not None:
                proc.proc.stdin.close()
        for proc in procs:
            proc.stop()
