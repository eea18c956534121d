"""The dashboard's routes. Pages are GET and change nothing; actions are POST.

An action answers JSON to the page's script (Accept: application/json) and, for
a plain form post, a redirect back to the page with a message.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import psycopg
from flask import Blueprint, Response, abort, flash, g, jsonify, redirect, render_template, request, url_for
from werkzeug.datastructures import MultiDict

from .._display import DurationError, duration, limits_text
from ..models import JOB_STATES
from . import formatting, history
from .queries import FAILURES_WINDOW, QUEUE_LIMITS, BulkOutcome, Outcome, RawJson, Row, SearchFilter, decode_json
from .run_graph import lay_out
from .state import current

blueprint = Blueprint("treadle", __name__)

BIGINT_MAX = 2**63 - 1
MAX_FILTER_LENGTH = 200
MAX_ARGS_FILTER_LENGTH = 2000
MAX_QUEUE_PAGE = 1_000_000  # the overview's pages of queues: past this, an offset the database would only walk
GRANT_HINT = (
    "The extension's owner gives a role what the dashboard needs with "
    "treadle.grant_dashboard(role) (read_only => true to only read)."
)
BULK_BATCH_SIZE = 500  # jobs per transaction in a bulk action
# the states each bulk action applies to (what treadle.retry and treadle.cancel accept)
BULK_STATES = {"retry": formatting.RETRY_FROM, "cancel": formatting.CANCEL_FROM | {"running"}}


def wants_json() -> bool:
    return request.accept_mimetypes.best_match(["text/html", "application/json"]) == "application/json"


@blueprint.get("/health")
def health() -> Response:
    """For probes: no authentication, no data beyond the extension's version."""
    try:
        version = current().store.version()
    except Exception:  # any failure to answer means unhealthy
        return Response("database unreachable\n", status=503, mimetype="text/plain")
    return Response(f"ok treadle {version}\n", mimetype="text/plain")


@blueprint.get("/metrics")
def metrics() -> Response:
    """Prometheus metrics of the database (docs/metrics.md), behind the dashboard's authentication."""
    try:
        registry = current().metrics_registry()
        from treadle.metrics import exposition
    except ImportError as error:
        return Response(f"{error}\n", status=501, mimetype="text/plain")
    body, content_type = exposition(registry)
    return Response(body, content_type=content_type)


@blueprint.get("/")
def overview() -> str:
    run_id = _optional_id(request.args, "run", "a workflow run id")
    dashboard = current()
    limit = dashboard.settings.recent_rows
    per_page = dashboard.settings.top_queues
    queue_page = _optional_id(request.args, "queues", "a page of queues") or 1
    if queue_page > MAX_QUEUE_PAGE:
        abort(400, description=f"queues must be a page number from 1 to {MAX_QUEUE_PAGE}; got {queue_page}.")
    data = dashboard.store.overview(
        failures=limit, runs=limit, open_run=run_id, queue_offset=(queue_page - 1) * per_page, queues=per_page
    )
    if data is None:
        abort(404, description=f"There is no workflow run {run_id}.")
    dashboard.depth.record(data.now, data.queues)
    listed = {row["id"] for row in data.runs}
    return render_template(
        "overview.html",
        page="overview",
        live=True,
        now=data.now,
        o=data,
        chart=formatting.chart(data.throughput),
        open_run_listed=data.open_run is not None and data.open_run.run["id"] in listed,
    )


@blueprint.get("/jobs")
def search() -> Any:
    args = request.args
    job_id = _optional_id(args, "id", "a job id")
    if job_id is not None:
        _, found = current().store.job(job_id)
        if found is None:
            abort(404, description=f"There is no job {job_id}.")
        return redirect(url_for(".job", job_id=job_id), 303)
    where = _search_filter(args)
    dashboard = current()
    settings = dashboard.settings
    page = dashboard.store.search(where, page_size=settings.page_size, window=settings.search_window)
    return render_template(
        "jobs.html",
        page="jobs",
        live=False,
        now=page.now,
        where=where,
        result=page,
        filters=_filter_args(where),
        search_window=settings.search_window,
    )


