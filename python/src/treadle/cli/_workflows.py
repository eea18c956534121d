"""treadle workflows list | show | cancel | retry | compensate | fork | signal: runs read, operated, signalled."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

import psycopg

from treadle import _sql, client
from treadle._display import when
from treadle.errors import WorkflowNotFound

from ._base import (
    OK,
    NotFound,
    Refused,
    UsageError,
    add_dsn,
    add_json,
    bounded_int,
    command,
    connect,
    one_line,
    positive_id,
    print_json,
    print_table,
)

RUN_STATES = ("running", "completed", "failed", "cancelled", "compensating", "compensated")
LIST_LIMIT = 50
MAX_LIMIT = 10_000

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
        "list, show, cancel, retry, compensate, fork and signal workflow runs",
        examples=[
            "treadle workflows list --state running --name checkout",
            "treadle workflows show 42",
            "treadle workflows cancel 42",
            "treadle workflows retry 42",
            "treadle workflows fork 42 charge",
            'treadle workflows signal 42 approved --payload \'{"by": "ann"}\'',
            "treadle workflows signal --queue orders --key order-7 approved",
        ],
    )
    sub = workflows.add_subparsers(title="commands", required=True, metavar="COMMAND")
    listing = command(
        sub,
        "list",
        "list workflow runs, newest first",
        examples=[
            "treadle workflows list",
            "treadle workflows list --state failed --queue orders --limit 200",
            "treadle workflows list --name checkout --json | jq '.[].id'",
        ],
    )
    listing.add_argument(
        "--state",
        action="append",
        choices=RUN_STATES,
        metavar="STATE",
        help=f"only runs in this state (repeatable): {', '.join(RUN_STATES)}",
    )
    listing.add_argument("--name", help="only runs of this workflow")
    listing.add_argument("--queue", help="only runs of this queue")
    listing.add_argument(
        "--limit",
        type=bounded_int(1, MAX_LIMIT),
        default=LIST_LIMIT,
        help=f"at most this many runs (default: {LIST_LIMIT}, at most {MAX_LIMIT:,})",
    )
    add_json(listing)
    add_dsn(listing)
    listing.set_defaults(command=list_runs)

    show = command(
        sub,
        "show",
        "one workflow run: its steps with state, attempts and timing, and why it is where it is",
        description=(
            "Show a workflow run: its fields, each step with its state, attempts and times, and what "
            "treadle.explain_run says of it: the steps not completed and what each waits for (its "
            "dependencies, a sleep, a signal, a map's element jobs, or what holds its job). "
            "Exit 3 for an unknown run."
        ),
        examples=["treadle workflows show 42", "treadle workflows show 42 --json | jq .explain"],
    )
    show.add_argument("run", type=positive_id, metavar="RUN", help="the run's id")
    add_json(show)
    add_dsn(show)
    show.set_defaults(command=show_run)

    cancel = command(
        sub,
        "cancel",
        "cancel a running workflow run (treadle.cancel_workflow)",
        description=(
            "Cancel a running workflow run: its waiting steps now (no step starts after this), its running "
            "steps when they end. With --compensate (treadle.cancel_run), in the same transaction its "
            "compensations start: the run is compensating, then compensated; a cancelled run is compensated. "
            "Exit 3 for an unknown run, 4 when it is not running or its cancel was already requested (with "
            "--compensate: not running nor cancelled, or no compensations; nothing is written then)."
        ),
        examples=["treadle workflows cancel 42", "treadle workflows cancel 42 --compensate"],
    )
    cancel.add_argument("run", type=positive_id, metavar="RUN", help="the run's id")
    cancel.add_argument(
        "--compensate", action="store_true", help="undo its completed steps too, in the same transaction"
    )
    add_json(cancel)
    add_dsn(cancel)
    cancel.set_defaults(command=cancel_run)

    retry = command(
        sub,
        "retry",
        "retry a failed or cancelled workflow run from its failed steps (treadle.retry_run)",
        description=(
            "Retry a failed or cancelled workflow run: its failed and cancelled steps run again with attempt 0, "
            "and what waits for them follows; completed steps keep their results and never run again. A run "
            "whose compensation failed runs that compensation again. Exit 3 for an unknown run, 4 for a run "
            "that is not failed or cancelled (nothing is written then)."
        ),
        examples=["treadle workflows retry 42"],
    )
    retry.add_argument("run", type=positive_id, metavar="RUN", help="the run's id")
    add_json(retry)
    add_dsn(retry)
    retry.set_defaults(command=retry_run)

    compensate = command(
        sub,
        "compensate",
        "undo a cancelled workflow run's completed steps (treadle.compensate_run)",
        description=(
            "Run the compensations of a cancelled workflow run's completed steps, the last completed first; "
            "the run is compensating, then compensated (or failed if a compensation fails for good). Exit 3 "
            "for an unknown run, 4 for a run that is not cancelled (a cancel still under way too) or has no "
            "compensations (nothing is written then)."
        ),
        examples=["treadle workflows cancel 42 && treadle workflows compensate 42"],
    )
    compensate.add_argument("run", type=positive_id, metavar="RUN", help="the run's id")
    add_json(compensate)
    add_dsn(compensate)
    compensate.set_defaults(command=compensate_run)

    fork = command(
        sub,
        "fork",
        "start a new run of a workflow run from one of its steps (treadle.fork_run)",
        description=(
            "Start a new run of the same workflow definition as RUN, carrying the results RUN recorded for "
            "every step that is neither STEP nor a step after it (directly or through others); STEP and the "
            "steps after it run again. RUN itself is not changed. Prints the new run's id. Exit 3 for an "
            "unknown run, 2 for a step RUN does not have or a bad --input (nothing is written then)."
        ),
        examples=["treadle workflows fork 42 charge", "treadle workflows fork 42 charge --input '{\"order\": 7}'"],
    )
    fork.add_argument("run", type=positive_id, metavar="RUN", help="the run's id")
    fork.add_argument("step", metavar="STEP", help="the step to run again from")
    fork.add_argument("--input", metavar="JSON", help="the new run's input (default: RUN's)")
    add_json(fork)
    add_dsn(fork)
    fork.set_defaults(command=fork_run)

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


def _text(value: str | None, option: str) -> str | None:
    """A filter's value: UsageError for a NUL character (no text in PostgreSQL holds one)."""
    if value is not None and "\x00" in value:
        raise UsageError(f"{option} contains a NUL character")
    return value


