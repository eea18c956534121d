"""The catalogue of the statements the client, the worker, the CLI and the dashboard share.

A statement either face sends that another also sends lives here once: the operator
controls run through the client's functions (pause, resume, set_queue, cancel, retry,
cancel_workflow, retry_many, cancel_many); the readers both faces show (queue settings,
live workers, schedules) are read from here. What only one face asks stays beside it.

Grouped by caller; each statement calls one function of the extension in named
notation, or reads one table or view, and says in one line what it is for. The
state machine itself lives in the database.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from typing_extensions import LiteralString

# -- producer (client.py) -----------------------------------------------------------------

# treadle.enqueue: one job; a run_at given as a delay counts from the database's clock
ENQUEUE: Final[LiteralString] = """
SELECT treadle.enqueue(
    name => %(name)s::text, args => %(args)s::jsonb, queue => %(queue)s::text,
    priority => %(priority)s::integer,
    run_at => coalesce(%(run_at)s::timestamptz, treadle.now() + %(delay)s::interval),
    max_attempts => %(max_attempts)s::integer,
    idempotency_key => %(idempotency_key)s::text, every => %(every)s::interval,
    timeout => %(timeout)s::interval, backoff => %(backoff)s::interval[],
    on_conflict => %(on_conflict)s::text, unique_while => %(unique_while)s::text,
    unique_period => %(unique_period)s::interval, meta => %(meta)s::jsonb,
    concurrency_key => %(concurrency_key)s::text)
"""
# treadle.enqueue with every option at its default (the function's defaults are the client's)
ENQUEUE_AT_DEFAULTS: Final[LiteralString] = "SELECT treadle.enqueue(name => %(name)s::text, args => %(args)s::jsonb)"
# treadle.enqueue_many, the jobs as given: none has a "run_in" delay (the common case;
# ENQUEUE_MANY's rewrite would rebuild and sort the whole array for nothing)
ENQUEUE_MANY_AS_GIVEN: Final[LiteralString] = "SELECT id FROM treadle.enqueue_many(jobs => %(jobs)s::jsonb) AS id"
# treadle.enqueue_arrays: jobs with only the columns it takes, one array per column (sent
# in binary, which psycopg writes without escaping each element); args and meta as one
# JSON array each, split here in order (a null element takes the default), or, for a
# batch too large for one jsonb value, as a jsonb[] (args_list, meta_list)
ENQUEUE_ARRAYS: Final[LiteralString] = """
SELECT id FROM treadle.enqueue_arrays(
    name => %(name)b::text[],
    args => coalesce(%(args_list)s::jsonb[], (SELECT array_agg(e.v ORDER BY e.o)
                                               FROM jsonb_array_elements(%(args)s::jsonb) WITH ORDINALITY AS e(v, o))),
    queue => %(queue)b::text[], priority => %(priority)b::integer[], run_at => %(run_at)b::timestamptz[],
    max_attempts => %(max_attempts)b::integer[], idempotency_key => %(idempotency_key)b::text[],
    every => %(every)b::interval[], timeout => %(timeout)b::interval[],
    meta => coalesce(%(meta_list)s::jsonb[], (SELECT array_agg(e.v ORDER BY e.o)
                                               FROM jsonb_array_elements(%(meta)s::jsonb) WITH ORDINALITY AS e(v, o))),
    concurrency_key => %(concurrency_key)b::text[]) AS id
"""
# treadle.enqueue_many: a job's "run_in" delay becomes run_at on the database's clock
ENQUEUE_MANY: Final[LiteralString] = """
SELECT id FROM treadle.enqueue_many(jobs => (
    SELECT coalesce(jsonb_agg(
               CASE WHEN s.spec ? 'run_in'
                    THEN (s.spec - 'run_in')
                         || jsonb_build_object('run_at', treadle.now() + (s.spec ->> 'run_in')::interval)
                    ELSE s.spec END
               ORDER BY s.ord), '[]')
      FROM jsonb_array_elements(%(jobs)s::jsonb) WITH ORDINALITY AS s(spec, ord))) AS id
