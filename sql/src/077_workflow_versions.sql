--------------------------------------------------------------------------------
-- Workflow versions and rolling deploys. A step job is named
-- 'workflow:<workflow name>/<step>' (050_finish.sql), and a worker claims the
-- step jobs of the steps it has handlers for by those names: such a name holds
-- two names, so job names given to claim and worker_seen may be longer than
-- other names.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._are_job_names(value) -> boolean
--
-- True for a list of job names that claim and worker_seen accept: 1 to 1,000
-- names, one dimension, each as treadle._is_name accepts a name but up to 410
-- characters long ('workflow:', a workflow name, '/' and a step name).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._are_job_names(value text[])
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_name text;
BEGIN
    IF value IS NULL OR cardinality(value) NOT BETWEEN 1 AND 1000 OR array_ndims(value) <> 1 THEN
        RETURN false;
    END IF;
    FOREACH v_name IN ARRAY value LOOP
        IF v_name IS NULL OR btrim(v_name) = '' OR length(v_name) > 410 OR v_name ~ '[[:cntrl:]]' THEN
            RETURN false;
        END IF;
    END LOOP;
    RETURN true;
END;
$$;
COMMENT ON FUNCTION treadle._are_job_names(text[]) IS
    'True for a list of 1 to 1000 job names (step job names included: up to 410 characters each).';

--------------------------------------------------------------------------------
-- treadle._check_job_names(value, argument) -> void
--
-- Raises 22004 when value is null, 22023 when treadle._are_job_names refuses it.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_job_names(value text[], argument text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'treadle: % must not be null', argument
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF cardinality(value) = 0 OR array_ndims(value) <> 1 OR cardinality(value) > 1000 THEN
        RAISE EXCEPTION 'treadle: % must be a list of 1 to 1000 names', argument
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT treadle._are_job_names(value) THEN
        RAISE EXCEPTION 'treadle: % must hold job names of 1 to 410 characters, not only spaces, without control characters',
                        argument
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._check_job_names(text[], text) IS
    'Raise 22004 for a null list of job names, 22023 for an empty, nested or over-long one or a bad name.';

--------------------------------------------------------------------------------
-- treadle.step_sleep(job_id, lease_token, seq, delay, until) -> interval
--
-- Transition: none here; what a running workflow step's `ctx.sleep` records. The
-- step's seq-th sleep (0 for its first ctx.sleep call, 1 for the next, in the
-- order the handler makes them) ends at a wake time recorded on its run
-- (workflow_runs.step_sleeps: step job id -> wake times, by seq) the first time it
-- is asked: until, or now + delay, on treadle's clock. Later attempts of the step
-- (after a snooze, a retry or a rescue) find it there. Returns how long is left
-- until that wake time (zero once it has passed): the worker then snoozes the job
-- (treadle.snooze: running -> available at the wake time, its attempt given back,
-- no worker held) and the step runs again from the start, passing the sleeps that
-- have ended. Null when the token does not hold the job (nothing recorded).
-- Raises 22004: job_id, lease_token or seq null, or neither delay nor until
-- given. 22023: both given; delay negative or over 366 days; until over 366 days
-- ahead; seq outside 0..99 or past the step's next sleep (a sleep skipped); the
-- job not a workflow step.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.step_sleep(
    job_id      bigint,
    lease_token uuid,
    seq         integer,
    delay       interval    DEFAULT NULL,
    until       timestamptz DEFAULT NULL
)
RETURNS interval
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    c_max_sleeps CONSTANT integer := 100;  -- ctx.sleep calls a step may make
    v_now   timestamptz := treadle.now();
    v_run   bigint;
    v_wakes jsonb;
    v_wake  timestamptz;
    v_prefix text;
BEGIN
    PERFORM treadle._check_lease_args(step_sleep.job_id, step_sleep.lease_token);
    IF step_sleep.seq IS NULL THEN
        RAISE EXCEPTION 'treadle: seq must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF step_sleep.seq NOT BETWEEN 0 AND c_max_sleeps - 1 THEN
        RAISE EXCEPTION 'treadle: seq must be between 0 and %, got %', c_max_sleeps - 1, step_sleep.seq
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF step_sleep.delay IS NULL AND step_sleep.until IS NULL THEN
        RAISE EXCEPTION 'treadle: give delay or until' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF step_sleep.delay IS NOT NULL AND step_sleep.until IS NOT NULL THEN
        RAISE EXCEPTION 'treadle: give delay or until, not both' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM treadle._check_interval(step_sleep.delay, 'delay', interval '366 days', may_be_zero => true);
    IF step_sleep.until > v_now + interval '366 days' OR NOT isfinite(step_sleep.until) THEN
        RAISE EXCEPTION 'treadle: until must be at most 366 days ahead, got %', step_sleep.until
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- a tenant's token holds only its own queues' jobs (another tenant's is stale)
    v_prefix := treadle._caller_prefix();
    -- the job first, then its run: the order of every path that locks both
    SELECT j.workflow_run_id INTO v_run FROM treadle.jobs AS j
     WHERE j.id = step_sleep.job_id AND j.state = 'running' AND j.lease_token = step_sleep.lease_token
       AND starts_with(j.queue, v_prefix)
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF v_run IS NULL THEN
        RAISE EXCEPTION 'treadle: job % is not a workflow step: only steps sleep (a job snoozes)', step_sleep.job_id
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT coalesce(r.step_sleeps -> step_sleep.job_id::text, '[]'::jsonb) INTO v_wakes
      FROM treadle.workflow_runs AS r WHERE r.id = v_run FOR UPDATE;
    IF step_sleep.seq < jsonb_array_length(v_wakes) THEN
        v_wake := (v_wakes ->> step_sleep.seq)::timestamptz;
    ELSIF step_sleep.seq = jsonb_array_length(v_wakes) THEN
        v_wake := coalesce(step_sleep.until, v_now + step_sleep.delay);
        UPDATE treadle.workflow_runs AS r
           SET step_sleeps = coalesce(r.step_sleeps, '{}'::jsonb)
                             || jsonb_build_object(step_sleep.job_id::text, v_wakes || to_jsonb(v_wake))
         WHERE r.id = v_run;
    ELSE
        RAISE EXCEPTION 'treadle: seq % skips a sleep: job % has recorded % sleep(s)', step_sleep.seq,
                        step_sleep.job_id, jsonb_array_length(v_wakes)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN greatest(v_wake - v_now, interval '0');
END;
$$;
COMMENT ON FUNCTION treadle.step_sleep(bigint, uuid, integer, interval, timestamptz) IS
    'Record (once) when a running step''s seq-th ctx.sleep ends; how long is left (0 once passed), null when the lease is lost.';
