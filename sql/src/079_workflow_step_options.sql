--------------------------------------------------------------------------------
-- Per-step options. A step of a workflow can have its own queue, priority,
-- max_attempts, timeout and backoff; a step without one takes the run's (queue,
-- priority, max_attempts) or none (timeout, backoff: no limit, the default
-- backoff). The run keeps them in workflow_runs.step_options, and every insert of
-- a step job (treadle._enqueue_step(s), treadle._enqueue_map's elements,
-- treadle._compensate_next) reads them.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._check_step_options(steps, sleeps, waits, children, compensations, step_options) -> jsonb
--
-- The per-step options of a workflow: null or {} is none (null). Otherwise a
-- JSON object mapping a step (one that runs as a job: not a sleep, wait or child
-- step; a compensating step too) to an object of options, each optional:
-- "queue" a queue name, "priority" an integer, "max_attempts" an integer of 1 or
-- more, "timeout" an interval string over 0 and at most 7 days, "backoff" an array
-- of 1 to 100 interval strings each of 0 to 366 days (as treadle.enqueue bounds
-- them), "concurrency_key" a key as treadle.enqueue takes one (1 to 200
-- characters, not only spaces, no control character): the step's jobs go
-- through its admission (034_key_lanes.sql). Returns the map with intervals
-- normalised and empty option objects left out (null when none is left).
-- Raises 22023, naming the step: step_options not an object; a key that is not a
-- step that runs as a job; options not an object, an unknown option, a value out
-- of its bounds; step_options over the payload size limit. 42501: a tenant's step
-- queue outside its prefix.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_step_options(steps text[], sleeps jsonb, waits jsonb, children jsonb,
                                                       compensations jsonb, step_options jsonb)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_step    text;
    v_opts    jsonb;
    v_key     text;
    v_value   jsonb;
    v_out     jsonb;
    v_map     jsonb := '{}'::jsonb;
    v_for     interval;
    v_delays  interval[];
