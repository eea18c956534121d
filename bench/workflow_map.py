"""Workflow map steps: the cost of fanning a step out over 10,000 elements and of joining them.

A run of three steps, load -> resize (maps over load's result) -> report. Per run it
times: load's completion with an array of --elements numbers (the map step becomes one
job per element, in one INSERT ... SELECT, in that transaction); every element job
claimed and completed, 100 per complete_many; and the completion of the last element
job alone, from the call until it returns: that transaction counts the step done,
gathers the element results in order and enqueues report, so when it commits the join
job is available (the time from the map step's completion to its join's start, no
worker poll included). Beside it, the completion of one element job in the middle
(a count on the run row and nothing else). No raw baseline: raw SQL has no workflows.

    .build/venv/bin/python bench/workflow_map.py [--elements 10000] [--runs 3]
"""

from __future__ import annotations

import time

import psycopg
from harness import database, fmt, median, parser, print_settings, progress, server, table
from psycopg.types.json import Jsonb

TITLE = "Workflow map: a step over 10,000 elements"
BATCH = 100


def one_run(url: str, elements: int, queue: str) -> dict[str, float]:
    with psycopg.connect(url, autocommit=True) as conn:
        run_id = conn.execute(
            "SELECT treadle.start_workflow('thumbs', '{}', steps => ARRAY['load', 'resize', 'report'],"
            ' maps => \'{"resize": "load"}\', queue => %s)',
            (queue,),
        ).fetchone()[0]  # type: ignore[index]
        [(job_id, token)] = conn.execute(
            "SELECT id, lease_token FROM treadle.claim('w', ARRAY[%s])", (queue,)
        ).fetchall()
        began = time.perf_counter()
        conn.execute("SELECT treadle.complete(%s, %s, %s)", (job_id, token, Jsonb(list(range(elements)))))
        fan_out = time.perf_counter() - began

        began = time.perf_counter()
        held: list[tuple[int, object]] = []
        while batch := conn.execute(
            "SELECT id, lease_token FROM treadle.claim('w', ARRAY[%s], batch => 1000)", (queue,)
        ).fetchall():
            held.extend(batch)
        claimed = time.perf_counter() - began
        last, middle = held.pop(), held.pop(len(held) // 2)
        began = time.perf_counter()
        for start in range(0, len(held), BATCH):
            chunk = held[start : start + BATCH]
            conn.execute(
                "SELECT count(*) FROM treadle.complete_many(%s, %s, %s::jsonb[])",
                ([i for i, _ in chunk], [t for _, t in chunk], [Jsonb(i) for i, _ in chunk]),
            )
        completed = time.perf_counter() - began
        began = time.perf_counter()
        conn.execute("SELECT treadle.complete(%s, %s, '1')", middle)
        one = time.perf_counter() - began
        began = time.perf_counter()
        conn.execute("SELECT treadle.complete(%s, %s, '1')", last)
        join = time.perf_counter() - began
        report = conn.execute(
            "SELECT count(*) FROM treadle.jobs WHERE workflow_run_id = %s AND step = 'report' AND state = 'available'",
            (run_id,),
        ).fetchone()[0]  # type: ignore[index]
        assert report == 1, f"report enqueued {report} times"
    return {
        "fan_out": fan_out * 1000,
        "claim": claimed * 1000,
        "complete": completed / (elements - 2) * 1e6,
        "one": one * 1000,
        "join": join * 1000,
    }


def main() -> None:
    p = parser(TITLE)
    p.add_argument("--elements", type=int, default=10_000)
    args = p.parse_args()
    elements = 100 if args.smoke else args.elements
    with server() as url:
        print_settings(url)
        samples: list[dict[str, float]] = []
        with database(url, "workflow_map") as db:
            for run in range(args.runs):
                progress(f"run {run + 1}/{args.runs}: {elements} elements")
                samples.append(one_run(db, elements, f"map-{run}"))

    def cell(key: str) -> str:
        values = [s[key] for s in samples]
        return f"{fmt(median(values))} [{fmt(min(values))}-{fmt(max(values))}]"

    table(
        f"{TITLE} ({elements} elements, median [range] of {args.runs} runs)",
        ["what", "time"],
        [
            ["load completes: the map step's jobs enqueued (ms)", cell("fan_out")],
            ["every element job claimed, 1000 a call (ms)", cell("claim")],
            [f"element jobs completed, {BATCH} a call (us per job)", cell("complete")],
            ["one element job in the middle completes (ms)", cell("one")],
            ["the last element job completes: results gathered, report enqueued (ms)", cell("join")],
        ],
    )


if __name__ == "__main__":
    main()