"""
# treadle.start_workflow: a run and its first step job
START_WORKFLOW: Final[LiteralString] = """
SELECT treadle.start_workflow(
    name => %(name)s::text, input => %(input)s::jsonb, steps => %(steps)s::text[], queue => %(queue)s::text,
    priority => %(priority)s::integer, max_attempts => %(max_attempts)s::integer,
    idempotency_key => %(idempotency_key)s::text, after => %(after)s::jsonb, sleeps => %(sleeps)s::jsonb,
    maps => %(maps)s::jsonb, waits => %(waits)s::jsonb, children => %(children)s::jsonb,
    compensations => %(compensations)s::jsonb, step_options => %(step_options)s::jsonb, meta => %(meta)s::jsonb)
"""
# treadle.signal, signal_by_key: 'delivered', 'kept', 'ignored', 'finished' or 'unknown'
SIGNAL: Final[LiteralString] = """
SELECT treadle.signal(run_id => %(run_id)s::bigint, name => %(name)s::text, payload => %(payload)s::jsonb)
"""
SIGNAL_BY_KEY: Final[LiteralString] = """
SELECT treadle.signal_by_key(queue => %(queue)s::text, idempotency_key => %(idempotency_key)s::text,
                             name => %(name)s::text, payload => %(payload)s::jsonb)
"""
# treadle.cancel, retry, cancel_workflow: operator controls; workflow_results, workflow_step_results: a run's results
CANCEL: Final[LiteralString] = "SELECT treadle.cancel(job_id => %(job_id)s::bigint)"
RETRY: Final[LiteralString] = "SELECT treadle.retry(job_id => %(job_id)s::bigint)"
CANCEL_WORKFLOW: Final[LiteralString] = "SELECT treadle.cancel_workflow(run_id => %(run_id)s::bigint)"
WORKFLOW_RESULTS: Final[LiteralString] = "SELECT treadle.workflow_results(run_id => %(run_id)s::bigint)"
WORKFLOW_STEP_RESULTS: Final[LiteralString] = (
    "SELECT treadle.workflow_step_results(run_id => %(run_id)s::bigint, step => %(step)s::text)"
)
# treadle.retry_run, compensate_run, fork_run: the operator's run controls
RETRY_RUN: Final[LiteralString] = "SELECT treadle.retry_run(run_id => %(run_id)s::bigint)"
COMPENSATE_RUN: Final[LiteralString] = "SELECT treadle.compensate_run(run_id => %(run_id)s::bigint)"
CANCEL_RUN: Final[LiteralString] = (
    "SELECT treadle.cancel_run(run_id => %(run_id)s::bigint, compensate => %(compensate)s::boolean)"
)
FORK_RUN: Final[LiteralString] = """
SELECT treadle.fork_run(run_id => %(run_id)s::bigint, from_step => %(from_step)s::text, input => %(input)s::jsonb)
"""
# treadle.retry, treadle.cancel over one batch of retry_many's, cancel_many's ids: how many changed
RETRY_MANY: Final[LiteralString] = """
SELECT count(*) FILTER (WHERE changed) AS changed
  FROM (SELECT treadle.retry(job_id => u.id) AS changed FROM unnest(%(ids)s::bigint[]) AS u(id)) AS done
"""
CANCEL_MANY: Final[LiteralString] = """
SELECT count(*) FILTER (WHERE changed) AS changed
  FROM (SELECT treadle.cancel(job_id => u.id) AS changed FROM unnest(%(ids)s::bigint[]) AS u(id)) AS done
"""
# a batch's own statement timeout: set_config's local form lasts until its transaction ends
BATCH_TIMEOUT: Final[LiteralString] = "SELECT set_config('statement_timeout', %(timeout)s, true)"
# one job without its lease token (job_details is what every reader role may select); jsonb as text
GET_JOB: Final[LiteralString] = """
SELECT id, queue, name, args::text AS args, state, priority, run_at, attempt, max_attempts, lease_until,
       worker_id, idempotency_key, result::text AS result, last_error, created_at, finished_at,
       workflow_run_id, step, every, next_id, cancel_requested, started_at, failed_at, errors::text AS errors,
       progress, progress_message, timeout, backoff, meta::text AS meta
  FROM treadle.job_details WHERE id = %(job_id)s::bigint
