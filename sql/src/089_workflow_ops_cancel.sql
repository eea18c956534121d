--------------------------------------------------------------------------------
-- Cancelling a run and undoing what it did, in one call (the operator's, as
-- compensate_run: the runs part).
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle.cancel_run(run_id, compensate) -> text
--
-- Transition, in the caller's transaction; returns the state the run is in now.
--   compensate false: a running run is cancelled as treadle.cancel_workflow does it
--     (its waiting steps now, its running steps when they end): `cancelled`, or
--     `running` while a running step's cancel is under way.
--   compensate true: a running run with compensations -> `cancelled` -> `compensating`
--     at once (cancel_workflow, then compensate_run, without waiting): its running
--     steps' cancel is requested, its waiting steps and its child runs under way are
--     cancelled, its sleeps and signal waits end; the compensations of
--     its completed steps then run one at a time, last completed first, once no step
--     of it runs (a running step that completes instead is compensated too):
--     `compensating`, or `compensated` when nothing is left to undo. A cancelled run
--     with compensations: as treadle.compensate_run.
-- Raises 22004: run_id or compensate null. P0002: no run has that id. 42501: a
-- tenant's run outside its queues. 55000: compensate false and a run that is not
-- running or whose cancel is requested already; compensate true and a run without
-- compensations, or one that is neither running nor cancelled. 40001: as
-- treadle.cancel_workflow, a run tree that kept changing while it was locked. A
-- refusal writes nothing.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.cancel_run(run_id bigint, compensate boolean DEFAULT false)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now   timestamptz := treadle.now();
    v_run   treadle.workflow_runs;
    v_ended treadle.workflow_runs;  -- the run as its cancel left it
    v_state text;
BEGIN
    IF cancel_run.compensate IS NULL THEN
        RAISE EXCEPTION 'treadle: compensate must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    v_run := treadle._run_for_operation(cancel_run.run_id);
    IF NOT cancel_run.compensate THEN
        IF v_run.state <> 'running' OR NOT treadle.cancel_workflow(v_run.id) THEN
            RAISE EXCEPTION 'treadle: workflow run % is %: only a running run whose cancel is not requested yet is cancelled',
                            v_run.id, CASE WHEN v_run.state = 'running' THEN 'being cancelled' ELSE v_run.state END
                USING ERRCODE = 'object_not_in_prerequisite_state';
        END IF;
        SELECT r.state INTO v_state FROM treadle.workflow_runs AS r WHERE r.queue = v_run.queue AND r.id = v_run.id;
        RETURN v_state;
    END IF;
    IF v_run.compensations IS NULL THEN
        RAISE EXCEPTION 'treadle: workflow run % has no compensations', v_run.id
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF v_run.state <> ALL (ARRAY['running', 'cancelled']) THEN
        RAISE EXCEPTION 'treadle: workflow run % is %: only a running or cancelled run is cancelled and compensated',
                        v_run.id, v_run.state
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF v_run.state = 'running' THEN
        -- cancelled as treadle.cancel_workflow does it (its waiting steps, which may cancel
        -- the run, its running steps' cancel requested, its child runs, its sleeps and
        -- waits), then cancelled at once though a step of it still runs: its compensations
        -- wait for that step (treadle._compensate_next). Through `cancelled`, not straight to
        -- `compensating`: no trigger on the run's row (on Citus one runs on the shard, where
        -- it may not reach the others)
        PERFORM treadle.cancel_workflow(v_run.id);
        UPDATE treadle.workflow_runs AS r
           SET state = 'cancelled', finished_at = v_now, wake_at = NULL, waiting = NULL, wait_until = NULL
         WHERE r.queue = v_run.queue AND r.id = v_run.id AND r.state = 'running'
        RETURNING r.* INTO v_ended;
        PERFORM treadle._child_run_ended(v_ended);  -- 076_workflow_children.sql
    END IF;
    UPDATE treadle.workflow_runs AS r SET state = 'compensating', finished_at = NULL
     WHERE r.queue = v_run.queue AND r.id = v_run.id AND r.state = 'cancelled';
    IF NOT FOUND THEN
        -- a step that ended meanwhile moved the run: as it is now
        SELECT r.state INTO v_state FROM treadle.workflow_runs AS r WHERE r.queue = v_run.queue AND r.id = v_run.id;
        RAISE EXCEPTION 'treadle: workflow run % is %: only a running or cancelled run is cancelled and compensated',
                        v_run.id, v_state
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    PERFORM treadle._compensate_next(v_run.id, v_now, v_run.queue);
    SELECT r.state INTO v_state FROM treadle.workflow_runs AS r WHERE r.queue = v_run.queue AND r.id = v_run.id;
    RETURN v_state;
END;
$$;
COMMENT ON FUNCTION treadle.cancel_run(bigint, boolean) IS
    'Cancel a workflow run, and with compensate => true run its compensations at once; returns its state.';
