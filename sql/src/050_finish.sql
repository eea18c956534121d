--------------------------------------------------------------------------------
-- Finishing. Every path that moves a job out of `running` or `available` into a
-- new state calls treadle._follow_up with the rows it changed, in the same
-- transaction, so a periodic job's next occurrence, a workflow's next step and a
-- run's state commit together with the job's own state, or not at all.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._enqueue_steps(run, steps, at) -> void
--
-- Transition: (none) -> available for steps of a workflow run, in one
-- statement: each a job named 'workflow:<workflow name>/<step>' whose `step`
-- column names the step, and whose meta is the run's. Workers of its queue hear of it when nobody else will
-- take it at once (treadle._notify_steps). A step with a concurrency_key in the
-- run's step_options starts blocked and is released as its key has room
-- (treadle._key_release_keys). PL/pgSQL, so that its statements are
-- planned once per session (a SQL function's are planned at every call).
-- treadle._advance_run's fast path writes a list's next step as its first
-- branch does, without the run's row (the two INSERTs change together).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._enqueue_steps(run treadle.workflow_runs, steps text[], at timestamptz)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id         bigint;
    v_queue      text;
    v_name       text;
    v_priority   integer;
    v_ids        bigint[];
    v_queues     text[];
    v_names      text[];
    v_priorities integer[];
    v_key_queues text[];
    v_keys       text[];
BEGIN
    IF cardinality(steps) = 1 AND run.step_options IS NULL THEN
        -- the common case: the next step of a run without per-step options
        INSERT INTO treadle.jobs
            (queue, name, args, priority, run_at, max_attempts, created_at, workflow_run_id, step, meta)
        VALUES (run.queue, 'workflow:' || run.name || '/' || steps[1], '{}', run.priority, at, run.max_attempts, at,
                run.id, steps[1], run.meta)
        RETURNING id, queue, name, priority INTO v_id, v_queue, v_name, v_priority;
        PERFORM treadle._notify_steps(ARRAY[v_id], ARRAY[v_queue], ARRAY[v_name], ARRAY[v_priority], at);
    ELSIF cardinality(steps) > 0 THEN
        -- a step with a concurrency_key starts blocked and goes through its key's
        -- admission, as a keyed enqueue does (034_key_lanes.sql)
        WITH added AS (
            INSERT INTO treadle.jobs
                (queue, name, args, priority, run_at, max_attempts, created_at, workflow_run_id, step, timeout, backoff,
                 concurrency_key, state, key_slot, meta, run_queue)
            SELECT coalesce(run.step_options -> s.step ->> 'queue', run.queue), 'workflow:' || run.name || '/' || s.step,
                   '{}', coalesce((run.step_options -> s.step ->> 'priority')::integer, run.priority), at,
                   coalesce((run.step_options -> s.step ->> 'max_attempts')::integer, run.max_attempts), at,
                   run.id, s.step, (run.step_options -> s.step ->> 'timeout')::interval,
                   treadle._intervals(run.step_options -> s.step -> 'backoff'),
                   run.step_options -> s.step ->> 'concurrency_key',
                   CASE WHEN run.step_options -> s.step ? 'concurrency_key' THEN 'blocked' ELSE 'available' END,
                   CASE WHEN run.step_options -> s.step ? 'concurrency_key' THEN false END, run.meta,
                   nullif(run.queue, coalesce(run.step_options -> s.step ->> 'queue', run.queue))
              FROM unnest(steps) WITH ORDINALITY AS s(step, i)
             ORDER BY s.i
            RETURNING id, queue, name, priority, concurrency_key
        )
        SELECT array_agg(a.id) FILTER (WHERE a.concurrency_key IS NULL),
               array_agg(a.queue) FILTER (WHERE a.concurrency_key IS NULL),
               array_agg(a.name) FILTER (WHERE a.concurrency_key IS NULL),
               array_agg(a.priority) FILTER (WHERE a.concurrency_key IS NULL),
               array_agg(a.queue) FILTER (WHERE a.concurrency_key IS NOT NULL),
               array_agg(a.concurrency_key) FILTER (WHERE a.concurrency_key IS NOT NULL)
          INTO v_ids, v_queues, v_names, v_priorities, v_key_queues, v_keys
          FROM added AS a;
        PERFORM treadle._notify_steps(v_ids, v_queues, v_names, v_priorities, at);
        IF v_keys IS NOT NULL THEN
            PERFORM treadle._key_release_keys(v_key_queues, v_keys);  -- 081_step_keys.sql
        END IF;
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._enqueue_steps(treadle.workflow_runs, text[], timestamptz) IS
    'Enqueue the jobs that run steps of a workflow run.';

--------------------------------------------------------------------------------
-- treadle._enqueue_step(run, step, at) -> void
--
-- Transition: (none) -> available for one step of a workflow run: a job named
-- 'workflow:<workflow name>/<step>' whose `step` column names the step (the next
-- step of a list): treadle._enqueue_steps with the one step. A worker claims the
-- steps it has a handler for by that name.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._enqueue_step(run treadle.workflow_runs, step text, at timestamptz)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM treadle._enqueue_steps(run, ARRAY[step], at);
END;
$$;
COMMENT ON FUNCTION treadle._enqueue_step(treadle.workflow_runs, text, timestamptz) IS
    'Enqueue the job that runs one step of a workflow run.';

--------------------------------------------------------------------------------
-- treadle._ready_steps(run, done) -> text[]
--
-- The steps of a graph run (run.after not null) that may start now: every step
-- it runs after has a result, it has none itself, no job of the run runs it
-- yet, it is not a sleep or a signal wait under way, and no child run of it is under way. In step order. With `done` (a step that
-- just completed) only the steps that run after it are looked at: no other can
-- have become ready. Callers hold the run row's lock, so what this reads cannot
-- change before they enqueue what it returns.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._ready_steps(run treadle.workflow_runs, done text DEFAULT NULL)
RETURNS text[]
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ready   text[] := '{}'::text[];
    v_jobs    jsonb;
    v_step    text;
    -- the run's maps, decompressed once (read from the table they may be compressed,
    -- and each lookup below would decompress them again)
    v_after   jsonb := '{}'::jsonb || run.after;
    v_results jsonb := '{}'::jsonb || run.results;
    v_wakes   jsonb := '{}'::jsonb || coalesce(run.wakes, '{}'::jsonb);
    v_waiting jsonb := coalesce(run.waiting, '{}'::jsonb);
BEGIN
    IF done IS NULL THEN
        -- every step with a job, read once
        SELECT coalesce(jsonb_object_agg(j.step, true), '{}'::jsonb) INTO v_jobs
          FROM treadle.jobs AS j WHERE j.workflow_run_id = run.id;
        IF run.children IS NOT NULL THEN
            SELECT v_jobs || coalesce(jsonb_object_agg(c.parent_step, true), '{}'::jsonb) INTO v_jobs
              FROM treadle.workflow_runs AS c WHERE c.parent_run_id = run.id;
        END IF;
    END IF;
    FOR v_step IN
        SELECT u.s FROM unnest(run.steps) WITH ORDINALITY AS u(s, i)
         WHERE (done IS NULL OR (v_after -> u.s) ? done)
           AND NOT v_results ? u.s
           AND NOT v_wakes ? u.s
           AND NOT v_waiting ? u.s
         ORDER BY u.i
    LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM jsonb_array_elements_text(v_after -> v_step) AS d(v)
                               WHERE NOT v_results ? d.v);
        IF done IS NULL THEN
            CONTINUE WHEN v_jobs ? v_step;
        ELSE
            CONTINUE WHEN EXISTS (SELECT 1 FROM treadle.jobs AS j
                                   WHERE j.workflow_run_id = run.id AND j.step = v_step);
            CONTINUE WHEN run.children IS NOT NULL AND run.children ? v_step
                      AND EXISTS (SELECT 1 FROM treadle.workflow_runs AS c
                                   WHERE c.parent_run_id = run.id AND c.parent_step = v_step);
        END IF;
        v_ready := v_ready || v_step;
    END LOOP;
    RETURN v_ready;
END;
$$;
COMMENT ON FUNCTION treadle._ready_steps(treadle.workflow_runs, text) IS
    'The steps of a workflow graph run whose dependencies have all completed and that have no job yet.';

--------------------------------------------------------------------------------
-- treadle._has_every_result(run) -> boolean
--
-- Whether every step of the run has a result (the run is done).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._has_every_result(run treadle.workflow_runs)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_results jsonb := '{}'::jsonb || run.results;  -- decompressed once
BEGIN
    RETURN NOT EXISTS (SELECT 1 FROM unnest(run.steps) AS u(s) WHERE NOT v_results ? u.s);
END;
$$;
COMMENT ON FUNCTION treadle._has_every_result(treadle.workflow_runs) IS
    'Whether every step of a workflow run has a result.';