"""
# treadle.pause, resume, set_queue: a queue's pause and limits; explain: why a job is where it is
PAUSE: Final[LiteralString] = "SELECT treadle.pause(queue => %(queue)s::text)"
RESUME: Final[LiteralString] = "SELECT treadle.resume(queue => %(queue)s::text)"
SET_QUEUE: Final[LiteralString] = """
SELECT treadle.set_queue(
    queue => %(queue)s::text, concurrency => %(concurrency)s::integer, rate_limit => %(rate_limit)s::integer,
    rate_period => %(rate_period)s::interval, max_depth => %(max_depth)s::integer,
    retain_completed => %(retain_completed)s::interval, retain_failed => %(retain_failed)s::interval,
    key_limit => %(key_limit)s::integer, key_ordered => %(key_ordered)s::boolean)
"""
EXPLAIN: Final[LiteralString] = "SELECT reason, message, at FROM treadle.explain(job_id => %(job_id)s::bigint)"
# treadle.explain_run: why a workflow run is where it is, a summary row then each step not completed
EXPLAIN_RUN: Final[LiteralString] = (
    "SELECT step, job_id, reason, message, at FROM treadle.explain_run(run_id => %(run_id)s::bigint)"
)
# workflow runs, newest first, each filter applied when given (treadle workflows list)
LIST_WORKFLOW_RUNS: Final[LiteralString] = """
SELECT r.id, r.name, r.queue, r.state, r.version,
       (SELECT count(*) FROM unnest(r.steps) AS s(step) WHERE r.results ? s.step)::integer AS steps_done,
       cardinality(r.steps) AS steps_total, r.created_at, r.finished_at
  FROM treadle.workflow_runs AS r
 WHERE (%(states)s::text[] IS NULL OR r.state = ANY (%(states)s::text[]))
   AND (%(name)s::text IS NULL OR r.name = %(name)s::text)
   AND (%(queue)s::text IS NULL OR r.queue = %(queue)s::text)
 ORDER BY r.id DESC
 LIMIT %(limit)s::integer
"""
# one workflow run (treadle workflows show); jsonb as text
GET_WORKFLOW_RUN: Final[LiteralString] = """
SELECT r.id, r.name, r.version, r.queue, r.state, r.priority, r.max_attempts, r.idempotency_key,
       r.created_at, r.finished_at, r.input::text AS input, r.parent_run_id, r.parent_step, r.forked_from,
       r.forked_step
  FROM treadle.workflow_runs AS r WHERE r.id = %(run_id)s::bigint
"""
# a workflow run's steps in order, with the job that runs each (treadle workflows show)
WORKFLOW_RUN_STEPS: Final[LiteralString] = """
SELECT s.position, s.step, s.job_id, s.state, s.attempt, s.max_attempts, s.run_at, s.started_at, s.finished_at,
       s.after, s.sleeps_until, s.waits_for, s.last_error
  FROM treadle.workflow_run_steps AS s WHERE s.run_id = %(run_id)s::bigint ORDER BY s.position
"""
# treadle.set_queue over the queue's current settings: only the settings given (given_NAME)
# change. One statement, so a concurrent change between a read and a write cannot be lost.
SET_QUEUE_GIVEN: Final[LiteralString] = """
SELECT treadle.set_queue(
    queue => q.queue,
    concurrency => CASE WHEN %(given_concurrency)s THEN %(concurrency)s::integer ELSE s.concurrency END,
    rate_limit => CASE WHEN %(given_rate_limit)s THEN %(rate_limit)s::integer ELSE s.rate_limit END,
    rate_period => CASE WHEN %(given_rate_period)s THEN %(rate_period)s::interval ELSE s.rate_period END,
    max_depth => CASE WHEN %(given_max_depth)s THEN %(max_depth)s::integer ELSE s.max_depth END,
    retain_completed => CASE WHEN %(given_retain_completed)s THEN %(retain_completed)s::interval
                             ELSE s.retain_completed END,
    retain_failed => CASE WHEN %(given_retain_failed)s THEN %(retain_failed)s::interval ELSE s.retain_failed END,
    key_limit => CASE WHEN %(given_key_limit)s THEN %(key_limit)s::integer ELSE s.key_limit END,
    key_ordered => CASE WHEN %(given_key_ordered)s THEN %(key_ordered)s::boolean ELSE s.key_ordered END)
  FROM (VALUES (%(queue)s::text)) AS q(queue)
  LEFT JOIN treadle.queue_settings AS s ON s.queue = q.queue
