--------------------------------------------------------------------------------
-- Dashboard reads: one job, a workflow run's steps, and counts that stay fast on
-- large tables. Finished rows have no index by state (claims never need one), so
-- on a large table their counts come from the planner's statistics and say so.
--------------------------------------------------------------------------------

-- One job as a reader sees it: every column but the lease token, which is a
-- worker's write credential that nobody reading needs. Jobs archived to
-- treadle.job_history are here too.
CREATE VIEW treadle.job_details WITH (security_invoker = true) AS
SELECT j.id, j.queue, j.name, j.args, j.state, j.priority, j.run_at, j.attempt, j.max_attempts,
       j.lease_until, j.worker_id, j.idempotency_key, j.result, j.last_error, j.created_at,
       j.finished_at, j.workflow_run_id, j.step, j.every, j.next_id, j.cancel_requested,
       j.started_at, j.failed_at, j.errors, j.progress, j.progress_message, j.schedule,
       j.timeout, j.backoff, j.meta, j.concurrency_key
  FROM treadle.jobs AS j
UNION ALL
SELECT h.id, h.queue, h.name, h.args, h.state, h.priority, h.run_at, h.attempt, h.max_attempts,
       h.lease_until, h.worker_id, h.idempotency_key, h.result, h.last_error, h.created_at,
       h.finished_at, h.workflow_run_id, h.step, h.every, h.next_id, h.cancel_requested,
       h.started_at, h.failed_at, h.errors, h.progress, h.progress_message, h.schedule,
       h.timeout, h.backoff, h.meta, NULL::text  -- a finished job holds no key
  FROM treadle.job_history AS h;
COMMENT ON VIEW treadle.job_details IS
    'Every job with all its columns but the lease token; filter by id, queue, name, state or meta (@>).';

-- A run's steps in order, each with the job that runs it; a step whose job is not
-- enqueued yet has state 'pending' and no job. A sleep step has no job: its state
-- is 'sleeping' until sleeps_until, then 'completed'. A wait step has no job either:
-- it is 'waiting' for the signal waits_for names, then 'completed' (or 'timed_out').
-- `after`: the steps it runs after in a graph; null in a list (each step after the
-- one before it). A child step has no job either: child_run_id is the run it
-- started, and until the step completes its state is that run's.
CREATE VIEW treadle.workflow_run_steps WITH (security_invoker = true) AS
SELECT r.id AS run_id, s.position, s.step,
       j.id AS job_id,
       coalesce(j.state, CASE WHEN r.wakes ? s.step THEN 'sleeping'
                              WHEN r.waiting -> s.step ? 'timed_out' THEN 'timed_out'
                              WHEN r.waiting ? s.step THEN 'waiting'
                              WHEN r.results ? s.step THEN 'completed'
                              WHEN c.state IS NOT NULL THEN c.state
                              ELSE 'pending' END) AS state,
       j.attempt, j.max_attempts, j.cancel_requested,
       r.results ? s.step AS has_result,
       r.results -> s.step AS result,
       j.last_error, j.errors, j.progress, j.progress_message,
       j.run_at, j.started_at, j.finished_at,
       CASE WHEN r.after IS NOT NULL
            THEN ARRAY(SELECT d.v FROM jsonb_array_elements_text(r.after -> s.step) AS d(v)) END AS after,
       (r.wakes ->> s.step)::timestamptz AS sleeps_until,
       r.waits -> s.step ->> 'signal' AS waits_for,
       c.id AS child_run_id
  FROM treadle.workflow_runs AS r
 CROSS JOIN LATERAL unnest(r.steps) WITH ORDINALITY AS s(step, position)
  LEFT JOIN LATERAL (
        SELECT j.id, j.state, j.attempt, j.max_attempts, j.cancel_requested, j.last_error, j.errors,
               j.progress, j.progress_message, j.run_at, j.started_at, j.finished_at
          FROM treadle.jobs AS j
         WHERE j.workflow_run_id = r.id AND j.step = s.step
         ORDER BY j.id DESC
         LIMIT 1) AS j ON true
  LEFT JOIN treadle.workflow_runs AS c
    ON r.children ? s.step AND c.parent_run_id = r.id AND c.parent_step = s.step;
COMMENT ON VIEW treadle.workflow_run_steps IS
    'A workflow run''s steps in order, with each step''s job, state, attempt, result, error, dependencies, sleep, signal and child run.';

