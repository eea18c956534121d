"""treadle enqueue: one job from the command line, or many from a file or stdin (one per line)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from typing import IO, Any

from treadle import client
from treadle.errors import InvalidArgument

from ._base import (
    OK,
    CommandError,
    Progress,
    UsageError,
    add_dsn,
    add_json,
    bounded_int,
    command,
    connect,
    duration,
    moment,
    print_json,
)

BATCH = 1000
MAX_BATCH = 10_000
# how the client (jobs[3]['priority']) and the SQL layer (jobs element 3) name a refused element
_ELEMENT = re.compile(r"jobs(?:\[| element )(\d+)\]?(?:\['(\w+)'\])?")


def add_command(commands: Any) -> None:
    enqueue = command(
        commands,
        "enqueue",
        "enqueue a job and print its id, or many jobs from a file or stdin",
        description=(
            "Enqueue a job and print its id. With --from FILE (or - for stdin), enqueue one job per line in "
            "batches through enqueue_many and print their ids: with NAME, each line is a job's args (a JSON "
            "object or array); without, each line is a JSON object with name, args and any of queue, "
            "priority, run_at, every, max_attempts, idempotency_key, meta. The options set the defaults of every line."
        ),
        examples=[
            'treadle enqueue send_email \'{"to": "ada@example.com"}\' --queue mail',
            "treadle enqueue report --run-at 2026-12-24T08:00:00+01:00",
            "treadle enqueue cleanup --run-at 10m --every 1h --idempotency-key cleanup",
            'treadle enqueue send_email \'{"to": "ada@example.com"}\' --meta \'{"tenant": "acme"}\'',
            "treadle enqueue send_email --from addresses.jsonl --queue mail",
            "jq -c '.[]' jobs.json | treadle enqueue --from -",
        ],
    )
    enqueue.add_argument("name", nargs="?", help="the job's name (with --from: of every line's job)")
    enqueue.add_argument("args", nargs="?", metavar="JSON", help="its arguments, a JSON object or array (default: {})")
    enqueue.add_argument("--from", dest="source", metavar="FILE", help="one job per line from FILE, or - for stdin")
    enqueue.add_argument("--queue", help=f"the queue (default: {client.ENQUEUE_DEFAULTS['queue']})")
    enqueue.add_argument(
        "--priority",
        type=bounded_int(-(2**31), 2**31 - 1),
        help=f"lower runs first (default: {client.ENQUEUE_DEFAULTS['priority']})",
    )
    enqueue.add_argument(
        "--max-attempts",
        type=bounded_int(1, 2**31 - 1),
        help=f"attempts before it is discarded (default: {client.ENQUEUE_DEFAULTS['max_attempts']})",
    )
    enqueue.add_argument("--idempotency-key", help="enqueue once per key in its queue (one job only)")
    enqueue.add_argument(
        "--run-at", metavar="TIME", help="not before TIME: 2026-12-01T09:30:00+01:00, Z for UTC, or a delay: 10m"
    )
    enqueue.add_argument("--every", metavar="DURATION", help="periodic: the next occurrence this long after each one")
    enqueue.add_argument("--meta", metavar="JSON", help="metadata stored with the job, a JSON object")
    enqueue.add_argument(
        "--batch-size",
        type=bounded_int(1, MAX_BATCH),
        default=BATCH,
        help=f"jobs per enqueue_many call with --from (default: {BATCH:,})",
    )
    enqueue.add_argument(
        "--atomic", action="store_true", help="with --from: every batch in one transaction, all or nothing"
    )
    add_json(enqueue)
    add_dsn(enqueue)
    enqueue.set_defaults(command=run)


def run(options: argparse.Namespace) -> int:
    defaults = _defaults(options)
    if options.source is None:
        return _one(options, defaults)
    if options.args is not None:
        raise UsageError("give the args as JSON or --from, not both")
    if options.idempotency_key is not None:
        raise UsageError("--idempotency-key would make one job of every line: give each line its idempotency_key")
    return _many(options, defaults)


def _defaults(options: argparse.Namespace) -> dict[str, Any]:
    given = {
        "queue": options.queue,
        "priority": options.priority,
        "max_attempts": options.max_attempts,
        "idempotency_key": options.idempotency_key,
        "run_at": None if options.run_at is None else moment(options.run_at, "--run-at"),
        "every": None if options.every is None else duration(options.every, "--every"),
        "meta": None if options.meta is None else _meta(options.meta),
    }
    return {key: value for key, value in given.items() if value is not None}


def _meta(text: str) -> Any:
    meta = _json(text, "--meta")
    if not isinstance(meta, dict):
        raise UsageError(f"--meta must be a JSON object, not {'an array' if isinstance(meta, list) else _kind(meta)}")
    return meta


def _one(options: argparse.Namespace, defaults: dict[str, Any]) -> int:
    if options.name is None:
        raise UsageError("name the job to enqueue, or give --from FILE")
    args = _json(options.args or "{}", "JSON")
    with connect(options) as conn:
        job_id = client.enqueue(conn, options.name, args, **defaults)
    if options.json:
        print_json({"id": job_id})
    else:
        print(job_id)
    return OK


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"{where} is not valid JSON: {error}") from None
    except RecursionError:
        raise UsageError(f"{where} is nested too deeply") from None


# -- --from FILE ---------------------------------------------------------------------------------


def _many(options: argparse.Namespace, defaults: dict[str, Any]) -> int:
    where = "stdin" if options.source == "-" else options.source
    with _open(options.source) as lines:
        numbered = list(_jobs(lines, where, options.name, defaults))
    if not numbered:
        raise UsageError(f"{where} has no job: expected one JSON document per line")
    ids: list[int] = []
    with connect(options) as conn, conn.transaction() if options.atomic else nullcontext():
        with Progress("enqueueing", len(numbered)) as bar:
            for start in range(0, len(numbered), options.batch_size):
                batch = numbered[start : start + options.batch_size]
                try:
                    ids += client.enqueue_many(conn, [job for _, job in batch])
                except InvalidArgument as error:
                    raise _refused(error, batch, where, ids, options.atomic) from None
                bar.advance(len(batch))
    if options.json:
        print_json({"ids": ids})
    else:
        print("\n".join(map(str, ids)))
    print(f"enqueued {len(ids):,} jobs from {where}", file=sys.stderr)
    return OK


def _open(source: str) -> Any:
    if source == "-":
        return nullcontext(sys.stdin)
    try:
        return open(source, encoding="utf-8")
    except OSError as error:
        raise UsageError(f"--from {source}: {error.strerror}") from None


def _jobs(lines: IO[str], where: str, name: str | None, defaults: dict[str, Any]) -> Iterator[tuple[int, Any]]:
    """(line number, job spec) for every non-blank line; UsageError at the first bad one."""
    try:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                yield number, _spec(_json(line, f"{where} line {number}"), f"{where} line {number}", name, defaults)
    except UnicodeDecodeError as error:
        raise UsageError(f"{where} is not UTF-8 text: {error.reason}") from None


def _spec(document: Any, where: str, name: str | None, defaults: dict[str, Any]) -> dict[str, Any]:
    if name is not None:
        if not isinstance(document, (dict, list)):
            raise UsageError(f"{where}: args must be a JSON object or array, not {_kind(document)}")
        return {"name": name, "args": document, **defaults}
    if not isinstance(document, dict) or not isinstance(document.get("name"), str):
        raise UsageError(f'{where}: without NAME, each line is a job: {{"name": "...", "args": {{...}}, ...}}')
    spec = {**defaults, **document}
    if isinstance(spec.get("run_at"), str):
        spec["run_at"] = moment(spec["run_at"], f"{where}: run_at")
    if isinstance(spec.get("every"), str):
        spec["every"] = duration(spec["every"], f"{where}: every")
    return spec


def _kind(value: Any) -> str:
    return {str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")


def _refused(
    error: InvalidArgument, batch: Iterable[tuple[int, Any]], where: str, ids: list[int], atomic: bool
) -> CommandError:
    """The refusal of one batch, naming the line, and what was written before it."""
    lines = [number for number, _ in batch]
    found = _ELEMENT.search(str(error))
    line = lines[int(found.group(1))] if found and int(found.group(1)) < len(lines) else None
    text = str(error).removeprefix("treadle: ")
    message = _ELEMENT.sub(lambda m: m.group(2) or "the job", text) if line else text
    at = f"{where} line {line}" if line else f"{where} lines {lines[0]}-{lines[-1]}"
    if atomic or not ids:
        return UsageError(f"{at}: {message}; nothing was enqueued")
    return CommandError(
        f"{at}: {message}; the {len(ids):,} jobs before line {lines[0]} were enqueued, none after "
        f"(go on with: tail -n +{lines[0]} {where if where != 'stdin' else 'FILE'} | treadle enqueue --from -)"
    )
