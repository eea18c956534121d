--------------------------------------------------------------------------------
-- Operating workflow runs: retry a run from its failed steps, fork a run from a
-- named step (a new run of the same pinned definition that carries the results
-- recorded before that step), compensate a cancelled run. All are the operator's (treadle.grant_admin,
-- treadle.grant_dashboard unless read-only); a tenant reaches only its queues'
-- runs. Cancel is treadle.cancel_workflow (070_workflows.sql).
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._run_for_operation(run_id, what) -> treadle.workflow_runs
--
-- The run an operator names, checked: 22004 when run_id is null, P0002 when no
-- run has that id, 42501 for a tenant's run outside its queues (naming nothing of
-- the run).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._run_for_operation(run_id bigint)
RETURNS treadle.workflow_runs
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_run treadle.workflow_runs;
BEGIN
    IF run_id IS NULL THEN
        RAISE EXCEPTION 'treadle: run_id must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT * INTO v_run FROM treadle.workflow_runs AS r WHERE r.id = _run_for_operation.run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'treadle: no workflow run has id %', run_id USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM treadle._check_row_allowed(v_run.queue, 'workflow run');
    RETURN v_run;
END;
$$;
COMMENT ON FUNCTION treadle._run_for_operation(bigint) IS
    'The workflow run an operation names: 22004 for null, P0002 for an unknown id, 42501 outside a tenant''s queues.';

--------------------------------------------------------------------------------
-- treadle.retry_run(run_id) -> text
--
-- Transition: a failed or cancelled run goes on from where it stopped, and the
-- state it is in now is returned:
--   a run whose compensation failed or was cancelled (state failed, a discarded
--     or cancelled compensation job): that compensation runs again and the run is
--     `compensating` (it ends compensated, or failed again);
--   otherwise the run is `running`: its discarded and cancelled step jobs are
--     available again with attempt 0 (treadle.retry), its failed and cancelled
--     child runs resume, its sleeps under way wake it again, a signal wait that
--     timed out waits again (its timeout counted from the retry), and the steps whose
--     dependencies completed meanwhile start (treadle._resume_graph); a list run
--     with no such job starts its first step without a result.
-- Completed steps never run again: their results are kept. In the caller's
-- transaction; a refusal writes nothing.
-- Raises 22004: run_id null. P0002: no run has that id. 42501: a tenant's run (or
-- one of its step jobs) outside its queues. 55000: a run that is not failed or
-- cancelled (running, compensating, completed, or compensated: its completed
-- steps were undone, so treadle.fork_run starts it again instead), or one with a
-- child run under it that undid its steps (treadle._undone_run: compensating,
-- compensated, or failed in a compensation), whose child step never completes; or
-- a child run of a tree where another run undid its steps (a compensated sibling):
-- its retry would resume its parents, and the top run would never complete.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.retry_run(run_id bigint)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_run   treadle.workflow_runs := treadle._run_for_operation(retry_run.run_id);
    v_ids   bigint[];
    v_id    bigint;
    v_first integer;
    v_state text;
    v_undone bigint;
    v_root   bigint;