def list_runs(options: argparse.Namespace) -> int:
    params = {
        "states": options.state,
        "name": _text(options.name, "--name"),
        "queue": _text(options.queue, "--queue"),
        "limit": options.limit,
    }
    with connect(options) as conn:
        rows = conn.execute(_sql.LIST_WORKFLOW_RUNS, params).fetchall()
    if options.json:
        print_json(rows)
        return OK
    if not rows:
        print("no workflow runs")
        return OK
    print_table(
        ("ID", "WORKFLOW", "QUEUE", "STATE", "STEPS", "CREATED", "FINISHED"),
        [
            (
                str(row["id"]),
                row["name"],
                row["queue"],
                row["state"],
                f"{row['steps_done']}/{row['steps_total']}",
                when(row["created_at"]),
                when(row["finished_at"]),
            )
            for row in rows
        ],
        right=frozenset({0}),
    )
    return OK


RUN_SHOWN = (
    "name version queue state priority max_attempts idempotency_key created_at finished_at "
    "parent_run_id parent_step forked_from forked_step"
).split()


def show_run(options: argparse.Namespace) -> int:
    with connect(options) as conn:
        run = conn.execute(_sql.GET_WORKFLOW_RUN, {"run_id": options.run}).fetchone()
        if run is None:
            raise NotFound(f"no workflow run {options.run}")
        steps = conn.execute(_sql.WORKFLOW_RUN_STEPS, {"run_id": options.run}).fetchall()
        try:
            reasons = client.explain_run(conn, options.run)
        except WorkflowNotFound:
            raise NotFound(f"no workflow run {options.run}") from None
    if options.json:
        print_json(
            {
                "run": {**run, "input": json.loads(run["input"])},
                "steps": steps,
                "explain": [dataclasses.asdict(reason) for reason in reasons],
            }
        )
        return OK
    print(f"workflow run {run['id']}")
    width = max(map(len, RUN_SHOWN))
    for key in RUN_SHOWN:
        value = run[key]
        text = when(value) if key.endswith("_at") else "-" if value is None else str(value)
        print(f"  {key.replace('_', ' '):<{width}}  {text}")
    print(f"  {'input':<{width}}  {one_line(run['input'], 200)}")
    print("steps")
    print_table(
        ("#", "STEP", "STATE", "ATTEMPT", "JOB", "STARTED", "FINISHED", "LAST ERROR"),
        [
            (
                str(step["position"]),
                step["step"],
                step["state"],
                "-" if step["attempt"] is None else f"{step['attempt']}/{step['max_attempts']}",
                "-" if step["job_id"] is None else str(step["job_id"]),
                when(step["started_at"]),
                when(step["finished_at"]),
                one_line(step["last_error"]),
            )
            for step in steps
        ],
        right=frozenset({0}),
    )
    print("why")
    for reason in reasons:
        print(f"  {reason.step or '(run)'}: {reason.reason}: {reason.message}")
    return OK


