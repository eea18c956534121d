"""The claim loop keeps the slots it reserved for a claim until the jobs that claim took are
tracked: a write of successes that claims along meanwhile never counts those slots free, so
the worker never holds more jobs than `concurrency` and the jobs it claims ahead."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.worker.worker_support import wait_for
from treadle import JobContext, Worker
from treadle._producer import Producer

MakeWorker = Callable[..., Worker]

JOBS = 300
CONCURRENCY = 3


def test_a_write_of_successes_never_claims_the_slots_of_jobs_the_loop_has_not_tracked_yet(
    conn: psycopg.Connection[Any], make_worker: MakeWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The claim loop's hand-over of what it claimed (not the completer's, inline), made slow
    # (30 ms): the gap between its claim and the tracking of its jobs, where a write of
    # successes on the completer's thread claims along, stays open long enough to be met.
    # The loop claims for the slots that failures free (their writes claim nothing), while
    # successes finish beside them. (Without the reservation held through the hand-over,
    # this saw 4 and 5 jobs held with concurrency 3, in every run.)
    adopt = Producer.adopt
    most = [0]  # the most slots held right after a claim's jobs were tracked

    def slow_adopt(self: Producer, rows: list[tuple[Any, ...]], asked: int, *, inline: bool = False) -> list[Any]:
        if not inline:
            time.sleep(0.03)
        taken = adopt(self, rows, asked, inline=inline)
        most[0] = max(most[0], self._host.holding())
        return taken

    monkeypatch.setattr(Producer, "adopt", slow_adopt)
    worker = make_worker(concurrency=CONCURRENCY, claim_ahead=0, stop_timeout=0)

    @worker.register
    def tick(args: dict[str, Any], ctx: JobContext) -> None:
        time.sleep(0.005 * (1 + args["i"] % 4))  # slots free at different times
        if args["i"] % 3 == 0:
            raise ValueError("fails")  # (a failure's write claims nothing: the loop claims for its slot)

    jobs = [{"name": "tick", "args": {"i": i}, "max_attempts": 1} for i in range(JOBS)]
    conn.execute("SELECT count(*) FROM treadle.enqueue_many(%s)", [Jsonb(jobs)])
    worker.start()
    wait_for(
        lambda: (
            conn.execute("SELECT count(*) FROM treadle.jobs WHERE state <> ALL ('{available,running}')").fetchone()
            == (JOBS,)
        ),
        "every job to end",
        60,
    )
    assert most[0] > 0, "no claim was seen"
    assert most[0] <= CONCURRENCY, f"the worker held {most[0]} jobs at once with concurrency {CONCURRENCY}"