BEGIN
    IF step_options IS NULL OR step_options = '{}'::jsonb OR jsonb_typeof(step_options) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(step_options) <> 'object' THEN
        RAISE EXCEPTION 'treadle: step_options must be a JSON object mapping a step to its options, not %',
                        jsonb_typeof(step_options)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM treadle._check_payload(step_options, 'step_options', treadle._max_payload_bytes());
    FOR v_step, v_opts IN SELECT e.key, e.value FROM jsonb_each(step_options) AS e LOOP
        IF NOT (v_step = ANY (steps)
                OR EXISTS (SELECT 1 FROM jsonb_each_text(compensations) AS c WHERE c.value = v_step)) THEN
            RAISE EXCEPTION 'treadle: step_options names step "%", which is not one of the steps', v_step
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF (sleeps IS NOT NULL AND sleeps ? v_step) OR (waits IS NOT NULL AND waits ? v_step)
           OR (children IS NOT NULL AND children ? v_step) THEN
            RAISE EXCEPTION 'treadle: step "%" is a sleep, wait or child step: it runs no job to set options for', v_step
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF jsonb_typeof(v_opts) <> 'object' THEN
            RAISE EXCEPTION 'treadle: the options of step "%" must be a JSON object, not %', v_step, jsonb_typeof(v_opts)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_out := '{}'::jsonb;
        FOR v_key, v_value IN SELECT o.key, o.value FROM jsonb_each(v_opts) AS o LOOP
            CONTINUE WHEN jsonb_typeof(v_value) = 'null';
            CASE v_key
            WHEN 'queue' THEN
                IF jsonb_typeof(v_value) <> 'string' OR NOT coalesce(treadle._is_name(v_value #>> '{}'), false) THEN
                    RAISE EXCEPTION 'treadle: step "%" has a "queue" that is not a valid queue name: %', v_step,
                                    left(v_value::text, 200)
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
                PERFORM treadle._check_queue_allowed(v_value #>> '{}');
            WHEN 'priority' THEN
                IF NOT treadle._is_int(v_value, -2147483648, 2147483647) THEN
                    RAISE EXCEPTION 'treadle: step "%" has a "priority" that is not an integer: %', v_step,
                                    left(v_value::text, 200)
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
                v_value := to_jsonb((v_value #>> '{}')::numeric::integer);
            WHEN 'max_attempts' THEN
                IF NOT treadle._is_int(v_value, 1, 2147483647) THEN
                    RAISE EXCEPTION 'treadle: step "%" has a "max_attempts" that is not an integer of at least 1: %',
                                    v_step, left(v_value::text, 200)
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
                v_value := to_jsonb((v_value #>> '{}')::numeric::integer);
            WHEN 'timeout' THEN
                v_for := NULL;
                IF jsonb_typeof(v_value) = 'string' THEN
                    BEGIN
                        v_for := (v_value #>> '{}')::interval;
                    EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
                        v_for := NULL;
                    END;
                END IF;
                IF v_for IS NULL OR v_for <= interval '0' OR v_for > interval '7 days' THEN
                    RAISE EXCEPTION 'treadle: step "%" has a "timeout" that is not an interval over 0 and at most 7 days: %',
                                    v_step, left(v_value::text, 200)
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
                v_value := to_jsonb(v_for::text);
            WHEN 'backoff' THEN
                v_delays := NULL;
                IF jsonb_typeof(v_value) = 'array' AND jsonb_array_length(v_value) BETWEEN 1 AND 100
                   AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(v_value) AS b(delay)
                                    WHERE jsonb_typeof(b.delay) <> 'string') THEN
                    BEGIN
                        v_delays := treadle._intervals(v_value);
                    EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
                        v_delays := NULL;
                    END;
                END IF;
                IF v_delays IS NULL OR EXISTS (SELECT 1 FROM unnest(v_delays) AS d(delay)
                                                WHERE d.delay < interval '0' OR d.delay > interval '366 days') THEN
                    RAISE EXCEPTION 'treadle: step "%" has a "backoff" that is not a list of 1 to 100 intervals of 0 to 366 days: %',
                                    v_step, left(v_value::text, 200)
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
                v_value := (SELECT jsonb_agg(d.delay::text ORDER BY d.i) FROM unnest(v_delays) WITH ORDINALITY AS d(delay, i));
            WHEN 'concurrency_key' THEN
                IF jsonb_typeof(v_value) <> 'string' OR NOT treadle._is_name(v_value #>> '{}') THEN
                    RAISE EXCEPTION 'treadle: step "%" has a "concurrency_key" that is not 1 to 200 characters, not only spaces, without control characters: %',
                                    v_step, left(v_value::text, 200)
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
            ELSE
                RAISE EXCEPTION 'treadle: step "%" has an unknown option "%" (queue, priority, max_attempts, timeout, backoff, concurrency_key)',
                                v_step, left(v_key, 200)
                    USING ERRCODE = 'invalid_parameter_value';
            END CASE;
            v_out := v_out || jsonb_build_object(v_key, v_value);
        END LOOP;
        IF v_out <> '{}'::jsonb THEN
            v_map := v_map || jsonb_build_object(v_step, v_out);
        END IF;
    END LOOP;
    RETURN nullif(v_map, '{}'::jsonb);
END;
$$;
COMMENT ON FUNCTION treadle._check_step_options(text[], jsonb, jsonb, jsonb, jsonb, jsonb) IS
    'Check the per-step options of a workflow (22023 naming the step, 42501 outside a tenant''s prefix); null for none.';

--------------------------------------------------------------------------------
-- treadle._check_step_queues(step_options) -> void
--
-- The step queues of a definition, checked against the caller's prefix when a
-- run of it starts (whoever defined it).
-- Raises 42501: a tenant's step queue outside its prefix.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_step_queues(step_options jsonb)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM treadle._check_queue_allowed(o.value ->> 'queue')
       FROM jsonb_each(step_options) AS o
      WHERE o.value ? 'queue';
END;
$$;
COMMENT ON FUNCTION treadle._check_step_queues(jsonb) IS
    'Raise 42501 for a step queue of a workflow outside a tenant''s prefix.';
