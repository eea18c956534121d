"""The dashboard's routes. Pages are GET and change nothing; actions are POST.

An action answers JSON to the page's script (Accept: application/json) and, for
a plain form post, a redirect back to the page with a message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Blueprint, Response, abort, flash, jsonify, redirect, render_template, request, url_for
from werkzeug.datastructures import MultiDict

from ..models import JOB_STATES
from . import formatting
from .queries import Outcome, SearchFilter
from .state import current

blueprint = Blueprint("treadle", __name__)

BIGINT_MAX = 2**63 - 1
MAX_FILTER_LENGTH = 200


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
    data = dashboard.store.overview(failures=limit, runs=limit, open_run=run_id)
    if data is None:
        abort(404, description=f"There is no workflow run {run_id}.")
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
    state = _text_filter(args, "state")
    if state is not None and state not in JOB_STATES:
        abort(400, description=f"state must be one of {', '.join(JOB_STATES)}; got {state!r}.")
    where = SearchFilter(
        name=_text_filter(args, "name"),
        queue=_text_filter(args, "queue"),
        state=state,
        before=_optional_id(args, "before", "a job id"),
    )
    page = current().store.search(where, page_size=current().settings.page_size)
    return render_template("jobs.html", page="jobs", live=False, now=page.now, where=where, result=page)


@blueprint.get("/jobs/<int:job_id>")
def job(job_id: int) -> str:
    now, row = current().store.job(_bigint(job_id, "job"))
    if row is None:
        abort(404, description=f"There is no job {job_id}.")
    return render_template("job.html", page="job", live=True, now=now, job=row)


@blueprint.get("/runs/<int:run_id>")
def run(run_id: int) -> str:
    now, detail = current().store.run(_bigint(run_id, "workflow run"))
    if detail is None:
        abort(404, description=f"There is no workflow run {run_id}.")
    return render_template("run.html", page="run", live=True, now=now, detail=detail)


@blueprint.post("/jobs/<int:job_id>/retry")
def retry_job(job_id: int) -> Any:
    return _act(_bigint(job_id, "job"), current().store.retry_job, _retried)


@blueprint.post("/jobs/<int:job_id>/cancel")
def cancel_job(job_id: int) -> Any:
    return _act(_bigint(job_id, "job"), current().store.cancel_job, _job_cancelled)


@blueprint.post("/runs/<int:run_id>/cancel")
def cancel_run(run_id: int) -> Any:
    return _act(_bigint(run_id, "workflow run"), current().store.cancel_run, _run_cancelled)


def _retried(job_id: int, outcome: Outcome) -> tuple[int, str]:
    if outcome.changed:
        return 200, f"Job {job_id} will run again now."
    if outcome.state is None:
        return 404, f"There is no job {job_id}."
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


def _text_filter(args: MultiDict[str, str], name: str) -> str | None:
    raw = args.get(name, "").strip()
    if not raw:
        return None
    if len(raw) > MAX_FILTER_LENGTH or not raw.isprintable():
        abort(400, description=f"{name} must be printable text of at most {MAX_FILTER_LENGTH} characters.")
    return raw