@blueprint.get("/jobs/bulk/<action>")
def confirm_bulk(action: str) -> str:
    """The confirmation of a bulk action: how many jobs of the search it would change."""
    states = _bulk_states(action)
    if not _can_act():
        abort(403, description="This dashboard is read-only: actions are turned off.")
    where = _search_filter(request.args)
    dashboard = current()
    plan = dashboard.store.plan_bulk(
        where, states=states, window=dashboard.settings.search_window, limit=dashboard.settings.bulk_limit
    )
    return render_template(
        "bulk.html",
        page="jobs",
        live=False,
        now=plan.now,
        action=action,
        states=sorted(states),
        where=where,
        filters=_filter_args(where),
        plan=plan,
        window=dashboard.settings.search_window,
        limit=dashboard.settings.bulk_limit,
        batch_size=BULK_BATCH_SIZE,
    )


@blueprint.post("/jobs/bulk/<action>")
def act_in_bulk(action: str) -> Any:
    """Retry or cancel what the confirmation counted, in batches."""
    states = _bulk_states(action)
    form = request.form
    where = _search_filter(form)
    upto = _optional_id(form, "upto", "a job id")
    floor = _optional_id(form, "floor", "a job id")
    expected = _optional_id(form, "expected", "a count of jobs")
    settings = current().settings
    if upto is None or expected is None:
        abort(400, description="A bulk action needs the upto and expected its confirmation gives.")
    limit = min(expected, settings.bulk_limit)
    outcome = current().store.act_in_bulk(
        action, where, states=states, upto=upto, floor=floor, limit=limit, batch_size=BULK_BATCH_SIZE
    )
    status, message = _bulk_message(action, outcome)
    if wants_json():
        return jsonify(ok=status == 200, message=message, changed=outcome.changed, batches=outcome.batches), status
    flash(message, "done" if status == 200 else "problem")
    return redirect(url_for(".search", **_filter_args(where)), 303)


def _bulk_states(action: str) -> frozenset[str]:
    if action not in BULK_STATES:
        abort(404, description=f"There is no bulk action {action[:40]!r}: only retry and cancel.")
    return frozenset(BULK_STATES[action])


def _bulk_message(action: str, outcome: BulkOutcome) -> tuple[int, str]:
    done = "retried" if action == "retry" else "cancelled (or asked to cancel, when running)"
    batches = f"in {outcome.batches} batch{'es' if outcome.batches != 1 else ''}"
    unchanged = outcome.attempted - outcome.changed
    left = f"; {unchanged:,} had changed state since and were left as they are" if unchanged else ""
    if outcome.refused is not None:
        error = outcome.refused
        reason = (error.diag.message_primary if error.diag else None) or type(error).__name__
        status = 403 if isinstance(error, psycopg.errors.InsufficientPrivilege) else 503
        return status, (
            f"Stopped after {outcome.attempted:,} of {outcome.total:,} jobs ({outcome.changed:,} {done}): "
            f"the database refused the next batch: {reason}"
            + (f". {GRANT_HINT}" if reason.startswith("permission denied") else "")
        )
    if outcome.total == 0:
        return 409, "No job matches any more: nothing changed."
    return 200, f"{outcome.changed:,} of {outcome.total:,} jobs {done} {batches}{left}."


def _can_act() -> bool:
    return bool(g.get("can_act", False))


def _search_filter(args: MultiDict[str, str]) -> SearchFilter:
    state = _text_filter(args, "state")
    if state is not None and state not in JOB_STATES:
        abort(400, description=f"state must be one of {', '.join(JOB_STATES)}; got {state!r}.")
    return SearchFilter(
        name=_text_filter(args, "name"),
        queue=_text_filter(args, "queue"),
        state=state,
        key=_text_filter(args, "key"),
        args=_json_filter(args, "args"),
        worker=_text_filter(args, "worker"),
        error=_text_filter(args, "error"),
        failed_after=_time_filter(args, "failed_after"),
        failed_before=_time_filter(args, "failed_before"),
        before=_optional_id(args, "before", "a job id"),
        meta=_json_filter(args, "meta", objects_only=True),
    )


def _filter_args(where: SearchFilter) -> dict[str, Any]:
    """The search as query arguments (without its page cursor)."""
    given = {
        "name": where.name,
        "queue": where.queue,
        "state": where.state,
        "key": where.key,
        "args": json.dumps(where.args, ensure_ascii=False) if where.args is not None else None,
        "worker": where.worker,
        "error": where.error,
        "failed_after": _time_text(where.failed_after),
        "failed_before": _time_text(where.failed_before),
        "meta": json.dumps(where.meta, ensure_ascii=False) if where.meta is not None else None,
    }
    return {name: value for name, value in given.items() if value is not None}


