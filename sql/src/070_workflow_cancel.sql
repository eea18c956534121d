--------------------------------------------------------------------------------
-- What cancelling a running workflow run stops, in one place: treadle.cancel_workflow
-- (the operator's cancel) and a step's own end that cancels its run (a step job that
-- ends `cancelled`, or a child run that is cancelled: treadle._advance_run,
-- treadle._child_run_ended) leave the run's other steps as one another would.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._cancel_under_way(run_id, queue, stopped) -> boolean
--
-- Transition, for a run being cancelled (its queue given: every statement on the
-- run names it): its waiting step jobs -> cancelled (treadle.cancel: the first of a
-- running run's cancels the run, as any cancelled step does), its running steps ->
-- a cancel request, looked at again until none is left (a step that finishes
-- meanwhile may hand over to the next ones); its child runs under way are cancelled
-- (treadle.cancel_workflow: a child that becomes cancelled cancels the run with it).
-- When it changed any of them, or `stopped` (one of the run's steps ended cancelled,
-- which stops it as a cancel would), the run's sleeps under way stop waking it
-- (wake_at null) and its signal waits end (waiting, wait_until null), so no step
-- starts after the cancel. Jobs are locked before the run (each cancel locks its
-- job, then the run), as on every path. While it runs, treadle.cancelling names the
-- run: a step of it that the loop cancels moves the run as any cancelled step does,
-- without calling this again. Returns true when it changed a step or a child run.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._cancel_under_way(run_id bigint, queue text, stopped boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_step   treadle.jobs;
    v_any    boolean := false;
    v_looked boolean;
    v_child  bigint;
    v_outer  text := current_setting('treadle.cancelling', true);  -- restored at the end
BEGIN
    PERFORM set_config('treadle.cancelling', _cancel_under_way.run_id::text, true);
    LOOP
        v_looked := false;
        FOR v_step IN
            SELECT * FROM treadle.jobs AS j
             WHERE j.workflow_run_id = _cancel_under_way.run_id
               AND j.state = ANY (ARRAY['available', 'retryable', 'running', 'blocked'])
               AND NOT j.cancel_requested
             ORDER BY j.queue, j.concurrency_key, j.id  -- keys' slots in the one order (034_key_lanes.sql)
        LOOP
            v_looked := true;
            IF treadle.cancel(v_step.id) THEN
                v_any := true;
            END IF;
        END LOOP;
        EXIT WHEN NOT v_looked;
    END LOOP;
    -- child runs under way: each one's cancel reaches this run when the child ends
    FOR v_child IN
        SELECT r.id FROM treadle.workflow_runs AS r
         WHERE r.parent_run_id = _cancel_under_way.run_id AND r.state = 'running'
         ORDER BY r.id
    LOOP
        IF treadle.cancel_workflow(v_child) THEN
            v_any := true;
        END IF;
    END LOOP;
    PERFORM set_config('treadle.cancelling', coalesce(v_outer, ''), true);
    IF v_any OR _cancel_under_way.stopped THEN
        UPDATE treadle.workflow_runs AS r SET wake_at = NULL, waiting = NULL, wait_until = NULL
         WHERE r.queue = _cancel_under_way.queue AND r.id = _cancel_under_way.run_id
           AND (r.wake_at IS NOT NULL OR r.waiting IS NOT NULL);
    END IF;
    RETURN v_any;
END;
$$;
COMMENT ON FUNCTION treadle._cancel_under_way(bigint, text, boolean) IS
    'Cancel a workflow run''s waiting steps and child runs, request its running steps'' cancel, end its sleeps and waits.';
