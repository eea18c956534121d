"""treadle.rescue's server CPU, this tree's against another revision's, in one database.

The other revision's treadle.rescue, treadle._wake_runs and treadle._time_out_waits are
created beside this tree's as treadle.rescue_before (and _wake_runs_before,
_time_out_waits_before), from `git show REV:sql/src/...`. The two run interleaved (A, B,
A, B: the other first in odd rounds), each figure is the median over the rounds of the
backend's CPU time (/proc/PID/schedstat, in nanoseconds; /proc/PID/stat's clock ticks where
the kernel keeps no schedstat), and the ratio is this tree / the other, round by
round.

  idle    --calls rescues in a row with nothing to move: 10,000 jobs waiting and 1,000
          running with live leases, in 4 queues.
  moved   one rescue, from a new session, that moves --moved expired leases spread over
          the 4 queues; CPU per moved job.

    .build/venv/bin/python bench/rescue_cost.py [--runs 5] [--before main] [--calls 2000] [--moved 2000]
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import psycopg
from harness import ROOT, database, fmt, median, paired_ratio, parser, progress, server, table
from harness import cpu_seconds as harness_cpu_seconds

TITLE = "treadle.rescue's backend CPU, this tree against another revision"

FUNCTIONS = {"050_finish.sql": ["rescue", "_wake_runs"], "074_workflow_signals.sql": ["_time_out_waits"]}


def before_functions(rev: str) -> str:
    """The other revision's functions, renamed *_before and calling each other."""
    out = []
    for source, names in FUNCTIONS.items():
        if rev == ".":  # this tree against itself (the smoke test: no git history needed)
            text = (ROOT / "sql" / "src" / source).read_text()
        else:
            text = subprocess.run(["git", "show", f"{rev}:sql/src/{source}"], cwd=ROOT, check=True,
                                  capture_output=True, text=True).stdout  # fmt: skip
        for name in names:
            m = re.search(rf"CREATE OR REPLACE FUNCTION treadle\.{name}\(.*?\n\$\$;\n", text, re.S)
            assert m, f"no treadle.{name} in {rev}:{source}"
            out.append(m.group(0))
    sql = "\n".join(out)
    for name in ("rescue", "_wake_runs", "_time_out_waits"):
        sql = re.sub(rf"treadle\.{name}\(", f"treadle.{name}_before(", sql)
    return sql


def cpu_seconds(pid: int) -> float | None:
    """The CPU time a process on this machine has used, in nanoseconds' resolution where the
    kernel keeps schedstat (a clock tick, 10 ms, is 5 us a job at 2,000 moved)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return harness_cpu_seconds(pid)


def cpu_of(conn: psycopg.Connection[Any], sql: str, times: int) -> float:
    pid = conn.info.backend_pid
    start = cpu_seconds(pid)
    for _ in range(times):
        conn.execute(sql)
    end = cpu_seconds(pid)
    assert start is not None and end is not None
    return end - start


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--before", default="main", help="the revision to compare with (default main; '.': this tree)")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--moved", type=int, default=2000)
    args = p.parse_args()
    if args.smoke:
        args.calls, args.moved, args.runs, args.before = 50, 40, 1, "."
    fn = {"before": "treadle.rescue_before()", "this": "treadle.rescue()"}
    idle: dict[str, list[float]] = {"before": [], "this": []}
    moved: dict[str, list[float]] = {"before": [], "this": []}
    with server() as url, database(url, "rescue") as db:
        with psycopg.connect(db, autocommit=True) as admin:
            admin.execute(before_functions(args.before))
            admin.execute("SELECT treadle.enqueue('job', '{}', queue => 'q' || (g % 4)) "
                          "FROM generate_series(1, 11000) AS g")  # fmt: skip
            admin.execute("""UPDATE treadle.jobs SET state = 'running', attempt = 1, lease_until = now() + '1 hour',
                                    lease_token = gen_random_uuid(), worker_id = 'w', started_at = now()
                              WHERE id <= 1000""")
            admin.execute("VACUUM ANALYZE treadle.jobs")
            sessions = {k: psycopg.connect(db, autocommit=True) for k in fn}
            for k, s in sessions.items():
                s.execute(f"SELECT {fn[k]}")  # each session's cursor set up
            for r in range(args.runs):
                order = ["before", "this"] if r % 2 == 0 else ["this", "before"]
                for k in order:
                    idle[k].append(cpu_of(sessions[k], f"SELECT {fn[k]}", args.calls) / args.calls * 1e6)
                for k in order:
                    admin.execute("""UPDATE treadle.jobs SET state = 'running', attempt = 1, errors = '[]',
                                            lease_until = now() - interval '1 minute', lease_token = gen_random_uuid(),
                                            worker_id = 'w', started_at = now() - interval '2 minutes',
                                            finished_at = NULL, failed_at = NULL, last_error = NULL
                                      WHERE id > 1000 AND id <= 1000 + %s""", [args.moved])  # fmt: skip
                    with psycopg.connect(db, autocommit=True) as c:
                        c.execute("SELECT 1")
                        pid = c.info.backend_pid
                        start = cpu_seconds(pid)
                        row = c.execute(f"SELECT {fn[k]} AS n").fetchone()
                        end = cpu_seconds(pid)
                        assert row is not None and row[0] == args.moved, row
                        assert start is not None and end is not None
                        moved[k].append((end - start) / args.moved * 1e6)
                progress(f"round {r + 1}: idle {idle['before'][-1]:.1f}/{idle['this'][-1]:.1f} us, "
                         f"moved {moved['before'][-1]:.1f}/{moved['this'][-1]:.1f} us per job")  # fmt: skip
            for s in sessions.values():
                s.close()
    table(TITLE,
          ["case", args.before, "this tree", "ratio"],
          [["idle, per call (us)", fmt(median(idle["before"])), fmt(median(idle["this"])),
            paired_ratio(idle["this"], idle["before"])],
           ["moved, per job (us)", fmt(median(moved["before"])), fmt(median(moved["this"])),
            paired_ratio(moved["this"], moved["before"])]],
          [f"median of {args.runs} rounds; ratio: this tree / {args.before}, round by round"])  # fmt: skip


if __name__ == "__main__":
    main()
