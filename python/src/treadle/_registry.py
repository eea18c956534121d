"""The handlers and workflows a worker runs, and which one a claimed job calls."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from . import _args
from ._args import name as check_name
from ._retry import HandlerPolicy
from .errors import InvalidArgument

if TYPE_CHECKING:
    from ._context import JobContext

Handler = Callable[[Any, "JobContext"], Any]
StepFunction = Callable[[Any, "JobContext"], Any]  # fn(input, ctx), earlier results on ctx.results
# The shape before 0.4.0, fn(input, results, ctx): still called, with a DeprecationWarning
# at registration; it goes in 0.5.0.
LegacyStepFunction = Callable[[Any, dict[str, Any], "JobContext"], Any]
F = TypeVar("F", bound=Callable[..., Any])
# a sleep step as define_workflow's `sleeps` holds it: an interval text, or
# {"until": a time text or {"input": key}}
SleepEntry = str | dict[str, str | dict[str, str]]

# The SQL names a workflow's step jobs workflow:<workflow name>/<step>; the worker claims
# the steps it has a function for by those names (so in a rolling deploy it never claims a
# step of a definition it does not have), and tells a step from a plain job by its
# workflow_run_id.
STEP_JOB_PREFIX = "workflow:"
MAX_CLAIM_NAMES = 1000  # treadle.claim's bound on its list of names


def step_job_name(workflow: str, step: str) -> str:
    """The name of the jobs that run `step` of `workflow`'s runs."""
    return f"{STEP_JOB_PREFIX}{workflow}/{step}"


NO_POLICY = HandlerPolicy()
MAX_TIMEOUT = 7 * 86400.0  # seconds: enqueue's bound on a job's timeout, for handlers too


def handler_policy(max_attempts: object, backoff: object, timeout: object) -> HandlerPolicy:
    """Check `worker.register`'s policy options: InvalidArgument for a bad one."""
    checked_max = None if max_attempts is None else _args.integer(max_attempts, "max_attempts", (1, _args.INT4[1]))
    if backoff is not None and not callable(backoff):
        raise InvalidArgument(f"backoff must be callable (attempt -> seconds) or None, not {type(backoff).__name__}")
    checked_timeout = None if timeout is None else _args.seconds(timeout, "timeout", allow_zero=False)
    if checked_timeout is not None and checked_timeout > MAX_TIMEOUT:
        raise InvalidArgument(f"timeout must be at most 7 days, got {checked_timeout:g} s")
    return HandlerPolicy(checked_max, backoff, checked_timeout)


class Step(NamedTuple):
    """One step of a workflow: its name, `fn(input, ctx)`, and the steps it runs after.

    `after` None: in a workflow where no step names `after`, each step runs after the one
    before it (a list). Once a step names `after`, the workflow is a graph: each step runs
    once the steps it names have completed, and a step without `after` starts with the run.
    `ctx.results` (a read-only mapping) holds the results of the steps a step runs after,
    directly or through others. A `fn(input, results, ctx)` of three required positional
    parameters, the shape before 0.4.0, is still called that way, with a
    DeprecationWarning when the workflow is registered.
    `over` names a step it runs after whose result is a JSON array (or is
    `{"input": key}`: the run's input holds the array under that key): the step then runs
    once per element (`ctx.args` is `{"element": ..., "index": ...}`, each call with its
    own attempts), and its result, for the steps after it, is the list of those results
    in element order.
    `queue`, `priority`, `max_attempts`, `timeout` and `backoff` (a list of delays before
    retries 1, 2, ...; the last repeats) are the step's own job options, kept in the
    database with the definition (define_workflow's `step_options`): None takes the
    run's queue, priority and max_attempts, no timeout and the default backoff.
    `concurrency_key` puts the step's jobs in that key's lane, as enqueue's does: at most
    the queue's key_limit of them (over every run) at once (docs/queues.md).
    """

    name: str
    fn: StepFunction | Callable[..., Any]  # or, deprecated, a LegacyStepFunction
    after: Iterable[str] | None = None
    over: str | Mapping[str, str] | None = None
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    timeout: timedelta | None = None
    backoff: Sequence[timedelta] | None = None
    concurrency_key: str | None = None


