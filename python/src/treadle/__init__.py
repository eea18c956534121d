"""treadle: background jobs and step workflows inside PostgreSQL.

The producer side (`enqueue`, `start_workflow`, ...) runs on the caller's own
connection and transaction; `Worker` claims jobs and runs Python handlers. Every
state decision is made by the extension's SQL functions.

Names are loaded on first use, so `import treadle` stays light.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # type checkers see the real signatures; at run time names load lazily
    from .client import (
        WatchEvent,
        cancel,
        cancel_workflow,
        enqueue,
        enqueue_many,
        get_job,
        retry,
        start_workflow,
        version,
        wait,
        wait_workflow,
        watch,
        workflow_results,
    )
    from .errors import (
        ExtensionMissing,
        InvalidArgument,
        JobCancelled,
        JobFailed,
        JobNotFound,
        LeaseLost,
        TreadleError,
        UnsupportedVersion,
        WaitTimeout,
        WorkflowCancelled,
        WorkflowFailed,
        WorkflowNotFound,
    )
    from .models import Job
    from .worker import JobContext, Step, Worker, WorkerEvent

__version__ = importlib.metadata.version("treadle")  # pyproject.toml's, which the extension's pins

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    # producer side
    "enqueue": "client",
    "enqueue_many": "client",
    "start_workflow": "client",
    "cancel": "client",
    "retry": "client",
    "cancel_workflow": "client",
    "get_job": "client",
    "workflow_results": "client",
    "version": "client",
    "wait": "client",
    "wait_workflow": "client",
    "watch": "client",
    "WatchEvent": "client",
    # worker side
    "Worker": "worker",
    "Step": "worker",
    "JobContext": "worker",
    "WorkerEvent": "worker",
    # data and errors
    "Job": "models",
    "TreadleError": "errors",
    "InvalidArgument": "errors",
    "ExtensionMissing": "errors",
    "UnsupportedVersion": "errors",
    "LeaseLost": "errors",
    "JobCancelled": "errors",
    "JobFailed": "errors",
    "JobNotFound": "errors",
    "WaitTimeout": "errors",
    "WorkflowCancelled": "errors",
    "WorkflowFailed": "errors",
    "WorkflowNotFound": "errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'treadle' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"treadle.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