BEGIN
    IF v_run.state = 'compensated' THEN
        RAISE EXCEPTION 'treadle: workflow run % is compensated: its completed steps were undone', v_run.id
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'treadle.fork_run starts it again from a step.';
    END IF;
    IF v_run.state <> ALL (ARRAY['failed', 'cancelled']) THEN
        RAISE EXCEPTION 'treadle: workflow run % is %: only a failed or cancelled run is retried', v_run.id, v_run.state
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    -- a child run under it that undid its steps never completes its child step
    v_undone := treadle._undone_run(v_run.id);  -- 076_workflow_children.sql
    IF v_undone <> v_run.id THEN
        SELECT r.state INTO v_state FROM treadle.workflow_runs AS r WHERE r.id = v_undone;
        RAISE EXCEPTION 'treadle: workflow run % has a child run % that is %: its steps were undone, so its child step never completes',
                        v_run.id, v_undone, v_state
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'treadle.fork_run starts the run again from the child step, with a new child run.';
    END IF;
    -- a child run resumes its parents: another run of its tree that undid its steps
    -- would keep the top run waiting for ever
    v_root := treadle._root_run(v_run.id);
    IF v_undone IS NULL AND v_root <> v_run.id THEN
        v_undone := treadle._undone_run(v_root);
        IF v_undone IS NOT NULL THEN
            SELECT r.state INTO v_state FROM treadle.workflow_runs AS r WHERE r.id = v_undone;
            RAISE EXCEPTION 'treadle: workflow run % is under run %, whose tree has a run % that is %: its steps were undone, so run % never completes',
                            v_run.id, v_root, v_undone, v_state, v_root
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = format('treadle.fork_run starts run %s again from a step, with new child runs.', v_root);
        END IF;
    END IF;

    -- its jobs that ended without completing, here or in the history
    IF v_run.compensations IS NOT NULL AND v_run.state = 'failed' THEN
        SELECT array_agg(s.id ORDER BY s.id) INTO v_ids
          FROM (SELECT j.id, j.state, j.args FROM treadle.jobs AS j WHERE j.workflow_run_id = v_run.id
                UNION ALL
                SELECT h.id, h.state, h.args FROM treadle.job_history AS h WHERE h.workflow_run_id = v_run.id) AS s
         WHERE s.state = ANY (ARRAY['discarded', 'cancelled']) AND s.args ? 'compensates';
        IF v_ids IS NOT NULL THEN
            FOREACH v_id IN ARRAY v_ids LOOP
                PERFORM treadle.retry(v_id);  -- the first puts the run back to compensating
            END LOOP;
            RETURN 'compensating';
        END IF;
    END IF;

    SELECT array_agg(s.id ORDER BY s.id) INTO v_ids
      FROM (SELECT j.id, j.state, j.args FROM treadle.jobs AS j WHERE j.workflow_run_id = v_run.id
            UNION ALL
            SELECT h.id, h.state, h.args FROM treadle.job_history AS h WHERE h.workflow_run_id = v_run.id) AS s
     WHERE s.state = ANY (ARRAY['discarded', 'cancelled']) AND NOT s.args ? 'compensates';
    IF v_ids IS NOT NULL THEN
        -- the first resumes the run (and, for a graph, retries the others in treadle.jobs);
        -- the rest are made available if they are not yet
        FOREACH v_id IN ARRAY v_ids LOOP
            PERFORM treadle.retry(v_id);
        END LOOP;
    ELSE
        -- stopped without a failed step job: a cancel while only sleeps, waits or
        -- children were under way, a failed child run, or step rows deleted by hand
        UPDATE treadle.workflow_runs AS r SET state = 'running', finished_at = NULL
         WHERE r.id = v_run.id AND r.state = ANY (ARRAY['failed', 'cancelled'])
        RETURNING r.* INTO v_run;
        IF NOT FOUND THEN
            -- another session resumed it first
            SELECT r.state INTO v_state FROM treadle.workflow_runs AS r WHERE r.id = retry_run.run_id;
            RETURN v_state;
        END IF;
        PERFORM treadle._child_run_ended(v_run);  -- 076_workflow_children.sql
        IF v_run.after IS NOT NULL THEN
            PERFORM treadle._resume_graph(v_run);
        ELSE
            SELECT u.i INTO v_first FROM unnest(v_run.steps) WITH ORDINALITY AS u(s, i)
             WHERE NOT v_run.results ? u.s ORDER BY u.i LIMIT 1;
            IF FOUND THEN
                PERFORM treadle._enqueue_step(v_run, v_run.steps[v_first], treadle.now());
            END IF;
        END IF;
    END IF;
    SELECT r.state INTO v_state FROM treadle.workflow_runs AS r WHERE r.id = v_run.id;
    RETURN v_state;
END;
$$;
COMMENT ON FUNCTION treadle.retry_run(bigint) IS
    'Retry a failed or cancelled workflow run from its failed steps (completed steps keep their results); returns its state.';