STEP_OPTION_KEYS = ("queue", "priority", "max_attempts", "timeout", "backoff", "concurrency_key")


def step_options_entry(options: Mapping[str, Any], what: str) -> dict[str, Any]:
    """One step's options as define_workflow's `step_options` holds them (InvalidArgument for a bad one).

    The database bounds the values as enqueue bounds a job's (22023 naming the step).
    """
    unknown = [key for key in options if key not in STEP_OPTION_KEYS]
    if unknown:
        raise InvalidArgument(f"{what} has an unknown option {unknown[0]!r} (one of {', '.join(STEP_OPTION_KEYS)})")
    out: dict[str, Any] = {}
    if options.get("queue") is not None:
        out["queue"] = check_name(options["queue"], f"{what}'s queue")
    if options.get("priority") is not None:
        out["priority"] = _args.integer(options["priority"], f"{what}'s priority")
    if options.get("max_attempts") is not None:
        out["max_attempts"] = _args.integer(options["max_attempts"], f"{what}'s max_attempts", (1, _args.INT4[1]))
    timeout = _args.interval(options.get("timeout"), f"{what}'s timeout")
    if timeout is not None:
        out["timeout"] = _args.interval_text(timeout)
    backoff = _args.intervals(options.get("backoff"), f"{what}'s backoff")
    if backoff is not None:
        out["backoff"] = [_args.interval_text(delay) for delay in backoff]
    if options.get("concurrency_key") is not None:
        out["concurrency_key"] = _args.text(options["concurrency_key"], f"{what}'s concurrency_key")
    return out


class Sleep(NamedTuple):
    """A sleep step: it has no handler and completes by itself `duration` after it becomes ready.

    Or, with `until` in place of `duration`, at a time: a timezone-aware datetime (the
    same for every run, at most 366 days after the definition is made), or
    `{"input": key}`: each run's input holds the time under that key (an ISO 8601 text
    with an offset, read when the step becomes ready). A time already past ends the
    sleep at once. The run waits in the database (treadle.rescue ends the sleep on its
    clock): no worker, connection or attempt is held. `after` as for Step. Its result
    is when it ended.
    """

    name: str
    duration: timedelta | None = None
    after: Iterable[str] | None = None
    until: datetime | Mapping[str, str] | None = None


class Child(NamedTuple):
    """A child step: it has no handler; it starts a run of `workflow` and completes with its results.

    The child run starts when the step becomes ready, in the same transaction, in `queue`
    (None: the parent run's). Its input is the parent run's input for a child step that
    runs after no step, otherwise the results of the steps it runs after (as a step
    receives them). The step's result is the child's results keyed by its step names; a
    child that fails fails the parent, one that is cancelled cancels it, and cancelling
    the parent cancels the child. `after` as for Step.
    """

    name: str
    workflow: str
    after: Iterable[str] | None = None
    queue: str | None = None


class Compensation(NamedTuple):
    """The compensating step `name` of step `undoes`, called as `fn(input, ctx)`.

    It runs only when the run fails for good: the compensations of the completed steps
    run one at a time, in reverse order of completion, each at least once, and the run
    ends `compensated` (or `failed` when one fails for good). `ctx.args` is
    `{"compensates": <step>, "result": <that step's result>}`. `queue`, `priority`,
    `max_attempts`, `timeout`, `backoff` and `concurrency_key` are its own job options,
    as for Step.
    """

    name: str
    fn: StepFunction
    undoes: str
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    timeout: timedelta | None = None
    backoff: Sequence[timedelta] | None = None
    concurrency_key: str | None = None


MAX_SLEEP = timedelta(days=366)


