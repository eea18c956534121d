"""Order fulfilment: a workflow step that waits on a slow external service and heartbeats.

    charge  take the payment
    ship    ask the carrier for a shipping label, then poll until it is ready
    notify  tell the customer

The carrier takes longer than the worker's lease to make a label. While `ship` polls,
it calls ctx.heartbeat(): the lease moves forward, so no rescue hands the job to another
worker, and the answer says at once when the order was cancelled. (The worker also
heartbeats every running job by itself every heartbeat_interval; a handler's own calls
add a check at the moments it chooses.)

The carrier is a small HTTP server in this process. Order 1's label is ready after 16
polls; order 2's never is, and that order is cancelled while `ship` waits.

    DATABASE_URL=postgresql://localhost/app python examples/order_fulfilment.py
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
import treadle

DSN = os.environ["DATABASE_URL"]
QUEUE = "fulfilment"
POLL_SECONDS = 0.25


class Carrier(BaseHTTPRequestHandler):
    """POST /labels makes a label; GET /labels/<id> says pending until it has been polled 16 times."""

    polls: dict[int, int] = {}
    never_ready: set[int] = set()
    lock = threading.Lock()

    def do_POST(self) -> None:
        order = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["order"]
        with self.lock:
            self.polls.setdefault(order, 0)
        self.answer(202, {"label_id": order})

    def do_GET(self) -> None:
        label = int(self.path.rsplit("/", 1)[1])
        with self.lock:
            self.polls[label] += 1
            ready = self.polls[label] >= 16 and label not in self.never_ready
        self.answer(200, {"status": "ready", "tracking": f"TRK{label:06d}"} if ready else {"status": "pending"})

    def answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def call(url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def charge(input: dict, ctx: treadle.JobContext) -> dict:
    return {"charged": input["total"]}


def ship(input: dict, ctx: treadle.JobContext) -> dict:
    label = call(f"{input['carrier']}/labels", {"order": input["order"]})["label_id"]
    while True:
        status = call(f"{input['carrier']}/labels/{label}")
        if status["status"] == "ready":
            return {"tracking": status["tracking"]}
        # Extend the lease, and learn whether the order was cancelled meanwhile.
        if ctx.heartbeat() != "held":
            ctx.check_cancelled()  # raises JobCancelled (or LeaseLost): the step stops here
        time.sleep(POLL_SECONDS)


def notify(input: dict, ctx: treadle.JobContext) -> dict:
    return {"emailed": f"order {input['order']} ships as {ctx.results['ship']['tracking']}"}


def run_state(conn: psycopg.Connection, run_id: int) -> str:
    return conn.execute("select state from treadle.workflow_runs where id = %s", [run_id]).fetchone()[0]


def step_state(conn: psycopg.Connection, run_id: int, step: str) -> str:
    return conn.execute(
        "select state from treadle.workflow_run_steps where run_id = %s and step = %s", [run_id, step]
    ).fetchone()[0]


def wait_until(check, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("the example did not reach the state it waits for")
        time.sleep(0.05)


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Carrier)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    carrier = f"http://127.0.0.1:{server.server_port}"
    Carrier.never_ready.add(2)

    worker = treadle.Worker(DSN, queues=[QUEUE], lease=3, heartbeat_interval=1)
    worker.workflow("fulfil_order", [("charge", charge), ("ship", ship), ("notify", notify)])
    steps = ["charge", "ship", "notify"]
    with psycopg.connect(DSN) as conn:
        first = treadle.start_workflow(conn, "fulfil_order", {"order": 1, "total": 30, "carrier": carrier},
                                       steps=steps, queue=QUEUE)
        second = treadle.start_workflow(conn, "fulfil_order", {"order": 2, "total": 12, "carrier": carrier},
                                        steps=steps, queue=QUEUE)

    with worker, psycopg.connect(DSN, autocommit=True) as conn:
        wait_until(lambda: step_state(conn, second, "ship") == "running")
        print(f"run {second}: cancelled while 'ship' waits:", treadle.cancel_workflow(conn, second))
        wait_until(lambda: run_state(conn, first) != "running" and run_state(conn, second) != "running")
        first_state, second_state = run_state(conn, first), run_state(conn, second)
        results = treadle.workflow_results(conn, first)
        ship_attempt = conn.execute(
            "select attempt from treadle.workflow_run_steps where run_id = %s and step = 'ship'", [first]
        ).fetchone()[0]
        notified_second = step_state(conn, second, "notify")
    server.shutdown()

    print(f"run {first}: {first_state}, {results['notify']['emailed']}")
    print(f"run {second}: {second_state}; its 'notify' step is {notified_second}")
    assert first_state == "completed" and results["ship"] == {"tracking": "TRK000001"}, (first_state, results)
    assert Carrier.polls[1] >= 16 and ship_attempt == 1, (Carrier.polls, ship_attempt)
    assert second_state == "cancelled" and notified_second == "pending", (second_state, notified_second)
    print("'ship' outlived its lease on one attempt; the cancelled order stopped while it waited")


if __name__ == "__main__":
    main()
