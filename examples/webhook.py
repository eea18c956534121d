"""Outgoing webhooks, retried with backoff until the receiver accepts them.

Each delivery is a job. A handler that raises fails the attempt; treadle retries it
after a backoff, and discards the job once max_attempts attempts have failed. Every
attempt sends the same Idempotency-Key header, built from the job id, so a receiver can
drop a delivery it already processed.

The receiver here is a small HTTP server in this process: /flaky answers 503 twice and
then 200, /broken always answers 500. The worker's backoff is shortened so the example
finishes in a few seconds.

    DATABASE_URL=postgresql://localhost/app python examples/webhook.py
"""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
import treadle

DSN = os.environ["DATABASE_URL"]
QUEUE = "webhooks"


class Receiver(BaseHTTPRequestHandler):
    """Answers /flaky with 503 twice, then 200; /broken always with 500."""

    deliveries: list[tuple[str, str, dict]] = []
    flaky_failures_left = 2
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            self.deliveries.append((self.path, self.headers["Idempotency-Key"], body))
            if self.path == "/broken":
                status = 500
            elif self.path == "/flaky" and Receiver.flaky_failures_left > 0:
                Receiver.flaky_failures_left -= 1
                status = 503
            else:
                status = 200
        self.send_response(status)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def deliver_webhook(args: dict, ctx: treadle.JobContext) -> dict:
    request = urllib.request.Request(
        args["url"],
        data=json.dumps(args["event"]).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": f"webhook-{ctx.job_id}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return {"status": response.status, "attempt": ctx.attempt}
    except urllib.error.HTTPError as error:
        # Raising fails this attempt; the message becomes the job's last_error.
        raise RuntimeError(f"{args['url']} answered {error.code}") from None


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"

    event = {"type": "invoice.paid", "invoice": 1042}
    with psycopg.connect(DSN) as conn:
        flaky = treadle.enqueue(conn, "deliver_webhook", {"url": f"{base}/flaky", "event": event},
                                queue=QUEUE, max_attempts=5)
        broken = treadle.enqueue(conn, "deliver_webhook", {"url": f"{base}/broken", "event": event},
                                 queue=QUEUE, max_attempts=3)

    # Production keeps the default backoff (2^attempt seconds plus jitter, at most an
    # hour). Here: 0.2 s, 0.4 s, 0.6 s ...
    worker = treadle.Worker(DSN, queues=[QUEUE], poll_interval=0.2, backoff=lambda attempt: 0.2 * attempt)
    worker.register("deliver_webhook", deliver_webhook)
    with worker:
        result = treadle.wait(DSN, flaky, timeout=60)
        print(f"job {flaky} delivered:", result)
        try:
            treadle.wait(DSN, broken, timeout=60)
            raise AssertionError("the broken endpoint never accepts a delivery")
        except treadle.JobFailed as failed:
            # failed.error is the last attempt's traceback; its last line is the exception
            print(f"job {broken} discarded after 3 attempts:", failed.error.splitlines()[-1])
    server.shutdown()

    assert result == {"status": 200, "attempt": 3}, result
    flaky_keys = [key for path, key, _ in Receiver.deliveries if path == "/flaky"]
    assert flaky_keys == [f"webhook-{flaky}"] * 3, flaky_keys
    assert [path for path, _, _ in Receiver.deliveries].count("/broken") == 3
    with psycopg.connect(DSN) as conn:
        errors = conn.execute(
            "select jsonb_array_length(errors), last_error from treadle.jobs where id = %s", [broken]
        ).fetchone()
    assert errors[0] == 3 and "answered 500" in errors[1], errors
    print("every attempt carried the same idempotency key")


if __name__ == "__main__":
    main()