class Wait(NamedTuple):
    """A wait step: it has no handler and completes when the run receives the signal `signal`.

    `treadle.signal(run_id, signal, payload)` (or `treadle.client.signal`) delivers it, and the
    payload is the step's result; a signal sent before the run reaches the step is kept for
    it. With `timeout`, the run fails when no signal came that long after the step became
    ready (treadle.rescue times it out on its clock), or with `on_timeout="continue"` the
    step completes with the result `{"timed_out": True}` and the steps after it run.
    `after` as for Step.
    """

    name: str
    signal: str
    timeout: timedelta | None = None
    after: Iterable[str] | None = None
    on_timeout: str = "fail"


class Registry:
    """Job name -> handler, and workflow name -> its steps in order."""

    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}
        self.policies: dict[str, HandlerPolicy] = {}  # handlers registered with a policy
        self.workflows: dict[str, dict[str, StepFunction]] = {}
        self.workflow_after: dict[str, dict[str, list[str]] | None] = {}  # None: a list
        # sleep step -> interval text, or {"until": time text or {"input": key}}
        self.workflow_sleeps: dict[str, dict[str, SleepEntry] | None] = {}
        self.workflow_maps: dict[str, dict[str, str | dict[str, str]] | None] = {}  # map step -> what it maps over
        self.workflow_waits: dict[str, dict[str, dict[str, str]] | None] = {}  # wait step -> {"signal", "timeout"}
        self.workflow_steps: dict[str, list[str]] = {}  # every step, sleeps too, in order
        self.workflow_children: dict[str, dict[str, dict[str, str]] | None] = {}  # child step -> its workflow, queue
        self.workflow_compensations: dict[str, dict[str, str] | None] = {}  # step -> its compensation's name
        self.workflow_step_options: dict[str, dict[str, dict[str, Any]] | None] = {}  # step -> its job options

    def __bool__(self) -> bool:
        return bool(self.handlers or self.workflows)

    def add_handler(self, name: object, fn: object, policy: HandlerPolicy | None = None) -> None:
        job_name = check_name(name, "handler name")
        if job_name.startswith(STEP_JOB_PREFIX):
            raise InvalidArgument(
                f"handler name {job_name!r}: names starting with {STEP_JOB_PREFIX!r} belong to workflow "
                "steps; register workflows with worker.workflow()"
            )
        if not callable(fn):
            raise InvalidArgument(f"the handler for {job_name!r} must be callable, not {type(fn).__name__}")
        if job_name in self.handlers:
            raise InvalidArgument(f"a handler for {job_name!r} is already registered")
        self._check_claim_names(1)
        self.handlers[job_name] = fn
        if policy is not None and policy != NO_POLICY:
            self.policies[job_name] = policy

    def _check_claim_names(self, more: int) -> None:
        count = len(self.handlers) + sum(len(steps) for steps in self.workflows.values()) + more
        if count > MAX_CLAIM_NAMES:
            raise InvalidArgument(
                f"a worker runs at most {MAX_CLAIM_NAMES} handlers and workflow steps (treadle.claim's "
                f"bound on its names), this one would run {count}: split them among workers"
            )

    def add_workflow(self, name: object, steps: object, policy: HandlerPolicy | None = None) -> None:
        workflow_name = check_name(name, "workflow name")
        if workflow_name in self.workflows:
            raise InvalidArgument(f"a workflow {workflow_name!r} is already registered")
        if isinstance(steps, (str, bytes)) or not isinstance(steps, Iterable):
            raise InvalidArgument(
                f"steps must be a list of Step(name, fn) or (name, fn) pairs, not {type(steps).__name__}"
            )
        parsed: dict[str, StepFunction] = {}
        legacy: list[str] = []
        after: dict[str, list[str]] = {}
        sleeps: dict[str, SleepEntry] = {}
        maps: dict[str, str | dict[str, str]] = {}
        waits: dict[str, dict[str, str]] = {}
        children: dict[str, dict[str, str]] = {}
        compensations: dict[str, str] = {}
        compensators: dict[str, StepFunction] = {}
        step_options: dict[str, dict[str, Any]] = {}
        names: list[str] = []
        graph = False
        for item in steps:
            if isinstance(item, Compensation):
                comp_name = check_name(item.name, "compensation name")
                undoes = check_name(item.undoes, "step name in undoes")
                if not callable(item.fn):
                    raise InvalidArgument(f"compensation {comp_name!r} of workflow {workflow_name!r} needs a callable")
                if comp_name in compensators or undoes in compensations:
                    raise InvalidArgument(
                        f"workflow {workflow_name!r} repeats the compensation {comp_name!r} or of step {undoes!r}"
                    )
                compensations[undoes] = comp_name
                compensators[comp_name] = _step_function(item.fn, comp_name, legacy)
                entry = step_options_entry(
                    {key: getattr(item, key) for key in STEP_OPTION_KEYS},
                    f"compensation {comp_name!r} of workflow {workflow_name!r}",
                )
                if entry:
                    step_options[comp_name] = entry
                continue
            if isinstance(item, Wait):
                step_name = check_name(item.name, "step name")
                if step_name in names:
                    raise InvalidArgument(f"workflow {workflow_name!r} repeats the step name {step_name!r}")
                waits[step_name] = _wait(item, workflow_name, step_name)
                names.append(step_name)
                if item.after is not None:
                    graph = True
                    after[step_name] = _after_names(item.after, workflow_name, step_name)
                continue
            if isinstance(item, Child):
                step_name = check_name(item.name, "step name")
                if step_name in names:
                    raise InvalidArgument(f"workflow {workflow_name!r} repeats the step name {step_name!r}")
                children[step_name] = {"workflow": check_name(item.workflow, "child workflow name")}
                if item.queue is not None:
                    children[step_name]["queue"] = check_name(item.queue, "child queue")
                names.append(step_name)
                if item.after is not None:
                    graph = True
                    after[step_name] = _after_names(item.after, workflow_name, step_name)
                continue
            if isinstance(item, Sleep):
                step_name = check_name(item.name, "step name")
                if step_name in names:
                    raise InvalidArgument(f"workflow {workflow_name!r} repeats the step name {step_name!r}")
                sleeps[step_name] = _sleep_entry(item, workflow_name, step_name)
                names.append(step_name)
                if item.after is not None:
                    graph = True
                    after[step_name] = _after_names(item.after, workflow_name, step_name)
                continue
            if not isinstance(item, tuple) or (not isinstance(item, Step) and len(item) not in (2, 3)):
                raise InvalidArgument(f"a workflow step is a Step(name, fn, after) or a (name, fn) pair, not {item!r}")
            step_name = check_name(item[0], "step name")
            if not callable(item[1]):
                raise InvalidArgument(f"step {step_name!r} of workflow {workflow_name!r} needs a callable")
            if step_name in names:
                raise InvalidArgument(f"workflow {workflow_name!r} repeats the step name {step_name!r}")
            parsed[step_name] = _step_function(item[1], step_name, legacy)
            names.append(step_name)
            if len(item) >= 3 and item[2] is not None:
                graph = True
                after[step_name] = _after_names(item[2], workflow_name, step_name)
            if isinstance(item, Step) and item.over is not None:
                maps[step_name] = _over(item.over, workflow_name, step_name)
            if isinstance(item, Step):
                entry = step_options_entry(
                    {key: getattr(item, key) for key in STEP_OPTION_KEYS},
                    f"step {step_name!r} of workflow {workflow_name!r}",
                )
                if entry:
                    step_options[step_name] = entry
        if not names:
            raise InvalidArgument(f"workflow {workflow_name!r} needs at least one step")
        for undoes, comp_name in compensations.items():
            if undoes not in names:
                raise InvalidArgument(
                    f"compensation {comp_name!r} of workflow {workflow_name!r} undoes {undoes!r}, "
                    "which is not one of its steps"
                )
            if comp_name in names:
                raise InvalidArgument(f"workflow {workflow_name!r} has a step and a compensation named {comp_name!r}")
        parsed.update(compensators)
        for step_name, deps in after.items():
            unknown = [n for n in deps if n not in names]
            if unknown:
                raise InvalidArgument(
                    f"step {step_name!r} of workflow {workflow_name!r} runs after {unknown[0]!r}, "
                    "which is not one of its steps"
                )
        self._check_claim_names(len(parsed))
        if legacy:
            warnings.warn(
                f"workflow {workflow_name!r}: step(s) {', '.join(legacy)} take (input, results, ctx); steps take "
                "(input, ctx) with the earlier results on ctx.results (the old shape goes in treadle 0.5.0)",
                DeprecationWarning,
                stacklevel=3,  # the caller of worker.workflow
            )
        self.workflows[workflow_name] = parsed
        self.workflow_steps[workflow_name] = names
        self.workflow_after[workflow_name] = after if graph else None
        self.workflow_sleeps[workflow_name] = sleeps or None
        self.workflow_maps[workflow_name] = maps or None
        self.workflow_waits[workflow_name] = waits or None
        self.workflow_children[workflow_name] = children or None
        self.workflow_compensations[workflow_name] = compensations or None
        self.workflow_step_options[workflow_name] = step_options or None
        if policy is not None and policy != NO_POLICY:
            for step_name in parsed:  # keyed by the step jobs' names
                self.policies[step_job_name(workflow_name, step_name)] = policy

    def definition(self, workflow: str) -> dict[str, Any]:
        """define_workflow's arguments for a registered workflow: its steps and their `after`."""
        return {
            "name": workflow,
            "steps": self.workflow_steps[workflow],
            "after": self.workflow_after[workflow],
            "sleeps": self.workflow_sleeps[workflow],
            "maps": self.workflow_maps[workflow],
            "waits": self.workflow_waits[workflow],
            "children": self.workflow_children[workflow],
            "compensations": self.workflow_compensations[workflow],
            "step_options": self.workflow_step_options[workflow],
        }

    def claim_names(self) -> list[str]:
        """The job names this worker claims: its handlers', and those of its workflows' steps.

        Only the steps it has a function for (a sleep step has no job): a step of another
        definition of the workflow waits for a worker that has it.
        """
        return [
            *self.handlers,
            *(step_job_name(name, step) for name, steps in self.workflows.items() for step in steps),
        ]

    def policy(self, job_name: str) -> HandlerPolicy:
        """The retry and timeout policy of a job name's handler, or of a workflow's step jobs."""
        return self.policies.get(job_name, NO_POLICY)

    def handler(self, job_name: str) -> Handler:
        fn = self.handlers.get(job_name)
        if fn is None:
            raise LookupError(f"this worker has no handler for {job_name!r}")
        return fn

    def step(self, workflow: str, step: str | None) -> StepFunction:
        steps = self.workflows.get(workflow)
        if steps is None:
            raise LookupError(f"this worker has no workflow {workflow!r}")
        fn = steps.get(step or "")
        if fn is None:
            raise LookupError(
                f"workflow {workflow!r} has no step {step!r} in this worker (it knows {', '.join(steps)})"
            )
        return fn