--------------------------------------------------------------------------------
-- treadle._steps_from(run, from_step) -> text[]
--
-- The steps a fork from `from_step` runs again: from_step and every step that runs
-- after it, directly or through others (for a list, from_step and the steps after
-- it in the list). In step order.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._steps_from(run treadle.workflow_runs, from_step text)
RETURNS text[]
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_after jsonb := '{}'::jsonb || coalesce(run.after, treadle._linear_after(run.steps));
    v_seen  jsonb := jsonb_build_object(from_step, true);
    v_todo  text[] := ARRAY[from_step];
BEGIN
    -- walk forward along the dependencies, a layer at a time
    WHILE cardinality(v_todo) > 0 LOOP
        v_todo := ARRAY(SELECT DISTINCT kv.key
                          FROM jsonb_each(v_after) AS kv
                         WHERE NOT v_seen ? kv.key
                           AND EXISTS (SELECT 1 FROM jsonb_array_elements_text(kv.value) AS d(v)
                                        WHERE d.v = ANY (v_todo)));
        v_seen := v_seen || coalesce((SELECT jsonb_object_agg(t.s, true) FROM unnest(v_todo) AS t(s)), '{}'::jsonb);
    END LOOP;
    RETURN ARRAY(SELECT u.s FROM unnest(run.steps) WITH ORDINALITY AS u(s, i) WHERE v_seen ? u.s ORDER BY u.i);
END;
$$;
COMMENT ON FUNCTION treadle._steps_from(treadle.workflow_runs, text) IS
    'The steps of a run that a fork from a step runs again: the step and every step after it, directly or not.';

