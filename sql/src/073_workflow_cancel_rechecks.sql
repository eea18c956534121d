--------------------------------------------------------------------------------
-- A step whose end cancels its run, left for a re-check. A step that ends cancelled
-- cancels its running run and stops the rest of the run's tree, whose step jobs it
-- locks first (treadle._lock_run_tree_jobs, 053_workflow_lock_order.sql). Its
-- finish holds its own job (and a batch's, the batch's other rows): when another
-- session holds a job of that tree, that session may be waiting for one of them
-- (two steps of a run that end cancelled at once on two connections, two batches
-- whose cancelled steps cancel each other's runs), so the finish does not wait: the
-- step is written to treadle.run_rechecks and its queue woken, and the run is
-- cancelled by the next claim on the step's queue or treadle.rescue
-- (treadle._move_rechecks, 073_workflow_rechecks.sql), once no other session
-- holds a job of the tree. Not on Citus (there a step's end waits, as before).
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._cancel_later(done, runs) -> bigint[]
--
-- Transition: (none) -> a re-check (treadle.run_rechecks) of each step of `done`
-- that ended cancelled (not a compensation) in one of `runs`; their queues'
-- workers hear of it (treadle_jobs). Returns the steps' job ids.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._cancel_later(done treadle.jobs[], runs bigint[])
RETURNS bigint[]
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_queues text[];
BEGIN
    WITH later AS (
        INSERT INTO treadle.run_rechecks (queue, job_id, run_queue, run_id, added_at)
        SELECT d.queue, d.id, coalesce(d.run_queue, d.queue), d.workflow_run_id, treadle.now()
          FROM unnest(done) AS d
         WHERE d.state = 'cancelled' AND NOT d.args ? 'compensates' AND d.workflow_run_id = ANY (runs)
        ON CONFLICT DO NOTHING
        RETURNING queue
    )
    SELECT array_agg(DISTINCT l.queue) INTO v_queues FROM later AS l;
    PERFORM treadle._notify('treadle_jobs', q.q) FROM unnest(v_queues) AS q(q);
    -- (a row there already, written by this transaction: the step is left all the same)
    RETURN ARRAY(SELECT d.id FROM unnest(done) AS d
                  WHERE d.state = 'cancelled' AND NOT d.args ? 'compensates' AND d.workflow_run_id = ANY (runs));
END;
$$;
COMMENT ON FUNCTION treadle._cancel_later(treadle.jobs[], bigint[]) IS
    'Leave steps that ended cancelled, whose run trees another session holds a job of, for a later cancel of their runs.';

--------------------------------------------------------------------------------
-- treadle._cancel_now(queue, job_id) -> boolean
--
-- For treadle._move_rechecks, with the re-check of job job_id (of queue `queue`)
-- locked: when the job is a step that ended cancelled (treadle._cancel_later), the
-- jobs under way of its run's tree are locked, none of them waited for, then their
-- runs; the re-check is deleted and the run moves as after the step (cancelled,
-- the rest of its tree stopped: treadle._advance_run). Returns true when it did;
-- false when another transaction holds a job of the tree (the re-check is left for
-- the next); null for any other re-check (its job is not a cancelled step, or gone).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._cancel_now(queue text, job_id bigint)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job treadle.jobs;
BEGIN
    SELECT * INTO v_job FROM treadle.jobs AS j WHERE j.queue = _cancel_now.queue AND j.id = _cancel_now.job_id;
    IF NOT FOUND OR v_job.state <> 'cancelled' THEN
        RETURN NULL;
    END IF;
    IF NOT treadle._lock_run_tree_jobs(ARRAY[v_job.workflow_run_id], '{}', false) THEN
        RETURN false;
    END IF;
    DELETE FROM treadle.run_rechecks AS c WHERE c.queue = _cancel_now.queue AND c.job_id = _cancel_now.job_id;
    PERFORM treadle._advance_run(v_job);  -- 050_finish.sql
    RETURN true;
END;
$$;
COMMENT ON FUNCTION treadle._cancel_now(text, bigint) IS
    'Cancel the run of a step that ended cancelled and was left for a re-check, unless another transaction holds a job of its tree.';