"""
# treadle.version: the installed SQL API's version
VERSION: Final[LiteralString] = "SELECT treadle.version()"

# -- wait and watch (_wait.py, _watch.py) ---------------------------------------------------

# how a job ended; jsonb as text, so that a result this client cannot decode fails one wait clearly
JOB_OUTCOME: Final[LiteralString] = """
SELECT queue, state, result::text AS result, last_error FROM treadle.job_details WHERE id = %(job_id)s::bigint
"""
# how a run ended and, once it failed, the step whose job was discarded (its latest step job)
RUN_OUTCOME: Final[LiteralString] = """
SELECT r.queue, r.state, r.results::text AS results, s.step, s.last_error,
       (r.state <> 'running' AND EXISTS (
            WITH RECURSIVE kids(id, depth) AS (
                SELECT c.id, 1 FROM treadle.workflow_runs AS c WHERE c.parent_run_id = r.id
                UNION ALL
                SELECT c.id, k.depth + 1 FROM kids AS k JOIN treadle.workflow_runs AS c ON c.parent_run_id = k.id
                 WHERE k.depth < 10)
            SELECT 1 FROM kids AS k JOIN treadle.workflow_runs AS c ON c.id = k.id
             WHERE c.state = ANY (ARRAY['running', 'compensating'])))
           AS children_running
  FROM treadle.workflow_runs AS r
  LEFT JOIN LATERAL (
        SELECT j.step, j.last_error FROM treadle.job_details AS j
         WHERE j.workflow_run_id = r.id AND r.state = ANY (ARRAY['failed', 'compensated'])
         ORDER BY j.state = 'discarded' AND NOT j.args ? 'compensates' DESC, j.id DESC LIMIT 1) AS s ON true
 WHERE r.id = %(run_id)s::bigint