def _is_legacy(fn: Callable[..., Any]) -> bool:
    """Whether a step function has the shape before 0.4.0: three required positional parameters."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read (some builtins): the current shape
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in parameters if p.kind in positional and p.default is inspect.Parameter.empty) == 3


def _step_function(fn: Callable[..., Any], step: str, legacy: list[str]) -> StepFunction:
    """A step function as the worker calls it, fn(input, ctx): an old-shaped one adapted."""
    if not _is_legacy(fn):
        return fn
    legacy.append(step)
    if inspect.iscoroutinefunction(fn):

        async def adapted_async(input: Any, ctx: JobContext) -> Any:
            return await fn(input, dict(ctx.results), ctx)

        return adapted_async

    def adapted(input: Any, ctx: JobContext) -> Any:
        return fn(input, dict(ctx.results), ctx)

    return adapted


def _over(value: object, workflow: str, step: str) -> str | dict[str, str]:
    """A Step's `over`: a step name, or {"input": key}; the database checks the rest."""
    if isinstance(value, Mapping):
        return {check_name(k, "over's key"): check_name(v, "over's input key") for k, v in value.items()}
    if isinstance(value, str):
        return check_name(value, "step name in over")
    raise InvalidArgument(
        f"over of step {step!r} of workflow {workflow!r} must be a step name or {{'input': key}}, "
        f"not {type(value).__name__}"
    )


