"""A workflow run's server CPU and lock waits, this tree's advance path against another revision's.

In one database, before each side the functions of sql/src/050_finish.sql and
070_workflows.sql are created again from that side's files (`git show REV:...` for the
other revision, this tree's otherwise), then bench/workflows.py's linear side (--linear-runs
runs of a -> b -> c drained on one connection) and parallel side (--parallel-runs runs of
a -> b1..b4 -> join drained by 4 connections, pg_stat_activity sampled every 10 ms) run;
plain jobs run beside them the same way. The three sides take turns in each round (the
order rotating); figures are medians (range) over the rounds of the backends' CPU
(/proc/PID/stat) per job, and ratios are taken round by round.

    .build/venv/bin/python bench/workflow_cost.py [--runs 5] [--before main] [--linear-runs 2000]
                                                  [--parallel-runs 1000]
"""

from __future__ import annotations

import subprocess

import psycopg
from harness import ROOT, database, median, paired_ratio, parser, print_settings, progress, server, spread, table
from workflows import linear_side, parallel_side

TITLE = "A workflow run's server CPU and lock waits: this tree against another revision"
FILES = ["sql/src/050_finish.sql", "sql/src/070_workflows.sql"]


def sources(rev: str) -> str:
    """The functions of FILES at `rev` ('.': this tree)."""
    if rev == ".":
        return "\n".join((ROOT / f).read_text() for f in FILES)
    shown = [subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{f}"], check=True, capture_output=True, text=True)
             for f in FILES]  # fmt: skip
    return "\n".join(done.stdout for done in shown)


def main() -> None:
    p = parser(TITLE)
    p.add_argument("--before", default="main", help="the revision to compare with (default main; '.': this tree)")
    p.add_argument("--linear-runs", type=int, default=2000)
    p.add_argument("--parallel-runs", type=int, default=1000)
    args = p.parse_args()
    if args.smoke:
        args.linear_runs, args.parallel_runs, args.before = 20, 10, "."
    code = {"before": sources(args.before), "this": sources(".")}
    sides = ["before", "this", "plain"]
    lin: dict[str, list[float]] = {s: [] for s in sides}
    par: dict[str, list[float]] = {s: [] for s in sides}
    share: dict[str, list[float]] = {s: [] for s in sides}
    with server() as url:
        print_settings(url)
        with database(url, "workflow_cost") as db:
            for r in range(args.runs):
                order = sides[r % 3 :] + sides[: r % 3]
                for side in order:
                    if side != "plain":
                        with psycopg.connect(db, autocommit=True) as conn:
                            conn.execute(code[side].encode())
                    kind = "plain" if side == "plain" else "run"
                    progress(f"round {r + 1}/{args.runs}: {side}")
                    _, cpu = linear_side(db, kind, args.linear_runs, 10, f"lin-{r}-{side}")
                    lin[side].append(cpu * 1000 / (3 * args.linear_runs))
                    got = parallel_side(db, kind, args.parallel_runs, 10, f"par-{r}-{side}")
                    par[side].append(got["cpu_ms"])
                    share[side].append(got["share"])
    table(
        f"{TITLE} (median (range) of {args.runs} rounds; before = {args.before})",
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
                f"parallel: {args.parallel_runs} runs a -> b1..b4 -> join: server CPU ms per job",
                spread(par["before"], 3),
                spread(par["this"], 3),
                spread(par["plain"], 3),
                paired_ratio(par["this"], par["before"]),
                paired_ratio(par["before"], par["plain"]),
                paired_ratio(par["this"], par["plain"]),
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
        [f"median lock share: before {median(share['before']):.1f}%, this tree {median(share['this']):.1f}%"],
    )


if __name__ == "__main__":
    main()
