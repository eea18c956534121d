"""treadle jobs list | show | retry | cancel."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from treadle import client
from treadle._display import when
from treadle.errors import JobNotFound
from treadle.models import JOB_STATES, Job

from ._base import (
    NOT_FOUND,
    OK,
    REFUSED,
    Connection,
    NotFound,
    Progress,
    UsageError,
    add_dsn,
    add_json,
    bounded_int,
    command,
    confirm,
    connect,
    either,
    one_line,
    positive_id,
    print_json,
    print_table,
)

LIST_LIMIT = 50
MAX_LIMIT = 10_000
BATCH = 500


@dataclass(frozen=True)
class Action:
    """retry or cancel: the client call, the states it applies to, and how to say what it did."""

    verb: str  # retry
    done: str  # retried
    doing: str  # retrying
    states: tuple[str, ...]
    call: Any  # client.retry or client.cancel
    call_many: Any  # client.retry_many or client.cancel_many

    def why_not(self, job: Job) -> str:
        if self.verb == "cancel" and job.state == "running":
            return "it is running and its cancel was already requested"
        return f"it is {job.state}; {self.verb} applies to {either(self.states)} jobs"


RETRY = Action("retry", "retried", "retrying", ("discarded", "cancelled", "retryable"), client.retry, client.retry_many)
CANCEL = Action(
    "cancel", "cancelled", "cancelling", ("available", "retryable", "running"), client.cancel, client.cancel_many
)


def add_commands(commands: Any) -> None:
    jobs = command(
        commands,
        "jobs",
        "list, show, retry and cancel jobs",
        examples=[
            "treadle jobs list --state discarded --queue mail",
            "treadle jobs show 42",
            "treadle jobs retry 42 43",
            "treadle jobs retry --state discarded --queue mail --yes",
        ],
    )
    sub = jobs.add_subparsers(title="commands", required=True, metavar="COMMAND")

    listing = command(
        sub,
        "list",
        "list jobs, newest first",
        examples=[
            "treadle jobs list",
            "treadle jobs list --queue mail --state discarded --state retryable --limit 200",
            "treadle jobs list --name send_email --json | jq '.[].id'",
            "treadle jobs list --meta tenant=acme --meta region=eu",
        ],
    )
    _add_filters(listing)
    listing.add_argument(
        "--meta",
        action="append",
        metavar="KEY=VALUE",
        help="only jobs whose meta has KEY with the string VALUE (repeatable: all must match)",
    )
    listing.add_argument(
        "--limit",
        type=bounded_int(1, MAX_LIMIT),
        default=LIST_LIMIT,
        help=f"at most this many jobs (default: {LIST_LIMIT}, at most {MAX_LIMIT:,})",
    )
    add_json(listing)
    add_dsn(listing)
    listing.set_defaults(command=list_jobs)

    show = command(
        sub,
        "show",
        "one job: every field and its history of failed attempts",
        examples=["treadle jobs show 42", "treadle jobs show 42 --json | jq .errors"],
    )
    show.add_argument("id", type=positive_id, help="the job's id")
    add_json(show)
    add_dsn(show)
    show.set_defaults(command=show_job)

    add_explain(sub)

    for action in (RETRY, CANCEL):
        states = ", ".join(action.states)
        parser = command(
            sub,
            action.verb,
            f"{action.verb} jobs by id, or every job a filter selects (in batches, after a confirmation)",
            description=(
                f"{action.verb.capitalize()} the jobs named by id, or, with no id, every {states} job that "
                "--state, --queue and --name select, in batches of --batch-size, after asking (or with --yes)."
            ),
            examples=[
                f"treadle jobs {action.verb} 42 43",
                f"treadle jobs {action.verb} --state {action.states[0]} --queue mail --dry-run",
                f"treadle jobs {action.verb} --state {action.states[0]} --queue mail --yes",
            ],
        )
        parser.add_argument("ids", nargs="*", type=positive_id, metavar="ID", help="job ids")
        _add_filters(parser, action.states)
        parser.add_argument("--yes", "-y", action="store_true", help="do not ask before a filtered action")
        parser.add_argument("--dry-run", action="store_true", help="say how many jobs the filter selects, and stop")
        parser.add_argument(
            "--batch-size",
            type=bounded_int(1, MAX_LIMIT),
            default=BATCH,
            help=f"jobs per transaction in a filtered action (default: {BATCH})",
        )
        add_json(parser)
        add_dsn(parser)
        parser.set_defaults(command=act, action=action)


def add_explain(commands: Any) -> None:
    """`jobs explain ID`; also added at the top level as `treadle explain ID`."""
    explain = command(
        commands,
        "explain",
        "why a job is where it is: what holds a waiting job, where a running one runs, how one ended",
        examples=["treadle jobs explain 42", "treadle explain 42 --json"],
    )
    explain.add_argument("id", type=positive_id, help="the job's id")
    add_json(explain)
    add_dsn(explain)
    explain.set_defaults(command=explain_job)


def _add_filters(parser: argparse.ArgumentParser, states: tuple[str, ...] = JOB_STATES) -> None:
    parser.add_argument(
        "--state",
        action="append",
        choices=states,
        metavar="STATE",
        help=f"only jobs in this state (repeatable): {', '.join(states)}",
    )
    parser.add_argument("--queue", help="only jobs of this queue")
    parser.add_argument("--name", help="only jobs of this name")


def _where(options: argparse.Namespace, states: list[str] | None) -> tuple[sql.Composable, dict[str, Any]]:
    """The WHERE clause of the filters, and its parameters."""
    parts: list[sql.Composable] = [sql.SQL("true")]
    params: dict[str, Any] = {}
    if states:
        parts.append(sql.SQL("state = ANY(%(states)s::text[])"))
        params["states"] = states
    for column in ("queue", "name"):
        value = getattr(options, column)
        if value is not None:
            if "\x00" in value:
                raise UsageError(f"--{column} contains a NUL character")
            parts.append(sql.SQL("{} = %({})s::text").format(sql.Identifier(column), sql.SQL(column)))
            params[column] = value
    return sql.SQL(" AND ").join(parts), params


# -- treadle jobs list ---------------------------------------------------------------------------

LIST_COLUMNS = sql.SQL(
    "id, queue, name, state, attempt, max_attempts, priority, run_at, created_at, finished_at, "
    "last_error, workflow_run_id, step, meta"
)


def _meta_filter(pairs: list[str] | None) -> dict[str, str] | None:
    """--meta KEY=VALUE, repeated: the object the jobs' meta must contain (jsonb @>)."""
    if not pairs:
        return None
    wanted: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--meta takes KEY=VALUE, not {pair!r}")
        if "\x00" in pair:
            raise UsageError("--meta contains a NUL character")
        wanted[key] = value
    return wanted


