--------------------------------------------------------------------------------
-- Child workflows: a step of a graph run (run.children) that starts a run of
-- another workflow, its child, when it becomes ready, in the same transaction
-- and under the parent run's lock, and completes with the child's results when
-- the child completes. The child's row names its parent (parent_run_id,
-- parent_step; a unique index keeps it to one child per step). A child that
-- fails fails its parent as a discarded step does; one that is cancelled cancels
-- it; cancelling the parent cancels its children (treadle.cancel_workflow). A
-- retry that resumes a child resumes its parent, and one that resumes a parent
-- resumes its failed and cancelled children (never starting a second child).
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._check_children(steps, sleeps, maps, children, waits) -> jsonb
--
-- The child steps of a workflow, checked against its step names and its sleep
-- map and wait steps: null or {} is none (null). Otherwise a JSON object mapping a
-- step to {"workflow": name} and optionally "queue": name (the child run's
-- queue; without it, the parent run's). Returns the map as given.
-- Raises 22023, naming the step: children not an object; a key that is not a
-- step, or is a sleep, map or wait step; a value that is not such an object, or
-- holds a name that is not a valid name (treadle._is_name); children over the
-- payload size limit. 42501: a tenant's child workflow or queue outside its
-- prefix.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_children(steps text[], sleeps jsonb, maps jsonb, children jsonb,
                                                   waits jsonb DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_step  text;
    v_value jsonb;
BEGIN
    IF children IS NULL OR children = '{}'::jsonb THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(children) <> 'object' THEN
        RAISE EXCEPTION 'treadle: children must be a JSON object mapping a step to {"workflow": name}, not %',
                        jsonb_typeof(children)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM treadle._check_payload(children, 'children', treadle._max_payload_bytes());
    FOR v_step, v_value IN SELECT e.key, e.value FROM jsonb_each(children) AS e LOOP
        IF NOT v_step = ANY (steps) THEN
            RAISE EXCEPTION 'treadle: children names step "%", which is not one of the steps', v_step
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF (sleeps IS NOT NULL AND sleeps ? v_step) OR (maps IS NOT NULL AND maps ? v_step)
           OR (waits IS NOT NULL AND waits ? v_step) THEN
            RAISE EXCEPTION 'treadle: step "%" is a % step and cannot start a child workflow', v_step,
                            CASE WHEN sleeps IS NOT NULL AND sleeps ? v_step THEN 'sleep'
                                 WHEN maps IS NOT NULL AND maps ? v_step THEN 'map' ELSE 'wait' END
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF jsonb_typeof(v_value) IS DISTINCT FROM 'object'
           OR jsonb_typeof(v_value -> 'workflow') IS DISTINCT FROM 'string'
           OR NOT coalesce(treadle._is_name(v_value ->> 'workflow'), false)
           OR (v_value ? 'queue' AND (jsonb_typeof(v_value -> 'queue') IS DISTINCT FROM 'string'
                                      OR NOT coalesce(treadle._is_name(v_value ->> 'queue'), false)))
           OR EXISTS (SELECT 1 FROM jsonb_object_keys(v_value) AS k(key) WHERE k.key <> ALL (ARRAY['workflow', 'queue'])) THEN
            RAISE EXCEPTION 'treadle: child step "%" must be {"workflow": name} with an optional "queue": name, not %',
                            v_step, left(v_value::text, 200)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        PERFORM treadle._check_workflow_allowed(v_value ->> 'workflow');
        IF v_value ? 'queue' THEN
            PERFORM treadle._check_queue_allowed(v_value ->> 'queue');
        END IF;
    END LOOP;
    RETURN children;
END;
$$;
COMMENT ON FUNCTION treadle._check_children(text[], jsonb, jsonb, jsonb, jsonb) IS
    'Check the child steps of a workflow (22023 naming the step, 42501 outside a tenant''s prefix); null for none.';

--------------------------------------------------------------------------------
-- treadle._max_tree_runs() -> integer
--
-- The most runs one run tree may hold: a root run (one that treadle.start_workflow
-- or treadle.fork_run started) and every run its child steps start, directly or
-- not. 10,000, as the map step's 100,000 elements: a fixed bound on what one start
-- may grow into.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._max_tree_runs()
RETURNS integer
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
RETURN 10000;
COMMENT ON FUNCTION treadle._max_tree_runs() IS
    'The most runs one run tree (a root run and its descendants) may hold: 10000.';

--------------------------------------------------------------------------------
-- treadle._start_child(run, step, at) -> void
--
-- Transition: a child step of a run (run.children) starts: (none) -> a running
-- run of the workflow it names (its definition and version from treadle.define_workflow), in
-- the queue it names or the parent's, with the parent's priority and
-- max_attempts, and its first steps are enqueued (as treadle.start_workflow
-- does). Its input is the parent run's input for a child step that runs after
-- no step, otherwise what a step there receives: the results of the steps it
-- runs after, directly or not, keyed by step name (treadle.workflow_step_results).
-- The caller holds the parent run's lock; the unique index on (parent_run_id,
-- parent_step) makes a second start fail rather than run twice.
-- The child belongs to its parent's run tree (root_run_id, root_queue: the run no
-- child step started), and the root's tree_runs counts it, in the statement that takes the
-- root's lock (after the parent's: a child before its parent, as on every path).
-- Raises 22023, naming the step: the workflow has no definition; the child would
-- nest runs over 10 levels deep (a workflow that starts itself); its input over
-- the size limit. 54000 (program_limit_exceeded), naming the step and the root: the
-- root's tree holds 10,000 runs already (a limit on what one start may grow
-- into, not a bad argument: child steps that fan out at each level multiply).
-- The step that led to it stays where it was (a run that would start with it
-- does not start), and nothing is written.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._start_child(run treadle.workflow_runs, step text, at timestamptz)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_spec  jsonb := run.children -> step;
    v_def   treadle.workflows;
    v_depth integer;
    v_input jsonb;
    v_child treadle.workflow_runs;
    v_root  bigint := coalesce(run.root_run_id, run.id);
    v_root_queue text := CASE WHEN run.root_run_id IS NULL THEN run.queue ELSE run.root_queue END;
    v_runs  integer;
    v_up    bigint;   -- the next run up the tree
