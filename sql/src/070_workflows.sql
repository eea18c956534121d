--------------------------------------------------------------------------------
-- Workflows: a run is an ordered list of steps; each step is a job named
-- 'workflow:<workflow name>' whose `step` column names the step. Completing a
-- step stores its result on the run and enqueues the next step in the same
-- transaction (treadle._advance_run), so a completed step never runs again.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._check_steps(steps) -> void
--
-- Raises 22004 when steps is null, 22023 when treadle._check_names refuses it or
-- it repeats a name.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_steps(steps text[])
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM treadle._check_names(steps, 'steps');
    IF (SELECT count(DISTINCT u.s) FROM unnest(steps) AS u(s)) <> cardinality(steps) THEN
        RAISE EXCEPTION 'treadle: steps must not repeat a name: %', steps
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._check_steps(text[]) IS
    'Raise 22004/22023 for a step list that is null, empty, has empty names or repeats one.';

--------------------------------------------------------------------------------
-- treadle.define_workflow(name, steps) -> void
--
-- Records the ordered step names of a workflow (workers call it when they
-- register one). Replaces an earlier definition for new runs; existing runs
-- keep the steps they started with.
-- Raises 22004: name or steps null. 22023: a name that is not a valid name (see
-- treadle._is_name); steps empty, nested, over 1000, with a bad name, or
-- repeating one. 42501: a tenant's workflow name outside its prefix (a tenant's
-- definitions are named under its queue prefix, so no tenant replaces another's).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.define_workflow(name text, steps text[])
RETURNS void
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM treadle._check_text(define_workflow.name, 'name');
    PERFORM treadle._check_workflow_allowed(define_workflow.name);
    PERFORM treadle._check_steps(define_workflow.steps);

    INSERT INTO treadle.workflows AS w (name, steps, updated_at)
    VALUES (define_workflow.name, define_workflow.steps, treadle.now())
    ON CONFLICT (name) DO UPDATE
       SET steps = excluded.steps, updated_at = excluded.updated_at
     WHERE w.steps IS DISTINCT FROM excluded.steps;
END;
$$;
COMMENT ON FUNCTION treadle.define_workflow(text, text[]) IS
    'Record (or replace) the ordered step names of a workflow.';