def _after_names(value: object, workflow: str, step: str) -> list[str]:
    """A step's `after`: a list of step names (checked against the steps by the caller)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidArgument(
            f"after of step {step!r} of workflow {workflow!r} must be a list of step names, not {type(value).__name__}"
        )
    names = [check_name(n, "step name in after") for n in value]
    if len(set(names)) != len(names):
        raise InvalidArgument(f"step {step!r} of workflow {workflow!r} names a step twice in after")
    return names


def _wait(item: Wait, workflow: str, step: str) -> dict[str, str]:
    """A Wait as define_workflow's `waits` value: {"signal": name, "timeout": interval text}."""
    wait = {"signal": check_name(item.signal, f"signal of wait step {step!r}")}
    if item.timeout is not None:
        if not isinstance(item.timeout, timedelta):
            raise InvalidArgument(
                f"wait step {step!r} of workflow {workflow!r} needs a datetime.timedelta timeout, "
                f"not {type(item.timeout).__name__}"
            )
        if not timedelta(0) < item.timeout <= MAX_SLEEP:
            raise InvalidArgument(
                f"wait step {step!r} of workflow {workflow!r} must time out after more than 0 and at most 366 days"
            )
        wait["timeout"] = _args.interval_text(item.timeout)
    if item.on_timeout not in ("fail", "continue"):
        raise InvalidArgument(
            f"wait step {step!r} of workflow {workflow!r}: on_timeout is 'fail' or 'continue', not {item.on_timeout!r}"
        )
    if item.on_timeout == "continue":
        if item.timeout is None:
            raise InvalidArgument(f"wait step {step!r} of workflow {workflow!r}: on_timeout='continue' needs a timeout")
        wait["on_timeout"] = "continue"
    return wait