BEGIN
    -- up the tree a run at a time, by id (Citus refuses a recursive CTE over runs by id alone)
    v_depth := 1;
    v_up := run.parent_run_id;
    WHILE v_up IS NOT NULL AND v_depth <= 11 LOOP
        v_depth := v_depth + 1;
        SELECT r.parent_run_id INTO v_up FROM treadle.workflow_runs AS r WHERE r.id = v_up;
    END LOOP;
    IF v_depth > 10 THEN
        RAISE EXCEPTION 'treadle: child step "%" would nest workflow runs more than 10 levels deep', step
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A workflow that starts itself as a child must stop before that.';
    END IF;
    SELECT * INTO v_def FROM treadle.workflows AS w WHERE w.name = v_spec ->> 'workflow';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'treadle: child step "%" starts workflow %, which has no definition', step, v_spec ->> 'workflow'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Register the workflow with a worker (treadle.define_workflow).';
    END IF;
    IF jsonb_array_length(run.after -> step) = 0 THEN
        v_input := run.input;
    ELSE
        v_input := treadle.workflow_step_results(run.id, step);
    END IF;
    PERFORM treadle._check_payload(v_input, format('the input of child step "%s"', step), treadle._max_payload_bytes());

    -- one more run in the tree: counted on the root's row, not by walking the tree
    -- (a root that prune removed first counts nothing: its descendants go on)
    UPDATE treadle.workflow_runs AS r SET tree_runs = coalesce(r.tree_runs, 1) + 1
     WHERE r.id = v_root AND r.queue = v_root_queue
    RETURNING r.tree_runs INTO v_runs;
    IF v_runs > treadle._max_tree_runs() THEN
        RAISE EXCEPTION 'treadle: child step "%" would grow the run tree of workflow run % past % runs',
                        step, v_root, treadle._max_tree_runs()
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Child steps that fan out at each level multiply; start fewer children, or more roots.';
    END IF;
    INSERT INTO treadle.workflow_runs AS r
        (name, input, steps, queue, priority, max_attempts, created_at, after, sleeps, maps, waits, version,
         children, parent_run_id, parent_step, compensations, step_options, meta, root_run_id, root_queue, parent_queue)
    VALUES
        (v_def.name, v_input, v_def.steps, coalesce(v_spec ->> 'queue', run.queue), run.priority, run.max_attempts, at,
         v_def.after, v_def.sleeps, v_def.maps, v_def.waits, v_def.version, v_def.children, run.id, step,
         v_def.compensations, v_def.step_options, run.meta,  -- a child run inherits its parent's meta
         v_root, v_root_queue, run.queue)
    RETURNING r.* INTO v_child;
    IF v_child.after IS NULL THEN
        PERFORM treadle._enqueue_step(v_child, v_child.steps[1], at);
    ELSE
        PERFORM treadle._enqueue_ready(v_child, at);
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._start_child(treadle.workflow_runs, text, timestamptz) IS
    'Start the child run of a child step of a workflow run, and enqueue its first steps.';

