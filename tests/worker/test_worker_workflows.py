"""Workflows in a worker: steps run in order with earlier results, a failing step fails the run."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.worker.worker_support import (
    enqueue,
    run,
    run_steps,
    start_workflow,
    until_registered,
    until_run_finished,
    until_state,
    wait_for,
)
from treadle import InvalidArgument, JobContext, Sleep, Step, Worker
from treadle import client as treadle_client
from treadle._registry import StepFunction

MakeWorker = Callable[..., Worker]


def test_three_steps_pass_their_results_along(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()
    calls: list[tuple[str, Any, dict[str, Any], str | None, int | None]] = []

    def reserve(input: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        results = dict(ctx.results)
        calls.append(("reserve", input, results, ctx.step, ctx.run_id))
        return {"hold": f"H-{input['order']}"}

    async def charge(input: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        results = dict(ctx.results)
        calls.append(("charge", input, results, ctx.step, ctx.run_id))
        return {"ref": results["reserve"]["hold"] + "/paid"}

    def settle(input: dict[str, Any], ctx: JobContext) -> None:
        results = dict(ctx.results)
        calls.append(("settle", input, results, ctx.step, ctx.run_id))

    worker.workflow("withdraw", [Step("reserve", reserve), ("charge", charge), Step("settle", settle)])
    worker.start()
    # the worker recorded the definition, so a run may name the workflow alone
    assert conn.execute("SELECT steps FROM treadle.workflows WHERE name = 'withdraw'").fetchone() == (
        ["reserve", "charge", "settle"],
    )
    run_id = start_workflow(conn, "withdraw", {"order": 42})

    finished = until_run_finished(conn, run_id)
    assert finished["state"] == "completed"
    assert finished["results"] == {"reserve": {"hold": "H-42"}, "charge": {"ref": "H-42/paid"}, "settle": None}
    assert calls == [
        ("reserve", {"order": 42}, {}, "reserve", run_id),
        ("charge", {"order": 42}, {"reserve": {"hold": "H-42"}}, "charge", run_id),
        ("settle", {"order": 42}, {"reserve": {"hold": "H-42"}, "charge": {"ref": "H-42/paid"}}, "settle", run_id),
    ]
    assert [(s["name"], s["step"], s["attempt"]) for s in run_steps(conn, run_id)] == [
        ("workflow:withdraw/reserve", "reserve", 1),
        ("workflow:withdraw/charge", "charge", 1),
        ("workflow:withdraw/settle", "settle", 1),
    ]


def test_a_failing_step_fails_the_run(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker(backoff=lambda attempt: 0)
    later: list[str] = []

    def charge(input: Any, ctx: JobContext) -> None:
        raise RuntimeError("card declined")

    worker.workflow(
        "withdraw",
        [("reserve", lambda i, c: "held"), ("charge", charge), ("settle", lambda i, c: later.append("settle"))],
    )
    row = conn.execute(
        "SELECT treadle.start_workflow('withdraw', %s, %s, max_attempts => 2)",
        [Jsonb({}), ["reserve", "charge", "settle"]],
    ).fetchone()
    assert row is not None
    run_id = row[0]
    worker.start()

    finished = until_run_finished(conn, run_id)
    assert finished["state"] == "failed"
    assert finished["results"] == {"reserve": "held"}
    steps = run_steps(conn, run_id)
    assert [(s["step"], s["state"], s["attempt"]) for s in steps] == [
        ("reserve", "completed", 1),
        ("charge", "discarded", 2),
    ]
    assert "RuntimeError: card declined" in steps[1]["last_error"]
    assert later == []


def test_a_step_this_worker_does_not_know_waits_for_one_that_does(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    """The worker claims only the steps it has: the other one stays available, no attempt
    spent, the run running, and explain names the step nobody runs."""
    worker = make_worker()
    worker.workflow("withdraw", [("reserve", lambda i, c: 1)])
    worker.register("ping", lambda args, ctx: None)
    row = conn.execute(
        "SELECT treadle.start_workflow('withdraw', '{}', %s, max_attempts => 1)", [["reserve", "refund"]]
    ).fetchone()
    assert row is not None
    worker.start()
    wait_for(lambda: len(run_steps(conn, row[0])) == 2, "the refund step's job")
    # a job enqueued after it and run by the worker: its claims have looked since
    ping = enqueue(conn, "ping")
    until_state(conn, ping, "completed")
    until_registered(conn, worker.worker_id)
    refund = run_steps(conn, row[0])[1]
    assert (refund["name"], refund["state"], refund["attempt"], refund["last_error"]) == (
        "workflow:withdraw/refund",
        "available",
        0,
        None,
    )
    assert run(conn, row[0])["state"] == "running"
    reasons = conn.execute("SELECT reason, message FROM treadle.explain(%s)", [refund["id"]]).fetchall()
    no_worker = [message for reason, message in reasons if reason == "no_worker"]
    assert len(no_worker) == 1 and "no live worker runs step refund of workflow withdraw" in no_worker[0], reasons


def test_a_graph_runs_its_branches_and_joins_them_once(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    """extract_a and extract_b run in parallel (on two handler threads at once), report after
    both with exactly their results, mail after report with every result before it."""
    worker = make_worker(concurrency=4)
    both_running = threading.Barrier(2, timeout=30)
    calls: dict[str, dict[str, Any]] = {}

    def extract(name: str) -> StepFunction:
        def fn(input: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
            both_running.wait()  # the other branch runs at the same time, or this raises
            calls[name] = dict(ctx.results)
            return {"rows": input[name]}

        return fn

    def report(input: Any, ctx: JobContext) -> int:
        results = dict(ctx.results)
        calls["report"] = results
        return int(results["extract_a"]["rows"] + results["extract_b"]["rows"])

    def mail(input: Any, ctx: JobContext) -> str:
        results = dict(ctx.results)
        calls["mail"] = results
        return f"sum {results['report']}"

    worker.workflow(
        "etl",
        [
            Step("extract_a", extract("extract_a"), after=[]),
            Step("extract_b", extract("extract_b"), after=[]),
            Step("report", report, after=["extract_a", "extract_b"]),
            Step("mail", mail, after=["report"]),
        ],
    )
    worker.start()
    assert conn.execute("SELECT steps, after FROM treadle.workflows WHERE name = 'etl'").fetchone() == (
        ["extract_a", "extract_b", "report", "mail"],
        {"extract_a": [], "extract_b": [], "report": ["extract_a", "extract_b"], "mail": ["report"]},
    )
    run_id = start_workflow(conn, "etl", {"extract_a": 1, "extract_b": 2})

    finished = until_run_finished(conn, run_id)
    assert finished["state"] == "completed"
    assert finished["results"] == {
        "extract_a": {"rows": 1},
        "extract_b": {"rows": 2},
        "report": 3,
        "mail": "sum 3",
    }
    assert calls == {
        "extract_a": {},
        "extract_b": {},
        "report": {"extract_a": {"rows": 1}, "extract_b": {"rows": 2}},
        "mail": {"extract_a": {"rows": 1}, "extract_b": {"rows": 2}, "report": 3},
    }
    assert sorted(s["step"] for s in run_steps(conn, run_id)) == ["extract_a", "extract_b", "mail", "report"]


def test_a_list_of_steps_is_still_recorded_as_a_list(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()
    worker.workflow("pair", [("one", lambda i, c: 1), Step("two", lambda i, c: 2)])
    worker.start()
    assert conn.execute("SELECT steps, after FROM treadle.workflows WHERE name = 'pair'").fetchone() == (
        ["one", "two"],
        None,
    )


def test_a_bad_graph_is_refused_when_it_is_registered(make_worker: MakeWorker) -> None:
    worker = make_worker()
    with pytest.raises(InvalidArgument, match="runs after 'nope', which is not one of its steps"):
        worker.workflow("bad", [Step("a", lambda i, c: 1, after=["nope"])])
    with pytest.raises(InvalidArgument, match="must be a list of step names"):
        worker.workflow("bad", [Step("a", lambda i, c: 1, after="a")])
    with pytest.raises(InvalidArgument, match="names a step twice"):
        worker.workflow("bad", [Step("a", lambda i, c: 1), Step("b", lambda i, c: 1, after=["a", "a"])])


def test_a_cycle_stops_the_worker_at_start(make_worker: MakeWorker) -> None:
    worker = make_worker()
    worker.workflow("loop", [Step("a", lambda i, c: 1, after=["b"]), Step("b", lambda i, c: 1, after=["a"])])
    with pytest.raises(
        psycopg.errors.InvalidParameterValue, match='step "a" is in a dependency cycle: a after b after a'
    ):
        worker.start()


def test_a_sleep_step_holds_no_worker_and_ends_on_time(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    """A sleep ends no earlier than its time, and no later than about one rescue interval after
    it: the worker's rescue ends it (polls come every 5 s here, rescues every 0.5 s)."""
    worker = make_worker(poll_interval=5.0, rescue_interval=0.5)
    worker.workflow(
        "remind",
        [("signup", lambda i, c: "ok"), Sleep("pause", timedelta(seconds=1)), ("mail", lambda i, c: sorted(c.results))],
    )
    worker.start()
    assert conn.execute("SELECT steps, sleeps FROM treadle.workflows WHERE name = 'remind'").fetchone() == (
        ["signup", "pause", "mail"],
        {"pause": "00:00:01"},
    )
    run_id = start_workflow(conn, "remind", {})
    finished = until_run_finished(conn, run_id)
    assert finished["state"] == "completed"
    assert finished["results"]["mail"] == ["pause", "signup"]
    steps = {s["step"]: s for s in run_steps(conn, run_id)}
    assert sorted(steps) == ["mail", "signup"]  # the sleep was no job
    # the next step started no earlier than the sleep's end, on the database's clock
    assert steps["mail"]["created_at"] - steps["signup"]["finished_at"] >= timedelta(seconds=1)
    # and the sleep ended (its result: when) within a rescue interval of its time; the 1.5 s
    # beyond it is room for a loaded machine, still well under the 5 s between polls
    due = steps["signup"]["finished_at"] + timedelta(seconds=1)
    late = datetime.fromisoformat(finished["results"]["pause"]) - due
    assert timedelta(0) <= late <= timedelta(seconds=0.5 + 1.5), late


