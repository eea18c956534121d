"""A worker process with the Worker's default options, for the PgBouncer tests.

    python bouncer_worker.py DSN

Handlers: `echo(args)` returns args; workflow "pair": steps first and second,
each returning its name and the steps it saw before it.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from treadle import JobContext, Step, Worker


def echo(args: Any, ctx: JobContext) -> Any:
    return args


def step(name: str) -> Any:
    def run(input: Any, ctx: JobContext) -> dict[str, Any]:
        return {"step": name, "seen": sorted(ctx.results), "input": input}

    return run


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(threadName)s %(levelname)s %(message)s"
    )
    worker = Worker(sys.argv[1])  # every option at its default
    worker.register("echo", echo)
    worker.workflow("pair", [Step("first", step("first")), Step("second", step("second"))])
    worker.run()


if __name__ == "__main__":
    main()