def _time_text(value: datetime | None) -> str | None:
    """A time as a datetime-local field holds it, in UTC."""
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") if value is not None else None


@blueprint.get("/jobs/<int:job_id>")
def job(job_id: int) -> str:
    now, row = current().store.job(_bigint(job_id, "job"))
    if row is None:
        abort(404, description=f"There is no job {job_id}.")
    reasons = current().store.explain(job_id)
    return render_template(
        "job.html",
        page="job",
        live=True,
        now=now,
        job=row,
        reasons=reasons,
        lane_head=formatting.blocks_lane(row, reasons),
        attempts=history.attempts(row),
        history_truncated=history.truncated(row),
    )


@blueprint.get("/queues/<path:queue>")
def queue(queue: str) -> str:
    _check_queue(queue)
    dashboard = current()
    data = dashboard.store.queue(queue, failures=dashboard.settings.recent_rows)
    depth = dashboard.depth.record(data.now, [data.counts]).get(queue, [])
    return render_template(
        "queue.html",
        page="queue",
        live=True,
        now=data.now,
        q=data,
        chart=formatting.chart(data.throughput),
        depth=formatting.depth_chart(depth, data.now),
        common_errors=formatting.common_errors(data.failures),
        failures_window=FAILURES_WINDOW,
    )


def _check_queue(queue: str) -> None:
    if not queue or len(queue) > MAX_FILTER_LENGTH or not queue.isprintable():
        abort(404, description="There is no such queue.")


@blueprint.get("/schedules")
def schedules() -> str:
    now, rows = current().store.schedules()
    return render_template("schedules.html", page="schedules", live=True, now=now, schedules=rows)


# -- the queue controls: POSTs, refused in read-only mode and without the CSRF token (app._authenticate)


@blueprint.post("/queues/<path:queue>/pause")
def pause_queue(queue: str) -> Any:
    _check_queue(queue)
    return _queue_done(queue, lambda: _switched(queue, current().store.pause_queue(queue), "paused"))


@blueprint.post("/queues/<path:queue>/resume")
def resume_queue(queue: str) -> Any:
    _check_queue(queue)
    return _queue_done(queue, lambda: _switched(queue, current().store.resume_queue(queue), "resumed"))


@blueprint.post("/queues/<path:queue>/limits")
def set_queue(queue: str) -> Any:
    _check_queue(queue)
    limits = _limits(request.form)
    return _queue_done(
        queue, lambda: (200, f"Queue {queue}: {_limits_text(current().store.set_queue(queue, limits))}.")
    )


def _switched(queue: str, changed: bool, done: str) -> tuple[int, str]:
    if changed:
        return 200, f"Queue {queue} {done}."
    return 409, f"Queue {queue} was already {'paused' if done == 'paused' else 'running'}: nothing changed."


def _queue_done(queue: str, act: Callable[[], tuple[int, str]]) -> Any:
    """Run a queue control; the database's refusals (a bad value, a tenant's bounds) become answers."""
    try:
        status, message = act()
    except (psycopg.errors.InvalidParameterValue, psycopg.errors.NullValueNotAllowed) as error:
        status, message = 400, f"Queue {queue}: {_primary(error)}."
    except psycopg.errors.InsufficientPrivilege as error:
        reason = _primary(error)
        status = 403
        message = f"The database refused this to the dashboard's role: {reason}" + (
            f". {GRANT_HINT}" if reason.startswith("permission denied") else "."
        )
    if wants_json():
        return jsonify(ok=status == 200, message=message), status
    flash(message, "done" if status == 200 else "problem")
    return redirect(_back() if request.form.get("next") else url_for(".queue", queue=queue), 303)


def _primary(error: psycopg.Error) -> str:
    return ((error.diag.message_primary if error.diag else None) or type(error).__name__).removeprefix("treadle: ")