def test_more_sleeps_due_than_a_rescue_ends_end_without_waiting_a_rescue_interval(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    """A rescue ends at most 1,000 sleeps a call and says when it left more: the worker then
    calls again at once, not a rescue interval (here a minute) later."""
    conn.execute(
        "SELECT count(treadle.start_workflow('nap', steps => ARRAY['zz', 'wake'], sleeps => '{\"zz\": \"1 second\"}',"
        " queue => 'many-naps')) FROM generate_series(1, 2500)"
    )
    asleep = "SELECT count(*) FROM treadle.workflow_runs WHERE queue = 'many-naps' AND wakes IS NOT NULL"
    wait_for(lambda: conn.execute("SELECT treadle.now() > max(wake_at) FROM treadle.workflow_runs"
                                  " WHERE queue = 'many-naps'").fetchone() == (True,), "the sleeps due")  # fmt: skip
    worker = make_worker(queues=["other"], rescue_interval=60.0)
    worker.register("ping", lambda args, ctx: None)
    worker.start()
    wait_for(lambda: conn.execute(asleep).fetchone() == (0,), "every sleep ended", timeout=30)


def test_a_sleep_step_until_the_time_the_input_holds_never_ends_early_and_one_past_ends_at_once(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    worker = make_worker()
    worker.workflow(
        "trial",
        [
            ("signup", lambda i, c: "ok"),
            Sleep("wait", until={"input": "remind_at"}),
            ("mail", lambda i, c: c.results["wait"]),
        ],
    )
    worker.start()
    assert conn.execute("SELECT sleeps FROM treadle.workflows WHERE name = 'trial'").fetchone() == (
        {"wait": {"until": {"input": "remind_at"}}},
    )
    row = conn.execute("SELECT treadle.now()").fetchone()
    assert row is not None
    now: datetime = row[0]
    soon = start_workflow(conn, "trial", {"remind_at": (now + timedelta(seconds=1)).isoformat()})
    past = start_workflow(conn, "trial", {"remind_at": (now - timedelta(days=1)).isoformat()})
    for run_id in (soon, past):
        assert until_run_finished(conn, run_id)["state"] == "completed"
    soon_steps = {s["step"]: s for s in run_steps(conn, soon)}
    assert sorted(soon_steps) == ["mail", "signup"]  # the sleep was no job
    assert soon_steps["mail"]["created_at"] >= now + timedelta(seconds=1)  # never before the time, on its clock
    # a time already past: the sleep ended when signup completed, in its transaction (no rescue waited for)
    past_steps = {s["step"]: s for s in run_steps(conn, past)}
    assert past_steps["mail"]["created_at"] == past_steps["signup"]["finished_at"]
    assert datetime.fromisoformat(run(conn, past)["results"]["wait"]) == past_steps["signup"]["finished_at"]


def test_a_sleep_until_a_datetime_in_the_definition_and_in_start_workflow(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    launch = datetime(2026, 1, 4, 9, 0, tzinfo=timezone(timedelta(hours=1)))
    row = conn.execute("SELECT treadle.now()").fetchone()
    assert row is not None
    worker = make_worker()
    worker.workflow("launch", [Sleep("wait", until=row[0] + timedelta(days=30)), ("go", lambda i, c: 1)])
    worker.start()
    stored = conn.execute("SELECT sleeps FROM treadle.workflows WHERE name = 'launch'").fetchone()
    assert stored is not None
    assert datetime.fromisoformat(stored[0]["wait"]["until"].replace("Z", "+00:00")) == row[0] + timedelta(days=30)
    # start_workflow's own steps: a datetime, and an input key
    run_id = treadle_client.start_workflow(
        conn,
        "adhoc",
        {"at": "2026-01-01T00:00:00+00:00"},
        steps=["a", "b"],
        sleeps={"a": launch, "b": {"input": "at"}},
        after={"b": []},
    )
    assert conn.execute("SELECT sleeps FROM treadle.workflow_runs WHERE id = %s", [run_id]).fetchone() == (
        {"a": {"until": "2026-01-04T08:00:00.000000Z"}, "b": {"until": {"input": "at"}}},
    )


def test_a_bad_sleep_until_is_refused(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()
    with pytest.raises(InvalidArgument, match="needs a timezone-aware datetime in until"):
        worker.workflow("bad", [Sleep("pause", until=datetime(2030, 1, 1))])
    with pytest.raises(InvalidArgument, match="takes a duration or until, not both"):
        worker.workflow("bad", [Sleep("pause", timedelta(hours=1), until=datetime(2030, 1, 1, tzinfo=timezone.utc))])
    with pytest.raises(InvalidArgument, match=r"sleeps until a datetime or \{'input': key\}, not \{'step': 'a'\}"):
        worker.workflow("bad", [Sleep("pause", until={"step": "a"})])
    with pytest.raises(InvalidArgument, match="sleeps until a datetime or"):
        worker.workflow("bad", [Sleep("pause", until="2030-01-01")])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"sleeps\['a'\] needs a timezone-aware datetime"):
        treadle_client.start_workflow(conn, "bad", steps=["a"], sleeps={"a": datetime(2030, 1, 1)})
    # a time over 366 days away is the database's to refuse, when the worker records the definition
    worker.workflow("far", [Sleep("pause", until=datetime(9999, 1, 1, tzinfo=timezone.utc))])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match='sleep step "pause" sleeps until at most 366 days'):
        worker.start()
    assert conn.execute("SELECT count(*) FROM treadle.workflows WHERE name IN ('bad', 'far')").fetchone() == (0,)


def test_a_bad_sleep_is_refused_when_it_is_registered(make_worker: MakeWorker) -> None:
    worker = make_worker()
    with pytest.raises(InvalidArgument, match=r"needs a datetime\.timedelta, not int"):
        worker.workflow("bad", [Sleep("pause", 5)])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="must sleep more than 0 and at most 366 days"):
        worker.workflow("bad", [Sleep("pause", timedelta(days=400))])
    with pytest.raises(InvalidArgument, match="repeats the step name 'a'"):
        worker.workflow("bad", [("a", lambda i, c: 1), Sleep("a", timedelta(seconds=1))])


def test_a_map_step_runs_once_per_element_and_hands_on_the_results_in_order(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    worker = make_worker(backoff=lambda attempt: 0)
    seen: list[tuple[int, int, int]] = []
    lock = threading.Lock()

    def resize(input: Any, ctx: JobContext) -> dict[str, Any]:
        element, index = ctx.args["element"], ctx.args["index"]
        with lock:
            seen.append((index, element, ctx.attempt))
        if element == 30 and ctx.attempt == 1:
            raise RuntimeError("flaky")  # this element alone runs again
        return {"size": element * 2}

    got: list[Any] = []
    worker.workflow(
        "thumbs",
        [
            ("load", lambda i, c: [10, 20, 30, 40]),
            Step("resize", resize, over="load"),
            ("report", lambda i, c: got.append(c.results["resize"])),
        ],
    )
    worker.start()
    assert conn.execute("SELECT maps FROM treadle.workflows WHERE name = 'thumbs'").fetchone() == ({"resize": "load"},)
    run_id = start_workflow(conn, "thumbs", {})

    finished = until_run_finished(conn, run_id)
    assert finished["state"] == "completed"
    assert finished["results"]["resize"] == [{"size": 20}, {"size": 40}, {"size": 60}, {"size": 80}]
    assert got == [[{"size": 20}, {"size": 40}, {"size": 60}, {"size": 80}]]
    assert sorted(seen) == [(0, 10, 1), (1, 20, 1), (2, 30, 1), (2, 30, 2), (3, 40, 1)]
    assert [s["step"] for s in run_steps(conn, run_id)].count("resize") == 4


def test_a_map_over_the_input_starts_with_the_run(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()
    with pytest.raises(InvalidArgument, match="must be a step name"):
        worker.workflow("bad", [Step("a", lambda i, c: 1, over=5)])  # type: ignore[arg-type]
    worker.workflow(
        "tally",
        [
            Step("each", lambda i, c: c.args["element"] + 1, over={"input": "items"}),
            ("sum", lambda i, c: sum(c.results["each"])),
        ],
    )
    worker.start()
    run_id = start_workflow(conn, "tally", {"items": [1, 2, 3]})
    finished = until_run_finished(conn, run_id)
    assert finished["state"] == "completed"
    assert finished["results"] == {"each": [2, 3, 4], "sum": 9}


def test_a_map_over_a_step_it_does_not_run_after_stops_the_worker_at_start(make_worker: MakeWorker) -> None:
    worker = make_worker()
    worker.workflow("bad", [("a", lambda i, c: [1]), ("b", lambda i, c: None), Step("c", lambda i, c: None, over="a")])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match='map step "c" maps over step "a"'):
        worker.start()


def test_steps_take_input_and_ctx_and_the_old_shape_still_runs_with_a_warning(
    conn: psycopg.Connection[Any], make_worker: MakeWorker
) -> None:
    """fn(input, ctx) reads the earlier results on ctx.results (read-only); the old
    fn(input, results, ctx), sync or async, warns once when registered and still runs."""
    worker = make_worker()
    seen: dict[str, Any] = {}

    def new_shape(input: Any, ctx: JobContext) -> int:
        seen["new"] = dict(ctx.results)
        with pytest.raises(TypeError):
            ctx.results["first"] = 0  # type: ignore[index]
        return int(ctx.results["first"]) + 1

    def old_shape(input: Any, results: dict[str, Any], ctx: JobContext) -> int:
        seen["old"] = results
        results["scratch"] = True  # the old shape got a dict of its own, and still does
        return int(results["second"]) + 1

    async def old_async(input: Any, results: dict[str, Any], ctx: JobContext) -> int:
        seen["old_async"] = (results, dict(ctx.results))
        return int(results["third"]) + 1

    with pytest.warns(DeprecationWarning) as warned:
        worker.workflow(
            "shapes",
            [("first", lambda i, c: i["start"]), ("second", new_shape), ("third", old_shape), ("fourth", old_async)],
        )
    assert len(warned) == 1
    message = str(warned[0].message)
    assert "step(s) third, fourth take (input, results, ctx)" in message and "ctx.results" in message
    assert warned[0].filename == __file__  # it points at the worker.workflow call

    run_id = start_workflow(conn, "shapes", {"start": 1}, ["first", "second", "third", "fourth"])
    worker.start()
    finished = until_run_finished(conn, run_id)
    assert finished["state"] == "completed"
    assert finished["results"] == {"first": 1, "second": 2, "third": 3, "fourth": 4}
    assert seen["new"] == {"first": 1}
    assert seen["old"] == {"first": 1, "second": 2, "scratch": True}
    assert seen["old_async"] == ({"first": 1, "second": 2, "third": 3}, {"first": 1, "second": 2, "third": 3})
    assert all(step["attempt"] == 1 for step in run_steps(conn, run_id))


def test_a_plain_jobs_context_has_no_results(conn: psycopg.Connection[Any], make_worker: MakeWorker) -> None:
    worker = make_worker()
    seen: list[Any] = []
    worker.register("plain", lambda args, ctx: seen.append(dict(ctx.results)))
    job_id = enqueue(conn, "plain")
    worker.start()
    until_state(conn, job_id, "completed")
    assert seen == [{}]
