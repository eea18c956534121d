--------------------------------------------------------------------------------
-- treadle.explain(job_id, queue) -> table(reason, message, at)
--
-- Transition: none. Why a job is where it is, one row per reason, in words: a
-- stable key (reason), a sentence (message) and the time it names, if any (at).
--   available, retryable: not_due (run_at later; "debounced until" for a job
--     that holds its idempotency key), retrying (attempt n of m
--     failed), paused, concurrency_limit (N running), rate_limit (next slot at),
--     no_worker (no live worker serves the queue, or none of those that do
--     handles the job's name: for a workflow step, has a handler for the step
--     of its run's definition), behind (K jobs a claim takes
--     first, counted up to 1000), ready (nothing holds it back);
--   running: running (worker, attempt, lease), worker (its last report, or that
--     it is not in the registry), lease_expired, cancel_requested;
--   completed, discarded (with the last error; lane_blocked for an ordered
--     lane's failed head), cancelled;
--   blocked (034_key_lanes.sql): key_full (N of N slots held, by jobs ...),
--     lane_blocked (by failed head #id), key_waiting (older jobs of the key first).
-- No rows for an unknown id, a job of a queue a tenant may not see, or one not in
-- queue when that is given. Readers
-- may call it (treadle.grant_reader); it reads as the owner and applies the
-- tenant rule itself, as the views' row-level security does.
-- Raises 22004: job_id null.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.explain(job_id bigint, queue text DEFAULT NULL)
RETURNS TABLE (reason text, message text, at timestamptz)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    c_live   CONSTANT interval := interval '30 seconds';  -- as treadle.live_workers
    c_ahead  CONSTANT integer := 1000;                    -- the most jobs ahead counted
    v_now    timestamptz := treadle.now();
    v_prefix text := treadle._caller_prefix();  -- read first: Citus runs no such call inside a shard's query
    v_job    record;
    v_queue  treadle.queues;
    v_worker record;
    v_count  bigint;
    v_handlers bigint;  -- live workers on the queue that handle the job's name
    v_tokens double precision;
    v_held   boolean := false;  -- some reason keeps a waiting job from being claimed
BEGIN
    IF explain.job_id IS NULL THEN
        RAISE EXCEPTION 'treadle: job_id must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- not j.*: the lease token is nobody's business here
    SELECT j.id, j.queue, j.name, j.state, j.priority, j.run_at, j.attempt, j.max_attempts, j.lease_until,
           j.worker_id, j.last_error, j.finished_at, j.started_at, j.cancel_requested, j.workflow_run_id, j.step,
           j.idempotency_key, (SELECT e.key_scope FROM treadle.jobs AS e WHERE e.id = j.id AND e.queue = j.queue) AS key_scope
      INTO v_job
      FROM treadle.job_details AS j  -- treadle.jobs and its history
     WHERE j.id = explain.job_id AND starts_with(j.queue, v_prefix)
       AND (explain.queue IS NULL OR j.queue = explain.queue);
    IF NOT FOUND THEN
        RETURN;
    END IF;

    IF v_job.state = 'completed' THEN
        RETURN QUERY SELECT 'completed', format('completed at %s after %s attempt(s)', v_job.finished_at, v_job.attempt),
                            v_job.finished_at;
        RETURN;
    ELSIF v_job.state = 'cancelled' THEN
        RETURN QUERY SELECT 'cancelled', format('cancelled at %s', v_job.finished_at), v_job.finished_at;
        RETURN;
    ELSIF v_job.state = 'discarded' THEN
        RETURN QUERY SELECT 'discarded',
                            format('discarded at %s after attempt %s of %s failed: %s', v_job.finished_at,
                                   v_job.attempt, v_job.max_attempts, coalesce(left(v_job.last_error, 500), 'no error given')),
                            v_job.finished_at;
        RETURN QUERY SELECT * FROM treadle._key_explain(v_job.id);  -- an ordered lane's failed head
        RETURN;
    ELSIF v_job.state = 'blocked' THEN
        -- waits for a slot of its concurrency key (034_key_lanes.sql)
        RETURN QUERY SELECT * FROM treadle._key_explain(v_job.id);
        RETURN;
    ELSIF v_job.state = 'running' THEN
        RETURN QUERY SELECT 'running',
                            format('running on worker %s since %s (attempt %s of %s), lease until %s',
                                   v_job.worker_id, v_job.started_at, v_job.attempt, v_job.max_attempts, v_job.lease_until),
                            v_job.lease_until;
        SELECT w.last_seen, w.host, w.pid INTO v_worker FROM treadle.workers AS w WHERE w.id = v_job.worker_id;
        IF FOUND THEN
            RETURN QUERY SELECT 'worker',
                                format('worker %s (host %s, pid %s) last reported at %s%s', v_job.worker_id,
                                       v_worker.host, v_worker.pid, v_worker.last_seen,
                                       CASE WHEN v_worker.last_seen <= v_now - c_live THEN ', over 30 seconds ago' ELSE '' END),
                                v_worker.last_seen;
        ELSE
            RETURN QUERY SELECT 'worker',
                                format('worker %s is not in the worker registry (not a treadle worker, or it stopped)',
                                       v_job.worker_id),
                                NULL::timestamptz;
        END IF;
        IF v_job.lease_until < v_now THEN
            RETURN QUERY SELECT 'lease_expired',
                                format('its lease expired at %s: the next rescue makes it retryable', v_job.lease_until),
                                v_job.lease_until;
        END IF;
        IF v_job.cancel_requested THEN
            -- treadle.cancel notifies the worker (060_control.sql); the heartbeat is where it learns
            RETURN QUERY SELECT 'cancel_requested',
                                'a cancel was requested: its worker was told at once (treadle_cancel), and the heartbeat it sends on hearing it (without LISTEN, its next heartbeat) answers cancel; the job ends cancelled', NULL::timestamptz;
        END IF;
        RETURN;
    END IF;

    -- available or retryable: what keeps it waiting
    IF v_job.state = 'retryable' THEN
        RETURN QUERY SELECT 'retrying',
                            format('retrying at %s after attempt %s of %s failed: %s', v_job.run_at, v_job.attempt,
                                   v_job.max_attempts, coalesce(left(v_job.last_error, 500), 'no error given')),
                            v_job.run_at;
    END IF;
    IF v_job.run_at > v_now THEN
        v_held := true;
        IF v_job.state = 'available' THEN
            -- a job that holds its key: a call with on_conflict 'replace' moves its time (032_enqueue_keys.sql)
            IF v_job.idempotency_key IS NOT NULL AND v_job.key_scope IS DISTINCT FROM 'released'
               AND NOT (v_job.key_scope = 'waiting' AND v_job.started_at IS NOT NULL) THEN
                RETURN QUERY SELECT 'not_due', format('debounced until %s: it holds key %s, and a call with that key and on_conflict replace moves this time',
                                                      v_job.run_at, v_job.idempotency_key), v_job.run_at;
            ELSE
                RETURN QUERY SELECT 'not_due', format('not due until %s', v_job.run_at), v_job.run_at;
            END IF;
        END IF;
    END IF;

    SELECT * INTO v_queue FROM treadle.queues AS s WHERE s.queue = v_job.queue;
    IF v_queue.paused THEN
        v_held := true;
        RETURN QUERY SELECT 'paused', format('queue %s is paused: nothing is claimed from it until it is resumed',
                                             v_job.queue), v_queue.updated_at;
    END IF;
    IF v_queue.concurrency IS NOT NULL THEN
        SELECT count(*) INTO v_count FROM treadle.jobs AS j
         WHERE j.lease_until IS NOT NULL AND j.queue = v_job.queue;
        IF v_count >= v_queue.concurrency THEN
            v_held := true;
            RETURN QUERY SELECT 'concurrency_limit',
                                format('queue %s is at its concurrency limit: %s running, limit %s',
                                       v_job.queue, v_count, v_queue.concurrency),
                                NULL::timestamptz;
        END IF;
    END IF;
    IF v_queue.rate_limit IS NOT NULL THEN
        v_tokens := treadle._rate_tokens(v_queue.rate_limit, v_queue.rate_period, v_queue.rate_tokens,
                                         v_queue.rate_updated_at, v_now);
        IF v_tokens < 1 THEN
            v_held := true;
            RETURN QUERY SELECT 'rate_limit',
                                format('queue %s is at its rate limit of %s per %s: next slot at %s', v_job.queue,
                                       v_queue.rate_limit, v_queue.rate_period,
                                       v_now + v_queue.rate_period * ((1 - v_tokens) / v_queue.rate_limit)),
                                v_now + v_queue.rate_period * ((1 - v_tokens) / v_queue.rate_limit);
        END IF;
    END IF;
    -- live workers on the queue, and whether one handles the job's name (a worker
    -- that did not say its names, as before 0.3.0, may)
    SELECT count(*), count(*) FILTER (WHERE w.names IS NULL OR v_job.name = ANY (w.names))
      INTO v_count, v_handlers
      FROM treadle.workers AS w
     WHERE w.last_seen > v_now - c_live AND v_job.queue = ANY (w.queues);
    IF v_count = 0 THEN
        v_held := true;
        RETURN QUERY SELECT 'no_worker',
                            format('no live worker serves queue %s (none reported in the last 30 seconds); '
                                   'it needs one that handles %s', v_job.queue, v_job.name),
                            NULL::timestamptz;
    ELSIF v_handlers = 0 AND v_job.workflow_run_id IS NOT NULL THEN
        -- a step of a definition the live workers do not have (a rolling deploy): it waits
        v_held := true;
        RETURN QUERY SELECT 'no_worker',
                            format('no live worker runs step %s of workflow %s (run %s, definition version %s) on '
                                   'queue %s: the %s live worker(s) serving it have no handler for that step; it '
                                   'waits for a worker that registers it', v_job.step, r.name, r.id,
                                   coalesce(r.version::text, 'not recorded'), v_job.queue, v_count),
                            NULL::timestamptz
          FROM treadle.workflow_runs AS r WHERE r.id = v_job.workflow_run_id;
    ELSIF v_handlers = 0 THEN
        v_held := true;
        RETURN QUERY SELECT 'no_worker',
                            format('no live worker handles %s on queue %s: the %s live worker(s) serving it '
                                   'handle other job names', v_job.name, v_job.queue, v_count),
                            NULL::timestamptz;
    END IF;
    IF v_job.run_at <= v_now THEN
        -- due jobs a claim of this queue takes first, from the claim index, bounded
        SELECT count(*) INTO v_count
          FROM (SELECT 1 FROM treadle.jobs AS j
                 WHERE j.queue = v_job.queue
                   AND j.state = ANY (ARRAY['available', 'retryable'])
                   AND (j.priority, j.run_at, j.id) < (v_job.priority, v_job.run_at, v_job.id)
                   AND j.run_at <= v_now
                 LIMIT c_ahead) AS a;
        IF v_count > 0 THEN
            v_held := true;
            RETURN QUERY SELECT 'behind',
                                format('waiting behind %s%s due job(s) of queue %s that a claim takes first '
                                       '(higher priority, or older)',
                                       CASE WHEN v_count >= c_ahead THEN 'at least ' ELSE '' END, v_count, v_job.queue),
                                NULL::timestamptz;
        END IF;
    END IF;
    IF NOT v_held THEN
        RETURN QUERY SELECT 'ready',
                            format('due now and nothing holds it back: the next claim on queue %s that handles %s takes it',
                                   v_job.queue, v_job.name),
                            v_job.run_at;
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle.explain(bigint, text) IS
    'Why a job is where it is: one row per reason (reason key, message in words, time).';
