"""treadle workflows signal: send a named signal to a workflow run."""

from __future__ import annotations

import argparse
import json
from typing import Any

from treadle import client

from ._base import OK, NotFound, Refused, UsageError, add_dsn, add_json, command, connect, print_json

# what treadle.signal says became of a signal -> the line printed for it
OUTCOMES = {
    "delivered": "delivered: the run's wait step completed with the payload",
    "kept": "kept: the run takes it when it reaches its wait step",
    "ignored": "ignored: the run waits for no further signal of that name; nothing was written",
    "finished": "the run has finished; nothing was written",
    "unknown": "no such run",
}


def add_commands(commands: Any) -> None:
    workflows = command(
        commands,
        "workflows",
        "act on workflow runs",
        examples=[
            'treadle workflows signal 42 approved --payload \'{"by": "ann"}\'',
            "treadle workflows signal --queue orders --key order-7 approved",
        ],
    )
    sub = workflows.add_subparsers(title="commands", required=True, metavar="COMMAND")
    signal = command(
        sub,
        "signal",
        "send a named signal to a workflow run (treadle.signal)",
        description=(
            "Send the signal NAME to a workflow run, by its id or, with --queue and --key, by the workflow "
            "idempotency key it was started with. A wait step of the run that waits for NAME completes with "
            "the payload as its result; a signal sent before the run reaches that step is kept for it. "
            "Exit 0 when it was delivered or kept, 3 for an unknown run, 4 when the run has finished or "
            "waits for no further signal of that name (nothing is written then)."
        ),
    )
    signal.add_argument("run", nargs="?", metavar="RUN", help="the run's id (or give --queue and --key)")
    signal.add_argument("name", metavar="NAME", help="the signal's name")
    signal.add_argument("--payload", metavar="JSON", help="the payload, a JSON object or array (default: {})")
    signal.add_argument("--queue", help="with --key: the queue the run was started in")
    signal.add_argument("--key", help="the run's workflow idempotency key (with --queue)")
    add_json(signal)
    add_dsn(signal)
    signal.set_defaults(command=send_signal)


def send_signal(options: argparse.Namespace) -> int:
    payload = None
    if options.payload is not None:
        try:
            payload = json.loads(options.payload)
        except json.JSONDecodeError as error:
            raise UsageError(f"--payload is not valid JSON: {error}") from None
        except RecursionError:
            raise UsageError("--payload is nested too deeply") from None
    by_key = options.queue is not None or options.key is not None
    if by_key and (options.queue is None or options.key is None):
        raise UsageError("--queue and --key go together")
    if by_key == (options.run is not None):
        raise UsageError("name the run: its id, or --queue and --key")
    run_id = None
    if options.run is not None:
        try:
            run_id = int(options.run)
        except ValueError:
            raise UsageError(f"RUN must be a run id (an integer), not {options.run!r}") from None
    with connect(options) as conn:
        if run_id is not None:
            outcome = client.signal(conn, run_id, options.name, payload)
        else:
            outcome = client.signal_by_key(conn, options.queue, options.key, options.name, payload)
    run = str(run_id) if run_id is not None else f"{options.queue}/{options.key}"
    if outcome == "unknown":
        raise NotFound(f"no workflow run {run}")
    if outcome in ("finished", "ignored"):
        raise Refused(f"signal {options.name!r} to run {run}: {OUTCOMES[outcome]}")
    if options.json:
        print_json({"run": run_id if run_id is not None else run, "signal": options.name, "outcome": outcome})
    else:
        print(OUTCOMES[outcome])
    return OK
