"""The Worker's options, checked once: `WorkerOptions.of(...)` takes Worker's keyword arguments.

Every check is made here, before the worker holds anything, and raises
InvalidArgument naming the option; the rest of the worker reads the frozen result
and never checks again. The bounds that are the extension's (a claim's batch,
apply_retention's batch) are pinned to it by tests/worker/test_worker_units.py.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from . import _args, _dsn
from .errors import InvalidArgument

if TYPE_CHECKING:
    from ._events import WorkerEvent
    from .models import Job

Duration = float | timedelta  # seconds, or a timedelta

MAX_CONCURRENCY = 1000  # treadle.claim takes at most this many jobs at once
MAX_RETENTION_BATCH = 100_000  # treadle.apply_retention deletes at most this many jobs at once


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """What a Worker was asked to do, checked; durations in seconds (the Worker's docstring says what each means)."""

    queues: tuple[str, ...]
    concurrency: int
    claim_ahead: int  # the jobs held beyond free slots (the default: concurrency)
    ahead_if_quick: bool  # claim_ahead was not given: hold jobs ahead only while handlers are quick
    poll_interval: float
    lease: float
    heartbeat_interval: float
    rescue_interval: float
    retention_interval: float | None
    retention_batch: int
    stop_timeout: float
    backoff: Callable[[int], Duration] | None
    on_error: Callable[[BaseException, Job], None] | None
    on_event: Callable[[WorkerEvent], None] | None
    worker_id: str
    listen: bool
    listen_dsn: str | None
    prepared_statements: bool | None

    @classmethod
    def of(
        cls,
        *,
        queues: Sequence[str],
        concurrency: int,
        poll_interval: Duration,
        lease: Duration,
        heartbeat_interval: Duration,
        rescue_interval: Duration,
        retention_interval: Duration | None,
        retention_batch: int,
        stop_timeout: Duration,
        backoff: Callable[[int], Duration] | None,
        on_error: Callable[[BaseException, Job], None] | None,
        on_event: Callable[[WorkerEvent], None] | None,
        worker_id: str | None,
        listen: bool,
        listen_dsn: str | None,
        prepared_statements: bool | None,
        claim_ahead: int | None,
    ) -> WorkerOptions:
        """Check each option once, in the order Worker always did; InvalidArgument names the first bad one."""
        checked_queues = _queues(queues)
        checked_concurrency = _args.integer(concurrency, "concurrency", (1, MAX_CONCURRENCY))
        checked_ahead = (
            checked_concurrency
            if claim_ahead is None
            else _args.integer(claim_ahead, "claim_ahead", (0, MAX_CONCURRENCY))
        )
        checked_poll = _args.seconds(poll_interval, "poll_interval", allow_zero=False)
        checked_lease = _args.seconds(lease, "lease", allow_zero=False)
        checked_heartbeat = _args.seconds(heartbeat_interval, "heartbeat_interval", allow_zero=False)
        checked_rescue = _args.seconds(rescue_interval, "rescue_interval", allow_zero=False)
        checked_retention = (
            None
            if retention_interval is None
            else _args.seconds(retention_interval, "retention_interval", allow_zero=False)
        )
        checked_batch = _args.integer(retention_batch, "retention_batch", (1, MAX_RETENTION_BATCH))
        checked_stop = _args.seconds(stop_timeout, "stop_timeout", allow_zero=True)
        if checked_heartbeat >= checked_lease:
            raise InvalidArgument(
                f"heartbeat_interval ({checked_heartbeat:g} s) must be shorter than lease ({checked_lease:g} s)"
            )
        for option, callback in (("backoff", backoff), ("on_error", on_error), ("on_event", on_event)):
            if callback is not None and not callable(callback):
                raise InvalidArgument(f"{option} must be callable or None, not {type(callback).__name__}")
        if not isinstance(listen, bool):
            raise InvalidArgument(f"listen must be True or False, not {type(listen).__name__}")
        if prepared_statements is not None and not isinstance(prepared_statements, bool):
            raise InvalidArgument(
                f"prepared_statements must be True, False or None, not {type(prepared_statements).__name__}"
            )
        if listen_dsn is not None:
            if not (isinstance(listen_dsn, str) and listen_dsn.strip()):
                raise InvalidArgument("listen_dsn must be a connection string or None")
            _dsn.check(listen_dsn, "listen_dsn")
        if worker_id is None:
            worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        return cls(
            queues=checked_queues,
            concurrency=checked_concurrency,
            claim_ahead=checked_ahead,
            ahead_if_quick=claim_ahead is None,
            poll_interval=checked_poll,
            lease=checked_lease,
            heartbeat_interval=checked_heartbeat,
            rescue_interval=checked_rescue,
            retention_interval=checked_retention,
            retention_batch=checked_batch,
            stop_timeout=checked_stop,
            backoff=backoff,
            on_error=on_error,
            on_event=on_event,
            worker_id=_args.name(worker_id, "worker_id"),
            listen=listen,
            listen_dsn=listen_dsn,
            prepared_statements=prepared_statements,
        )


def _queues(queues: object) -> tuple[str, ...]:
    if isinstance(queues, (str, bytes)) or not isinstance(queues, Iterable):
        raise InvalidArgument(f"queues must be a list of queue names, not {type(queues).__name__}")
    names = [_args.name(queue, "queue name") for queue in queues]
    if not names:
        raise InvalidArgument("queues must name at least one queue")
    return tuple(dict.fromkeys(names))
