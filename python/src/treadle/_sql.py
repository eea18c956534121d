"""Every SQL statement the Python package sends. Nothing else builds SQL.

Each statement calls one function or reads one view of the extension; the state
machine itself lives in the database.
"""

from __future__ import annotations

from typing import Final

# the extension versions this client speaks
SUPPORTED_VERSIONS: Final = frozenset({"0.1.0"})

VERSION: Final = "SELECT treadle.version()"
EXTENSION_VERSION: Final = "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'treadle'"

ENQUEUE: Final = """
SELECT treadle.enqueue(
    name => %(name)s, args => %(args)s, queue => %(queue)s, priority => %(priority)s,
    run_at => coalesce(%(run_at)s::timestamptz, treadle._now() + %(delay)s::interval),
    max_attempts => %(max_attempts)s,
    idempotency_key => %(idempotency_key)s, every => %(every)s)
"""
ENQUEUE_MANY: Final = "SELECT id FROM treadle.enqueue_many(%(jobs)s) AS id"
START_WORKFLOW: Final = """
SELECT treadle.start_workflow(
    name => %(name)s, input => %(input)s, steps => %(steps)s, queue => %(queue)s,
    priority => %(priority)s, max_attempts => %(max_attempts)s, idempotency_key => %(idempotency_key)s)
"""
DEFINE_WORKFLOW: Final = "SELECT treadle.define_workflow(%(name)s, %(steps)s)"
CANCEL: Final = "SELECT treadle.cancel(%(job_id)s)"
RETRY: Final = "SELECT treadle.retry(%(job_id)s)"
CANCEL_WORKFLOW: Final = "SELECT treadle.cancel_workflow(%(run_id)s)"
WORKFLOW_RESULTS: Final = "SELECT treadle.workflow_results(%(run_id)s)"
GET_JOB: Final = "SELECT * FROM treadle.jobs WHERE id = %(job_id)s"
QUEUE_STATS: Final = "SELECT queue, state, jobs, oldest_available_age FROM treadle.queue_stats"

CLAIM: Final = """
SELECT * FROM treadle.claim(
    worker_id => %(worker_id)s, queues => %(queues)s, names => %(names)s,
    batch => %(batch)s, lease => %(lease)s)
"""
# the run input and earlier results a workflow step is called with
STEP_CONTEXT: Final = "SELECT id, input, results FROM treadle.workflow_runs WHERE id = ANY(%(run_ids)s)"
HEARTBEAT: Final = "SELECT treadle.heartbeat(%(job_id)s, %(lease_token)s, %(lease)s)"
PROGRESS: Final = "SELECT treadle.progress(%(job_id)s, %(lease_token)s, %(fraction)s, %(message)s)"
COMPLETE: Final = "SELECT treadle.complete(%(job_id)s, %(lease_token)s, %(result)s)"
COMPLETE_MANY: Final = "SELECT job_id, state FROM treadle.complete_many(%(job_ids)s, %(lease_tokens)s, %(results)s)"
FAIL: Final = "SELECT treadle.fail(%(job_id)s, %(lease_token)s, %(error)s, %(retry_in)s)"
RESCUE: Final = "SELECT treadle.rescue()"
WORKER_SEEN: Final = """
SELECT treadle.worker_seen(%(worker_id)s, %(host)s, %(pid)s, %(queues)s, %(concurrency)s, %(running)s)
"""
WORKER_STOPPED: Final = "SELECT treadle.worker_stopped(%(worker_id)s)"

# LISTEN/NOTIFY channels: wake-up hints whose payload is a queue name
CHANNEL_JOBS: Final = "treadle_jobs"  # work became claimable
CHANNEL_DONE: Final = "treadle_done"  # jobs finished
LISTEN_JOBS: Final = "LISTEN treadle_jobs"
LISTEN_DONE: Final = "LISTEN treadle_done"
RELEASE: Final = "SELECT treadle.release(%(job_id)s, %(lease_token)s)"

# producer side: a run_at given as a delay counts from the database's clock (treadle._now());
# with neither run_at nor delay the function takes that clock itself
ENQUEUE_MANY_DELAYED: Final = """
SELECT id FROM treadle.enqueue_many((
    SELECT coalesce(jsonb_agg(
               CASE WHEN s.spec ? 'run_in'
                    THEN (s.spec - 'run_in')
                         || jsonb_build_object('run_at', treadle._now() + (s.spec ->> 'run_in')::interval)
                    ELSE s.spec END
               ORDER BY s.ord), '[]')
      FROM jsonb_array_elements(%(jobs)s) WITH ORDINALITY AS s(spec, ord))) AS id
"""
JOB_OUTCOME: Final = "SELECT queue, state, result, last_error FROM treadle.jobs WHERE id = %(job_id)s"
TRANSACTION_ISOLATION: Final = "SELECT pg_catalog.current_setting('transaction_isolation') AS isolation"
LISTENING_CHANNELS: Final = "SELECT pg_catalog.pg_listening_channels() AS channel"
UNLISTEN_DONE: Final = "UNLISTEN treadle_done"
# a run and, once it failed, the step whose job was discarded (its latest step job), in one read
RUN_OUTCOME: Final = """
SELECT r.queue, r.state, r.results, s.step, s.last_error
  FROM treadle.workflow_runs AS r
  LEFT JOIN LATERAL (
        SELECT j.step, j.last_error FROM treadle.jobs AS j
         WHERE j.workflow_run_id = r.id AND r.state = 'failed'
         ORDER BY j.id DESC LIMIT 1) AS s ON true
 WHERE r.id = %(run_id)s
"""
