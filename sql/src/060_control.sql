--------------------------------------------------------------------------------
-- Operator controls: cancel, retry, prune.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle.cancel(job_id) -> boolean
--
-- Transition: available | retryable -> cancelled at once; running -> running
-- with a cancel request (heartbeat then answers 'cancel'; complete or fail
-- finish it as cancelled). A cancelled workflow step cancels its run; a
-- cancelled periodic occurrence ends its series. Returns true when this call
-- changed something; false for a finished job, a job whose cancel is already
-- requested, or an unknown id.
-- Raises 22004: job_id null. 42501: a tenant's job outside its queues.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.cancel(job_id bigint)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_job treadle.jobs;
BEGIN
    IF cancel.job_id IS NULL THEN
        RAISE EXCEPTION 'treadle: job_id must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM treadle._check_queue_allowed(j.queue) FROM treadle.jobs AS j WHERE j.id = cancel.job_id;

    UPDATE treadle.jobs AS j
       SET state = 'cancelled',
           finished_at = treadle.now()
     WHERE j.id = cancel.job_id
       AND j.state = ANY (ARRAY['available', 'retryable'])
    RETURNING j.* INTO v_job;
    IF FOUND THEN
        PERFORM treadle._follow_up(ARRAY[v_job]);
        RETURN true;
    END IF;

    UPDATE treadle.jobs AS j
       SET cancel_requested = true
     WHERE j.id = cancel.job_id
       AND j.state = 'running'
       AND NOT j.cancel_requested;
    RETURN FOUND;
END;
$$;
COMMENT ON FUNCTION treadle.cancel(bigint) IS
    'Cancel a waiting job now, or request cancel of a running one; true when something changed.';

--------------------------------------------------------------------------------
-- treadle.retry(job_id) -> boolean
--
-- Transition: discarded | cancelled | retryable -> available now, attempt reset
-- to 0. A retried workflow step resumes its failed or cancelled run. A retried
-- periodic occurrence that already started its successor runs once more without
-- starting another. Returns false for any other state or an unknown id.
-- Raises 22004: job_id null. 42501: a tenant's job outside its queues.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.retry(job_id bigint)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := treadle.now();
    v_job treadle.jobs;
BEGIN
    IF retry.job_id IS NULL THEN
        RAISE EXCEPTION 'treadle: job_id must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM treadle._check_queue_allowed(j.queue) FROM treadle.jobs AS j WHERE j.id = retry.job_id;

    UPDATE treadle.jobs AS j
       SET state = 'available',
           run_at = v_now,
           attempt = 0,
           finished_at = NULL,
           cancel_requested = false,
           lease_token = NULL,
           ready_txid = pg_current_xact_id()  -- claimable again: claims look for it (040_claim.sql)
     WHERE j.id = retry.job_id
       AND j.state = ANY (ARRAY['discarded', 'cancelled', 'retryable'])
    RETURNING j.* INTO v_job;
    IF NOT FOUND THEN
        RETURN false;
    END IF;

    IF v_job.workflow_run_id IS NOT NULL THEN
        UPDATE treadle.workflow_runs AS r
           SET state = 'running', finished_at = NULL
         WHERE r.id = v_job.workflow_run_id
           AND r.state = ANY (ARRAY['failed', 'cancelled']);
    END IF;
    PERFORM treadle._notify('treadle_jobs', v_job.queue);
    RETURN true;
END;
$$;
COMMENT ON FUNCTION treadle.retry(bigint) IS
    'Make a discarded, cancelled or retryable job available now with attempt 0; true when it did.';

--------------------------------------------------------------------------------
-- treadle.prune(older_than) -> bigint
--
-- Transition: deletes finished jobs (completed, discarded, cancelled) and
-- finished workflow runs whose finished_at is older than now - older_than. Step
-- jobs go only with their run, so a kept run keeps its whole history. Returns
-- how many jobs it deleted (step jobs included).
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
BEGIN
    IF prune.older_than IS NULL THEN
        RAISE EXCEPTION 'treadle: older_than must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM treadle._check_interval(prune.older_than, 'older_than', interval '100 years', may_be_zero => true);
    v_cutoff := treadle.now() - prune.older_than;

    SELECT count(*) INTO v_steps
      FROM treadle.jobs AS j
      JOIN treadle.workflow_runs AS r ON r.id = j.workflow_run_id
     WHERE r.state <> 'running' AND r.finished_at < v_cutoff;
    DELETE FROM treadle.workflow_runs AS r WHERE r.state <> 'running' AND r.finished_at < v_cutoff;

    DELETE FROM treadle.jobs AS j
     WHERE j.finished_at < v_cutoff
       AND j.workflow_run_id IS NULL;
    GET DIAGNOSTICS v_jobs = ROW_COUNT;
    RETURN v_jobs + v_steps;
END;
$$;
COMMENT ON FUNCTION treadle.prune(interval) IS
    'Delete finished jobs and workflow runs older than older_than; returns how many jobs went.';