def _limits(form: MultiDict[str, str]) -> dict[str, Any]:
    """The limits form: every field of set_queue, an empty one none; counts whole numbers, durations like 7d."""
    limits: dict[str, Any] = {}
    for name in QUEUE_LIMITS:
        raw = form.get(name, "").strip()
        label = name.replace("_", " ")
        if not raw:
            limits[name] = None
        elif name in ("rate_period", "retain_completed", "retain_failed"):
            try:
                limits[name] = duration(raw, label)
            except DurationError as error:
                abort(400, description=f"{error}.")
        elif raw.isascii() and raw.isdigit() and len(raw) <= 9:  # the SQL checks the bounds
            limits[name] = int(raw)
        else:
            abort(400, description=f"{label} must be a whole number, or empty for no limit; got {raw[:40]!r}.")
    return limits


def _limits_text(settings: Row | None) -> str:
    described = "-" if settings is None else limits_text(settings)
    return "no limits" if described == "-" else described


@blueprint.get("/runs/<int:run_id>")
def run(run_id: int) -> str:
    now, detail = current().store.run(_bigint(run_id, "workflow run"))
    if detail is None:
        abort(404, description=f"There is no workflow run {run_id}.")
    graph = lay_out([(step["step"], step["after"]) for step in detail.steps])
    return render_template("run.html", page="run", live=True, now=now, detail=detail, graph=graph)


@blueprint.post("/jobs/<int:job_id>/retry")
def retry_job(job_id: int) -> Any:
    return _act(_bigint(job_id, "job"), current().store.retry_job, _retried)


@blueprint.post("/jobs/<int:job_id>/cancel")
def cancel_job(job_id: int) -> Any:
    return _act(_bigint(job_id, "job"), current().store.cancel_job, _job_cancelled)


@blueprint.post("/runs/<int:run_id>/cancel")
def cancel_run(run_id: int) -> Any:
    return _act(_bigint(run_id, "workflow run"), current().store.cancel_run, _run_cancelled)


@blueprint.post("/runs/<int:run_id>/retry")
def retry_run(run_id: int) -> Any:
    outcome = current().store.retry_run(_bigint(run_id, "workflow run"))
    if outcome.refused is not None:
        return _answer(*_run_refused(run_id, outcome.refused))
    return _answer(200, f"Workflow run {run_id} retried: it is {outcome.state}.")


@blueprint.post("/runs/<int:run_id>/compensate")
def compensate_run(run_id: int) -> Any:
    outcome = current().store.compensate_run(_bigint(run_id, "workflow run"))
    if outcome.refused is not None:
        return _answer(*_run_refused(run_id, outcome.refused))
    return _answer(200, f"Workflow run {run_id} is {outcome.state}.")


@blueprint.post("/runs/<int:run_id>/fork")
def fork_run(run_id: int) -> Any:
    step = request.form.get("step", "")
    if not step or "\x00" in step:
        return _answer(400, "Name the step to fork the run from.")
    outcome = current().store.fork_run(_bigint(run_id, "workflow run"), step)
    if outcome.refused is not None:
        return _answer(*_run_refused(run_id, outcome.refused))
    assert outcome.new_run is not None
    message = f"Workflow run {outcome.new_run} forked from run {run_id} at step {step}."
    if wants_json():
        return jsonify(ok=True, message=message, run=outcome.new_run), 200
    flash(message, "done")
    return redirect(url_for(".run", run_id=outcome.new_run), 303)


def _run_refused(run_id: int, error: psycopg.Error) -> tuple[int, str]:
    if isinstance(error, psycopg.errors.NoDataFound):
        return 404, f"There is no workflow run {run_id}."
    status = 409 if isinstance(error, psycopg.errors.ObjectNotInPrerequisiteState) else 400
    message = _primary(error)
    return status, message[:1].upper() + message[1:] + "."


def _answer(status: int, message: str) -> Any:
    if wants_json():
        return jsonify(ok=status == 200, message=message), status
    if status == 404:
        abort(404, description=message)
    flash(message, "done" if status == 200 else "problem")
    return redirect(_back(), 303)


def _retried(job_id: int, outcome: Outcome) -> tuple[int, str]:
    if outcome.changed:
        return 200, f"Job {job_id} will run again now."
    if outcome.state is None:
        return 404, f"There is no job {job_id}."
    if outcome.state in formatting.RETRY_FROM:
        # a step of a run that undid its steps (treadle.retry: 060_control.sql)
        return (
            409,
            f"Job {job_id} was not retried: its workflow run undid its steps (it compensates, or another run "
            "of its tree did); retry the run, which retries a failed compensation, or fork it from a step.",
        )
    return (
        409,
        f"Job {job_id} was not retried: it is {outcome.state} (only discarded, cancelled or retryable jobs retry).",
    )