--------------------------------------------------------------------------------
-- treadle._undone_run(run_id) -> bigint
--
-- The run, or the first run under it (its child runs, theirs, ...), that undid
-- or undoes its steps: compensating, compensated, or failed in a compensation
-- after another of its compensations completed. Null when there is none. Such a
-- run never goes forward again: a step of it that ended without completing does
-- not run again, and a child step that waits for it never gets its result, so a
-- retry of a run over it is refused (treadle.retry, treadle.retry_run). Reads the
-- run tree without locks (at most 10,000 runs).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._undone_run(run_id bigint)
RETURNS bigint
LANGUAGE plpgsql  -- (not SQL: Citus plans neither a SQL function's parameterized read nor a recursive one)
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_level bigint[] := ARRAY[_undone_run.run_id];  -- the runs one level down, from the run itself
    v_tree  bigint[] := ARRAY[_undone_run.run_id];
    v_found bigint;
BEGIN
    IF _undone_run.run_id IS NULL THEN
        RETURN NULL;
    END IF;
    -- the tree, a level at a time (at most 10,000 runs)
    LOOP
        v_level := ARRAY(SELECT c.id FROM treadle.workflow_runs AS c WHERE c.parent_run_id = ANY (v_level));
        EXIT WHEN cardinality(v_level) = 0 OR cardinality(v_tree) >= 10000;
        v_tree := v_tree || v_level;
    END LOOP;
    SELECT r.id INTO v_found
      FROM treadle.workflow_runs AS r
     WHERE r.id = ANY (v_tree)
       AND (r.state = ANY (ARRAY['compensating', 'compensated'])
            OR (r.state = 'failed' AND r.compensations IS NOT NULL
                AND EXISTS (SELECT 1 FROM jsonb_each_text(r.compensations) AS c WHERE r.results ? c.value)))
     ORDER BY r.id
     LIMIT 1;
    RETURN v_found;
END;
$$;
COMMENT ON FUNCTION treadle._undone_run(bigint) IS
    'The run, or the first run under it, that undid its steps (compensating, compensated, failed in a compensation); null for none.';

--------------------------------------------------------------------------------
-- treadle._root_run(run_id) -> bigint
--
-- The run at the top of the run's tree: the run itself when it has no parent,
-- else the root its row names (root_run_id: a child run is given its parent's
-- root when it starts, treadle._start_child), whether or not that run is still
-- there (removed by hand, its tree is still the tree under it); null for an
-- unknown run. A retry that resumes a child run resumes its failed or cancelled
-- parents too (treadle._child_run_ended), up to that run, so a retry looks at the
-- whole tree under it (treadle._undone_run): a run there that undid its steps
-- keeps the top run from ever completing. Reads without locks.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._root_run(run_id bigint)
RETURNS bigint
LANGUAGE plpgsql  -- (not SQL: Citus plans no SQL function's parameterized read)
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_root bigint;
BEGIN
    SELECT coalesce(r.root_run_id, r.id) INTO v_root FROM treadle.workflow_runs AS r WHERE r.id = _root_run.run_id;
    RETURN v_root;
END;
$$;
COMMENT ON FUNCTION treadle._root_run(bigint) IS
    'The run at the top of a workflow run''s tree (the run itself when it has no parent).';

--------------------------------------------------------------------------------
-- treadle._resume_children(run) -> void
--
-- A run that a retry made running again (treadle._resume_graph): each of its
-- child runs that failed or was cancelled becomes running again and resumes as a
-- retry resumes a run: a graph child retries its discarded and cancelled steps
-- and starts the ready ones (treadle._resume_graph), a list child retries its
-- last discarded or cancelled step (treadle.retry). The caller holds the run's lock.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._resume_children(run treadle.workflow_runs)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_child treadle.workflow_runs;
    v_job   bigint;
BEGIN
    FOR v_child IN
        SELECT * FROM treadle.workflow_runs AS c
         WHERE c.parent_run_id = run.id AND c.state = ANY (ARRAY['failed', 'cancelled'])
         ORDER BY c.id
    LOOP
        UPDATE treadle.workflow_runs AS c SET state = 'running', finished_at = NULL
         WHERE c.queue = v_child.queue AND c.id = v_child.id
        RETURNING c.* INTO v_child;
        PERFORM treadle._child_run_ended(v_child);
        IF v_child.after IS NOT NULL THEN
            PERFORM treadle._resume_graph(v_child);
        ELSE
            SELECT s.id INTO v_job
              FROM (SELECT j.id, j.state FROM treadle.jobs AS j WHERE j.workflow_run_id = v_child.id
                    UNION ALL
                    SELECT h.id, h.state FROM treadle.job_history AS h WHERE h.workflow_run_id = v_child.id) AS s
             WHERE s.state = ANY (ARRAY['discarded', 'cancelled'])
             ORDER BY s.id DESC
             LIMIT 1;
            IF FOUND THEN
                PERFORM treadle.retry(v_job);
            END IF;
        END IF;
    END LOOP;
END;
$$;
COMMENT ON FUNCTION treadle._resume_children(treadle.workflow_runs) IS
    'Resume the failed and cancelled child runs of a workflow run that a retry resumed.';

--------------------------------------------------------------------------------
-- treadle._child_run_ended(child) -> void
--
-- A workflow run's state changed (child: its row as the statement that changed it
-- returned it; that statement's caller calls this next, in every path that
-- changes a run's state: a null row, one whose state the statement left as it
-- was, or a run that is not a child (parent_run_id null) do nothing). For a child
-- run, its parent moves:
--   running:   a retry resumed it: a parent that failed or was cancelled becomes
--              running again and resumes (treadle._resume_graph);
--   completed: the parent's step completes with the child's results (keyed by the
--              child's step names), and the parent moves on as after a completed
--              step (the steps now ready start, or the parent completes);
--   failed, compensated: the parent becomes failed, as after a discarded step;
--   cancelled: the parent becomes cancelled, as after a cancelled step (its other
--              steps and child runs stop as treadle.cancel_workflow stops them);
--   compensating: nothing yet (it fails its parent once its compensations end).
-- As for a step's job, only a running parent moves, but a completed child's
-- results are recorded on a parent that failed or was cancelled meanwhile. A
-- parent whose state changes moves its own parent in turn, up the run tree.
-- Locks the parent after the child (every path locks a child run before its
-- parent), names it by id and queue (parent_queue: one shard on Citus, reached
-- from the coordinator, where every caller runs). First, for any run that reached a
-- final state (completed, failed, cancelled, compensated), child or not: the
-- sessions waiting on its queue or an ancestor's hear treadle_done
-- (treadle._notify_run_done, 048_done_waiters.sql), so every end of a run wakes
-- wait_workflow, whether or not a job of its queue finished with it.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._child_run_ended(child treadle.workflow_runs)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now    timestamptz;
    v_parent treadle.workflow_runs;
BEGIN
    -- a run that ended tells its waiters, and its ancestors' (048_done_waiters.sql)
    PERFORM treadle._notify_run_done(child);
    IF child.parent_run_id IS NULL OR child.state = 'compensating' THEN
        RETURN;  -- a compensating child fails its parent once its compensations end
    END IF;
    v_now := treadle.now();
    SELECT * INTO v_parent FROM treadle.workflow_runs AS r
     WHERE r.queue = child.parent_queue AND r.id = child.parent_run_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF child.state = 'running' THEN
        IF v_parent.state = ANY (ARRAY['failed', 'cancelled']) THEN
            UPDATE treadle.workflow_runs AS r SET state = 'running', finished_at = NULL
             WHERE r.queue = v_parent.queue AND r.id = v_parent.id
            RETURNING r.* INTO v_parent;
            PERFORM treadle._child_run_ended(v_parent);
            PERFORM treadle._resume_graph(v_parent);
        END IF;
        RETURN;
    END IF;
    IF child.state = 'completed' THEN
        UPDATE treadle.workflow_runs AS r
           SET results = r.results || jsonb_build_object(child.parent_step, child.results)
         WHERE r.queue = v_parent.queue AND r.id = v_parent.id
        RETURNING r.* INTO v_parent;
        IF v_parent.state = 'running' THEN
            IF treadle._has_every_result(v_parent) THEN
                UPDATE treadle.workflow_runs AS r SET state = 'completed', finished_at = v_now
                 WHERE r.queue = v_parent.queue AND r.id = v_parent.id
                RETURNING r.* INTO v_parent;
                PERFORM treadle._child_run_ended(v_parent);
            ELSE
                PERFORM treadle._enqueue_ready(v_parent, v_now, child.parent_step);
            END IF;
        END IF;
    ELSIF v_parent.state = 'running' THEN
        -- failed or compensated: the parent fails
        UPDATE treadle.workflow_runs AS r
           SET state = CASE WHEN child.state = 'cancelled' THEN 'cancelled' ELSE 'failed' END, finished_at = v_now
         WHERE r.queue = v_parent.queue AND r.id = v_parent.id
        RETURNING r.* INTO v_parent;
        PERFORM treadle._child_run_ended(v_parent);
        IF v_parent.state = 'compensating' THEN
            PERFORM treadle._run_compensates(v_parent.id, v_parent.queue);  -- 078_workflow_compensation.sql
        ELSIF v_parent.state = 'cancelled'
              AND coalesce(current_setting('treadle.cancelling', true), '') <> v_parent.id::text THEN
            -- the rest of the parent stops as treadle.cancel_workflow stops it (070_workflow_cancel.sql)
            PERFORM treadle._cancel_under_way(v_parent.id, v_parent.queue, true);
        END IF;
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._child_run_ended(treadle.workflow_runs) IS
    'A workflow run changed state: when it is a child run, complete, fail, cancel or resume its parent.';