--------------------------------------------------------------------------------
-- treadle.fork_run(run_id, from_step, input) -> bigint
--
-- Transition: (none) -> a new running run of the same workflow and the same
-- pinned definition (steps, dependencies, sleeps, maps, waits, children,
-- compensations, step options, version), on the same queue with the same
-- priority and attempts, whose forked_from is the source run and forked_step
-- from_step. It starts with the results the source has, under its row's lock, for
-- every step that is neither from_step nor a step that runs after it, directly or
-- through others (those recorded, and those of steps that completed while another
-- transaction held the row and wait for a re-check: treadle._recheck_results):
-- for a list, the steps before from_step; for a graph, the steps from_step does
-- not lead to, whatever their place (a parallel branch's result is kept). Those
-- steps never run in the fork. from_step, the steps after it, and any step the
-- source had not completed run as a new run's steps do: every one whose
-- dependencies all have results starts now. The source run is not changed, in
-- whatever state it is. The fork's input is the source's, or `input` when given.
-- It has no idempotency key and no parent (a fork of a child run stands alone),
-- and its compensations, should it fail, undo only the steps it ran itself.
-- Returns the new run's id.
-- Raises 22004: run_id or from_step null. P0002: no run has that id. 42501: a
-- tenant's run outside its queues. 22023: from_step not one of the run's steps;
-- input neither an object nor an array, over the size limit or nested too deep; a
-- child step ready at the start that treadle._start_child refuses.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.fork_run(run_id bigint, from_step text, input jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now     timestamptz := treadle.now();
    v_source  treadle.workflow_runs := treadle._run_for_operation(fork_run.run_id);
    v_input   jsonb;
    v_again   text[];
    v_results jsonb;
    v_run     treadle.workflow_runs;
BEGIN
    IF fork_run.from_step IS NULL THEN
        RAISE EXCEPTION 'treadle: from_step must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT fork_run.from_step = ANY (v_source.steps) THEN
        RAISE EXCEPTION 'treadle: workflow run % has no step "%"', v_source.id, left(fork_run.from_step, 200)
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = format('Its steps: %s.', left(array_to_string(v_source.steps, ', '), 1000));
    END IF;
    v_input := CASE WHEN fork_run.input IS NULL THEN v_source.input ELSE treadle._payload(fork_run.input, 'input') END;
    v_again := treadle._steps_from(v_source, fork_run.from_step);
    -- The source's results as of now, under its row's lock, with those of its steps
    -- that completed while another transaction held the row and wait for a re-check
    -- to be recorded (073_workflow_rechecks.sql): such a step completed, and does
    -- not run again in the fork. The source is only read.
    SELECT * INTO v_source FROM treadle.workflow_runs AS r
     WHERE r.queue = v_source.queue AND r.id = v_source.id
       FOR SHARE;
    SELECT coalesce(jsonb_object_agg(e.key, e.value), '{}'::jsonb) INTO v_results
      FROM jsonb_each(v_source.results || treadle._recheck_results(v_source)) AS e
     WHERE e.key = ANY (v_source.steps) AND NOT e.key = ANY (v_again);

    INSERT INTO treadle.workflow_runs AS r
        (name, input, steps, results, queue, priority, max_attempts, created_at, after, sleeps, maps, waits, version,
         children, compensations, step_options, forked_from, forked_step, meta)
    VALUES
        (v_source.name, v_input, v_source.steps, v_results, v_source.queue, v_source.priority, v_source.max_attempts,
         v_now, v_source.after, v_source.sleeps, v_source.maps, v_source.waits, v_source.version, v_source.children,
         v_source.compensations, v_source.step_options, v_source.id, fork_run.from_step, v_source.meta)
    RETURNING r.* INTO v_run;
    IF v_run.after IS NULL THEN
        -- the first step without a result: from_step, or an earlier one the source had not completed
        PERFORM treadle._enqueue_step(v_run, (SELECT u.s FROM unnest(v_run.steps) WITH ORDINALITY AS u(s, i)
                                               WHERE NOT v_results ? u.s ORDER BY u.i LIMIT 1), v_now);
    ELSE
        PERFORM treadle._enqueue_ready(v_run, v_now);
    END IF;
    RETURN v_run.id;
END;
$$;
COMMENT ON FUNCTION treadle.fork_run(bigint, text, jsonb) IS
    'Start a new run of a workflow run''s definition from a step, with the results recorded before it; returns its id.';

--------------------------------------------------------------------------------
-- treadle.compensate_run(run_id) -> text
--
-- Transition: a cancelled run with compensations -> `compensating`: the
-- compensations of its completed steps run one at a time, in reverse order of
-- completion, as for a run that failed (treadle._compensate_next; a step of it
-- still running finishes first), and it ends `compensated`, or `failed` if one
-- fails for good (treadle.retry_run then runs that one again). Its cancelled child
-- runs are not compensated by it (compensate each). Returns the state it is in
-- now: `compensating`, or `compensated` when no completed step has a compensation.
-- So a cancel undoes what the run did when asked: treadle.cancel_workflow, then,
-- once the run is cancelled, treadle.compensate_run.
-- Raises 22004: run_id null. P0002: no run has that id. 42501: a tenant's run
-- outside its queues. 55000: a run that is not cancelled (a running one whose
-- cancel is under way too: its running steps have not finished), or one without
-- compensations.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.compensate_run(run_id bigint)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_run   treadle.workflow_runs := treadle._run_for_operation(compensate_run.run_id);
    v_state text;
BEGIN
    IF v_run.compensations IS NULL THEN
        RAISE EXCEPTION 'treadle: workflow run % has no compensations', v_run.id
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    UPDATE treadle.workflow_runs AS r SET state = 'compensating', finished_at = NULL
     WHERE r.id = v_run.id AND r.state = 'cancelled';
    IF NOT FOUND THEN
        SELECT r.state INTO v_state FROM treadle.workflow_runs AS r WHERE r.id = v_run.id;
        RAISE EXCEPTION 'treadle: workflow run % is %: only a cancelled run is compensated on request', v_run.id, v_state
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'A run whose cancel was requested is cancelled once its running steps finish.';
    END IF;
    PERFORM treadle._compensate_next(v_run.id, treadle.now(), v_run.queue);
    SELECT r.state INTO v_state FROM treadle.workflow_runs AS r WHERE r.id = v_run.id;
    RETURN v_state;
END;
$$;
COMMENT ON FUNCTION treadle.compensate_run(bigint) IS
    'Run the compensations of a cancelled workflow run''s completed steps; returns its state.';