def list_jobs(options: argparse.Namespace) -> int:
    where, params = _where(options, options.state)
    meta = _meta_filter(options.meta)
    if meta is not None:
        where = sql.SQL("{} AND meta @> %(meta)s::jsonb").format(where)
        params["meta"] = Jsonb(meta)
    query = sql.SQL("SELECT {} FROM treadle.job_details WHERE {} ORDER BY id DESC LIMIT %(limit)s").format(
        LIST_COLUMNS, where
    )
    with connect(options) as conn:
        rows = conn.execute(query, {**params, "limit": options.limit}).fetchall()
    if options.json:
        print_json(rows)
        return OK
    if not rows:
        print("no jobs")
        return OK
    print_table(
        ("ID", "QUEUE", "NAME", "STATE", "ATTEMPT", "RUN AT", "LAST ERROR"),
        [
            (
                str(row["id"]),
                row["queue"],
                row["name"],
                row["state"],
                f"{row['attempt']}/{row['max_attempts']}",
                when(row["run_at"]),
                one_line(row["last_error"]),
            )
            for row in rows
        ],
        right=frozenset({0}),
    )
    return OK


# -- treadle jobs show ---------------------------------------------------------------------------

SHOWN = (
    "queue name state priority attempt max_attempts run_at created_at started_at failed_at finished_at "
    "lease_until worker_id idempotency_key every next_id workflow_run_id step cancel_requested progress "
    "progress_message"
).split()


def show_job(options: argparse.Namespace) -> int:
    with connect(options) as conn:
        job = client.get_job(conn, options.id)
    if job is None:
        raise NotFound(f"no job with id {options.id}")
    fields = {k: v for k, v in dataclasses.asdict(job).items() if k != "lease_token"}
    if options.json:
        print_json(fields)
        return OK
    print(f"job {job.id}")
    width = max(map(len, SHOWN))
    for key in SHOWN:
        value = fields[key]
        text = when(value) if key.endswith(("_at", "_until")) else "-" if value is None else str(value)
        print(f"  {key.replace('_', ' '):<{width}}  {text}")
    print(f"  {'args':<{width}}  {_json_text(job.args)}")
    print(f"  {'result':<{width}}  {_json_text(job.result)}")
    print(f"  {'meta':<{width}}  {_json_text(job.meta)}")
    history = job.errors or []
    print(f"errors ({len(history)})" if history else "errors: none")
    for entry in history:
        print(f"  attempt {entry.get('attempt')} at {entry.get('at')}:")
        for line in str(entry.get("error", "")).splitlines() or [""]:
            print(f"    {line}")
    if job.last_error and not history:
        print(f"last error:\n    {job.last_error}")
    return OK


# -- treadle jobs explain ------------------------------------------------------------------------


