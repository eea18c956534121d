"""treadle: background jobs and step workflows inside PostgreSQL.

The producer side (`enqueue`, `start_workflow`, ...) runs on the caller's own
connection and transaction; `Worker` claims jobs and runs Python handlers. Every
state decision is made by the extension's SQL functions.

Names are loaded on first use, so `import treadle` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any


def _package_version() -> str:
    # the one version is the extension's (treadle.control); pyproject.toml's is the package's build of it
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("treadle")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0.0.0+unknown"


if TYPE_CHECKING:  # type checkers see the real signatures; at run time names load lazily
    from ._registry import Child, Compensation
    from .client import (
        EnqueueOptions,
        WorkflowOptions,
        cancel,
        cancel_many,
        cancel_run,
        cancel_workflow,
        compensate_run,
        enqueue,
        enqueue_many,
        explain,
        explain_run,
        fork_run,
        get_job,
        pause,
        resume,
        retry,
        retry_many,
        retry_run,
        set_queue,
        signal,
        signal_by_key,
        start_workflow,
        version,
        workflow_results,
        workflow_step_results,
    )
    from .errors import (
        Discard,
        ExtensionMissing,
        InvalidArgument,
        JobCancelled,
        JobFailed,
        JobNotFound,
        JobTimeout,
        LeaseLost,
        QueueFull,
        Snooze,
        TreadleError,
        UndecodablePayload,
        UnsupportedVersion,
        WaitTimeout,
        WorkflowCancelled,
        WorkflowFailed,
        WorkflowNotFound,
    )
    from .models import Explanation, Job, RunExplanation
    from .results import WaitOptions, WatchEvent, wait, wait_workflow, watch
    from .worker import JobContext, Sleep, Step, Wait, Worker, WorkerEvent

__version__ = _package_version()

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    # producer side
    "enqueue": "client",
    "enqueue_many": "client",
    "start_workflow": "client",
    "cancel": "client",
    "retry": "client",
    "cancel_many": "client",
    "retry_many": "client",
    "cancel_workflow": "client",
    "retry_run": "client",
    "fork_run": "client",
    "compensate_run": "client",
    "cancel_run": "client",
    "signal": "client",
    "signal_by_key": "client",
    "get_job": "client",
    "explain": "client",
    "explain_run": "client",
    "pause": "client",
    "resume": "client",
    "set_queue": "client",
    "workflow_results": "client",
    "workflow_step_results": "client",
    "version": "client",
    "EnqueueOptions": "client",
    "WorkflowOptions": "client",
    "wait": "results",
    "wait_workflow": "results",
    "watch": "results",
    "WatchEvent": "results",
    "WaitOptions": "results",
    # worker side
    "Worker": "worker",
    "Step": "worker",
    "Sleep": "worker",
    "Wait": "worker",
    "Child": "_registry",
    "Compensation": "_registry",
    "JobContext": "worker",
    "WorkerEvent": "worker",
    # data and errors
    "Job": "models",
    "Explanation": "models",
    "RunExplanation": "models",
    "TreadleError": "errors",
    "InvalidArgument": "errors",
    "ExtensionMissing": "errors",
    "UnsupportedVersion": "errors",
    "UndecodablePayload": "errors",
    "LeaseLost": "errors",
    "QueueFull": "errors",
    "JobCancelled": "errors",
    "JobFailed": "errors",
    "JobNotFound": "errors",
    "JobTimeout": "errors",
    "Discard": "errors",
    "Snooze": "errors",
    "WaitTimeout": "errors",
    "WorkflowCancelled": "errors",
    "WorkflowFailed": "errors",
    "WorkflowNotFound": "errors",
}

# the names of _EXPORTS, spelled out so that type checkers see what the package exports
# (tests/client/test_public_names.py holds the two equal)
__all__ = [
    "Child",
    "Compensation",
    "Discard",
    "EnqueueOptions",
    "Explanation",
    "ExtensionMissing",
    "InvalidArgument",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobFailed",
    "JobNotFound",
    "JobTimeout",
    "LeaseLost",
    "QueueFull",
    "RunExplanation",
    "Sleep",
    "Snooze",
    "Step",
    "TreadleError",
    "UndecodablePayload",
    "UnsupportedVersion",
    "Wait",
    "WaitOptions",
    "WaitTimeout",
    "WatchEvent",
    "Worker",
    "WorkerEvent",
    "WorkflowCancelled",
    "WorkflowFailed",
    "WorkflowNotFound",
    "WorkflowOptions",
    "cancel",
    "cancel_many",
    "cancel_run",
    "cancel_workflow",
    "compensate_run",
    "enqueue",
    "enqueue_many",
    "explain",
    "explain_run",
    "fork_run",
    "get_job",
    "pause",
    "resume",
    "retry",
    "retry_many",
    "retry_run",
    "set_queue",
    "signal",
    "signal_by_key",
    "start_workflow",
    "version",
    "wait",
    "wait_workflow",
    "watch",
    "workflow_results",
    "workflow_step_results",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'treadle' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"treadle.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
