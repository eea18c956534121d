"""A workflow run's server CPU and lock waits, this tree's advance path against another revision's.

In one database, before each side the functions of sql/src/040_claim.sql, 045_cycle.sql,
048_done_waiters.sql, 050_finish.sql, 051_workflow_lists.sql, 070_workflows.sql, 071_workflow_notify.sql,
073_workflow_joins.sql, 073_workflow_rechecks.sql and 076_workflow_children.sql are created again from
that side's files (`git show REV:...` for the other revision, a file it lacks left out; this
tree's otherwise), then bench/workflows.py's linear side (--linear-runs runs of a -> b -> c
drained on one connection) and parallel side (--parallel-runs runs of a -> b1..b4 -> join
drained by 4 connections, pg_stat_activity sampled every 10 ms) run, drained by --drain:
"claim" (treadle.claim, then treadle.complete_many) or "cycle" (treadle.complete_and_claim,
the worker's statement), --batch jobs per claim (and so per finish);
plain jobs run beside them the same way, and, linear only, plain jobs of three names claimed
over the three (as a worker with three handlers claims them, and a run's worker its three
steps). The sides take turns in each round (the order rotating); figures are medians
(range) over the rounds of the backends' CPU (/proc/PID/stat) per job, and ratios are taken
round by round.

    .build/venv/bin/python bench/workflow_cost.py [--runs 5] [--before main] [--linear-runs 2000]
                                                  [--parallel-runs 1000] [--drain claim|cycle] [--batch 10]
"""

from __future__ import annotations

import subprocess
from collections import Counter

import psycopg
from harness import ROOT, database, median, paired_ratio, parser, print_settings, progress, server, spread, table
from workflows import DRAINS, PLAIN3, linear_side, parallel_side

TITLE = "A workflow run's server CPU and lock waits: this tree against another revision"
FILES = ["sql/src/040_claim.sql", "sql/src/045_cycle.sql", "sql/src/048_done_waiters.sql", "sql/src/050_finish.sql",
         "sql/src/051_workflow_lists.sql", "sql/src/070_workflows.sql", "sql/src/071_workflow_notify.sql",
         "sql/src/073_workflow_joins.sql", "sql/src/073_workflow_rechecks.sql", "sql/src/076_workflow_children.sql"]


def sources(rev: str) -> str:
    """The functions of FILES at `rev` ('.': this tree)."""
    if rev == ".":
        return "\n".join((ROOT / f).read_text() for f in FILES if (ROOT / f).exists())
    shown = [subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{f}"], capture_output=True, text=True)
             for f in FILES]  # fmt: skip
    return "\n".join(done.stdout for done in shown if done.returncode == 0)


