"""Retry policies: a handler that snoozes, discards, retries with its own backoff, and times out.

A report service builds reports slowly. `fetch_report` asks it for a report:
- not ready yet: `treadle.Snooze(seconds)`, so the job runs again later without
  spending one of its attempts (it may snooze any number of times);
- unknown report: `treadle.Discard`, so the job ends at once, discarded, since no
  retry can make it exist;
- the service fails: an ordinary exception, retried after the handler's backoff,
  at most max_attempts times;
- the service hangs: the attempt runs past its timeout; the handler sees
  ctx.cancelled and the attempt fails with JobTimeout.
Delays are shortened so the example finishes in a few seconds.

    DATABASE_URL=postgresql://localhost/app python examples/retry_policies.py
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta

import psycopg
import treadle

DSN = os.environ["DATABASE_URL"]
QUEUE = "reports"


class ReportService:
    """Report 7 is ready after three polls; report 8 fails twice; report 9 hangs; others do not exist."""

    def __init__(self) -> None:
        self.polls: dict[int, int] = {}
        self.lock = threading.Lock()

    def fetch(self, report: int, cancelled: threading.Event) -> str:
        with self.lock:
            self.polls[report] = polls = self.polls.get(report, 0) + 1
        if report == 7:
            return "ready" if polls >= 3 else "building"
        if report == 8:
            if polls <= 2:
                raise ConnectionError("report service unavailable")
            return "ready"
        if report == 9:
            cancelled.wait(60)  # hangs until the worker cancels the attempt
            return "too late"
        return "unknown"


service = ReportService()
worker = treadle.Worker(DSN, queues=[QUEUE], poll_interval=0.1)


@worker.register("fetch_report", max_attempts=4, backoff=lambda attempt: 0.1 * attempt, timeout=10)
def fetch_report(args: dict, ctx: treadle.JobContext) -> dict:
    status = service.fetch(args["report"], ctx.cancelled)
    if status == "building":
        raise treadle.Snooze(0.2)  # poll again soon; not a failure
    if status == "unknown":
        raise treadle.Discard(f"report {args['report']} does not exist")
    ctx.check_cancelled()  # past the timeout this raises JobTimeout
    return {"report": args["report"], "attempt": ctx.attempt}


def main() -> None:
    with psycopg.connect(DSN) as conn:
        slow = treadle.enqueue(conn, "fetch_report", {"report": 7}, queue=QUEUE)
        flaky = treadle.enqueue(conn, "fetch_report", {"report": 8}, queue=QUEUE)
        missing = treadle.enqueue(conn, "fetch_report", {"report": 404}, queue=QUEUE)
        # a job's own timeout wins over the handler's 10 s
        hung = treadle.enqueue(
            conn, "fetch_report", {"report": 9}, queue=QUEUE, max_attempts=1, timeout=timedelta(seconds=0.5)
        )

    with worker:
        assert treadle.wait(DSN, slow, timeout=60) == {"report": 7, "attempt": 1}
        print(f"job {slow}: ready after 2 snoozes, still on attempt 1")
        assert treadle.wait(DSN, flaky, timeout=60) == {"report": 8, "attempt": 3}
        print(f"job {flaky}: ready on attempt 3, after 2 failures and the handler's backoff")
        for job_id, expected in ((missing, "Discard: report 404 does not exist"), (hung, "JobTimeout")):
            try:
                treadle.wait(DSN, job_id, timeout=60)
                raise AssertionError(f"job {job_id} should have been discarded")
            except treadle.JobFailed as failed:
                last_line = (failed.error or "").splitlines()[-1]
                assert expected in last_line, last_line
                print(f"job {job_id}: discarded: {last_line}")

    with psycopg.connect(DSN) as conn:
        attempts = conn.execute("select attempt from treadle.jobs where id = %s", [missing]).fetchone()
    assert attempts == (1,), attempts  # Discard ended it on its first attempt, of 4
    print("a discarded job spends no more attempts")


if __name__ == "__main__":
    main()