"""
# whether a wait inside the caller's transaction can see other transactions commit
TRANSACTION_ISOLATION: Final[LiteralString] = "SELECT pg_catalog.current_setting('transaction_isolation') AS isolation"
# whether the caller's connection listens already (then wait does not borrow it)
LISTENING_CHANNELS: Final[LiteralString] = "SELECT pg_catalog.pg_listening_channels() AS channel"

# the server's own port: a connection whose port differs goes through a pooler or proxy
SERVER_PORT: Final[LiteralString] = "SELECT pg_catalog.current_setting('port')::integer"
# the server process behind a session: through a pooler it is not the one libpq was told of
BACKEND_PID: Final[LiteralString] = "SELECT pg_catalog.pg_backend_pid()"

# LISTEN/NOTIFY channels: wake-up hints whose payload is a queue name
CHANNEL_JOBS: Final[LiteralString] = "treadle_jobs"  # work became claimable
CHANNEL_DONE: Final[LiteralString] = "treadle_done"  # jobs finished
LISTEN_JOBS: Final[LiteralString] = "LISTEN treadle_jobs"
# treadle.cancel of a running job: payload the job id (the worker running it heartbeats it now)
LISTEN_CANCEL: Final[LiteralString] = "LISTEN treadle_cancel"
LISTEN_DONE: Final[LiteralString] = "LISTEN treadle_done"
UNLISTEN_DONE: Final[LiteralString] = "UNLISTEN treadle_done"
# treadle.listen_done: this session waits for finishes on the job's, the run's or the
# named queues (on every queue: WAIT_FOR_ALL), so that finishing there sends treadle_done;
# run before LISTEN treadle_done, the read after both (a psycopg.sql template: the ids
# and names are literals, for the notifier's statements take no parameters)
WAIT_FOR_JOB: Final[LiteralString] = (
    "SELECT treadle.listen_done(queue => j.queue) FROM treadle.jobs AS j WHERE j.id = {}"
)
WAIT_FOR_RUN: Final[LiteralString] = (
    "SELECT treadle.listen_done(queue => r.queue) FROM treadle.workflow_runs AS r WHERE r.id = {}"
)
WAIT_FOR_QUEUES: Final[LiteralString] = "SELECT treadle.listen_done(queue => q.q) FROM unnest({}::text[]) AS q(q)"
WAIT_FOR_ALL: Final[LiteralString] = "SELECT treadle.listen_done()"
# treadle.unlisten_done: this session waits no more (before UNLISTEN, or closing its connection)
STOP_WAITING: Final[LiteralString] = "SELECT treadle.unlisten_done()"

# -- worker (worker.py, _executor.py, _completer.py, _housekeeping.py) ----------------------

# A claimed job's fields, in the order of Job's (tests/client/test_models.py pins it); each
# statement that claims selects them all (_claimed_columns: CLAIMED_EAGER, then the others
# as one record). jsonb comes as text, so that each job's payload is decoded alone.
CLAIMED_NAMES: Final = (
    "id", "queue", "name", "args", "state", "priority", "run_at", "attempt", "max_attempts", "lease_until",
    "worker_id", "idempotency_key", "result", "last_error", "created_at", "finished_at", "workflow_run_id",
    "step", "lease_token", "every", "next_id", "cancel_requested", "started_at", "failed_at", "errors",
    "progress", "progress_message", "timeout", "backoff", "meta",
)  # fmt: skip
_CLAIMED_AS_TEXT: Final = frozenset({"args", "result", "errors", "meta"})
# What the worker reads of every job it runs, a column each (in this order); the other
# fields come as one record, in CLAIMED_DEFERRED's order and of its types (jsonb as text),
# taken apart only when something reads one of them (_executor.DeferredLoader): each column a row
# carries costs the client its own loading, most of all the timestamps.
CLAIMED_EAGER: Final = (
    "id", "queue", "name", "args", "attempt", "max_attempts", "workflow_run_id", "step", "lease_token",
    "timeout", "meta",
)  # fmt: skip
CLAIMED_DEFERRED: Final = (
    ("state", "text"), ("priority", "integer"), ("run_at", "timestamptz"), ("lease_until", "timestamptz"),
    ("worker_id", "text"), ("idempotency_key", "text"), ("result", "text"), ("last_error", "text"),
    ("created_at", "timestamptz"), ("finished_at", "timestamptz"), ("every", "interval"), ("next_id", "bigint"),
    ("cancel_requested", "boolean"), ("started_at", "timestamptz"), ("failed_at", "timestamptz"),
    ("errors", "text"), ("progress", "double precision"), ("progress_message", "text"), ("backoff", "interval[]"),
)  # fmt: skip


def _claimed_columns(row: LiteralString) -> LiteralString:
    """The select list of a claimed job: CLAIMED_EAGER's columns, then CLAIMED_DEFERRED's as one
    record in text, each read from `row` ('' for a table's own)."""
    eager = ", ".join(row + name + ("::text" if name in _CLAIMED_AS_TEXT else "") for name in CLAIMED_EAGER)
    deferred = ", ".join(row + name + "::" + kind for name, kind in CLAIMED_DEFERRED)
    return eager + ", row(" + deferred + ")::text"


# treadle.claim: every job this call claims holds the call's own lease token
CLAIM: Final[LiteralString] = (
    "SELECT "
    + _claimed_columns("")
    + """
  FROM treadle.claim(
    worker_id => %(worker_id)s::text, queues => %(queues)s::text[], names => %(names)s::text[],
    batch => %(batch)s::integer, lease => %(lease)s::interval, lease_token => %(lease_token)s::uuid)
"""
)
# whether the worker's queues have a concurrency or rate limit, and the shortest rate slot in seconds
QUEUE_LIMITS: Final[LiteralString] = """
SELECT coalesce(bool_or(concurrency IS NOT NULL OR rate_limit IS NOT NULL), false) AS limited,
       min(extract(epoch FROM rate_period) / rate_limit)::float8 AS rate_slot
  FROM treadle.queue_settings WHERE queue = ANY (%(queues)s::text[])
"""
# treadle.claimed: what a claim whose answer was lost committed (nothing when it did not)
CLAIMED: Final[LiteralString] = (
    "SELECT "
    + _claimed_columns("")
    + """
  FROM treadle.claimed(lease_token => %(lease_token)s::uuid)
"""
)
# the workflow, input and the results of the steps it runs after, for each claimed step
STEP_CONTEXT: Final[LiteralString] = """
SELECT r.id, s.step, r.name, r.input::text AS input,
       treadle._step_results(r.steps, r.after, r.results, s.step)::text AS results
  FROM unnest(%(run_ids)s::bigint[], %(steps)s::text[]) AS s(run_id, step)
  JOIN treadle.workflow_runs AS r ON r.id = s.run_id
"""
# treadle.heartbeat: extend a lease; 'held', 'cancel' or 'lost'
HEARTBEAT: Final[LiteralString] = """
SELECT treadle.heartbeat(job_id => %(job_id)s::bigint, lease_token => %(lease_token)s::uuid,
                         lease => %(lease)s::interval, queue => %(queue)s::text)
"""
# treadle.progress: a running handler's fraction and note
PROGRESS: Final[LiteralString] = """
SELECT treadle.progress(job_id => %(job_id)s::bigint, lease_token => %(lease_token)s::uuid,
                        fraction => %(fraction)s::double precision, message => %(message)s::text,
                        queue => %(queue)s::text)
"""
# treadle.complete: one job, in complete_in's transaction or after complete_many was refused. The
# finishes name the job's queue: every statement is then of that queue (one shard on Citus).
COMPLETE: Final[LiteralString] = """
SELECT treadle.complete(job_id => %(job_id)s::bigint, lease_token => %(lease_token)s::uuid,
                        result => %(result)s::jsonb, queue => %(queue)s::text)
"""
# treadle.complete_many: the buffered successes in one statement, each with its queue (one
# statement per queue inside: one shard each on Citus)
COMPLETE_MANY: Final[LiteralString] = """
SELECT job_id, state FROM treadle.complete_many(
    job_ids => %(job_ids)s::bigint[], lease_tokens => %(lease_tokens)s::uuid[], results => %(results)s::jsonb[],
    job_queues => %(job_queues)s::text[])
"""
# treadle.complete_and_claim: the buffered successes finished and up to `batch` more claimed in one
# statement. Rows: one per finished input (finished_id, finished_state), then one per claimed job
# (finished_id null, then the claimed columns: _claimed_columns).
COMPLETE_AND_CLAIM: Final[LiteralString] = (
    "SELECT c.finished_id, c.finished_state, "
    + _claimed_columns("(c.job).")
    + """
  FROM treadle.complete_and_claim(
    job_ids => %(job_ids)s::bigint[], lease_tokens => %(lease_tokens)s::uuid[], results => %(results)s::jsonb[],
    worker_id => %(worker_id)s::text, queues => %(queues)s::text[], names => %(names)s::text[],
    batch => %(batch)s::integer, lease => %(lease)s::interval, lease_token => %(lease_token)s::uuid,
    job_queues => %(job_queues)s::text[]) AS c
"""
)
# treadle.heartbeat_many: every lease of the worker in one statement, each with its job's queue;
# one answer per job, in order
HEARTBEAT_MANY: Final[LiteralString] = """
SELECT answer FROM treadle.heartbeat_many(
    job_ids => %(job_ids)s::bigint[], lease_tokens => %(lease_tokens)s::uuid[], lease => %(lease)s::interval,
    job_queues => %(job_queues)s::text[])
"""
# treadle.fail: a failed attempt; retryable, discarded or cancelled
FAIL: Final[LiteralString] = """
SELECT treadle.fail(job_id => %(job_id)s::bigint, lease_token => %(lease_token)s::uuid,
                    error => %(error)s::text, retry_in => %(retry_in)s::interval,
                    retryable => %(retryable)s::boolean, queue => %(queue)s::text)
"""
# treadle.snooze: run the job again after a delay, its attempt given back
SNOOZE: Final[LiteralString] = """
SELECT treadle.snooze(job_id => %(job_id)s::bigint, lease_token => %(lease_token)s::uuid,
                      delay => %(delay)s::interval, queue => %(queue)s::text)
"""
# treadle.step_sleep: when a step's seq-th ctx.sleep ends (recorded once); the time left
STEP_SLEEP: Final[LiteralString] = """
SELECT treadle.step_sleep(job_id => %(job_id)s::bigint, lease_token => %(lease_token)s::uuid,
                          seq => %(seq)s::integer, delay => %(delay)s::interval, until => %(until)s::timestamptz)
"""
# treadle.release: hand a job back at shutdown, its attempt given back
RELEASE: Final[LiteralString] = """
SELECT treadle.release(job_id => %(job_id)s::bigint, lease_token => %(lease_token)s::uuid, queue => %(queue)s::text)
"""
# treadle.rescue: return the jobs of workers whose lease expired
# the jobs rescued, and whether the rescue left workflow runs due (sleeps, signal timeouts, re-checks;
# it takes 1,000 of each a call): its FROM runs before the setting is read
RESCUE: Final[LiteralString] = (
    "SELECT r.n, coalesce(current_setting('treadle.rescue_left', true), '') = 'on' FROM treadle.rescue() AS r(n)"
)
# treadle.apply_retention: delete one batch of finished work past its retention
APPLY_RETENTION: Final[LiteralString] = "SELECT treadle.apply_retention(batch => %(batch)s::integer)"
# treadle.archive: move one batch of finished jobs to treadle.job_history
ARCHIVE: Final[LiteralString] = "SELECT treadle.archive(batch => %(batch)s::integer)"
# treadle.define_workflow: record a registered workflow's steps
DEFINE_WORKFLOW: Final[LiteralString] = """
SELECT treadle.define_workflow(name => %(name)s::text, steps => %(steps)s::text[], after => %(after)s::jsonb,
                               sleeps => %(sleeps)s::jsonb, maps => %(maps)s::jsonb, waits => %(waits)s::jsonb,
                               children => %(children)s::jsonb, compensations => %(compensations)s::jsonb,
                               step_options => %(step_options)s::jsonb)
"""
# treadle.worker_seen, worker_stopped: the registry of live workers
WORKER_SEEN: Final[LiteralString] = """
SELECT treadle.worker_seen(worker_id => %(worker_id)s::text, host => %(host)s::text, pid => %(pid)s::integer,
                           queues => %(queues)s::text[], concurrency => %(concurrency)s::integer,
                           running => %(running)s::integer, names => %(names)s::text[])
"""
WORKER_STOPPED: Final[LiteralString] = "SELECT treadle.worker_stopped(worker_id => %(worker_id)s::text)"

# -- the faces' readers (cli/, dashboard/queries.py, metrics.py) ---------------------------

# treadle.queue_settings: every queue's pause, limits and retention (a tenant sees its own)
QUEUE_SETTINGS: Final[LiteralString] = """
SELECT queue, paused, concurrency, rate_limit, rate_period, max_depth, retain_completed, retain_failed, updated_at,
       key_limit, key_ordered
  FROM treadle.queue_settings
"""
# ... one queue's (no row: no setting, not paused)
QUEUE_SETTINGS_OF: Final[LiteralString] = QUEUE_SETTINGS + " WHERE queue = %(queue)s::text"
# treadle.live_workers: the workers seen lately, what they serve and how busy they are
LIVE_WORKERS: Final[LiteralString] = """
SELECT id, host, pid, queues, concurrency, running_jobs, started_at, last_seen
  FROM treadle.live_workers
"""
# ... those that serve one queue
QUEUE_WORKERS: Final[LiteralString] = LIVE_WORKERS + " WHERE %(queue)s::text = ANY (queues)"
# treadle.schedules: the cron schedules, each next run in its own zone
SCHEDULES: Final[LiteralString] = """
SELECT name, cron, tz, job, queue, args, priority, max_attempts, catch_up, next_run_at, next_run_local,
       job_id, job_state
  FROM treadle.schedules
 ORDER BY name
"""

# A CTE over `counts` (job_counts' rows) that ranks the queues for a bounded view (the
# metrics' top N, the overview's pages): the most jobs waiting or running first, then the
# most jobs, then by name.
QUEUE_RANKS: Final[LiteralString] = """
ranked AS (
    SELECT queue, row_number() OVER (
               ORDER BY coalesce(sum(jobs) FILTER (WHERE state IN ('available', 'retryable', 'running')), 0) DESC,
                        sum(jobs) DESC, queue) AS rank
      FROM counts
     WHERE queue IS NOT NULL
     GROUP BY queue)"""