def cancel_run(options: argparse.Namespace) -> int:
    if options.compensate:
        return cancel_and_compensate_run(options)
    with connect(options) as conn:
        done = client.cancel_workflow(conn, options.run)
        run = conn.execute(_sql.GET_WORKFLOW_RUN, {"run_id": options.run}).fetchone()
    if run is None:
        raise NotFound(f"no workflow run {options.run}")
    if not done:
        if run["state"] == "running":
            raise Refused(f"workflow run {options.run}: not cancelled: its cancel was already requested")
        raise Refused(f"workflow run {options.run}: not cancelled: it is {run['state']}, not running")
    if options.json:
        print_json({"run": options.run, "cancelled": True, "state": run["state"]})
    elif run["state"] == "cancelled":
        print(f"workflow run {options.run}: cancelled")
    else:
        print(f"workflow run {options.run}: cancel requested: its running steps stop when they end")
    return OK


def cancel_and_compensate_run(options: argparse.Namespace) -> int:
    with connect(options) as conn:
        try:
            state = client.cancel_run(conn, options.run, compensate=True)
        except psycopg.errors.NoDataFound:
            raise NotFound(f"no workflow run {options.run}") from None
        except psycopg.errors.ObjectNotInPrerequisiteState as error:
            raise Refused(f"workflow run {options.run}: not cancelled and compensated: {_primary(error)}") from None
    if options.json:
        print_json({"run": options.run, "cancelled": True, "state": state})
    else:
        print(f"workflow run {options.run}: {state}")
    return OK


def retry_run(options: argparse.Namespace) -> int:
    with connect(options) as conn:
        try:
            state = client.retry_run(conn, options.run)
        except psycopg.errors.NoDataFound:
            raise NotFound(f"no workflow run {options.run}") from None
        except psycopg.errors.ObjectNotInPrerequisiteState as error:
            raise Refused(f"workflow run {options.run}: not retried: {_primary(error)}") from None
    if options.json:
        print_json({"run": options.run, "retried": True, "state": state})
    else:
        print(f"workflow run {options.run}: retried: it is {state}")
    return OK


def compensate_run(options: argparse.Namespace) -> int:
    with connect(options) as conn:
        try:
            state = client.compensate_run(conn, options.run)
        except psycopg.errors.NoDataFound:
            raise NotFound(f"no workflow run {options.run}") from None
        except psycopg.errors.ObjectNotInPrerequisiteState as error:
            raise Refused(f"workflow run {options.run}: not compensated: {_primary(error)}") from None
    if options.json:
        print_json({"run": options.run, "state": state})
    else:
        print(f"workflow run {options.run}: {state}")
    return OK


def fork_run(options: argparse.Namespace) -> int:
    given = None
    if options.input is not None:
        try:
            given = json.loads(options.input)
        except json.JSONDecodeError as error:
            raise UsageError(f"--input is not valid JSON: {error}") from None
        except RecursionError:
            raise UsageError("--input is nested too deeply") from None
    with connect(options) as conn:
        try:
            new_id = client.fork_run(conn, options.run, _text(options.step, "STEP") or "", input=given)
        except psycopg.errors.NoDataFound:
            raise NotFound(f"no workflow run {options.run}") from None
    if options.json:
        print_json({"run": new_id, "forked_from": options.run, "step": options.step})
    else:
        print(f"workflow run {new_id}: forked from run {options.run} at step {options.step}")
    return OK


def _primary(error: psycopg.Error) -> str:
    """The server's message without its 'treadle: ' prefix."""
    message = error.diag.message_primary or str(error)
    return message.removeprefix("treadle: ")