def explain_job(options: argparse.Namespace) -> int:
    with connect(options) as conn:
        try:
            reasons = client.explain(conn, options.id)
        except JobNotFound:
            raise NotFound(f"no job with id {options.id}") from None
    if options.json:
        print_json([dataclasses.asdict(reason) for reason in reasons])
        return OK
    print(f"job {options.id}")
    width = max(len(reason.reason) for reason in reasons)
    for reason in reasons:
        print(f"  {reason.reason:<{width}}  {reason.message}")
    return OK


def _json_text(value: Any) -> str:
    return "-" if value is None else json.dumps(value, ensure_ascii=False)


# -- treadle jobs retry | cancel -------------------------------------------------------------------


def act(options: argparse.Namespace) -> int:
    action: Action = options.action
    filtered = options.state or options.queue is not None or options.name is not None
    if options.ids and filtered:
        raise UsageError(f"give job ids or filters (--state, --queue, --name), not both: {action.verb} takes one")
    if not options.ids and not filtered:
        raise UsageError(f"name the jobs to {action.verb}: job ids, or --state, --queue or --name")
    with connect(options) as conn:
        if options.ids:
            return _act_on_ids(conn, action, options)
        return _act_on_filter(conn, action, options)


def _act_on_ids(conn: Connection, action: Action, options: argparse.Namespace) -> int:
    outcomes: list[dict[str, Any]] = []
    for job_id in dict.fromkeys(options.ids):  # each id once, in the order given
        outcomes.append(_act_on_one(conn, action, job_id))
    if options.json:
        print_json(outcomes)
    else:
        for outcome in outcomes:
            if outcome["done"]:
                print(f"job {outcome['id']}: {action.done}")
            else:
                print(f"treadle: job {outcome['id']}: not {action.done}: {outcome['error']}", file=sys.stderr)
    if any(o["error"] == "not found" for o in outcomes):
        return NOT_FOUND
    return REFUSED if any(not o["done"] for o in outcomes) else OK


def _act_on_one(conn: Connection, action: Action, job_id: int) -> dict[str, Any]:
    try:
        done = bool(action.call(conn, job_id))
    except psycopg.errors.InsufficientPrivilege as error:
        return {"id": job_id, "done": False, "state": None, "error": error.diag.message_primary or str(error)}
    job = client.get_job(conn, job_id)
    if job is None:
        return {"id": job_id, "done": False, "state": None, "error": "not found"}
    return {"id": job_id, "done": done, "state": job.state, "error": None if done else action.why_not(job)}


def _act_on_filter(conn: Connection, action: Action, options: argparse.Namespace) -> int:
    states = options.state or list(action.states)
    where, params = _where(options, states)
    selected = conn.execute(
        sql.SQL("SELECT count(*) AS jobs, max(id) AS last FROM treadle.job_details WHERE {}").format(where), params
    ).fetchone()
    assert selected is not None
    count, last = int(selected["jobs"]), selected["last"]
    described = _described(options, states)
    if options.dry_run or count == 0:
        if options.json:
            print_json({"selected": count, action.done: 0})
        else:
            print(f"{count:,} jobs ({described}) would be {action.done}" if options.dry_run else "no jobs match")
        return OK
    confirm(f"{action.verb} {count:,} jobs ({described})", options.yes, f"pass --yes to {action.verb} them")
    page = sql.SQL(
        "SELECT id FROM treadle.job_details WHERE {} AND id > %(after)s AND id <= %(last)s ORDER BY id LIMIT %(size)s"
    ).format(where)
    selected_ids = _pages(conn, page, {**params, "last": last, "size": options.batch_size})
    with Progress(action.doing, count) as bar:
        changed = action.call_many(
            conn, selected_ids, batch_size=options.batch_size, on_batch=lambda jobs, _: bar.advance(jobs)
        )
    skipped = count - changed
    if options.json:
        print_json({"selected": count, action.done: changed})
    else:
        note = f" ({skipped:,} had changed state meanwhile)" if skipped else ""
        print(f"{action.done} {changed:,} of {count:,} jobs{note}")
    return OK


def _pages(conn: Connection, page: sql.Composed, params: dict[str, Any]) -> Iterator[int]:
    """The ids `page` selects, in id order, a page at a time: each page is read when the
    batch before it is done, so a job that no longer matches the filter is left alone."""
    after = 0
    while rows := conn.execute(page, {**params, "after": after}).fetchall():
        yield from (row["id"] for row in rows)
        after = rows[-1]["id"]


def _described(options: argparse.Namespace, states: list[str]) -> str:
    parts = [f"state {either(states)}"]
    parts += [f"{column} {getattr(options, column)}" for column in ("queue", "name") if getattr(options, column)]
    return ", ".join(parts)