--------------------------------------------------------------------------------
-- treadle._enqueue_map(run, step, at) -> boolean
--
-- Transition: a map step of a run (run.maps) starts: the array it maps over (the
-- result of a step it runs after, or {"input": key}: that key of the run's input),
-- N elements, becomes N jobs available now, in one statement, each with args
-- {"element": <element>, "index": <0-based position>} (blocked, released as its
-- key has room, for a step with a concurrency_key); run.map_left counts the N
-- that have not completed. An empty array completes the step at once with the
-- result [] and returns true (the caller looks for the steps that became ready).
-- The caller holds the run row's lock.
-- Raises 22023, naming the step: what it maps over is not a JSON array, or holds
-- over max_map_elements elements (treadle.configure, default 100,000; the step
-- that returned it stays running; a run that would start with it does not start).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._enqueue_map(run treadle.workflow_runs, step text, at timestamptz)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_over  jsonb := run.maps -> step;
    v_what  text;
    v_array jsonb;
    v_n     integer;
    v_max   integer;
    v_queue text := coalesce(run.step_options -> step ->> 'queue', run.queue);
    v_priority integer := coalesce((run.step_options -> step ->> 'priority')::integer, run.priority);
    v_max_attempts integer := coalesce((run.step_options -> step ->> 'max_attempts')::integer, run.max_attempts);
    v_timeout interval := (run.step_options -> step ->> 'timeout')::interval;
    v_backoff interval[] := treadle._intervals(run.step_options -> step -> 'backoff');
    v_key   text := run.step_options -> step ->> 'concurrency_key';
BEGIN
    IF jsonb_typeof(v_over) = 'object' THEN
        v_what := format('the input''s "%s"', v_over ->> 'input');
        v_array := run.input -> (v_over ->> 'input');
    ELSE
        v_what := format('the result of step "%s"', v_over #>> '{}');
        v_array := run.results -> (v_over #>> '{}');
    END IF;
    IF jsonb_typeof(v_array) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'treadle: map step "%" maps over %, which must be a JSON array, not %',
                        step, v_what, coalesce(jsonb_typeof(v_array), 'missing')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_n := jsonb_array_length(v_array);
    v_max := treadle._max_map_elements();
    IF v_n > v_max THEN
        RAISE EXCEPTION 'treadle: map step "%" maps over at most % elements, % holds %', step, v_max, v_what, v_n
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'The owner sets the limit with treadle.configure(max_map_elements => n).';
    END IF;
    IF v_n = 0 THEN
        UPDATE treadle.workflow_runs AS r SET results = r.results || jsonb_build_object(step, '[]'::jsonb)
         WHERE r.queue = run.queue AND r.id = run.id;
        RETURN true;
    END IF;
    INSERT INTO treadle.jobs
        (queue, name, args, priority, run_at, max_attempts, created_at, workflow_run_id, step, timeout, backoff,
         concurrency_key, state, key_slot, meta, run_queue)
    SELECT v_queue, 'workflow:' || run.name || '/' || step, jsonb_build_object('element', e.value, 'index', e.i - 1),
           v_priority, at, v_max_attempts, at, run.id, step, v_timeout, v_backoff,
           v_key, CASE WHEN v_key IS NULL THEN 'available' ELSE 'blocked' END, CASE WHEN v_key IS NOT NULL THEN false END,
           run.meta, nullif(run.queue, v_queue)
      FROM jsonb_array_elements(v_array) WITH ORDINALITY AS e(value, i)
     ORDER BY e.i;
    UPDATE treadle.workflow_runs AS r
       SET map_left = coalesce(r.map_left, '{}'::jsonb) || jsonb_build_object(step, v_n)
     WHERE r.queue = run.queue AND r.id = run.id;
    IF v_key IS NULL THEN
        PERFORM treadle._notify('treadle_jobs', v_queue);
    ELSE
        PERFORM treadle._key_release(v_queue, v_key, 0);  -- blocked until its key has room (034_key_lanes.sql)
    END IF;
    RETURN false;
END;
$$;
COMMENT ON FUNCTION treadle._enqueue_map(treadle.workflow_runs, text, timestamptz) IS
    'Start a map step of a workflow run: one job per element of the array it maps over.';

--------------------------------------------------------------------------------
-- treadle._enqueue_ready(run, at, done) -> void
--
-- Transition: the ready steps of a graph run (treadle._ready_steps, with `done`
-- the step that just completed, or null to look at every step) start: a
-- step -> a job, available now (treadle._enqueue_steps); a sleep step -> a sleep
-- under way on the run (wakes: step -> at + its interval; wake_at, the earliest,
-- is where treadle.rescue looks); a map step -> a job per element
-- (treadle._enqueue_map; one over an empty array completes at once, and the
-- run moves on from it, or completes); a wait step -> a signal wait under way, or
-- completed at once by a signal kept for it (treadle._start_waits), and the run
-- moves on from it; a child step -> its child run (treadle._start_child). The
-- caller holds the run row's lock.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._enqueue_ready(run treadle.workflow_runs, at timestamptz, done text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ready  text[] := treadle._ready_steps(run, done);
    v_sleeps jsonb;
    v_step   text;
    v_empty  boolean := false;
BEGIN
    IF run.sleeps IS NOT NULL THEN
        SELECT jsonb_object_agg(u.s, treadle._sleep_wake(run, u.s, at)) INTO v_sleeps
          FROM unnest(v_ready) AS u(s)
         WHERE run.sleeps ? u.s;
    END IF;
    IF v_sleeps IS NOT NULL THEN
        v_ready := ARRAY(SELECT u.s FROM unnest(v_ready) WITH ORDINALITY AS u(s, i)
                          WHERE NOT v_sleeps ? u.s ORDER BY u.i);
        UPDATE treadle.workflow_runs AS r
           SET wakes = coalesce(r.wakes, '{}'::jsonb) || v_sleeps,
               wake_at = (SELECT min(e.value::text::timestamptz)
                            FROM jsonb_each(coalesce(r.wakes, '{}'::jsonb) || v_sleeps) AS e)
         WHERE r.queue = run.queue AND r.id = run.id;
        IF EXISTS (SELECT 1 FROM jsonb_each_text(v_sleeps) AS e WHERE e.value::timestamptz <= at) THEN
            PERFORM treadle._end_due_sleeps(run, at);  -- until a time already past (074_workflow_sleep_until.sql)
            v_empty := true;
        END IF;
    END IF;
    IF run.maps IS NOT NULL THEN
        FOR v_step IN SELECT u.s FROM unnest(v_ready) WITH ORDINALITY AS u(s, i) WHERE run.maps ? u.s ORDER BY u.i LOOP
            IF treadle._enqueue_map(run, v_step, at) THEN
                v_empty := true;
            END IF;
        END LOOP;
        v_ready := ARRAY(SELECT u.s FROM unnest(v_ready) WITH ORDINALITY AS u(s, i)
                          WHERE NOT run.maps ? u.s ORDER BY u.i);
    END IF;
    IF run.waits IS NOT NULL THEN
        IF treadle._start_waits(run, ARRAY(SELECT u.s FROM unnest(v_ready) WITH ORDINALITY AS u(s, i)
                                            WHERE run.waits ? u.s ORDER BY u.i), at) THEN
            v_empty := true;
        END IF;
        v_ready := ARRAY(SELECT u.s FROM unnest(v_ready) WITH ORDINALITY AS u(s, i)
                          WHERE NOT run.waits ? u.s ORDER BY u.i);
    END IF;
    IF run.children IS NOT NULL THEN
        FOR v_step IN SELECT u.s FROM unnest(v_ready) WITH ORDINALITY AS u(s, i) WHERE run.children ? u.s ORDER BY u.i LOOP
            PERFORM treadle._start_child(run, v_step, at);
        END LOOP;
        v_ready := ARRAY(SELECT u.s FROM unnest(v_ready) WITH ORDINALITY AS u(s, i)
                          WHERE NOT run.children ? u.s ORDER BY u.i);
    END IF;
    PERFORM treadle._enqueue_steps(run, v_ready, at);
    IF v_empty THEN
        -- a map over an empty array, a wait with a kept signal, or a sleep until a
        -- time already past, completed: what runs after it may start now
        SELECT * INTO run FROM treadle.workflow_runs AS r WHERE r.queue = run.queue AND r.id = run.id;
        IF treadle._has_every_result(run) THEN
            UPDATE treadle.workflow_runs AS r SET state = 'completed', finished_at = at
             WHERE r.queue = run.queue AND r.id = run.id AND r.state = 'running'
            RETURNING r.* INTO run;
            PERFORM treadle._child_run_ended(run);  -- 076_workflow_children.sql
        ELSE
            PERFORM treadle._enqueue_ready(run, at);
        END IF;
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._enqueue_ready(treadle.workflow_runs, timestamptz, text) IS
    'Start the ready steps of a workflow graph run: a job each, a sleep under way for a sleep step, a job per element for a map step.';

--------------------------------------------------------------------------------
-- treadle._wake_runs(at) -> integer
--
-- Transition: the sleeps under way that are due at `at` end: each sleep step
-- completes (its result is the time it ended), and its run moves on as after a
-- completed step (treadle._enqueue_ready, or the run completes). Only running
-- runs, at most 1000 per call, each locked unless another session holds it
-- (SKIP LOCKED: a later call takes it). Returns how many runs it took: 1000 when
-- more may be due. treadle.rescue calls it (and a worker calls rescue again at
-- once while more are due), so a sleep ends at most one rescue interval late
-- while rescues keep up, and never early: the time is treadle's clock.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._wake_runs(at timestamptz)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_run   treadle.workflow_runs;
    v_due   jsonb;
    v_left  jsonb;
    v_next  timestamptz;
    v_queue text;
    v_taken integer := 0;  -- runs locked, toward the 1000
BEGIN
    -- the queues with a sleep due, read without locks; then queue by queue (one shard
    -- on Citus), each run locked and what the write sets computed here
    FOR v_queue IN
        SELECT DISTINCT r.queue FROM treadle.workflow_runs AS r
         WHERE r.wake_at <= at AND r.wake_at IS NOT NULL AND r.state = 'running'
    LOOP
        EXIT WHEN v_taken >= 1000;
        FOR v_run IN
            SELECT * FROM treadle.workflow_runs AS r
             WHERE r.queue = v_queue
               AND r.wake_at <= at AND r.wake_at IS NOT NULL AND r.state = 'running'
             ORDER BY r.wake_at
             LIMIT 1000 - v_taken
               FOR UPDATE SKIP LOCKED
        LOOP
            v_taken := v_taken + 1;
            SELECT jsonb_object_agg(e.key, e.value) INTO v_due
              FROM jsonb_each(v_run.wakes) AS e
             WHERE e.value::text::timestamptz <= at;
            IF v_due IS NULL THEN
                -- (nothing due after all: wake_at is set again from the wakes, so that the
                -- run is not taken again, toward the 1000, before it is due)
                UPDATE treadle.workflow_runs AS r
                   SET wake_at = (SELECT min(e.value::text::timestamptz) FROM jsonb_each(v_run.wakes) AS e)
                 WHERE r.queue = v_run.queue AND r.id = v_run.id;
                CONTINUE;
            END IF;
            v_left := v_run.wakes - ARRAY(SELECT jsonb_object_keys(v_due));
            v_next := (SELECT min(e.value::text::timestamptz) FROM jsonb_each(v_left) AS e);
            UPDATE treadle.workflow_runs AS r
               SET results = r.results || v_due,
                   wakes = nullif(v_left, '{}'::jsonb),
                   wake_at = v_next
             WHERE r.queue = v_run.queue
               AND r.id = v_run.id
            RETURNING r.* INTO v_run;
            IF treadle._has_every_result(v_run) THEN
                UPDATE treadle.workflow_runs AS r SET state = 'completed', finished_at = at
                 WHERE r.queue = v_run.queue AND r.id = v_run.id
                RETURNING r.* INTO v_run;
                PERFORM treadle._child_run_ended(v_run);  -- 076_workflow_children.sql
            ELSE
                PERFORM treadle._enqueue_ready(v_run, at);
            END IF;
        END LOOP;
    END LOOP;
    RETURN v_taken;
END;
$$;
COMMENT ON FUNCTION treadle._wake_runs(timestamptz) IS
    'End the sleep steps of running workflow runs that are due; returns how many runs it took (1000: more may be due).';

--------------------------------------------------------------------------------
-- treadle._advance_run(step treadle.jobs) -> void
--
-- A workflow step reached `step.state`:
--   completed: its result joins the run's results; the next step is enqueued
--              (a graph: every step whose dependencies now all have results),
--              or the run becomes completed once every step has a result;
--   discarded: the run becomes failed;  cancelled: the run becomes cancelled, and
--              the rest of it stops as treadle.cancel_workflow stops it: its other
--              waiting steps are cancelled, its running steps asked to stop, its child
--              runs cancelled, its sleeps and waits ended (treadle._cancel_under_way),
--              the jobs under way of its run's tree locked first, none of them waited
--              for: when another session holds one, the run's cancel is left for a
--              re-check (treadle._cancel_later, 073_workflow_cancel_rechecks.sql).
-- Only a running run moves; but a graph's step that completes in a failed or
-- cancelled run still records its result (its branch ran on), so that a retry
-- of the run resumes from it. Locks the run after the job (the order every path
-- keeps): two branches that complete at once on two connections take turns on
-- the run row, and the second sees the first's result, so a join step is
-- enqueued once. A step of a running run that completed (not a map element, not
-- a compensation) is recorded by the UPDATE that takes that lock, which returns
-- only what a list's next step needs (the row is read again for the rest). Inside
-- treadle.complete_and_claim's finish any other completed step (one that may
-- make a join ready, a map element, a compensation, a step of a run that is not
-- running) moves its run after the claim (treadle._advance_deferred). A
-- completed step that may make a join ready (and any other completed step not
-- on Citus) tries the run row with SKIP LOCKED: a graph's step whose run row
-- another transaction holds is left for a re-check (treadle._recheck_later,
-- 073_workflow_rechecks.sql) and its transaction does not wait; the others wait.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._advance_run(step treadle.jobs)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now   timestamptz := treadle.now();
    v_run   treadle.workflow_runs;
    v_index integer;
    v_queue text := coalesce(step.run_queue, step.queue);  -- the run's queue: every statement names it
    v_defer boolean;
    -- the fast path's UPDATE returns only what the next step needs (the whole row is
    -- read again, locked, where more is needed: a graph, step options, a child's end)
    v_id       bigint;
    v_graph    boolean;
    v_next     text;
    v_ended    boolean;  -- a child run completed: its parent moves
    v_plain    boolean;  -- no step options
    v_name     text;
    v_priority integer;
    v_max      integer;
    v_meta     jsonb;
    v_job_id   bigint;
    v_job_name text;
BEGIN
    IF step.state = 'completed' THEN
        -- The common case: a step of a running run completed (not an element of a
        -- map step, not a compensation). Its result is recorded, and the run row
        -- locked, by one statement; a list's last step completes the run in it.
        -- Inside complete_and_claim's finish (setting treadle.defer_joins) a step that may
        -- make a join ready is left for after its claim (below). (A run's after never
        -- changes, so a row left out by it is never waited for.)
        v_defer := current_setting('treadle.defer_joins', true) = 'on';
        UPDATE treadle.workflow_runs AS r
           SET results = r.results || jsonb_build_object(step.step, step.result),
               state = CASE WHEN r.after IS NOT NULL OR array_position(r.steps, step.step) < cardinality(r.steps)
                            THEN r.state ELSE 'completed' END,
               finished_at = CASE WHEN r.after IS NOT NULL OR array_position(r.steps, step.step) < cardinality(r.steps)
                                  THEN r.finished_at ELSE v_now END
         WHERE r.queue = v_queue
           AND r.id = step.workflow_run_id
           AND r.state = 'running'
           AND (r.maps IS NULL OR NOT r.maps ? step.step)
           AND (r.compensations IS NULL OR NOT step.args ? 'compensates')
           AND (r.after IS NULL  -- (a step that may make a join ready: below, 073_workflow_rechecks.sql)
                OR NOT EXISTS (SELECT 1 FROM jsonb_each(r.after) AS e
                                WHERE e.value ? step.step AND jsonb_array_length(e.value) > 1))
        RETURNING r.id, r.after IS NOT NULL, r.steps[array_position(r.steps, step.step) + 1],
                  r.state = 'completed' AND r.parent_run_id IS NOT NULL, r.step_options IS NULL,
                  r.name, r.priority, r.max_attempts, r.meta
             INTO v_id, v_graph, v_next, v_ended, v_plain, v_name, v_priority, v_max, v_meta;
        IF FOUND THEN
            IF v_next IS NOT NULL AND v_plain AND NOT v_graph THEN
                -- a list's next step, no step options: treadle._enqueue_steps's common case
                -- (that INSERT and wake-up) without the run's whole row
                INSERT INTO treadle.jobs
                    (queue, name, args, priority, run_at, max_attempts, created_at, workflow_run_id, step, meta)
                VALUES (v_queue, 'workflow:' || v_name || '/' || v_next, '{}', v_priority, v_now, v_max, v_now,
                        v_id, v_next, v_meta)
                RETURNING id, name INTO v_job_id, v_job_name;
                PERFORM treadle._notify_steps(ARRAY[v_job_id], ARRAY[v_queue], ARRAY[v_job_name], ARRAY[v_priority],
                                              v_now);
                RETURN;
            END IF;
            IF NOT (v_graph OR v_next IS NOT NULL OR v_ended) THEN
                RETURN;  -- a list's last step completed a run that has no parent
            END IF;
            SELECT * INTO v_run FROM treadle.workflow_runs AS r WHERE r.queue = v_queue AND r.id = v_id;
            IF v_graph THEN
                -- a graph: as treadle._advance_graph does after recording the result
                IF treadle._has_every_result(v_run) THEN
                    UPDATE treadle.workflow_runs AS r SET state = 'completed', finished_at = v_now
                     WHERE r.queue = v_queue AND r.id = v_run.id
                    RETURNING r.* INTO v_run;
                    PERFORM treadle._child_run_ended(v_run);  -- 076_workflow_children.sql
                ELSE
                    PERFORM treadle._enqueue_ready(v_run, v_now, step.step);
                END IF;
                RETURN;
            END IF;
            IF v_next IS NOT NULL THEN
                PERFORM treadle._enqueue_steps(v_run, ARRAY[v_next], v_now);  -- with its step options
            ELSE
                PERFORM treadle._child_run_ended(v_run);  -- the run completed in the UPDATE
            END IF;
            RETURN;
        END IF;
        IF v_defer THEN
            -- Not that common case (a step that may make a join ready: a step that also
            -- runs after another runs after it, or an element of a map step; or a
            -- compensation, or a step of a run that is not running) inside
            -- complete_and_claim's finish: the run moves after its claim
            -- (treadle._advance_deferred, 073_workflow_joins.sql), so that the run row's
            -- lock is held through the commit only. The UPDATE above left the row unlocked.
            PERFORM set_config('treadle.joins_deferred',
                               coalesce(current_setting('treadle.joins_deferred', true), '')
                               || step.id || E'\t' || step.queue || E'\n',  -- (a name holds no control character)
                               true);
            RETURN;
        END IF;
    END IF;
    IF step.state = 'cancelled' AND NOT step.args ? 'compensates'
       AND coalesce(current_setting('treadle.cancelling', true), '') <> step.workflow_run_id::text THEN
        -- a step whose end cancels its running run stops the rest of it as
        -- treadle.cancel_workflow does (its other waiting steps cancelled, its running
        -- ones asked to stop, its child runs cancelled, its sleeps and waits ended),
        -- their jobs locked before the run (070_workflow_cancel.sql)
        PERFORM 1 FROM treadle.workflow_runs AS r
         WHERE r.queue = v_queue AND r.id = step.workflow_run_id AND r.state = 'running';
        IF FOUND THEN
            -- the jobs under way of its run's tree first, before any run row (053_workflow_lock_order.sql),
            -- unless another session holds one: then the run is cancelled by a re-check
            -- (its finish holds this job, which that session may wait for: 073_workflow_cancel_rechecks.sql)
            IF NOT treadle._lock_run_tree_jobs(ARRAY[step.workflow_run_id], '{}', false) THEN
                PERFORM treadle._cancel_later(ARRAY[step], ARRAY[step.workflow_run_id]);
                RETURN;
            END IF;
            PERFORM treadle._cancel_under_way(step.workflow_run_id, v_queue, true);
        END IF;
    END IF;

    IF step.state = 'completed' AND NOT treadle._on_citus() THEN
        -- a completed step does not wait for a run row another transaction holds: a
        -- graph's step is left for a re-check (073_workflow_rechecks.sql), others wait
        SELECT * INTO v_run FROM treadle.workflow_runs AS r
         WHERE r.queue = v_queue AND r.id = step.workflow_run_id
           FOR UPDATE SKIP LOCKED;
        IF NOT FOUND AND treadle._recheck_later(step, v_queue) THEN
            RETURN;
        END IF;
    END IF;
    IF v_run.id IS NULL THEN
        SELECT * INTO v_run FROM treadle.workflow_runs AS r
         WHERE r.queue = v_queue AND r.id = step.workflow_run_id
           FOR UPDATE;
        IF NOT FOUND THEN
            RETURN;
        END IF;
    END IF;
    IF v_run.compensations IS NOT NULL AND (v_run.state = 'compensating' OR step.args ? 'compensates') THEN
        PERFORM treadle._advance_compensation(v_run, step);
        RETURN;
    END IF;
    IF v_run.after IS NOT NULL THEN
        PERFORM treadle._advance_graph(v_run, step);
        RETURN;
    END IF;
    IF v_run.state <> 'running' THEN
        RETURN;
    END IF;

    IF step.state = 'completed' THEN
        v_index := array_position(v_run.steps, step.step);
        IF v_index < cardinality(v_run.steps) THEN
            UPDATE treadle.workflow_runs AS r
               SET results = r.results || jsonb_build_object(step.step, step.result)
             WHERE r.queue = v_queue AND r.id = v_run.id;
            PERFORM treadle._enqueue_step(v_run, v_run.steps[v_index + 1], v_now);
        ELSE
            UPDATE treadle.workflow_runs AS r
               SET results = r.results || jsonb_build_object(step.step, step.result),
                   state = 'completed',
                   finished_at = v_now
             WHERE r.queue = v_queue AND r.id = v_run.id
            RETURNING r.* INTO v_run;
            PERFORM treadle._child_run_ended(v_run);
        END IF;
    ELSIF step.state = 'discarded' THEN
        UPDATE treadle.workflow_runs AS r SET state = 'failed', finished_at = v_now
         WHERE r.queue = v_queue AND r.id = v_run.id
        RETURNING r.* INTO v_run;
        PERFORM treadle._child_run_ended(v_run);
        IF v_run.state = 'compensating' THEN
            PERFORM treadle._run_compensates(v_run.id, v_queue);  -- 078_workflow_compensation.sql
        END IF;
    ELSIF step.state = 'cancelled' THEN
        UPDATE treadle.workflow_runs AS r SET state = 'cancelled', finished_at = v_now
         WHERE r.queue = v_queue AND r.id = v_run.id
        RETURNING r.* INTO v_run;
        PERFORM treadle._child_run_ended(v_run);
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._advance_run(treadle.jobs) IS
    'Move a workflow run on after one of its steps changed state.';

--------------------------------------------------------------------------------
-- treadle._advance_graph(run, step) -> void
--
-- treadle._advance_run for a run whose steps form a graph (run.after not null),
-- with the run row locked by the caller. An element job of a map step counts
-- down run.map_left; the last one records the step's result, the element jobs'
-- results in element order, and the run moves on as after any completed step.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._advance_graph(run treadle.workflow_runs, step treadle.jobs)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now    timestamptz := treadle.now();
    v_run    treadle.workflow_runs;
    v_left   integer;
    v_result jsonb;
BEGIN
    IF step.state = 'completed' AND run.maps IS NOT NULL AND run.maps ? step.step THEN
        -- one element of a map step: counted under the run row's lock, so the step
        -- completes (and what runs after it starts) exactly once, with the last one
        v_left := (run.map_left ->> step.step)::integer - 1;
        IF v_left > 0 THEN
            UPDATE treadle.workflow_runs AS r SET map_left = r.map_left || jsonb_build_object(step.step, v_left)
             WHERE r.queue = run.queue AND r.id = run.id;
            RETURN;
        END IF;
        SELECT jsonb_agg(j.result ORDER BY (j.args ->> 'index')::integer) INTO v_result
          FROM treadle.jobs AS j
         WHERE j.workflow_run_id = run.id AND j.step = step.step;
        UPDATE treadle.workflow_runs AS r
           SET results = r.results || jsonb_build_object(step.step, v_result),
               map_left = nullif(r.map_left - step.step, '{}'::jsonb)
         WHERE r.queue = run.queue AND r.id = run.id
        RETURNING r.* INTO v_run;
    ELSIF step.state = 'completed' THEN
        UPDATE treadle.workflow_runs AS r
           SET results = r.results || jsonb_build_object(step.step, step.result)
         WHERE r.queue = run.queue AND r.id = run.id
        RETURNING r.* INTO v_run;
    END IF;
    IF step.state = 'completed' THEN
        IF v_run.state <> 'running' THEN
            RETURN;
        END IF;
        IF treadle._has_every_result(v_run) THEN
            UPDATE treadle.workflow_runs AS r SET state = 'completed', finished_at = v_now
             WHERE r.queue = run.queue AND r.id = run.id
            RETURNING r.* INTO v_run;
            PERFORM treadle._child_run_ended(v_run);
        ELSE
            PERFORM treadle._enqueue_ready(v_run, v_now, step.step);
        END IF;
    ELSIF run.state <> 'running' THEN
        RETURN;
    ELSIF step.state = 'discarded' THEN
        UPDATE treadle.workflow_runs AS r SET state = 'failed', finished_at = v_now
         WHERE r.queue = run.queue AND r.id = run.id
        RETURNING r.* INTO v_run;
        PERFORM treadle._child_run_ended(v_run);
        IF v_run.state = 'compensating' THEN
            PERFORM treadle._run_compensates(run.id, run.queue);  -- 078_workflow_compensation.sql
        END IF;
    ELSIF step.state = 'cancelled' THEN
        UPDATE treadle.workflow_runs AS r SET state = 'cancelled', finished_at = v_now
         WHERE r.queue = run.queue AND r.id = run.id
        RETURNING r.* INTO v_run;
        PERFORM treadle._child_run_ended(v_run);
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._advance_graph(treadle.workflow_runs, treadle.jobs) IS
    'Move a workflow graph run on after one of its steps changed state: record a result, enqueue the steps now ready.';

--------------------------------------------------------------------------------
-- treadle._follow_up(done treadle.jobs[]) -> void
--
-- What follows from jobs that just changed state (rows as they are now):
--   a periodic occurrence that completed or was discarded inserts the series'
--   next one at finished_at + every, once (treadle._successor: next_id records
--   it, so a retried occurrence never starts a second one); a cancelled
--   occurrence ends the series;
--   an occurrence of a cron schedule that completed, was discarded or was
--   cancelled inserts the schedule's next one (treadle._schedule_next);
--   a workflow step moves its run (treadle._advance_run; with more than one row,
--   the completed steps of list runs first, together: treadle._advance_lists);
--   with more than one row, the runs they may move and those runs' ancestors are
--   locked first, child before parent (run ids descending: treadle._lock_batch_runs,
--   053_workflow_lock_order.sql), after the rows' jobs, the one order of every path
--   (a batch of completed steps of list runs without a parent, one a run, takes
--   them in that order once, in treadle._advance_lists);
--   a job that held a slot of its concurrency key gives it back once it left,
--   first, keys in (queue, key) order (treadle._key_leave_all);
--   channel treadle_done hears each queue where jobs finished, and the run's queue
--   of a finished step that a step option put in another queue, when a session
--   waits on it (treadle._notify_done).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._follow_up(done treadle.jobs[])
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job    treadle.jobs;
    v_moved  bigint[] := '{}'::bigint[];  -- the steps treadle._advance_lists moved (or left for a re-check)
    v_queues text[];   -- the queues where jobs finished (treadle_done)
    v_run_q  text[];   -- the runs' queues of finished steps that ran in another queue
    v_keyed  boolean;  -- a job held a slot of its concurrency key
    v_steps  bigint;   -- completed workflow steps
    v_wf     bigint;   -- workflow steps, in any state
    v_runs   bigint[]; -- their runs
    v_lists  boolean := false;  -- every row a completed step of its own list run (no batch lock)
BEGIN
    -- what the rows need, read in one pass
    SELECT array_agg(DISTINCT d.queue) FILTER (WHERE d.state = ANY (ARRAY['completed', 'discarded', 'cancelled'])),
           array_agg(DISTINCT d.run_queue) FILTER (WHERE d.state = ANY (ARRAY['completed', 'discarded', 'cancelled'])
                                                     AND d.run_queue IS NOT NULL),
           coalesce(bool_or(d.key_slot), false),
           count(*) FILTER (WHERE d.workflow_run_id IS NOT NULL AND d.state = 'completed'),
           count(*) FILTER (WHERE d.workflow_run_id IS NOT NULL),
           array_agg(DISTINCT d.workflow_run_id) FILTER (WHERE d.workflow_run_id IS NOT NULL)
      INTO v_queues, v_run_q, v_keyed, v_steps, v_wf, v_runs
      FROM unnest(done) AS d;
    IF v_run_q IS NOT NULL THEN
        -- a step put in another queue by a step option: its run's waiters hear its end
        -- too (the run may have ended with it: treadle._advance_run ends a list there)
        v_queues := ARRAY(SELECT DISTINCT u.q FROM unnest(v_queues || v_run_q) AS u(q));
    END IF;
    IF v_keyed THEN
        PERFORM treadle._key_leave_all(done);  -- concurrency keys' slots, in (queue, key) order (034_key_lanes.sql)
    END IF;
    IF v_wf > 1 THEN
        IF v_steps = cardinality(done) AND cardinality(v_runs) = v_steps AND NOT treadle._on_citus() THEN
            -- Completed steps, one a run, of list runs without a parent, maps, step options or
            -- compensations (what never changes in a run, read without its lock): the runs
            -- treadle._lock_batch_runs would lock are the ones treadle._advance_lists locks
            -- below, in the same order (ids descending), and one no longer running is moved
            -- by treadle._advance_run, which locks that run alone (it has no parent). So
            -- the common batch of list runs' steps locks its runs once.
            v_lists := NOT EXISTS (SELECT 1 FROM treadle.workflow_runs AS r
                                    WHERE r.id = ANY (v_runs)
                                      AND (r.parent_run_id IS NOT NULL OR r.after IS NOT NULL OR r.maps IS NOT NULL
                                           OR r.step_options IS NOT NULL OR r.compensations IS NOT NULL));
        END IF;
        IF NOT v_lists THEN
            -- the runs the rows may move, and their ancestors, in one order (053_workflow_lock_order.sql;
            -- one step alone locks its run and its ancestors in that order, treadle._advance_run);
            -- cancelled steps it left for a re-check are not moved here
            v_moved := treadle._lock_batch_runs(done);
        END IF;
    END IF;
    IF v_steps > 1 AND NOT treadle._on_citus() THEN
        v_moved := v_moved || coalesce(treadle._advance_lists(done), '{}'::bigint[]);  -- 051_workflow_lists.sql
    END IF;
    IF cardinality(v_moved) = cardinality(done) THEN  -- (every row was a list's step)
        IF v_queues IS NOT NULL THEN
            PERFORM treadle._notify_done(v_queues);
        END IF;
        RETURN;
    END IF;
    FOR v_job IN
        SELECT d.* FROM unnest(done) AS d
         WHERE (d.workflow_run_id IS NOT NULL AND d.id <> ALL (v_moved))
            OR (d.every IS NOT NULL AND d.state = ANY (ARRAY['completed', 'discarded']))
            OR (d.schedule IS NOT NULL AND d.state = ANY (ARRAY['completed', 'discarded', 'cancelled']))
         ORDER BY d.id
    LOOP
        IF v_job.every IS NOT NULL AND v_job.state = ANY (ARRAY['completed', 'discarded']) THEN
            PERFORM treadle._successor(v_job.id, v_job.queue, v_job.name, v_job.args, v_job.priority,
                                       v_job.finished_at + v_job.every, v_job.max_attempts, v_job.every, NULL);
        END IF;
        IF v_job.schedule IS NOT NULL AND v_job.state = ANY (ARRAY['completed', 'discarded', 'cancelled']) THEN
            PERFORM treadle._schedule_next(v_job);
        END IF;
        IF v_job.workflow_run_id IS NOT NULL THEN
            PERFORM treadle._advance_run(v_job);
        END IF;
    END LOOP;

    -- treadle_done after the steps' wake-ups, the order listeners have always seen
    IF v_queues IS NOT NULL THEN
        PERFORM treadle._notify_done(v_queues);
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._follow_up(treadle.jobs[]) IS
    'Insert periodic and scheduled successors, advance workflow runs and notify, for jobs that just changed state.';

--------------------------------------------------------------------------------
-- Finishing keeps the lease token on the job: the token of the claim that finished
-- it. Repeating a finish with that token (a worker whose answer was lost after the
-- commit) returns the state the first call left, and writes nothing more.
-- A tenant's token holds only a job of its own queues: every call that takes a token
-- answers another tenant's (leaked) token as a stale one, and tells it nothing.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._left_by(job_id, lease_token, states, queue) -> text
--
-- The state of a job that this token finished, when it is one of `states` (what a
-- finish repeated after a lost answer returns), in treadle.jobs or its history,
-- and in queue `queue` when it is not null; null otherwise.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._left_by(job_id bigint, lease_token uuid, states text[], queue text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
-- (PL/pgSQL: Citus plans no statement of an SQL-language function with parameters
-- over its tables; and each read names the queue when it is given)
DECLARE
    v_state  text;
    -- a tenant is told only of its own queues' jobs (another tenant's leaked token is stale)
    v_prefix text := treadle._caller_prefix();
BEGIN
    IF _left_by.queue IS NULL THEN
        SELECT j.state INTO v_state FROM treadle.jobs AS j
         WHERE j.id = _left_by.job_id AND j.lease_token = _left_by.lease_token AND j.state = ANY (_left_by.states)
           AND starts_with(j.queue, v_prefix);
        IF NOT FOUND THEN
            SELECT h.state INTO v_state FROM treadle.job_history AS h
             WHERE h.id = _left_by.job_id AND h.lease_token = _left_by.lease_token AND h.state = ANY (_left_by.states)
               AND starts_with(h.queue, v_prefix)
             LIMIT 1;
        END IF;
    ELSE
        SELECT j.state INTO v_state FROM treadle.jobs AS j
         WHERE j.queue = _left_by.queue AND j.id = _left_by.job_id AND j.lease_token = _left_by.lease_token
           AND j.state = ANY (_left_by.states)
           AND starts_with(j.queue, v_prefix);
        IF NOT FOUND THEN
            SELECT h.state INTO v_state FROM treadle.job_history AS h
             WHERE h.queue = _left_by.queue AND h.id = _left_by.job_id AND h.lease_token = _left_by.lease_token
               AND h.state = ANY (_left_by.states)
               AND starts_with(h.queue, v_prefix)
             LIMIT 1;
        END IF;
    END IF;
    RETURN v_state;
END;
$$;
COMMENT ON FUNCTION treadle._left_by(bigint, uuid, text[], text) IS
    'The state a token''s finish left a job in, when it is one of states; null otherwise.';

--------------------------------------------------------------------------------
-- treadle.complete(job_id, lease_token, result, queue) -> text
--
-- Transition: running -> completed, or -> cancelled when a cancel was requested
-- while it ran (the result is stored either way). Returns the new state, or null
-- when the token does not hold the job (re-claimed, rescued, finished by another
-- claim, or a job outside a tenant caller's queues). An expired lease that nobody
-- took over still holds. A periodic job's
-- next occurrence and a workflow's next step are written by the same call.
-- queue, when given, is the job's queue: a job of another queue is not held (as
-- an unknown id). Without it, the job's queue is read first by its id (on Citus,
-- a read of every shard); with it, every statement names the queue.
-- Raises 22004: job_id or lease_token null. 22023: result over the payload size
-- limit or nested over 100 levels.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.complete(
    job_id      bigint,
    lease_token uuid,
    result      jsonb DEFAULT NULL,
    queue       text  DEFAULT NULL
)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := treadle.now();
    v_queue text := complete.queue;
    v_job   treadle.jobs;
BEGIN
    PERFORM treadle._check_lease_args(complete.job_id, complete.lease_token);
    IF complete.result IS NOT NULL THEN
        PERFORM treadle._check_payload(complete.result, 'result', treadle._max_payload_bytes());
    END IF;
    IF v_queue IS NULL THEN
        SELECT j.queue INTO v_queue FROM treadle.jobs AS j WHERE j.id = complete.job_id;
    END IF;
    -- a tenant's token holds only its own queues' jobs: another tenant's leaked token
    -- is treated as a stale one (nothing held, nothing written, nothing told of it)
    IF EXISTS (SELECT FROM treadle.tenants AS t
                WHERE t.tenant_role = treadle._caller_role() AND NOT starts_with(v_queue, t.queue_prefix)) THEN
        v_queue := NULL;
    END IF;

    UPDATE treadle.jobs AS j
       SET state = CASE WHEN j.cancel_requested THEN 'cancelled' ELSE 'completed' END,
           result = complete.result,
           finished_at = v_now,
           lease_until = NULL
     WHERE j.id = complete.job_id
       AND j.queue = v_queue
       AND j.state = 'running'
       AND j.lease_token = complete.lease_token
    RETURNING j.* INTO v_job;

    IF NOT FOUND THEN
        RETURN treadle._left_by(complete.job_id, complete.lease_token, ARRAY['completed', 'cancelled'], complete.queue);
    END IF;
    PERFORM treadle._follow_up(ARRAY[v_job]);
    RETURN v_job.state;
END;
$$;
COMMENT ON FUNCTION treadle.complete(bigint, uuid, jsonb, text) IS
    'Finish a running job (running -> completed, or cancelled if requested); null when the lease is lost.';

--------------------------------------------------------------------------------
-- treadle.complete_many(job_ids, lease_tokens, results, job_queues)
--     -> table(job_id, state)
--
-- Transition: as treadle.complete, for many jobs in one statement. Returns one
-- row per input, in input order; state is null where the token does not hold
-- the job. results, when given, pairs with job_ids by position; so does
-- job_queues, each job's queue (as treadle.complete's queue: a job of another
-- queue is not held): the jobs are then finished queue by queue, each statement
-- naming one queue (one shard on Citus). Without it, by id alone (on Citus, every
-- shard).
-- Raises 22004: job_ids or lease_tokens null, a null in job_queues. 22023: arrays
-- of different lengths; a result over the payload size limit or nested over 100
-- levels.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.complete_many(
    job_ids      bigint[],
    lease_tokens uuid[],
    results      jsonb[] DEFAULT NULL,
    job_queues   text[]  DEFAULT NULL
)
RETURNS TABLE (job_id bigint, state text)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := treadle.now();
    v_max    integer;
    v_bad    bigint;
    v_ords   bigint[];
    v_states text[];
    v_queues text[];
    v_done   treadle.jobs[];  -- only the rows that something follows (_follow_up)
    v_each   text[];  -- the queues finished one statement each; {null}: by id alone
    v_queue  text;
    v_o      bigint[];
    v_s      text[];
    v_q      text[];
    v_d      treadle.jobs[];
    v_prefix text;  -- a tenant's: its tokens hold only its own queues' jobs (another's is stale)
BEGIN
    IF complete_many.job_ids IS NULL OR complete_many.lease_tokens IS NULL THEN
        RAISE EXCEPTION 'treadle: job_ids and lease_tokens must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF cardinality(complete_many.job_ids) <> cardinality(complete_many.lease_tokens)
       OR cardinality(complete_many.job_ids) <> coalesce(cardinality(complete_many.results),
                                                          cardinality(complete_many.job_ids)) THEN
        RAISE EXCEPTION 'treadle: job_ids, lease_tokens and results must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF complete_many.job_queues IS NULL THEN
        v_each := ARRAY[NULL::text];
    ELSIF cardinality(complete_many.job_queues) <> cardinality(complete_many.job_ids) THEN
        RAISE EXCEPTION 'treadle: job_ids and job_queues must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF array_position(complete_many.job_queues, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'treadle: job_queues must not hold nulls' USING ERRCODE = 'null_value_not_allowed';
    ELSIF cardinality(complete_many.job_queues) > 0
          AND complete_many.job_queues[1] = ALL (complete_many.job_queues) THEN
        v_each := complete_many.job_queues[1:1];  -- (most batches: one queue)
    ELSE
        v_each := ARRAY(SELECT DISTINCT q.q FROM unnest(complete_many.job_queues) AS q(q));
    END IF;
    IF complete_many.results IS NOT NULL THEN
        -- the limit is read only when a result could pass it: it is never under 1 KiB
        SELECT r.ord INTO v_bad FROM unnest(complete_many.results) WITH ORDINALITY AS r(value, ord)
         WHERE pg_column_size(r.value) > 1024 OR treadle._too_deep(r.value)
         LIMIT 1;
        IF FOUND THEN
            v_max := treadle._max_payload_bytes();
            PERFORM treadle._check_payload(r.value, format('result %s', r.ord - 1), v_max)
               FROM unnest(complete_many.results) WITH ORDINALITY AS r(value, ord)
              WHERE r.ord >= v_bad;
        END IF;
    END IF;

    v_prefix := treadle._caller_prefix();

    -- (each result comes with its row: Citus 13.2 cannot take an array element in a
    -- distributed UPDATE's SET, and its backend crashes)
    FOREACH v_queue IN ARRAY v_each LOOP
        v_d := NULL;
        IF v_queue IS NULL THEN
            WITH input AS (
                SELECT i.id, i.token, i.result, i.ord
                  FROM unnest(complete_many.job_ids, complete_many.lease_tokens, complete_many.results)
                       WITH ORDINALITY AS i(id, token, result, ord)
            ), done AS (
                UPDATE treadle.jobs AS j
                   SET state = CASE WHEN j.cancel_requested THEN 'cancelled' ELSE 'completed' END,
                       result = i.result,
                       finished_at = v_now,
                       lease_until = NULL
                  FROM input AS i
                 WHERE j.id = i.id
                   AND j.id = ANY (complete_many.job_ids)
                   AND j.state = 'running'
                   AND j.lease_token = i.token
                   AND starts_with(j.queue, v_prefix)
                RETURNING i.ord, j.state, j.queue, j.id,
                          j.workflow_run_id IS NOT NULL OR j.every IS NOT NULL OR j.schedule IS NOT NULL
                          OR coalesce(j.key_slot, false) AS follows,
                          CASE WHEN j.workflow_run_id IS NOT NULL OR j.every IS NOT NULL OR j.schedule IS NOT NULL
                                    OR coalesce(j.key_slot, false)
                               THEN ROW(j.*)::treadle.jobs END AS row
            )
            -- Most batches are plain jobs: whole rows are gathered (and _follow_up called)
            -- only for steps and periodic or scheduled occurrences; the others' queues are
            -- told here, as _follow_up would. Their rows are the UPDATE's own, built as
            -- treadle.jobs from their columns (on Citus a whole-row reference returned from
            -- a shard would have its shard's type).
            SELECT array_agg(d.ord), array_agg(d.state), array_agg(DISTINCT d.queue) FILTER (WHERE NOT d.follows),
                   array_agg(d.row ORDER BY d.id) FILTER (WHERE d.follows)
              INTO v_o, v_s, v_q, v_d
              FROM done AS d;
        ELSE
            WITH input AS (
                SELECT i.id, i.token, i.result, i.ord
                  FROM unnest(complete_many.job_ids, complete_many.lease_tokens, complete_many.results,
                              complete_many.job_queues) WITH ORDINALITY AS i(id, token, result, queue, ord)
                 WHERE i.queue = v_queue
            ), done AS (
                UPDATE treadle.jobs AS j
                   SET state = CASE WHEN j.cancel_requested THEN 'cancelled' ELSE 'completed' END,
                       result = i.result,
                       finished_at = v_now,
                       lease_until = NULL
                  FROM input AS i
                 WHERE j.queue = v_queue
                   AND j.id = i.id
                   AND j.id = ANY (complete_many.job_ids)
                   AND j.state = 'running'
                   AND j.lease_token = i.token
                   AND starts_with(j.queue, v_prefix)
                RETURNING i.ord, j.state, j.queue, j.id,
                          j.workflow_run_id IS NOT NULL OR j.every IS NOT NULL OR j.schedule IS NOT NULL
                          OR coalesce(j.key_slot, false) AS follows,
                          CASE WHEN j.workflow_run_id IS NOT NULL OR j.every IS NOT NULL OR j.schedule IS NOT NULL
                                    OR coalesce(j.key_slot, false)
                               THEN ROW(j.*)::treadle.jobs END AS row
            )
            SELECT array_agg(d.ord), array_agg(d.state), array_agg(DISTINCT d.queue) FILTER (WHERE NOT d.follows),
                   array_agg(d.row ORDER BY d.id) FILTER (WHERE d.follows)
              INTO v_o, v_s, v_q, v_d
              FROM done AS d;
        END IF;
        v_ords := v_ords || v_o;
        v_states := v_states || v_s;
        v_queues := v_queues || v_q;
        v_done := v_done || v_d;
    END LOOP;

    IF v_done IS NOT NULL THEN
        PERFORM treadle._follow_up(v_done);
    END IF;
    IF v_queues IS NOT NULL THEN
        PERFORM treadle._notify_done(v_queues);
    END IF;

    IF coalesce(cardinality(v_ords), 0) < cardinality(complete_many.job_ids) THEN
        -- the rest: finished by this token before (a repeat), or not held
        SELECT v_ords || coalesce(array_agg(i.ord), '{}'), v_states || coalesce(array_agg(j.state), '{}')
          INTO v_ords, v_states
          FROM unnest(complete_many.job_ids, complete_many.lease_tokens, complete_many.job_queues)
               WITH ORDINALITY AS i(id, token, queue, ord)
          JOIN treadle.jobs AS j ON j.id = i.id AND j.lease_token = i.token
         WHERE j.state = ANY (ARRAY['completed', 'cancelled'])
           AND (i.queue IS NULL OR j.queue = i.queue)
           AND starts_with(j.queue, v_prefix)
           AND i.ord <> ALL (coalesce(v_ords, '{}'));
    END IF;

    RETURN QUERY
    SELECT i.id, d.state
      FROM unnest(complete_many.job_ids) WITH ORDINALITY AS i(id, ord)
      LEFT JOIN unnest(v_ords, v_states) AS d(ord, state) ON d.ord = i.ord
     ORDER BY i.ord;
END;
$$;
COMMENT ON FUNCTION treadle.complete_many(bigint[], uuid[], jsonb[], text[]) IS
    'Finish many running jobs in one statement; one (job_id, state) row per input, state null when stale.';

--------------------------------------------------------------------------------
-- treadle.fail(job_id, lease_token, error, retry_in, retryable, queue) -> text
--
-- Transition: running -> retryable (run_at = now + retry_in, or when retry_in is
-- null the job's backoff, or the default, with jitter: treadle._retry_delay),
-- -> discarded when attempt >= max_attempts or when the error is not retryable,
-- -> cancelled when a cancel was requested (treadle._failed_state). The error,
-- trimmed to 16,384 characters, is kept in last_error and appended to errors.
-- Returns the new state, or null when the token does not hold the job. queue, when
-- given, is the job's queue, as for treadle.complete.
-- Raises 22004: job_id, lease_token or retryable null. 22023: retry_in negative
-- or over 366 days.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.fail(
    job_id      bigint,
    lease_token uuid,
    error       text,
    retry_in    interval DEFAULT NULL,
    retryable   boolean  DEFAULT true,
    queue       text     DEFAULT NULL
)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := treadle.now();
    v_error    text := treadle._trim_error(coalesce(fail.error, '(no error message)'));
    v_job      treadle.jobs;
    v_state    text;
    v_run_at   timestamptz;
    v_finished timestamptz;
    v_queue    text := fail.queue;
BEGIN
    PERFORM treadle._check_lease_args(fail.job_id, fail.lease_token);
    PERFORM treadle._check_interval(fail.retry_in, 'retry_in', interval '366 days', may_be_zero => true);
    IF fail.retryable IS NULL THEN
        RAISE EXCEPTION 'treadle: retryable must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;

    -- The job is read and locked first, and what the write sets is computed here (the
    -- jitter, the clock): an UPDATE that Citus distributes may hold no volatile call,
    -- nor a CASE around a call that is not immutable.
    IF v_queue IS NULL THEN
        SELECT j.queue INTO v_queue FROM treadle.jobs AS j WHERE j.id = fail.job_id;
    END IF;
    -- a tenant's token holds only its own queues' jobs: another tenant's leaked token
    -- is treated as a stale one (nothing held, nothing written, nothing told of it)
    IF EXISTS (SELECT FROM treadle.tenants AS t
                WHERE t.tenant_role = treadle._caller_role() AND NOT starts_with(v_queue, t.queue_prefix)) THEN
        v_queue := NULL;
    END IF;
    SELECT j.* INTO v_job FROM treadle.jobs AS j
     WHERE j.id = fail.job_id
       AND j.queue = v_queue
       AND j.state = 'running'
       AND j.lease_token = fail.lease_token
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN treadle._left_by(fail.job_id, fail.lease_token, ARRAY['retryable', 'discarded', 'cancelled'], fail.queue);
    END IF;
    -- the failed state decides the rest: a retry is due after retry_in or the backoff,
    -- any other state is finished. An error that is not retryable spends every
    -- attempt that is left.
    v_state := treadle._failed_state(v_job.cancel_requested,
                                     CASE WHEN fail.retryable THEN v_job.attempt ELSE v_job.max_attempts END,
                                     v_job.max_attempts);
    IF v_state = 'retryable' THEN
        v_run_at := v_now + coalesce(fail.retry_in, treadle._retry_delay(v_job.attempt, v_job.backoff));
    ELSE
        v_run_at := v_job.run_at;
        v_finished := v_now;
    END IF;
    UPDATE treadle.jobs AS j
       SET state = v_state,
           run_at = v_run_at,
           finished_at = v_finished,
           lease_until = NULL,
           last_error = v_error,
           failed_at = v_now,
           errors = treadle._append_error(j.errors, j.attempt, v_now, v_error, j.worker_id, j.started_at),
           ready_txid = pg_current_xact_id()  -- claimable again: claims look for it (040_claim.sql)
     WHERE j.id = v_job.id
       AND j.queue = v_job.queue
    RETURNING j.* INTO v_job;
    PERFORM treadle._follow_up(ARRAY[v_job]);
    IF v_job.state = 'retryable' AND v_job.run_at <= v_now THEN
        PERFORM treadle._notify('treadle_jobs', v_job.queue);  -- a retry due at once
    END IF;
    RETURN v_job.state;
END;
$$;
COMMENT ON FUNCTION treadle.fail(bigint, uuid, text, interval, boolean, text) IS
    'Record a failed attempt (running -> retryable, discarded or cancelled); null when the lease is lost.';

--------------------------------------------------------------------------------
-- treadle._running_xids() -> setof xid
--
-- The transaction ids running now, prepared ones included: which transactions
-- could still commit a lease (treadle.rescue). Read once per transaction, when
-- first asked: every id taken before that is either listed or has ended.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._running_xids()
RETURNS SETOF xid
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT a.backend_xid FROM pg_stat_get_activity(NULL) AS a WHERE a.backend_xid IS NOT NULL
    UNION ALL
    SELECT p.transaction FROM pg_prepared_xacts AS p;
END;
COMMENT ON FUNCTION treadle._running_xids() IS
    'The transaction ids running now, prepared ones included (treadle.rescue).';

--------------------------------------------------------------------------------
-- treadle.rescue() -> integer
--
-- Transition: running with an expired lease -> retryable with run_at = now (the
-- worker died; the job did not fail, so no backoff); running more than 5 seconds
-- past its timeout (started_at + timeout), heartbeats or not -> retryable after
-- its backoff (treadle._retry_delay), failed with a timeout error: a hung handler
-- whose worker still heartbeats is not kept forever, and a worker, which cancels
-- its handler at the timeout itself, has 5 seconds to write that failure first.
-- Either goes -> discarded when its attempts are spent, -> cancelled when a
-- cancel was requested (treadle._failed_state). The lease token is dropped: the
-- rescued claim's writes, repeats included, find nothing. Returns how many jobs
-- it moved. Safe from many sessions at once: each job is counted once. It also
-- ends the workflow sleeps that are due (treadle._wake_runs) and times out the
-- signal waits whose timeout passed (treadle._time_out_waits), and moves the runs
-- of steps left for a re-check, up to 1000 each a call; when one of them did as
-- many, more may be due, and the setting treadle.rescue_left is 'on' until the
-- transaction ends (a worker then calls again at once).
-- How it writes. The jobs to move are read first without locks, across queues;
-- then each queue's are locked (SKIP LOCKED) by one read, which computes what the
-- write may not hold (the clock, the backoff's jitter, the error text), and moved by
-- one UPDATE that names the queue and sets the failed state by treadle._failed_state,
-- as treadle.fail does: on Citus every statement that locks or writes stays on one
-- shard. Whole rows are read back only for the jobs that have follow-ups.
-- Where a rescue reads. Every job that leaves `running` leaves a dead entry in the
-- lease index, and while any snapshot older than it stays open (a long transaction,
-- a replication slot) nothing removes it: a pass over all expired leases would
-- grow with the snapshot's age. So each session keeps a floor (the setting
-- treadle.rescue_cursor, a treadle._rescue_cursor) and reads the leases that ran out at or above it. After a
-- pass from the floor, the floor may move up to where that pass read (less a
-- second, and less any expired lease it found held by another session), but only
-- at a later pass, once every transaction that was running at the first one has
-- ended: a lease such a transaction committed could lie below where the first
-- pass read, and the later pass, still reading from the old floor, sees it. While
-- a transaction that has an id stays open the floor stays; the session then reads
-- from it once a minute and, between, only the leases that ran out since its
-- previous call, less a second (or since the earliest expired lease that call found
-- held by another session: the next call reads it again). A session's first rescue reads from the start; so
-- does every rescue while the setting treadle.now is in use, and under REPEATABLE
-- READ a rescue reads from the floor: both leave the cursor as it was. A lease written by a
-- statement that ran longer than that lease and a second before writing it can lie
-- below a floor that moved meanwhile: a session's first rescue finds it. On Citus
-- (treadle._distributed) no cursor is kept: every rescue reads from the start.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.rescue()
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now    timestamptz := treadle.now();
    v_now_us bigint := treadle._us(v_now);
    -- Read from the floor at least this often (microseconds), as claims sweep: it
    -- finds what the reads since the previous call can miss, below, at a cost that
    -- grows with the dead entries a held snapshot keeps.
    c_sweep_every CONSTANT bigint := 60 * 1000000;
    -- Reads reach this far (microseconds) below where the previous one stopped: a
    -- lease is written with its statement's now and committed a moment later.
    c_margin CONSTANT bigint := 1000000;
    v_text   text := current_setting('treadle.rescue_cursor', true);
    v_cursor treadle._rescue_cursor;
    v_from   timestamptz;
    v_full   boolean := true;  -- this call reads from the floor
    v_moves  boolean := false; -- and the floor moves up after it
    v_fixed  boolean;          -- a clock set by hand, or an older snapshot: the cursor stays
    v_ids    bigint[];
    v_leases bigint[];
    v_done   treadle.jobs[];  -- the moved rows that have follow-ups (_follow_up)
    v_done_ids bigint[] := '{}'::bigint[];  -- the ids of every job moved
    v_count  integer := 0;        -- how many
    v_k      bigint;              -- (of one queue)
    v_f      bigint[];            -- the jobs of one queue that have follow-ups
    v_fin    boolean;             -- and whether others of it finished
    v_due    boolean;             -- or a retry is due at once
    v_fin_q  text[] := '{}'::text[];  -- the queues where jobs without follow-ups finished
    v_due_q  text[] := '{}'::text[];  -- the queues with a retry due at once
    v_missed bigint;      -- the earliest expired lease read and not rescued here
    v_queues text[];      -- the queue of each expired lease read
    v_over   bigint[];    -- the jobs running past their timeout
    v_over_q text[];      -- and their queues
    v_queue  text;
    v_q_ids  bigint[];    -- the jobs of one queue read above
    v_txid   xid8;
    v_m_id   bigint[];    -- what one queue's UPDATE sets, job by job
    v_m_run  timestamptz[];
    v_m_err  text[];
    v_moved  treadle.jobs[];  -- and the rows it wrote
    v_left   boolean;     -- a pass of workflow runs took all it may: more may be left
    -- on Citus the cursor is not kept (as the claim's): a rescue reads from the start
    v_citus  boolean := treadle._on_citus();
BEGIN
    -- (under REPEATABLE READ or SERIALIZABLE a rescue reads with its transaction's
    -- first snapshot: from the floor, and the floor stays)
    v_fixed := v_now <> statement_timestamp() OR current_setting('transaction_isolation') <> 'read committed'
               OR v_citus;
    -- (a setting that is not a cursor's text, as treadle._is_cursor_text says, is none)
    IF v_now = statement_timestamp() AND NOT v_citus AND treadle._is_cursor_text(
            v_text, '{number,number or null,number or null,number or null,number}') THEN
        v_cursor := v_text::treadle._rescue_cursor;
        -- a clock that went back, or a cursor set by hand (into the future, a
        -- transaction id out of range): from the start
        IF v_cursor.taken_at > v_now_us OR v_cursor.floor > v_now_us OR v_cursor.next_floor > v_now_us
           OR v_cursor.swept_at > v_now_us OR v_cursor.newest_xid NOT BETWEEN 3 AND 4294967295 THEN
            v_cursor := NULL;
        END IF;
    END IF;
    IF v_cursor.version IS NOT NULL THEN  -- (not `v_cursor IS NOT NULL`: true only when no field is null)
        v_moves := NOT v_fixed AND v_cursor.next_floor IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM treadle._running_xids() AS x(x) WHERE age(x.x) >= age(v_cursor.newest_xid::text::xid));
        -- from the floor when it moves up after, or a minute after the last pass from it
        v_full := v_moves OR v_fixed OR v_cursor.swept_at <= v_now_us - c_sweep_every;
        v_from := treadle._from_us(CASE WHEN v_full THEN v_cursor.floor ELSE v_cursor.taken_at - c_margin END);
    ELSE
        v_from := '-infinity';
    END IF;

    -- the expired leases, read without locks (the one read that walks dead entries),
    -- then locked by id, skipping those others hold
    SELECT coalesce(array_agg(j.id), '{}'), coalesce(array_agg(treadle._us(j.lease_until)), '{}'),
           coalesce(array_agg(j.queue), '{}')
      INTO v_ids, v_leases, v_queues
      FROM treadle.jobs AS j
     WHERE j.lease_until >= v_from
       AND j.lease_until < v_now
       AND j.state = 'running';
    -- the jobs running past their timeout (the expired ones read above are taken as
    -- expired), read without locks from jobs_timeout_idx by started_at: a condition on
    -- lease_until here would let the planner read jobs_lease_idx, whose dead entries a
    -- held snapshot keeps
    SELECT coalesce(array_agg(j.id), '{}'), coalesce(array_agg(j.queue), '{}')
      INTO v_over, v_over_q
      FROM treadle.jobs AS j
     WHERE j.lease_until IS NOT NULL
       AND j.timeout IS NOT NULL
       AND j.started_at < v_now - interval '5 seconds'
       AND j.started_at + j.timeout + interval '5 seconds' < v_now
       AND j.state = 'running'
       AND NOT j.id = ANY (v_ids);

    -- Then queue by queue (one shard on Citus), set-based: one read locks the queue's
    -- jobs (unless another session holds them) and computes what the write may not (the
    -- clock, the backoff's jitter, the error text: an UPDATE that Citus distributes may
    -- hold no volatile call, nor a call that is not immutable on its columns); one UPDATE
    -- sets the failed state (treadle._failed_state, as treadle.fail). A job whose lease
    -- was renewed meanwhile, or that left running, stays.
    FOR v_queue, v_q_ids IN
        SELECT k.q, array_agg(k.id) FROM unnest(v_ids || v_over, v_queues || v_over_q) AS k(id, q) GROUP BY k.q
    LOOP
        -- (a job is taken as timed out when it is in v_over: few, so the test per row is short)
        SELECT coalesce(array_agg(m.id), '{}'), array_agg(m.run_at), array_agg(m.error)
          INTO v_m_id, v_m_run, v_m_err
          FROM (SELECT j.id,
                       v_now + CASE WHEN j.id = ANY (v_over) THEN treadle._retry_delay(j.attempt, j.backoff)
                                    ELSE interval '0' END AS run_at,
                       CASE WHEN j.id = ANY (v_over)
                            THEN format('timed out: attempt %s ran past its timeout of %s on worker %s',
                                        j.attempt, j.timeout, j.worker_id)
                            ELSE 'lease expired: worker ' || j.worker_id || ' stopped heartbeating' END AS error
                  FROM treadle.jobs AS j
                 WHERE j.queue = v_queue
                   AND j.id = ANY (v_q_ids)
                   AND j.state = 'running'
                   AND j.lease_until IS NOT NULL
                   AND CASE WHEN j.id = ANY (v_over) THEN j.timeout IS NOT NULL AND j.started_at + j.timeout + interval '5 seconds' < v_now
                            ELSE j.lease_until < v_now END
                 ORDER BY j.id
                   FOR UPDATE OF j SKIP LOCKED) AS m;
        CONTINUE WHEN cardinality(v_m_id) = 0;
        IF v_txid IS NULL THEN
            v_txid := pg_current_xact_id();  -- claimable again: claims look for it (040_claim.sql)
        END IF;
        -- (each value comes with its row: Citus 13.2 cannot take an array element in a
        -- distributed UPDATE's SET)
        WITH input AS (
            SELECT m.id, m.run_at, m.error FROM unnest(v_m_id, v_m_run, v_m_err) AS m(id, run_at, error)
        ), moved AS (
            UPDATE treadle.jobs AS j
               SET state = treadle._failed_state(j.cancel_requested, j.attempt, j.max_attempts),
                   run_at = i.run_at,
                   finished_at = CASE WHEN treadle._failed_state(j.cancel_requested, j.attempt, j.max_attempts) <> 'retryable'
                                      THEN v_now END,
                   lease_until = NULL,
                   lease_token = NULL,
                   last_error = i.error,
                   failed_at = v_now,
                   errors = treadle._append_error(j.errors, j.attempt, v_now, i.error, j.worker_id, j.started_at),
                   ready_txid = v_txid
              FROM input AS i
             WHERE j.queue = v_queue
               AND j.id = i.id
            RETURNING j.id, j.state, j.run_at <= v_now AS due,
                      j.workflow_run_id IS NOT NULL OR j.every IS NOT NULL OR j.schedule IS NOT NULL
                      OR coalesce(j.key_slot, false) AS follows
        )
        -- Whole rows are gathered (and _follow_up called) only for steps, periodic or
        -- scheduled occurrences and keyed jobs; the queue of the others is told below, as
        -- _follow_up would. (Those rows are read after: on Citus a row returned from a
        -- shard has its shard's type.)
        SELECT count(*), array_agg(m.id) FILTER (WHERE m.follows),
               coalesce(bool_or(m.state <> 'retryable') FILTER (WHERE NOT m.follows), false),
               coalesce(bool_or(m.state = 'retryable' AND m.due), false)
          INTO v_k, v_f, v_fin, v_due
          FROM moved AS m;
        v_count := v_count + v_k;
        IF v_fin THEN
            v_fin_q := v_fin_q || v_queue;
        END IF;
        IF v_due THEN
            v_due_q := v_due_q || v_queue;
        END IF;
        IF v_f IS NOT NULL THEN
            SELECT array_agg(j ORDER BY j.id) INTO v_moved FROM treadle.jobs AS j
             WHERE j.queue = v_queue AND j.id = ANY (v_f);
            v_done := coalesce(v_done, '{}') || v_moved;
        END IF;
        v_done_ids := v_done_ids || v_m_id;
    END LOOP;
    IF cardinality(v_ids) > 0 THEN
        -- the lowest expired lease another session held: the floor stays below it
        -- (an anti-join, which the planner hashes: `NOT s.id = ANY (...)` would compare
        -- every expired lease with every moved job)
        SELECT min(s.l) INTO v_missed
          FROM unnest(v_ids, v_leases) AS s(id, l)
         WHERE NOT EXISTS (SELECT FROM unnest(v_done_ids) AS d(id) WHERE d.id = s.id);
    END IF;

    IF NOT v_fixed THEN
        v_cursor.version := 1;
        IF v_full THEN
            -- the transactions running at the pass that set the next floor have all
            -- ended: what they wrote below it, this pass has read
            IF v_moves THEN
                v_cursor.floor := least(v_cursor.next_floor, v_missed);
            END IF;
            v_cursor.next_floor := least(v_now_us, v_missed) - c_margin;
            -- (the ids running now, not when this transaction first read them: the
            -- read above may have missed what any of them wrote)
            PERFORM pg_stat_clear_snapshot();
            v_cursor.newest_xid := (SELECT x.x::text::bigint FROM treadle._running_xids() AS x(x)
                                     ORDER BY age(x.x) LIMIT 1);
            v_cursor.swept_at := v_now_us;
        END IF;
        -- (where the next call reads from, less a second: an expired lease another session
        -- held is read again then, not only at the next pass from the floor)
        v_cursor.taken_at := least(v_now_us, v_missed);
        PERFORM set_config('treadle.rescue_cursor', v_cursor::text, false);
    END IF;

    -- workflow sleep steps that are due end here too, signal waits time out, and
    -- completed steps left for a re-check whose claims have not come move their runs
    -- (073_workflow_rechecks.sql): each at most 1000 a call. One that did as many
    -- may have left more: the setting treadle.rescue_left says so until the
    -- transaction ends, and a worker calls again at once instead of an interval later.
    v_left := treadle._wake_runs(v_now) >= 1000;
    v_left := treadle._time_out_waits(v_now) >= 1000 OR v_left;
    IF NOT v_citus AND EXISTS (SELECT 1 FROM treadle.run_rechecks) THEN
        v_left := treadle._move_rechecks(NULL, 1000) >= 1000 OR v_left;
    END IF;
    IF v_left THEN
        PERFORM set_config('treadle.rescue_left', 'on', true);
    END IF;

    IF v_count = 0 THEN
        RETURN 0;
    END IF;
    IF v_done IS NOT NULL THEN
        PERFORM treadle._follow_up(v_done);
    END IF;
    IF cardinality(v_fin_q) > 0 THEN
        PERFORM treadle._notify_done(v_fin_q);
    END IF;
    PERFORM treadle._notify('treadle_jobs', q.q) FROM unnest(v_due_q) AS q(q);
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION treadle.rescue() IS
    'Return running jobs whose lease expired to the queue (or discard/cancel them); returns how many.';

--------------------------------------------------------------------------------
-- treadle._hand_back(job_id, lease_token, delay, queue) -> text
--
-- What release and snooze share, their arguments checked: running -> available
-- at now + delay, giving back the attempt its claim took (no error recorded, no
-- attempt spent); -> cancelled when a cancel was requested. Returns the new
-- state, or what treadle._left_by says when the token does not hold the job.
-- queue, when not null, is the job's queue (as for treadle.complete).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._hand_back(job_id bigint, lease_token uuid, delay interval, queue text)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := treadle.now();
    v_run_at timestamptz := v_now + _hand_back.delay;  -- computed here: no CASE around it in the UPDATE
    v_queue  text := _hand_back.queue;
    v_job    treadle.jobs;
BEGIN
    IF v_queue IS NULL THEN
        SELECT j.queue INTO v_queue FROM treadle.jobs AS j WHERE j.id = _hand_back.job_id;
    END IF;
    -- a tenant's token holds only its own queues' jobs: another tenant's leaked token
    -- is treated as a stale one (nothing held, nothing written, nothing told of it)
    IF EXISTS (SELECT FROM treadle.tenants AS t
                WHERE t.tenant_role = treadle._caller_role() AND NOT starts_with(v_queue, t.queue_prefix)) THEN
        v_queue := NULL;
    END IF;
    UPDATE treadle.jobs AS j
       SET state = CASE WHEN j.cancel_requested THEN 'cancelled' ELSE 'available' END,
           attempt = CASE WHEN j.cancel_requested THEN j.attempt ELSE greatest(j.attempt - 1, 0) END,
           run_at = CASE WHEN j.cancel_requested THEN j.run_at ELSE v_run_at END,
           finished_at = CASE WHEN j.cancel_requested THEN v_now END,
           lease_until = NULL,
           ready_txid = pg_current_xact_id()  -- claimable again: claims look for it (040_claim.sql)
     WHERE j.id = _hand_back.job_id
       AND j.queue = v_queue
       AND j.state = 'running'
       AND j.lease_token = _hand_back.lease_token
    RETURNING j.* INTO v_job;

    IF NOT FOUND THEN
        RETURN treadle._left_by(_hand_back.job_id, _hand_back.lease_token, ARRAY['available', 'cancelled'], _hand_back.queue);
    END IF;
    PERFORM treadle._follow_up(ARRAY[v_job]);
    IF v_job.state = 'available' AND v_job.run_at <= v_now THEN
        PERFORM treadle._notify('treadle_jobs', v_job.queue);
    END IF;
    RETURN v_job.state;
END;
$$;
COMMENT ON FUNCTION treadle._hand_back(bigint, uuid, interval, text) IS
    'Hand a running job back for now + delay without spending an attempt (release and snooze).';

--------------------------------------------------------------------------------
-- treadle.release(job_id, lease_token, queue) -> text
--
-- Transition: running -> available now, giving back the attempt its claim took
-- (a worker shutting down hands over work it did not start or cannot finish);
-- -> cancelled when a cancel was requested. Returns the new state, or null when
-- the token does not hold the job. queue, when given, is the job's queue (as for
-- treadle.complete).
-- Raises 22004: job_id or lease_token null.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.release(job_id bigint, lease_token uuid, queue text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM treadle._check_lease_args(release.job_id, release.lease_token);
    RETURN treadle._hand_back(release.job_id, release.lease_token, interval '0', release.queue);
END;
$$;
COMMENT ON FUNCTION treadle.release(bigint, uuid, text) IS
    'Hand a running job back (running -> available, attempt given back); null when the lease is lost.';

--------------------------------------------------------------------------------
-- treadle.snooze(job_id, lease_token, delay, queue) -> text
--
-- Transition: running -> available at now + delay, giving back the attempt its
-- claim took (the handler asked to run later: not a failure, so no error is
-- recorded and no attempt is spent); -> cancelled when a cancel was requested.
-- Returns the new state, or null when the token does not hold the job. queue, when
-- given, is the job's queue (as for treadle.complete).
-- Raises 22004: job_id, lease_token or delay null. 22023: delay negative or over
-- 366 days.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.snooze(job_id bigint, lease_token uuid, delay interval, queue text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM treadle._check_lease_args(snooze.job_id, snooze.lease_token);
    IF snooze.delay IS NULL THEN
        RAISE EXCEPTION 'treadle: delay must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM treadle._check_interval(snooze.delay, 'delay', interval '366 days', may_be_zero => true);
    RETURN treadle._hand_back(snooze.job_id, snooze.lease_token, snooze.delay, snooze.queue);
END;
$$;
COMMENT ON FUNCTION treadle.snooze(bigint, uuid, interval, text) IS
    'Run a running job again after delay without spending an attempt (running -> available); null when the lease is lost.';
