"""Every benchmark scenario, one after the other, on one throwaway cluster (`make bench`);
the held snapshot on a cluster of its own, which loads pg_stat_statements.

Sizes are each script's defaults, but for the held snapshot (a 60 s hold instead
of 300 s) and the memory scenario (one run), so that the whole run takes about
ten minutes (and scale.py, with 1M finished jobs, about three more). Options after the script name go to every scenario (`--runs 5`,
`--smoke`).

    .build/venv/bin/python bench/run_all.py [--runs N] [--smoke]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from harness import BENCH, PYTHON, progress, server

# (script, its own options in this run)
SCENARIOS: list[tuple[str, list[str]]] = [
    ("claim_latency.py", []),
    ("storm.py", []),
    ("enqueue_rate.py", []),
    ("load.py", []),
    ("recovery.py", []),
    ("pickup.py", []),
    ("chain.py", []),
    ("notify.py", []),
    ("limits.py", []),
    ("queues.py", []),
    ("keys.py", []),
    ("scale.py", []),  # 1M finished jobs; the 10M-row run: bench/scale.py --finished 10000000
    ("held_snapshot.py", ["--warmup", "20", "--hold", "60", "--after", "20"]),
    ("memory.py", ["--runs", "1"]),
    ("cli_bulk.py", []),
    ("workflows.py", []),
    ("workflow_worker.py", []),
]
# scenarios that start a cluster of their own, with settings of their own (pg_stat_statements)
OWN_CLUSTER = {"held_snapshot.py"}


def main() -> None:
    shared = sys.argv[1:]
    failed = []
    began = time.monotonic()
    with server() as url:
        env = {**os.environ, "DATABASE_URL": url}
        for script, options in SCENARIOS:
            progress(f"== {script}")
            print(f"## {script}\n", flush=True)
            own = {k: v for k, v in env.items() if k != "DATABASE_URL"} if script in OWN_CLUSTER else env
            code = subprocess.run([PYTHON, str(BENCH / script), *options, *shared], env=own).returncode
            if code != 0:
                failed.append(script)
    progress(f"all scenarios in {(time.monotonic() - began) / 60:.1f} min")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
