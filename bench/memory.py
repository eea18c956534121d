"""Scenario 8, worker memory: the resident size of one worker process through the load scenario.

One worker process (concurrency 10, empty handlers) drains a bulk-enqueued
backlog, as in bench/load.py. Reported: its resident size once it is ready,
the peak through the drain (the kernel's high-water mark, VmHWM) and the size
after the drain; the raw worker process of the load baseline beside it.

    .build/venv/bin/python bench/memory.py [--jobs 20000] [--runs 3]
"""

from __future__ import annotations

from harness import (
    WorkerProcess,
    database,
    median,
    parser,
    print_settings,
    progress,
    ratio,
    runs_text,
    server,
    spread,
    table,
)
from load import drain

TITLE = "Worker memory: resident size of one worker process, MiB"


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--jobs", type=int, default=20_000, help="jobs per drain (default 20,000)")
    p.add_argument("--concurrency", type=int, default=10, help="the worker's concurrency (default 10)")
    args = p.parse_args()
    jobs = 300 if args.smoke else args.jobs

    sizes: dict[str, dict[str, list[float]]] = {k: {"ready": [], "peak": [], "end": []} for k in ("treadle", "raw")}
    with server() as url, database(url, "memory") as db:
        print_settings(db)
        for run in range(args.runs):
            for kind in (("treadle", "raw") if run % 2 == 0 else ("raw", "treadle")):
                progress(f"{kind}: run {run + 1}/{args.runs}, {jobs:,} jobs")
                seen: list[tuple[int, int]] = []  # (resident, peak so far) in KiB

                def watch(procs: list[WorkerProcess], seen: list[tuple[int, int]] = seen) -> None:
                    seen.append((procs[0].rss_kib(), procs[0].rss_kib("VmHWM")))

                drain(db, kind, 1, args.concurrency, jobs, watch=watch, on_ready=watch)
                sizes[kind]["ready"].append(seen[0][0] / 1024)
                sizes[kind]["end"].append(seen[-1][0] / 1024)
                sizes[kind]["peak"].append(seen[-1][1] / 1024)

    t, r = sizes["treadle"], sizes["raw"]
    table(TITLE, ["worker", "when ready", "peak", "after the drain", "peak ratio to raw"],
          [["treadle.Worker", spread(t["ready"], 1), spread(t["peak"], 1), spread(t["end"], 1),
            ratio(median(t["peak"]), median(r["peak"]))],
           ["raw worker", spread(r["ready"], 1), spread(r["peak"], 1), spread(r["end"], 1), "1.00"]],
          notes=[f"{jobs:,} jobs per drain, concurrency {args.concurrency}, {runs_text(args.runs)}: median (range). "
                 "Both are Python processes with psycopg loaded; the difference is the worker's own."])


if __name__ == "__main__":
    main()