def _job_cancelled(job_id: int, outcome: Outcome) -> tuple[int, str]:
    if outcome.changed and outcome.state == "running":
        return 200, f"Cancel requested for job {job_id}: it stops when its worker next hears from the database."
    if outcome.changed:
        return 200, f"Job {job_id} cancelled."
    if outcome.state is None:
        return 404, f"There is no job {job_id}."
    if outcome.state == "running" and outcome.cancel_requested:
        return 409, f"Job {job_id} already has a cancel request."
    return 409, f"Job {job_id} was not cancelled: it is {outcome.state}."


def _run_cancelled(run_id: int, outcome: Outcome) -> tuple[int, str]:
    if outcome.changed and outcome.state == "running":
        return 200, f"Cancel requested for workflow run {run_id}: it stops when its running step finishes."
    if outcome.changed:
        return 200, f"Workflow run {run_id} cancelled."
    if outcome.state is None:
        return 404, f"There is no workflow run {run_id}."
    if outcome.state == "running":
        return 409, f"Workflow run {run_id} already has a cancel request."
    return 409, f"Workflow run {run_id} was not cancelled: it is {outcome.state}."


def _act(ident: int, action: Callable[[int], Outcome], describe: Callable[[int, Outcome], tuple[int, str]]) -> Any:
    status, message = describe(ident, action(ident))
    if wants_json():
        return jsonify(ok=status == 200, message=message), status
    if status == 404:
        abort(404, description=message)
    flash(message, "done" if status == 200 else "problem")
    return redirect(_back(), 303)


def _back() -> str:
    """Where a form post returns: its `next` path inside this app, else the front page."""
    target = request.form.get("next", "")
    if target.startswith("/") and not target.startswith("//") and "\\" not in target and target.isprintable():
        return request.script_root + target
    return url_for(".overview")


def _bigint(value: int, what: str) -> int:
    if not 1 <= value <= BIGINT_MAX:
        abort(404, description=f"There is no {what} {value}.")
    return value


def _optional_id(args: MultiDict[str, str], name: str, what: str) -> int | None:
    raw = args.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not raw.isascii() or not 1 <= int(raw) <= BIGINT_MAX:
        abort(400, description=f"{name} must be {what}: a whole number from 1 to {BIGINT_MAX}; got {raw[:40]!r}.")
    return int(raw)


def _json_filter(args: MultiDict[str, str], name: str, *, objects_only: bool = False) -> Any:
    """A JSON object or array (only an object: `objects_only`) to match jobs' args or meta against (jsonb @>)."""
    raw = args.get(name, "").strip()
    if not raw:
        return None
    kinds = "a JSON object" if objects_only else "a JSON object or array"
    problem = f"{name} must be {kinds} of at most {MAX_ARGS_FILTER_LENGTH} characters"
    if len(raw) > MAX_ARGS_FILTER_LENGTH:
        abort(400, description=f"{problem}.")
    try:
        value = decode_json(raw)
    except ValueError as error:
        abort(400, description=f"{problem}; this is not JSON: {error}.")
    if isinstance(value, RawJson) or not isinstance(value, dict if objects_only else (dict, list)):
        abort(400, description=f"{problem}, nested at most 100 deep.")
    if "\\u0000" in json.dumps(value):
        abort(400, description=f"{name} must not hold the character U+0000, which PostgreSQL's jsonb refuses.")
    return value


def _time_filter(args: MultiDict[str, str], name: str) -> datetime | None:
    """A time in ISO 8601 ('2026-12-01T02:30', what a datetime-local field sends), UTC unless it says."""
    raw = args.get(name, "").strip()
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw) if len(raw) <= 40 else None
    except ValueError:
        value = None
    if value is None or not 1 <= value.year <= 9999:
        abort(400, description=f"{name} must be a time like 2026-12-01T02:30 (UTC); got {raw[:40]!r}.")
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def _text_filter(args: MultiDict[str, str], name: str) -> str | None:
    raw = args.get(name, "").strip()
    if not raw:
        return None
    if len(raw) > MAX_FILTER_LENGTH or not raw.isprintable():
        abort(400, description=f"{name} must be printable text of at most {MAX_FILTER_LENGTH} characters.")
    return raw
