--------------------------------------------------------------------------------
-- Operator controls: cancel, retry, retention and prune.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._job_queue(job_id, queue) -> text
--
-- The queue of job job_id, in treadle.jobs or its history, read into a variable
-- before the statements that then name it (Citus routes them to one shard, and
-- runs no function of a column inside a shard's query); null for an unknown id,
-- or when queue is given and the job is not in it.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._job_queue(job_id bigint, queue text)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_queue text;
BEGIN
    SELECT j.queue INTO v_queue FROM treadle.jobs AS j
     WHERE j.id = _job_queue.job_id AND (_job_queue.queue IS NULL OR j.queue = _job_queue.queue);
    IF NOT FOUND THEN
        SELECT h.queue INTO v_queue FROM treadle.job_history AS h
         WHERE h.id = _job_queue.job_id AND (_job_queue.queue IS NULL OR h.queue = _job_queue.queue);
    END IF;
    RETURN v_queue;
END;
$$;
COMMENT ON FUNCTION treadle._job_queue(bigint, text) IS
    'The queue of a job (in treadle.jobs or its history), or null when unknown or not in the queue given.';

--------------------------------------------------------------------------------
-- treadle.cancel(job_id, queue) -> boolean
--
-- Transition: available | retryable | blocked -> cancelled at once; an ordered
-- lane's failed head (discarded, holding its key's slot: 034_key_lanes.sql) ->
-- cancelled, which lets its lane go on; running -> running
-- with a cancel request (heartbeat then answers 'cancel'; complete or fail
-- finish it as cancelled), and a NOTIFY on channel treadle_cancel with the job id
-- as payload, on which the worker running it heartbeats it at once (a hint: the
-- heartbeat's answer is the truth). A cancelled workflow step cancels its run (the
-- rest of the run stops as treadle.cancel_workflow stops it: 070_workflow_cancel.sql); a
-- cancelled periodic occurrence ends its series. Returns true when this call
-- changed something; false for a finished job, a job whose cancel is already
-- requested, or an unknown id. queue, when given, is the job's queue: a job of
-- another queue is as an unknown id. The job's queue is read first, then every
-- statement names it.
-- Raises 22004: job_id null. 42501: a tenant's job outside its queues.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.cancel(job_id bigint, queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := treadle.now();
    v_queue text := treadle._job_queue(cancel.job_id, cancel.queue);
    v_job   treadle.jobs;
BEGIN
    IF cancel.job_id IS NULL THEN
        RAISE EXCEPTION 'treadle: job_id must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF v_queue IS NULL THEN
        RETURN false;
    END IF;
    PERFORM treadle._check_row_allowed(v_queue, 'job');

    UPDATE treadle.jobs AS j
       SET state = 'cancelled',
           finished_at = v_now
     WHERE j.id = cancel.job_id
       AND j.queue = v_queue
       AND j.state = ANY (ARRAY['available', 'retryable', 'blocked'])
    RETURNING j.* INTO v_job;
    IF FOUND THEN
        PERFORM treadle._follow_up(ARRAY[v_job]);
        RETURN true;
    END IF;
    -- a failed head that blocks its ordered lane: it was followed up when it failed
    UPDATE treadle.jobs AS j SET state = 'cancelled'
     WHERE j.id = cancel.job_id AND j.queue = v_queue AND j.state = 'discarded' AND j.key_slot
    RETURNING j.* INTO v_job;
    IF FOUND THEN
        PERFORM treadle._key_leave(v_job);
        RETURN true;
    END IF;

    UPDATE treadle.jobs AS j
       SET cancel_requested = true
     WHERE j.id = cancel.job_id
       AND j.queue = v_queue
       AND j.state = 'running'
       AND NOT j.cancel_requested;
    IF FOUND THEN
        -- the worker that runs it looks at once (its heartbeat confirms the request)
        PERFORM treadle._notify('treadle_cancel', cancel.job_id::text);
        RETURN true;
    END IF;
    RETURN false;
END;
$$;
COMMENT ON FUNCTION treadle.cancel(bigint, text) IS
    'Cancel a waiting job now, or request cancel of a running one; true when something changed.';

