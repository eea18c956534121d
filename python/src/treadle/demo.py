"""The example that `make demo` runs: a worker on a few kinds of job, the dashboard,
and a steady trickle of new work, so the dashboard has something live to show.

    python -m treadle.demo --dsn postgresql://... [--port 5000] [--seconds N]

Some jobs succeed, some fail and retry, one kind always fails and is discarded,
one job repeats every 30 seconds, and an `order` workflow runs three steps (one
order in a few has an expired card, so its `charge` step fails and the run fails).
SIGINT or SIGTERM stops everything the demo started.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import socket
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
from werkzeug.serving import make_server

from . import client
from .dashboard import create_app, dashboard_of
from .dashboard.security import LOOPBACK_NAMES
from .worker import JobContext, Step, Worker

QUEUES = ["default", "mail", "media", "billing"]
TRICKLE_EVERY = 3.0  # seconds between batches of new work


# handlers: `fn(args, ctx)`; steps: `fn(input, ctx)`, the earlier results on ctx.results


def send_email(args: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    time.sleep(random.uniform(0.1, 0.8))
    return {"delivered_to": args.get("to")}


def resize_image(args: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    for part in range(1, 5):
        time.sleep(0.6)
        ctx.progress(part / 4, f"resized {part} of 4 sizes")
    return {"sizes": [64, 256, 1024, 2048]}


def sync_crm(args: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Flaky: the first two attempts time out, the third gets through."""
    time.sleep(0.3)
    if ctx.attempt < 3:
        raise ConnectionError(f"CRM did not answer within 5 s (attempt {ctx.attempt})")
    return {"synced": args.get("account")}


def charge_card(args: dict[str, Any], ctx: JobContext) -> None:
    """Always refused: it is discarded when its attempts run out."""
    raise ValueError(f"card {args.get('card', '?')} declined: insufficient funds")


def nightly_report(args: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    time.sleep(0.5)
    return {"rows": random.randint(100, 999)}


def reserve(input: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    time.sleep(0.4)
    return {"hold": f"hold-{input['order']}"}


def charge(input: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    time.sleep(0.4)
    if input.get("card") == "expired":
        raise ValueError(f"card for order {input['order']} expired")
    return {"payment": f"pay-{ctx.results['reserve']['hold']}"}


def ship(input: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    time.sleep(0.4)
    return {"tracking": f"TRK{input['order']:06d}"}


def build_worker(dsn: str) -> Worker:
    worker = Worker(
        dsn,
        queues=QUEUES,
        concurrency=4,
        poll_interval=1.0,
        lease=30,
        stop_timeout=5,
        backoff=lambda attempt: 2.0 * attempt,  # quick retries, so the demo shows them
    )
    worker.register("send_email", send_email)
    worker.register("resize_image", resize_image)
    worker.register("sync_crm", sync_crm)
    worker.register("charge_card", charge_card)
    worker.register("nightly_report", nightly_report)
    worker.workflow("order", [Step("reserve", reserve), Step("charge", charge), Step("ship", ship)])
    return worker


def enqueue_examples(conn: psycopg.Connection[Any], round_no: int) -> None:
    """One batch of new work; the first batch also starts the periodic report."""
    with conn.transaction():
        for n in range(random.randint(1, 3)):
            client.enqueue(conn, "send_email", {"to": f"user{round_no}-{n}@example.com"}, queue="mail")
        if round_no % 2 == 0:
            client.enqueue(conn, "resize_image", {"image": f"photo-{round_no}.jpg"}, queue="media")
        if round_no % 4 == 0:
            client.enqueue(conn, "sync_crm", {"account": f"acct-{round_no}"}, max_attempts=5)
        if round_no % 5 == 0:
            client.enqueue(conn, "charge_card", {"card": f"**** {1000 + round_no}"}, queue="billing", max_attempts=2)
        if round_no % 3 == 0:
            card = "expired" if round_no % 9 == 0 else "valid"
            client.start_workflow(conn, "order", {"order": round_no, "card": card}, max_attempts=2)
        if round_no == 0:
            client.enqueue(
                conn, "nightly_report", {}, every=timedelta(seconds=30), idempotency_key="demo:nightly_report"
            )


def install(dsn: str) -> None:
    """CREATE EXTENSION when the database lacks it; exit with advice when the server lacks its files."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS treadle")
        except psycopg.errors.UndefinedFile:
            sys.exit(
                "demo: this PostgreSQL has no treadle extension files. Install them into the server "
                "the database runs on (`make install`, as a user who may write to `pg_config --sharedir`), "
                "then run the demo again."
            )


def dashboard_port(port: int) -> int:
    """The port asked for, or 0 (any free one) when something else holds it."""
    if port == 0:
        return 0
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            print(f"demo: port {port} is taken, so the dashboard takes a free one", file=sys.stderr)
            return 0
    return port


def trickle(dsn: str, stopping: threading.Event) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        round_no = 0
        while not stopping.is_set():
            try:
                enqueue_examples(conn, round_no)
            except psycopg.OperationalError as error:
                print(f"demo: could not enqueue ({error}); trying again", file=sys.stderr)
            round_no += 1
            stopping.wait(TRICKLE_EVERY)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m treadle.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("DATABASE_URL"), help="database URL (default: $DATABASE_URL)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "5000")), help="dashboard port")
    parser.add_argument(
        "--seconds",
        type=float,
        default=float(os.environ.get("TREADLE_DEMO_SECONDS", "0")),
        help="stop by itself after this many seconds (0: run until stopped)",
    )
    parser.add_argument("--no-dashboard", action="store_true", help="run the worker and the trickle only")
    options = parser.parse_args(argv)
    if not options.dsn:
        parser.error("give --dsn or set DATABASE_URL")
    if options.seconds < 0 or not 0 <= options.port <= 65535:
        parser.error("--seconds must not be negative, --port must be between 0 and 65535")
    return options


def main(argv: list[str] | None = None) -> int:
    options = parse(sys.argv[1:] if argv is None else argv)
    install(options.dsn)

    stopping = threading.Event()  # tells the feeder thread
    signalled: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        # a flag only: setting the Event here could deadlock on its lock, held by the main thread
        signalled.append(signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    worker = build_worker(options.dsn)
    worker.start()
    feeder = threading.Thread(target=trickle, args=(options.dsn, stopping), name="demo-trickle", daemon=True)
    feeder.start()

    server = app = None
    if not options.no_dashboard:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per page refresh
        app = create_app(options.dsn, refresh_seconds=2, trusted_hosts=LOOPBACK_NAMES)
        server = make_server("127.0.0.1", dashboard_port(options.port), app, threaded=True)
        threading.Thread(target=server.serve_forever, name="demo-dashboard", daemon=True).start()

    print("treadle demo")
    if server is not None:
        print(f"  dashboard: http://127.0.0.1:{server.server_port}/")
    print(f"  database:  {options.dsn}")
    print("  a worker runs example jobs; new ones arrive every few seconds. Ctrl-C stops it all.", flush=True)

    deadline = time.monotonic() + options.seconds if options.seconds else None
    while not signalled and (deadline is None or time.monotonic() < deadline):
        time.sleep(0.1)
    stopping.set()
    print("demo: stopping", file=sys.stderr)
    if server is not None and app is not None:
        server.shutdown()
        server.server_close()
        dashboard_of(app).close()
    feeder.join(timeout=10)
    worker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