def main() -> None:
    p = parser(TITLE)
    p.add_argument("--before", default="main", help="the revision to compare with (default main; '.': this tree)")
    p.add_argument("--linear-runs", type=int, default=2000)
    p.add_argument("--parallel-runs", type=int, default=1000)
    p.add_argument("--drain", choices=DRAINS, default="claim",
                   help="claim, then complete_many (default); or complete_and_claim (cycle)")
    p.add_argument("--batch", type=int, default=10, help="jobs per claim, and so per finish (default 10)")
    args = p.parse_args()
    if args.smoke:
        args.linear_runs, args.parallel_runs, args.before = 20, 10, "."
    code = {"before": sources(args.before), "this": sources(".")}
    sides = ["before", "this", "plain"]  # (and PLAIN3, linear only)
    every = [*sides, PLAIN3]
    lin: dict[str, list[float]] = {s: [] for s in every}
    par: dict[str, list[float]] = {s: [] for s in sides}
    share: dict[str, list[float]] = {s: [] for s in sides}
    events: dict[str, Counter[str]] = {s: Counter() for s in sides}  # wait events, backend samples
    joins: dict[str, list[tuple[float, ...]]] = {s: [] for s in sides}  # last branch -> join start, enqueue: ms
    with server() as url:
        print_settings(url)
        with database(url, "workflow_cost") as db:
            for r in range(args.runs):
                order = every[r % 4 :] + every[: r % 4]
                for side in order:
                    # (plain jobs run on this tree's functions, not on those of the side before them)
                    with psycopg.connect(db, autocommit=True) as conn:
                        conn.execute(code[side if side in code else "this"].encode())
                    kind = "run" if side in code else side
                    progress(f"round {r + 1}/{args.runs}: {side}")
                    _, cpu = linear_side(db, kind, args.linear_runs, args.batch, f"lin-{r}-{every.index(side)}",
                                         how=args.drain)  # fmt: skip
                    lin[side].append(cpu * 1000 / (3 * args.linear_runs))
                    if side == PLAIN3:  # (linear only)
                        continue
                    got = parallel_side(db, kind, args.parallel_runs, args.batch, f"par-{r}-{side}", how=args.drain)
                    par[side].append(got["cpu_ms"])
                    share[side].append(got["share"])
                    events[side].update(got["events"])
                    joins[side].append(got["join_ms"])
    table(
        f"{TITLE} (median (range) of {args.runs} rounds; before = {args.before}; drain = {args.drain};"
        f" batch {args.batch})",
        ["scenario", "before", "this tree", "plain jobs", "this / before", "before / plain", "this / plain"],
        [
            [
                f"linear: {args.linear_runs} runs of 3 steps: server CPU ms per job",
                spread(lin["before"], 3),
                spread(lin["this"], 3),
                spread(lin["plain"], 3),
                paired_ratio(lin["this"], lin["before"]),
                paired_ratio(lin["before"], lin["plain"]),
                paired_ratio(lin["this"], lin["plain"]),
            ],
            [
                "linear: the same, against plain jobs of three names claimed over the three",
                "-",
                "-",
                spread(lin[PLAIN3], 3),
                "-",
                paired_ratio(lin["before"], lin[PLAIN3]),
                paired_ratio(lin["this"], lin[PLAIN3]),
            ],
            [
                f"parallel: {args.parallel_runs} runs a -> b1..b4 -> join: server CPU ms per job",
                spread(par["before"], 3),
                spread(par["this"], 3),
                spread(par["plain"], 3),
                paired_ratio(par["this"], par["before"]),
                paired_ratio(par["before"], par["plain"]),
                paired_ratio(par["this"], par["plain"]),
            ],
            [
                "parallel: the last branch's completion to the join's start, ms: median",
                spread([j[0] for j in joins["before"]], 1),
                spread([j[0] for j in joins["this"]], 1),
                "-", "-", "-", "-",
            ],
            [
                "parallel: the same, p99 (ms)",
                spread([j[1] for j in joins["before"]], 1),
                spread([j[1] for j in joins["this"]], 1),
                "-", "-", "-", "-",
            ],
            [
                "parallel: the last branch's completion to the join's enqueue, ms: median",
                spread([j[2] for j in joins["before"]], 1),
                spread([j[2] for j in joins["this"]], 1),
                "-", "-", "-", "-",
            ],
            [
                "parallel: the same, p99 (ms)",
                spread([j[3] for j in joins["before"]], 1),
                spread([j[3] for j in joins["this"]], 1),
                "-", "-", "-", "-",
            ],
            [
                "parallel: samples with a backend waiting on a Lock (%)",
                spread(share["before"]),
                spread(share["this"]),
                spread(share["plain"]),
                "-",
                "-",
                "-",
            ],
        ],
        [f"median lock share: before {median(share['before']):.1f}%, this tree {median(share['this']):.1f}%"]
        + [f"wait events, {side} (backend samples over the rounds): "
           + ", ".join(f"{event} {n}" for event, n in events[side].most_common(6)) for side in sides],
    )


if __name__ == "__main__":
    main()