--------------------------------------------------------------------------------
-- treadle.estimated_jobs(queue, state) -> bigint
--
-- The planner's estimate of how many jobs are in a state (in one queue, or in all
-- the caller's queues when queue is null), from the table's statistics: no row is
-- read. Never below 1 (the planner rounds up), but 0 for a queue a tenant may not
-- see. It runs as the owner, since row-level security would hide the statistics
-- from readers and bend the estimate; a tenant gets estimates of its queues only.
-- VOLATILE because it runs EXPLAIN (a constant statement, the values passed as
-- parameters). treadle.grant_reader grants it.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.estimated_jobs(queue text, state text)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_prefix  text := treadle._caller_prefix();
    v_plan    json;
    v_where   text;
    v_history text;
    v_queue   text := queue;
BEGIN
    IF queue IS NOT NULL AND NOT starts_with(queue, v_prefix) THEN
        RETURN 0;
    END IF;
    -- finished jobs are in treadle.jobs and in its history; waiting and running ones only in jobs
    v_history := CASE WHEN state = ANY (ARRAY['completed', 'discarded', 'cancelled'])
                      THEN ' UNION ALL SELECT 1 FROM treadle.job_history AS j WHERE ' ELSE NULL END;
    IF queue IS NOT NULL THEN
        v_where := 'j.state = $1 AND j.queue = $2';
    ELSIF v_prefix <> '' THEN
        v_where := 'j.state = $1 AND j.queue LIKE $2';
        v_queue := replace(replace(replace(v_prefix, '\', '\\'), '%', '\%'), '_', '\_') || '%';
    ELSE
        v_where := 'j.state = $1';
    END IF;
    EXECUTE 'EXPLAIN (FORMAT JSON) SELECT 1 FROM treadle.jobs AS j WHERE ' || v_where
            || coalesce(v_history || v_where, '')
       INTO v_plan USING state, v_queue;
    RETURN round((v_plan -> 0 -> 'Plan' ->> 'Plan Rows')::numeric)::bigint;
END;
$$;
COMMENT ON FUNCTION treadle.estimated_jobs(text, text) IS
    'Planner estimate of the jobs in a state (and queue), read from statistics only.';

--------------------------------------------------------------------------------
-- treadle.job_counts(exact_up_to) -> table(queue, state, jobs, estimated,
--                                          oldest_available_age)
--
-- Jobs per state: one row per state with queue null (the total over all queues,
-- every state present, 0 included), and one row per queue and state that has
-- jobs, carrying the age of that queue's oldest due claimable job (null when it
-- has none; a growing age is the first sign of trouble).
-- When the table holds at most exact_up_to rows (by its statistics, or when it
-- has none yet), every count is exact. Above that, a state's count is estimated
-- (estimated = true) when it must be: finished states always, since counting them
-- would read the whole table; available, retryable and running only when their own
-- estimate passes exact_up_to (otherwise their indexes give an exact count).
-- It runs with the caller's rights, so every count it reads follows row-level
-- security: a tenant's cover its queues only, and so do those of a role that an
-- operator's RESTRICTIVE policy keeps to fewer queues. Estimates come from
-- treadle.estimated_jobs (the owner's statistics, kept to a tenant's prefix but
-- not to an operator's own policies); the queues it estimates for a reader are
-- those it counted, since the column statistics of a table with row-level
-- security are hidden from readers. It changes nothing, but is VOLATILE (it runs
-- EXPLAIN); treadle.grant_reader grants it.
-- Raises 22004: exact_up_to null. 22023: exact_up_to negative.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.job_counts(exact_up_to bigint DEFAULT 100000)
RETURNS TABLE (queue text, state text, jobs bigint, estimated boolean, oldest_available_age interval)
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    c_states CONSTANT text[] := ARRAY['available', 'running', 'retryable', 'completed', 'discarded', 'cancelled', 'blocked'];
    v_prefix text := treadle._caller_prefix();  -- '' unless the caller is a tenant
    v_now   timestamptz := treadle.now();
    v_rows  real;
    v_small boolean;
    v_exact text[];  -- the states counted exactly
BEGIN
    IF job_counts.exact_up_to IS NULL THEN
        RAISE EXCEPTION 'treadle: exact_up_to must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF job_counts.exact_up_to < 0 THEN
        RAISE EXCEPTION 'treadle: exact_up_to must not be negative, got %', job_counts.exact_up_to
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- reltuples is -1 until the table is first vacuumed or analyzed: count exactly then
    SELECT c.reltuples INTO v_rows FROM pg_catalog.pg_class AS c WHERE c.oid = 'treadle.jobs'::regclass;
    SELECT v_rows + coalesce(sum(greatest(c.reltuples, 0)), 0) INTO v_rows
      FROM pg_catalog.pg_inherits AS i JOIN pg_catalog.pg_class AS c ON c.oid = i.inhrelid
     WHERE i.inhparent = 'treadle.job_history'::regclass;
    v_small := v_rows < 0 OR v_rows <= job_counts.exact_up_to;
    IF v_small THEN
        v_exact := c_states;
    ELSE
        SELECT coalesce(array_agg(s.state), ARRAY[]::text[]) INTO v_exact
          FROM unnest(ARRAY['available', 'retryable', 'running']) AS s(state)
         WHERE treadle.estimated_jobs(NULL, s.state) <= job_counts.exact_up_to;
    END IF;

    RETURN QUERY
    WITH exact AS (
        -- a small table: one pass over it
        SELECT j.queue, j.state, count(*) AS jobs
          FROM (SELECT j.queue, j.state FROM treadle.jobs AS j
                UNION ALL
                SELECT h.queue, h.state FROM treadle.job_history AS h) AS j
         WHERE v_small AND starts_with(j.queue, v_prefix)
         GROUP BY j.queue, j.state
        UNION ALL
        -- a large one: waiting and running states from their partial indexes
        SELECT j.queue, j.state, count(*)
          FROM treadle.jobs AS j
         WHERE NOT v_small
           AND j.state = ANY (ARRAY['available', 'retryable'])
           AND j.state = ANY (v_exact)
           AND starts_with(j.queue, v_prefix)
         GROUP BY j.queue, j.state
        UNION ALL
        SELECT j.queue, j.state, count(*)
          FROM treadle.jobs AS j
         WHERE NOT v_small
           AND j.lease_until IS NOT NULL  -- = running (jobs_lease_check): read from jobs_lease_idx
           AND j.state = 'running'
           AND 'running' = ANY (v_exact)
           AND starts_with(j.queue, v_prefix)
         GROUP BY j.queue, j.state
    ), queues AS (
        -- the queues an estimate is given for: those with counted work, and those
        -- the column statistics know of
        SELECT e.queue FROM exact AS e
        UNION
        SELECT m.queue
          FROM pg_catalog.pg_stats AS st
         CROSS JOIN unnest(st.most_common_vals::text::text[]) AS m(queue)
         WHERE st.schemaname = 'treadle' AND st.attname = 'queue'
           AND (st.tablename = 'jobs' OR st.tablename ~ '^job_history_[0-9]{2}$')
           AND starts_with(m.queue, v_prefix)
    ), per_queue AS (
        SELECT e.queue, e.state, e.jobs, false AS estimated FROM exact AS e
        UNION ALL
        SELECT q.queue, s.state, treadle.estimated_jobs(q.queue, s.state), true
          FROM queues AS q
         CROSS JOIN unnest(c_states) AS s(state)
         WHERE NOT v_small
           AND s.state <> ALL (v_exact)
    ), ages AS (
        SELECT j.queue, v_now - min(j.run_at) AS age
          FROM treadle.jobs AS j
         WHERE j.state = ANY (ARRAY['available', 'retryable'])
           AND j.run_at <= v_now
           AND starts_with(j.queue, v_prefix)
         GROUP BY j.queue
    )
    SELECT r.queue, r.state, r.jobs, r.estimated, r.age
      FROM (SELECT NULL::text AS queue, s.state,
                   CASE WHEN s.state = ANY (v_exact)
                        THEN (SELECT coalesce(sum(e.jobs), 0)::bigint FROM exact AS e WHERE e.state = s.state)
                        ELSE treadle.estimated_jobs(NULL, s.state) END AS jobs,
                   s.state <> ALL (v_exact) AS estimated,
                   NULL::interval AS age
              FROM unnest(c_states) AS s(state)
            UNION ALL
            SELECT p.queue, p.state, p.jobs, p.estimated, a.age
              FROM per_queue AS p
              LEFT JOIN ages AS a ON a.queue = p.queue
             WHERE p.jobs > 0) AS r
     ORDER BY r.queue NULLS FIRST, array_position(c_states, r.state);
END;
$$;
COMMENT ON FUNCTION treadle.job_counts(bigint) IS
    'Jobs per state (queue null: all queues) and per queue and state, with each queue''s oldest waiting age; estimated on large tables, and flagged.';