--------------------------------------------------------------------------------
-- treadle.start_workflow(name, input, steps, queue, priority, max_attempts,
--                        idempotency_key) -> bigint
--
-- Transition: (none) -> a running run, and its first step job -> available, in
-- the caller's transaction. The run records its step names: `steps`, or when
-- null the definition from treadle.define_workflow. Returns the run id; a
-- workflow idempotency key (a namespace apart from jobs') that a run already
-- holds returns that run's id and starts nothing.
-- Raises 22004: name or queue null. 22023: name, queue or key not a valid name;
-- input neither an object nor an array, over the size limit or nested over 100
-- levels; max_attempts < 1; steps as define_workflow refuses them; no steps given
-- and no definition (unknown workflow). 42501: a tenant's queue or workflow name
-- outside its prefix.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.start_workflow(
    name            text,
    input           jsonb   DEFAULT '{}',
    steps           text[]  DEFAULT NULL,
    queue           text    DEFAULT 'default',
    priority        integer DEFAULT 0,
    max_attempts    integer DEFAULT 25,
    idempotency_key text    DEFAULT NULL
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := treadle.now();
    v_input jsonb;
    v_steps text[] := start_workflow.steps;
    v_run   treadle.workflow_runs;
    v_id    bigint;
BEGIN
    PERFORM treadle._check_text(start_workflow.name, 'name');
    PERFORM treadle._check_workflow_allowed(start_workflow.name);
    PERFORM treadle._check_text(start_workflow.queue, 'queue');
    IF start_workflow.idempotency_key IS NOT NULL THEN
        PERFORM treadle._check_text(start_workflow.idempotency_key, 'idempotency_key');
    END IF;
    v_input := treadle._payload(start_workflow.input, 'input');
    IF start_workflow.priority IS NULL THEN
        RAISE EXCEPTION 'treadle: priority must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF start_workflow.max_attempts IS NULL OR start_workflow.max_attempts < 1 THEN
        RAISE EXCEPTION 'treadle: max_attempts must be at least 1, got %',
                        coalesce(start_workflow.max_attempts::text, 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_steps IS NULL THEN
        SELECT w.steps INTO v_steps FROM treadle.workflows AS w WHERE w.name = start_workflow.name;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'treadle: unknown workflow %', start_workflow.name
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass steps, or register the workflow with a worker (treadle.define_workflow).';
        END IF;
    ELSE
        PERFORM treadle._check_steps(v_steps);
    END IF;
    PERFORM treadle._check_queue_allowed(start_workflow.queue);

    LOOP
        INSERT INTO treadle.workflow_runs AS r
            (name, input, steps, queue, priority, max_attempts, idempotency_key, created_at)
        VALUES
            (start_workflow.name, v_input, v_steps, start_workflow.queue, start_workflow.priority,
             start_workflow.max_attempts, start_workflow.idempotency_key, v_now)
        ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING r.* INTO v_run;

        IF v_run.id IS NOT NULL THEN
            PERFORM treadle._enqueue_step(v_run, v_steps[1], v_now);
            RETURN v_run.id;
        END IF;

        SELECT r.id INTO v_id FROM treadle.workflow_runs AS r
         WHERE r.queue = start_workflow.queue AND r.idempotency_key = start_workflow.idempotency_key;
        IF FOUND THEN
            RETURN v_id;
        END IF;
    END LOOP;
END;
$$;
COMMENT ON FUNCTION treadle.start_workflow(text, jsonb, text[], text, integer, integer, text) IS
    'Start a workflow run and enqueue its first step; returns the run id.';

--------------------------------------------------------------------------------
-- treadle.cancel_workflow(run_id) -> boolean
--
-- Transition: a running run's pending step is cancelled (the run becomes
-- cancelled at once), or its running step gets a cancel request (the run becomes
-- cancelled when that step finishes). Returns false for an unknown run, one that
-- is not running, or one whose cancel is already requested.
-- Raises 22004: run_id null. 42501: a tenant's run outside its queues.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.cancel_workflow(run_id bigint)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_step treadle.jobs;
BEGIN
    IF cancel_workflow.run_id IS NULL THEN
        RAISE EXCEPTION 'treadle: run_id must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM treadle._check_row_allowed(r.queue, 'workflow run') FROM treadle.workflow_runs AS r WHERE r.id = cancel_workflow.run_id;

    -- Jobs are locked before runs on every path; a step that finishes while we
    -- look hands over to the next one, so look again.
    LOOP
        PERFORM 1 FROM treadle.workflow_runs AS r
         WHERE r.id = cancel_workflow.run_id AND r.state = 'running';
        IF NOT FOUND THEN
            RETURN false;
        END IF;

        SELECT * INTO v_step FROM treadle.jobs AS j
         WHERE j.workflow_run_id = cancel_workflow.run_id
           AND j.state = ANY (ARRAY['available', 'retryable', 'running'])
         ORDER BY j.id DESC
         LIMIT 1;
        IF NOT FOUND THEN
            -- a running run without a pending step (its step rows were deleted by hand)
            UPDATE treadle.workflow_runs AS r
               SET state = 'cancelled', finished_at = treadle.now()
             WHERE r.id = cancel_workflow.run_id AND r.state = 'running';
            RETURN FOUND;
        END IF;
        IF v_step.cancel_requested THEN
            RETURN false;
        END IF;
        IF treadle.cancel(v_step.id) THEN
            RETURN true;
        END IF;
    END LOOP;
END;
$$;
COMMENT ON FUNCTION treadle.cancel_workflow(bigint) IS
    'Cancel a running workflow run (its pending step now, or its running step when it finishes).';

--------------------------------------------------------------------------------
-- treadle.workflow_results(run_id) -> jsonb
--
-- The finished steps' results keyed by step name: {} before any step finished,
-- null for an unknown run (or one the caller may not see: it runs with the
-- caller's rights, so row-level security applies).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.workflow_results(run_id bigint)
RETURNS jsonb
LANGUAGE sql
STABLE
BEGIN ATOMIC
    SELECT r.results FROM treadle.workflow_runs AS r WHERE r.id = workflow_results.run_id;
END;
COMMENT ON FUNCTION treadle.workflow_results(bigint) IS
    'A workflow run''s step results keyed by step name; null for an unknown run.';
