-- Sleep steps until a time (issue 23): define_workflow's sleeps map a step to
-- {"until": time} or {"until": {"input": key}} as well as to an interval
-- (treadle._check_sleeps); here the time is read and bounded, and a sleep until a
-- time already past ends at once.

--------------------------------------------------------------------------------
-- treadle._sleep_until(step, value, what, since) -> timestamptz
--
-- The time a sleep step sleeps until, from `value`: a JSON string holding a
-- timestamptz ('2027-01-04 09:00+00'; without an offset, in the session's time
-- zone). `what` says where it came from, for the message.
-- Raises 22023, naming the step: value not a string or not a timestamptz, not
-- finite, or over 366 days after `since` (the longest a sleep waits).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._sleep_until(step text, value jsonb, what text, since timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_at timestamptz;
BEGIN
    IF jsonb_typeof(value) = 'string' THEN
        BEGIN
            v_at := (value #>> '{}')::timestamptz;
        EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR invalid_time_zone_displacement_value
                       OR invalid_parameter_value THEN
            v_at := NULL;
        END;
    END IF;
    IF v_at IS NULL OR NOT isfinite(v_at) THEN
        RAISE EXCEPTION 'treadle: sleep step "%" sleeps until %, which must be a time such as "2027-01-04 09:00+00", not %',
                        step, what, coalesce(value::text, 'missing')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_at > since + interval '366 days' THEN
        RAISE EXCEPTION 'treadle: sleep step "%" sleeps until at most 366 days after %, got %', step, since, v_at
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN v_at;
END;
$$;
COMMENT ON FUNCTION treadle._sleep_until(text, jsonb, text, timestamptz) IS
    'The time a sleep step sleeps until, checked (22023 naming the step).';

--------------------------------------------------------------------------------
-- treadle._sleep_wake(run, step, at) -> timestamptz
--
-- When a sleep step of a run that becomes ready at `at` ends: `at` plus its
-- interval, or the time it sleeps until (run.sleeps: {"until": time}, checked at
-- define time, or {"until": {"input": key}}, the run's input holding the time
-- under that key), or `at` for a time already past.
-- Raises 22023, naming the step: the input's time missing, not a timestamptz, not
-- finite or over 366 days after `at` (treadle._sleep_until; the step that
-- completed before it stays running, a run that would start with it does not start).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._sleep_wake(run treadle.workflow_runs, step text, at timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_value jsonb := run.sleeps -> step;
    v_until jsonb;
BEGIN
    IF jsonb_typeof(v_value) = 'string' THEN
        RETURN at + (v_value #>> '{}')::interval;
    END IF;
    v_until := v_value -> 'until';
    IF jsonb_typeof(v_until) = 'object' THEN
        RETURN greatest(at, treadle._sleep_until(step, run.input -> (v_until ->> 'input'),
                                                 format('the input''s "%s"', v_until ->> 'input'), at));
    END IF;
    RETURN greatest(at, (v_until #>> '{}')::timestamptz);
END;
$$;
COMMENT ON FUNCTION treadle._sleep_wake(treadle.workflow_runs, text, timestamptz) IS
    'When a sleep step of a workflow run that becomes ready ends: after its interval or at its time.';

--------------------------------------------------------------------------------
-- treadle._end_due_sleeps(run, at) -> void
--
-- Transition: the sleeps under way of a run that are due at `at` (a sleep until a
-- time already past, which just started) end at once: each sleep step completes
-- with the time it ended as its result, as treadle._wake_runs ends them. The
-- caller holds the run row's lock and moves the run on (treadle._enqueue_ready).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._end_due_sleeps(run treadle.workflow_runs, at timestamptz)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_wakes jsonb;
    v_due   jsonb;
    v_left  jsonb;
BEGIN
    SELECT r.wakes INTO v_wakes FROM treadle.workflow_runs AS r WHERE r.queue = run.queue AND r.id = run.id;
    SELECT jsonb_object_agg(e.key, e.value) INTO v_due
      FROM jsonb_each(v_wakes) AS e
     WHERE e.value::text::timestamptz <= at;
    IF v_due IS NULL THEN
        RETURN;
    END IF;
    v_left := v_wakes - ARRAY(SELECT jsonb_object_keys(v_due));
    UPDATE treadle.workflow_runs AS r
       SET results = r.results || v_due,
           wakes = nullif(v_left, '{}'::jsonb),
           wake_at = (SELECT min(e.value::text::timestamptz) FROM jsonb_each(v_left) AS e)
     WHERE r.queue = run.queue AND r.id = run.id;
END;
$$;
COMMENT ON FUNCTION treadle._end_due_sleeps(treadle.workflow_runs, timestamptz) IS
    'End at once the sleeps under way of a workflow run that are already due.';