--------------------------------------------------------------------------------
-- treadle.retry(job_id, queue) -> boolean
--
-- Transition: discarded | cancelled | retryable -> available now, attempt reset
-- to 0 (from treadle.job_history too, back into treadle.jobs). A retried workflow
-- step resumes its failed or cancelled run; a run whose steps form a graph
-- resumes whole (treadle._resume_graph): its other discarded and cancelled steps
-- are retried too, and the steps whose dependencies completed meanwhile start.
-- Completed steps never run again. A retried compensation puts its failed run
-- back to compensating (treadle._advance_compensation goes on from it). A
-- discarded or cancelled step of a run that compensates, was compensated, or
-- failed in a compensation after another completed, or of a run of the same
-- run tree as such a run (over it, under it, or beside it: a retry resumes the
-- step's parent runs, which would then wait for ever), is not retried (false):
-- that run undid steps (treadle.retry_run retries the compensation,
-- treadle.fork_run starts the run again). A retried
-- periodic occurrence that already started its successor runs once more without
-- starting another. Returns false for any other state or an unknown id. queue,
-- when given, is the job's queue, as for treadle.cancel.
-- Raises 22004: job_id null. 42501: a tenant's job outside its queues.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.retry(job_id bigint, queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := treadle.now();
    v_queue text := treadle._job_queue(retry.job_id, retry.queue);
    v_job   treadle.jobs;
    v_run   treadle.workflow_runs;
    v_run_id     bigint;   -- a step's run, and whether the step is a compensation
    v_compensation boolean;
BEGIN
    IF retry.job_id IS NULL THEN
        RAISE EXCEPTION 'treadle: job_id must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF v_queue IS NULL THEN
        RETURN false;
    END IF;
    PERFORM treadle._check_row_allowed(v_queue, 'job');

    -- A step that ended without completing does not run again in a run that undoes
    -- its steps (compensating, compensated, or failed in a compensation after another
    -- completed), nor in a run of the same tree (a child step never completes):
    -- it would act beside the compensations, or after them (the step's end and its
    -- run's move to compensating commit together). The job is locked first, as every
    -- path that locks a job and its run does. treadle.retry_run retries a failed
    -- compensation instead.
    SELECT j.workflow_run_id, j.args ? 'compensates'
      INTO v_run_id, v_compensation
      FROM treadle.jobs AS j
     WHERE j.id = retry.job_id AND j.queue = v_queue AND j.state = ANY (ARRAY['discarded', 'cancelled'])
       FOR UPDATE;
    IF NOT FOUND THEN
        SELECT h.workflow_run_id, h.args ? 'compensates'
          INTO v_run_id, v_compensation
          FROM treadle.job_history AS h
         WHERE h.id = retry.job_id AND h.queue = v_queue AND h.state = ANY (ARRAY['discarded', 'cancelled']);
    END IF;
    -- The whole tree, from its top run: a retried step of a child run resumes its
    -- failed or cancelled parents up to it, which a run there that undid its steps
    -- (a compensated sibling) keeps from ever completing.
    IF v_run_id IS NOT NULL AND NOT v_compensation
       AND treadle._undone_run(treadle._root_run(v_run_id)) IS NOT NULL THEN
        RETURN false;  -- (076_workflow_children.sql)
    END IF;

    -- A job in history comes back to treadle.jobs first, as it was: its row as a
    -- treadle.jobs row, every column of jobs by name (purge_at and slot left behind).
    WITH back AS (
        DELETE FROM treadle.job_history AS h
         WHERE h.id = retry.job_id AND h.queue = v_queue AND h.state = ANY (ARRAY['discarded', 'cancelled'])
        RETURNING h.*
    )
    INSERT INTO treadle.jobs
    SELECT (jsonb_populate_record(NULL::treadle.jobs, to_jsonb(b))).* FROM back AS b;

    UPDATE treadle.jobs AS j
       SET state = 'available',
           run_at = v_now,
           attempt = 0,
           finished_at = NULL,
           cancel_requested = false,
           lease_token = NULL,
           ready_txid = pg_current_xact_id(),  -- claimable again: claims look for it (040_claim.sql)
           -- a key whose scope ended when the job finished is not taken back (032_enqueue_keys.sql)
           key_scope = CASE WHEN j.finished_at IS NOT NULL AND j.key_scope = ANY (ARRAY['waiting', 'active'])
                            THEN 'released' ELSE j.key_scope END
     WHERE j.id = retry.job_id
       AND j.queue = v_queue
       AND j.state = ANY (ARRAY['discarded', 'cancelled', 'retryable'])
    RETURNING j.* INTO v_job;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF NOT v_job.key_slot THEN
        PERFORM treadle._key_admit(v_job.id);  -- its concurrency key's slot, or blocked (034_key_lanes.sql)
    END IF;

    IF v_job.workflow_run_id IS NOT NULL AND v_job.args ? 'compensates' THEN
        -- a compensation: its run goes on compensating
        UPDATE treadle.workflow_runs AS r SET state = 'compensating', finished_at = NULL
         WHERE r.id = v_job.workflow_run_id AND r.state = 'failed' AND r.compensations IS NOT NULL;
    ELSIF v_job.workflow_run_id IS NOT NULL THEN
        UPDATE treadle.workflow_runs AS r
           SET state = 'running', finished_at = NULL
         WHERE r.id = v_job.workflow_run_id
           AND r.state = ANY (ARRAY['failed', 'cancelled'])
        RETURNING r.* INTO v_run;
        PERFORM treadle._child_run_ended(v_run);  -- 076_workflow_children.sql
        IF v_run.after IS NOT NULL THEN
            PERFORM treadle._resume_graph(v_run);
        END IF;
    END IF;
    PERFORM treadle._notify('treadle_jobs', v_job.queue);
    RETURN true;
END;
$$;
COMMENT ON FUNCTION treadle.retry(bigint, text) IS
    'Make a discarded, cancelled or retryable job available now with attempt 0; true when it did.';

--------------------------------------------------------------------------------
-- treadle._resume_graph(run) -> void
--
-- A workflow graph run that treadle.retry just made running again: the results of
-- its steps that completed while another transaction held its row are recorded
-- (treadle._recheck_results: their re-checks had not moved it yet), its other
-- discarded and cancelled steps are retried (treadle.retry), and the steps whose
-- dependencies all completed while it was stopped start (a sleep under way when it
-- stopped ends at its time, at the next treadle.rescue; a signal wait that timed out
-- waits again, its timeout counted from now, and takes a signal kept for it); its
-- failed and cancelled child runs resume too (treadle._resume_children).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._resume_graph(run treadle.workflow_runs)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id   bigint;
    v_run  treadle.workflow_runs;
    v_more jsonb;  -- those results
BEGIN
    -- its steps that completed while another transaction held its row, left for a
    -- re-check (073_workflow_rechecks.sql), have their results now: what runs after
    -- them starts below, and the re-check later finds nothing to move
    -- (read first, then written: Citus calls no function of a row's columns in an UPDATE)
    IF EXISTS (SELECT 1 FROM treadle.run_rechecks AS c WHERE c.run_queue = run.queue AND c.run_id = run.id) THEN
        SELECT * INTO v_run FROM treadle.workflow_runs AS r WHERE r.queue = run.queue AND r.id = run.id;
        v_more := treadle._recheck_results(v_run);
        IF v_more <> '{}'::jsonb THEN
            UPDATE treadle.workflow_runs AS r SET results = r.results || v_more
             WHERE r.queue = run.queue AND r.id = run.id;
        END IF;
    END IF;
    FOR v_id IN
        SELECT j.id FROM treadle.jobs AS j
         WHERE j.workflow_run_id = run.id
           AND j.state = ANY (ARRAY['discarded', 'cancelled'])
           AND NOT j.args ? 'compensates'  -- a compensation is retried on its own
         ORDER BY j.id
    LOOP
        PERFORM treadle.retry(v_id);
    END LOOP;
    IF run.children IS NOT NULL THEN
        PERFORM treadle._resume_children(run);
    END IF;
    -- its sleeps under way wake it again (a cancel stopped them)
    UPDATE treadle.workflow_runs AS r
       SET wake_at = (SELECT min(e.value::timestamptz) FROM jsonb_each_text(r.wakes) AS e)
     WHERE r.id = run.id AND r.wakes IS NOT NULL;
    -- a signal wait that timed out (and failed the run) starts again below, with its
    -- whole timeout from now; the waits still under way time out again at their time
    -- (the failure left wait_until null)
    UPDATE treadle.workflow_runs AS r
       SET waiting = nullif(r.waiting - ARRAY(SELECT e.key FROM jsonb_each(r.waiting) AS e
                                               WHERE e.value ? 'timed_out'), '{}'::jsonb),
           wait_until = (SELECT min((e.value ->> 'until')::timestamptz) FROM jsonb_each(r.waiting) AS e
                          WHERE NOT e.value ? 'timed_out')
     WHERE r.id = run.id AND r.waiting IS NOT NULL;
    SELECT * INTO v_run FROM treadle.workflow_runs AS r WHERE r.id = run.id;
    PERFORM treadle._enqueue_ready(v_run, treadle.now());
END;
$$;
COMMENT ON FUNCTION treadle._resume_graph(treadle.workflow_runs) IS
    'Resume a workflow graph run that a retry made running: retry its other failed steps, enqueue the ready ones.';

--------------------------------------------------------------------------------
-- treadle.apply_retention(batch) -> bigint
--
-- Transition: empties the partitions of treadle.job_history whose purge times
-- have passed, until `batch` jobs have gone (TRUNCATE; one that a reader holds
-- is left for a later call at once, without waiting for its lock, so no reader
-- queues behind retention), and deletes expired rows of its partition 0. Then
-- deletes, up to `batch` jobs in all, finished jobs (completed, discarded,
-- cancelled) whose retention has passed, oldest first, and finished workflow
-- runs whose retention has passed together with all their steps (a kept run
-- keeps its whole history; its step jobs count towards the batch, and the oldest
-- run goes whole even when it has more steps than the batch). A job's
-- retention is its queue's (treadle.queues.retain_completed for completed,
-- retain_failed for discarded and cancelled; a failed run is kept as long as a
-- discarded job), or where that is null the global one (treadle.configure);
-- null there too keeps it forever. Rows another transaction holds are skipped
-- (SKIP LOCKED): a run with a held step waits for a later call. So any number of
-- sessions may call it at once, each a short transaction; the workers'
-- housekeeping does, every minute and again while there is more. Runs and jobs
-- are read across queues, then locked and deleted queue by queue, by key (on Citus
-- each statement runs on one shard; a run's signals go with it). Returns how
-- many jobs it deleted, step jobs and emptied partitions included: less than
-- `batch` means it caught up. A job in history keeps the retention in force when
-- it moved there (treadle.archive); its partition goes within the UTC day after.
-- Raises 22004: batch null. 22023: batch outside 1..100000.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.apply_retention(batch integer DEFAULT 1000)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now        timestamptz := treadle.now();
    v_completed  interval;
    v_failed     interval;
    v_shortest   interval;
    v_runs       bigint[];
    v_step_ids   bigint[];
    v_busy_runs  bigint[];
    v_step_queues text[];
    v_step_queue text;
    v_options    jsonb;
    v_queue      text;
    v_count      bigint;
    v_cut_completed timestamptz;
    v_cut_failed    timestamptz;
    v_steps      bigint;
    v_jobs       bigint;
    v_room       integer;
BEGIN
    IF apply_retention.batch IS NULL THEN
        RAISE EXCEPTION 'treadle: batch must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF apply_retention.batch NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'treadle: batch must be between 1 and 100000, got %', apply_retention.batch
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- History first: its partitions go whole, its rows have their purge time.
    v_jobs := treadle._purge_history(v_now, apply_retention.batch);
    IF v_jobs >= apply_retention.batch THEN
        RETURN v_jobs;
    END IF;
    v_room := apply_retention.batch - v_jobs;

    SELECT r.retain_completed, r.retain_failed INTO v_completed, v_failed FROM treadle._retention() AS r;
    -- The shortest retention anywhere bounds the range of finished_at read.
    SELECT min(t.retain) INTO v_shortest
      FROM (SELECT v_completed UNION ALL SELECT v_failed
            UNION ALL SELECT q.retain_completed FROM treadle.queues AS q
            UNION ALL SELECT q.retain_failed FROM treadle.queues AS q) AS t(retain);
    IF v_shortest IS NULL THEN
        RETURN v_jobs;  -- everything is kept forever
    END IF;

    -- Finished runs first, oldest first, as many as fit in the batch by their step
    -- count: read across queues without a lock, then queue by queue (on Citus each
    -- statement is one shard's) as many of each queue's oldest are locked and go, by
    -- key, with their steps (in the run's queue and the queues its step_options name)
    -- and their signals (ON DELETE CASCADE).
    FOR v_queue, v_count, v_cut_completed, v_cut_failed IN
        SELECT f.queue, count(*), v_now - coalesce(q.retain_completed, v_completed),
               v_now - coalesce(q.retain_failed, v_failed)
          FROM (SELECT e.queue, row_number() OVER w AS n, sum(e.steps) OVER w AS steps_so_far
                  FROM (SELECT r.queue, r.id, r.finished_at, cardinality(r.steps) AS steps
                          FROM treadle.workflow_runs AS r
                          LEFT JOIN treadle.queues AS q ON q.queue = r.queue
                         WHERE r.finished_at < v_now - v_shortest
                           AND r.finished_at < v_now - CASE WHEN r.state = 'completed'
                                                            THEN coalesce(q.retain_completed, v_completed)
                                                            ELSE coalesce(q.retain_failed, v_failed) END
                         ORDER BY r.finished_at, r.id
                         LIMIT v_room) AS e
                WINDOW w AS (ORDER BY e.finished_at, e.id)) AS f
          LEFT JOIN treadle.queues AS q ON q.queue = f.queue
         WHERE f.n = 1 OR f.steps_so_far <= v_room
         GROUP BY f.queue, q.retain_completed, q.retain_failed
    LOOP
        SELECT array_agg(r.id), jsonb_agg(r.step_options) FILTER (WHERE r.step_options IS NOT NULL)
          INTO v_runs, v_options
          FROM (SELECT r.id, r.step_options
                  FROM treadle.workflow_runs AS r
                 WHERE r.queue = v_queue
                   AND r.finished_at < CASE WHEN r.state = 'completed' THEN v_cut_completed ELSE v_cut_failed END
                 ORDER BY r.finished_at, r.id
                 LIMIT v_count
                   FOR UPDATE SKIP LOCKED) AS r;
        CONTINUE WHEN v_runs IS NULL;
        -- the queues of their steps: the run's, and any a step's options give it
        SELECT array_agg(DISTINCT u.q) INTO v_step_queues
          FROM (SELECT v_queue
                UNION ALL
                SELECT o.value ->> 'queue'
                  FROM jsonb_array_elements(coalesce(v_options, '[]')) AS a(options)
                 CROSS JOIN jsonb_each(a.options) AS o
                 WHERE o.value ? 'queue') AS u(q);
        -- A run goes only with every step: one whose step someone holds (a retry) stays.
        v_busy_runs := '{}';
        FOREACH v_step_queue IN ARRAY v_step_queues LOOP
            SELECT array_agg(s.id) INTO v_step_ids
              FROM (SELECT j.id FROM treadle.jobs AS j
                     WHERE j.queue = v_step_queue AND j.workflow_run_id = ANY (v_runs)
                       FOR UPDATE SKIP LOCKED) AS s;
            SELECT v_busy_runs || coalesce(array_agg(DISTINCT j.workflow_run_id), '{}') INTO v_busy_runs
              FROM treadle.jobs AS j
             WHERE j.queue = v_step_queue AND j.workflow_run_id = ANY (v_runs)
               AND j.id <> ALL (coalesce(v_step_ids, '{}'));
        END LOOP;
        -- the runs go, then their steps (jobs.workflow_run_id has no foreign key)
        WITH gone AS (
            DELETE FROM treadle.workflow_runs AS r
             WHERE r.queue = v_queue AND r.id = ANY (v_runs) AND r.id <> ALL (v_busy_runs)
            RETURNING r.id
        )
        SELECT array_agg(g.id) INTO v_runs FROM gone AS g;
        CONTINUE WHEN v_runs IS NULL;
        FOREACH v_step_queue IN ARRAY v_step_queues LOOP
            DELETE FROM treadle.jobs AS j WHERE j.queue = v_step_queue AND j.workflow_run_id = ANY (v_runs);
            GET DIAGNOSTICS v_steps = ROW_COUNT;
            v_jobs := v_jobs + v_steps;
        END LOOP;
    END LOOP;

    IF v_jobs < apply_retention.batch THEN
        -- Queue by queue (on Citus each statement is then one shard's): the oldest
        -- expired jobs are read without a lock, and from each of their queues as many
        -- are then locked and deleted by key, oldest first.
        FOR v_queue, v_count, v_cut_completed, v_cut_failed IN
            SELECT c.queue, c.jobs, v_now - c.keep_completed, v_now - c.keep_failed
              FROM treadle._oldest_by_queue(v_now - v_shortest, apply_retention.batch - v_jobs, true,
                                            v_completed, v_failed, v_now) AS c  -- 061_housekeeping.sql
        LOOP
            DELETE FROM treadle.jobs AS j
             WHERE j.queue = v_queue
               AND j.id = ANY (ARRAY(
                SELECT e.id
                  FROM treadle.jobs AS e
                 WHERE e.queue = v_queue
                   AND e.finished_at < v_now - v_shortest
                   AND e.workflow_run_id IS NULL
                   AND treadle._may_go(e.key_slot)
                   AND e.finished_at < CASE WHEN e.state = 'completed' THEN v_cut_completed ELSE v_cut_failed END
                 ORDER BY e.finished_at
                 LIMIT v_count
                   FOR UPDATE SKIP LOCKED));
            GET DIAGNOSTICS v_steps = ROW_COUNT;
            v_jobs := v_jobs + v_steps;
        END LOOP;
    END IF;
    RETURN v_jobs;
END;
$$;
COMMENT ON FUNCTION treadle.apply_retention(integer) IS
    'Delete at most batch finished jobs (and finished runs with their steps) past their retention; returns how many jobs went.';

--------------------------------------------------------------------------------
-- treadle.prune(older_than) -> bigint
--
-- Transition: deletes finished jobs (completed, discarded, cancelled; in
-- treadle.jobs and in its history) and
-- finished workflow runs whose finished_at is older than now - older_than. Step
-- jobs go only with their run, so a kept run keeps its whole history. Returns
-- how many jobs it deleted (step jobs included). The one-off manual form: one
-- statement, one transaction however many rows go; apply_retention deletes in
-- small batches by the configured retention. A tenant (treadle.set_tenant)
-- prunes its own queues only.
-- Raises 22004: older_than null. 22023: older_than negative or over 100 years.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.prune(older_than interval DEFAULT '7 days')
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_cutoff timestamptz;
    v_jobs   bigint;
    v_steps  bigint;
    v_runs   bigint[];
    v_prefix text := treadle._caller_prefix();  -- '' unless the caller is a tenant
BEGIN
    IF prune.older_than IS NULL THEN
        RAISE EXCEPTION 'treadle: older_than must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM treadle._check_interval(prune.older_than, 'older_than', interval '100 years', may_be_zero => true);
    v_cutoff := treadle.now() - prune.older_than;

    -- the runs go, then their steps (jobs.workflow_run_id has no foreign key)
    WITH gone AS (
        DELETE FROM treadle.workflow_runs AS r WHERE r.state <> 'running' AND r.finished_at < v_cutoff
           AND starts_with(r.queue, v_prefix)
        RETURNING r.id
    )
    SELECT array_agg(g.id) INTO v_runs FROM gone AS g;
    DELETE FROM treadle.jobs AS j WHERE j.workflow_run_id = ANY (v_runs);
    GET DIAGNOSTICS v_steps = ROW_COUNT;

    DELETE FROM treadle.jobs AS j
     WHERE j.finished_at < v_cutoff
       AND j.workflow_run_id IS NULL
       AND treadle._may_go(j.key_slot)  -- a failed head blocking its lane stays (061_housekeeping.sql)
       AND starts_with(j.queue, v_prefix);
    GET DIAGNOSTICS v_jobs = ROW_COUNT;
    v_steps := v_steps + v_jobs;
    DELETE FROM treadle.job_history AS h WHERE h.finished_at < v_cutoff AND starts_with(h.queue, v_prefix);
    GET DIAGNOSTICS v_jobs = ROW_COUNT;
    RETURN v_jobs + v_steps;
END;
$$;
COMMENT ON FUNCTION treadle.prune(interval) IS
    'Delete finished jobs and workflow runs older than older_than; returns how many jobs went.';