def _sleep_entry(item: Sleep, workflow: str, step: str) -> SleepEntry:
    """A Sleep as define_workflow's `sleeps` value: an interval text, or {"until": ...}."""
    if item.until is None:
        return _sleep_interval(item.duration, workflow, step)
    if item.duration is not None:
        raise InvalidArgument(f"sleep step {step!r} of workflow {workflow!r} takes a duration or until, not both")
    return {"until": sleep_until(item.until, f"sleep step {step!r} of workflow {workflow!r}")}


def sleep_until(value: object, what: str) -> str | dict[str, str]:
    """A sleep's `until` as define_workflow takes it: a time text, or {"input": key}.

    The database bounds the time (22023 naming the step).
    """
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidArgument(f"{what} needs a timezone-aware datetime in until, not a naive one")
        return value.isoformat()
    if isinstance(value, Mapping):
        if list(value) != ["input"]:
            raise InvalidArgument(f"{what} sleeps until a datetime or {{'input': key}}, not {dict(value)!r}")
        return {"input": check_name(value["input"], f"{what}'s input key")}
    raise InvalidArgument(f"{what} sleeps until a datetime or {{'input': key}}, not {type(value).__name__}")


def _sleep_interval(value: object, workflow: str, step: str) -> str:
    """A Sleep's duration as the interval text define_workflow takes."""
    if not isinstance(value, timedelta):
        raise InvalidArgument(
            f"sleep step {step!r} of workflow {workflow!r} needs a datetime.timedelta, not {type(value).__name__}"
        )
    if not timedelta(0) < value <= MAX_SLEEP:
        raise InvalidArgument(
            f"sleep step {step!r} of workflow {workflow!r} must sleep more than 0 and at most 366 days"
        )
    return f"{value.days} days {value.seconds} seconds {value.microseconds} microseconds"
