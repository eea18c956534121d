--------------------------------------------------------------------------------
-- Workflow signals: a wait step of a run (run.waits) has no handler; it waits for
-- a named signal, which treadle.signal delivers from any SQL client in the
-- caller's transaction, and completes with the signal's payload as its result.
-- A signal sent before the run reaches the wait is kept (treadle.workflow_signals)
-- and consumed when the wait step becomes ready. Both happen under the run row's
-- lock, so each signal completes one wait step at most, and each wait step takes
-- one signal. A wait with a timeout that passes (treadle's clock, at a
-- treadle.rescue) fails the run, or with "on_timeout": "continue" completes with
-- the result {"timed_out": true}, so the steps after it take the timeout path.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._check_waits(steps, sleeps, maps, waits) -> jsonb
--
-- The wait steps of a workflow, checked against its step names and its (checked)
-- sleep and map steps: null or {} is none (null). Otherwise a JSON object mapping
-- a step to {"signal": name} or {"signal": name, "timeout": interval} and
-- optionally "on_timeout": "fail" (the default) or "continue": the name of the
-- signal it waits for, how long it waits at most, and what a timeout does.
-- Returns the map with each timeout normalised ("on_timeout" kept only as
-- "continue").
-- Raises 22023, naming the step: waits not an object; a key that is not a step,
-- or is a sleep or map step; a value that is not such an object (another key, a
-- signal name that is not a valid name, a timeout that is not an interval, not
-- positive or over 366 days, an on_timeout other than "fail" or "continue", or
-- one without a timeout); waits over the payload size limit.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_waits(steps text[], sleeps jsonb, maps jsonb, waits jsonb)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_step    text;
    v_value   jsonb;
    v_timeout interval;
    v_map     jsonb := '{}'::jsonb;
BEGIN
    IF waits IS NULL OR waits = '{}'::jsonb THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(waits) <> 'object' THEN
        RAISE EXCEPTION 'treadle: waits must be a JSON object mapping a step to {"signal": name, "timeout": interval}, not %',
                        jsonb_typeof(waits)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM treadle._check_payload(waits, 'waits', treadle._max_payload_bytes());
    FOR v_step, v_value IN SELECT e.key, e.value FROM jsonb_each(waits) AS e LOOP
        IF NOT v_step = ANY (steps) THEN
            RAISE EXCEPTION 'treadle: waits names step "%", which is not one of the steps', v_step
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF sleeps IS NOT NULL AND sleeps ? v_step THEN
            RAISE EXCEPTION 'treadle: step "%" is a sleep step and cannot wait for a signal', v_step
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF maps IS NOT NULL AND maps ? v_step THEN
            RAISE EXCEPTION 'treadle: step "%" is a map step and cannot wait for a signal', v_step
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF jsonb_typeof(v_value) <> 'object'
           OR EXISTS (SELECT 1 FROM jsonb_object_keys(v_value) AS k(k)
                       WHERE k.k <> ALL (ARRAY['signal', 'timeout', 'on_timeout']))
           OR jsonb_typeof(v_value -> 'signal') IS DISTINCT FROM 'string'
           OR NOT coalesce(treadle._is_name(v_value ->> 'signal'), false) THEN
            RAISE EXCEPTION 'treadle: wait step "%" must be {"signal": name} or {"signal": name, "timeout": interval}, not %',
                            v_step, left(v_value::text, 200)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF v_value ? 'on_timeout' AND (NOT v_value ? 'timeout'
                                        OR v_value -> 'on_timeout' NOT IN ('"fail"'::jsonb, '"continue"'::jsonb)) THEN
            RAISE EXCEPTION 'treadle: wait step "%" takes "on_timeout": "fail" or "continue", with a timeout, not %',
                            v_step, left((v_value -> 'on_timeout')::text, 200)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF v_value ? 'timeout' THEN
            v_timeout := NULL;
            IF jsonb_typeof(v_value -> 'timeout') = 'string' THEN
                BEGIN
                    v_timeout := (v_value ->> 'timeout')::interval;
                EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
                    v_timeout := NULL;
                END;
            END IF;
            IF v_timeout IS NULL THEN
                RAISE EXCEPTION 'treadle: wait step "%" must time out after an interval such as "3 days", not %',
                                v_step, v_value -> 'timeout'
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            IF v_timeout <= interval '0' OR v_timeout > interval '366 days' THEN
                RAISE EXCEPTION 'treadle: wait step "%" must time out after more than 0 and at most 366 days, got %',
                                v_step, v_timeout
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            v_map := v_map || jsonb_build_object(v_step, jsonb_build_object('signal', v_value ->> 'signal',
                                                                            'timeout', v_timeout::text)
                                                         || CASE WHEN v_value ->> 'on_timeout' = 'continue'
                                                                 THEN '{"on_timeout": "continue"}'::jsonb
                                                                 ELSE '{}'::jsonb END);
        ELSE
            v_map := v_map || jsonb_build_object(v_step, jsonb_build_object('signal', v_value ->> 'signal'));
        END IF;
    END LOOP;
    RETURN v_map;
END;
$$;
COMMENT ON FUNCTION treadle._check_waits(text[], jsonb, jsonb, jsonb) IS
    'Check the wait steps of a workflow (22023 naming the step); null for none.';

--------------------------------------------------------------------------------
-- treadle._start_waits(run, steps, at) -> boolean
--
-- Transition: wait steps of a run (run.waits) that just became ready start, in
-- step order: one for which a signal of its name is kept completes at once with
-- the oldest such signal's payload as its result (the signal row goes: consumed);
-- any other becomes a wait under way (run.waiting: step -> {"signal", "until"},
-- "until" being at + its timeout, or null without one; run.wait_until the
-- earliest, where treadle.rescue looks). Returns true when a step completed (the
-- caller looks for the steps that became ready). The caller holds the run row's
-- lock, so no signal is consumed twice.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._start_waits(run treadle.workflow_runs, steps text[], at timestamptz)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_step     text;
    v_signal   text;
    v_payload  jsonb;
    v_done     jsonb := '{}'::jsonb;
    v_waiting  jsonb := '{}'::jsonb;
BEGIN
    FOR v_step IN SELECT u.s FROM unnest(steps) WITH ORDINALITY AS u(s, i) ORDER BY u.i LOOP
        v_signal := run.waits -> v_step ->> 'signal';
        DELETE FROM treadle.workflow_signals AS g
         WHERE g.id = (SELECT k.id FROM treadle.workflow_signals AS k
                        WHERE k.run_id = run.id AND k.name = v_signal
                        ORDER BY k.id LIMIT 1)
        RETURNING g.payload INTO v_payload;
        IF FOUND THEN
            v_done := v_done || jsonb_build_object(v_step, v_payload);
        ELSE
            v_waiting := v_waiting || jsonb_build_object(v_step, jsonb_build_object(
                'signal', v_signal,
                'until', at + (run.waits -> v_step ->> 'timeout')::interval));
        END IF;
    END LOOP;
    IF v_done = '{}'::jsonb AND v_waiting = '{}'::jsonb THEN
        RETURN false;
    END IF;
    UPDATE treadle.workflow_runs AS r
       SET results = r.results || v_done,
           waiting = nullif(coalesce(r.waiting, '{}'::jsonb) || v_waiting, '{}'::jsonb),
           wait_until = (SELECT min((e.value ->> 'until')::timestamptz)
                           FROM jsonb_each(coalesce(r.waiting, '{}'::jsonb) || v_waiting) AS e)
     WHERE r.id = run.id;
    RETURN v_done <> '{}'::jsonb;
END;
$$;
COMMENT ON FUNCTION treadle._start_waits(treadle.workflow_runs, text[], timestamptz) IS
    'Start wait steps of a workflow run: complete those with a kept signal, the others wait.';

--------------------------------------------------------------------------------
-- treadle._time_out_waits(at) -> integer
--
-- Transition: the signal waits under way whose timeout is due at `at` time out.
-- A wait whose definition says "on_timeout": "continue" completes with the result
-- {"timed_out": true}, and the run moves on as after any completed step (or
-- completes). Any other fails the step: the run -> failed (finished_at = at); its
-- waits under way stay in run.waiting, each that timed out marked "timed_out":
-- true, and wait_until becomes null; step jobs of the run still running finish as
-- in any failed run. Only running runs, at most 1000 per call, each locked unless
-- another session holds it (SKIP LOCKED: a later call takes it). Returns how many
-- runs it took: 1000 when more may be due.
-- treadle.rescue calls it (and a worker calls rescue again at once while more are
-- due), so a wait times out at most one rescue interval late while rescues keep up,
-- and never early: the time is treadle's clock.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._time_out_waits(at timestamptz)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_run    treadle.workflow_runs;
    v_due    jsonb;
    v_left   jsonb;
    v_next   timestamptz;
    v_failed integer := 0;
    v_queue  text;
BEGIN
    -- the queues with a wait due, read without locks; then queue by queue (one shard
    -- on Citus), each run locked and what the write sets computed here
    FOR v_queue IN
        SELECT DISTINCT r.queue FROM treadle.workflow_runs AS r
         WHERE r.wait_until <= at AND r.wait_until IS NOT NULL AND r.state = 'running'
    LOOP
        EXIT WHEN v_failed >= 1000;
        FOR v_run IN
            SELECT * FROM treadle.workflow_runs AS r
             WHERE r.queue = v_queue
               AND r.wait_until <= at AND r.wait_until IS NOT NULL AND r.state = 'running'
             ORDER BY r.wait_until
             LIMIT 1000 - v_failed
               FOR UPDATE SKIP LOCKED
        LOOP
            v_failed := v_failed + 1;
            SELECT jsonb_object_agg(e.key, v_run.waits -> e.key ->> 'on_timeout') INTO v_due
              FROM jsonb_each(v_run.waiting) AS e
             WHERE (e.value ->> 'until')::timestamptz <= at;
            IF v_due IS NULL THEN
                -- (nothing due after all: wait_until is set again from the waits)
                v_next := (SELECT min((e.value ->> 'until')::timestamptz) FROM jsonb_each(v_run.waiting) AS e);
                UPDATE treadle.workflow_runs AS r
                   SET wait_until = v_next
                 WHERE r.queue = v_run.queue AND r.id = v_run.id;
                CONTINUE;
            END IF;
            IF NOT EXISTS (SELECT 1 FROM jsonb_each_text(v_due) AS d WHERE d.value IS DISTINCT FROM 'continue') THEN
                -- every wait due continues: it completes as timed out
                v_left := v_run.waiting - ARRAY(SELECT jsonb_object_keys(v_due));
                v_next := (SELECT min((e.value ->> 'until')::timestamptz) FROM jsonb_each(v_left) AS e);
                UPDATE treadle.workflow_runs AS r
                   SET results = r.results || (SELECT jsonb_object_agg(d.key, '{"timed_out": true}'::jsonb)
                                                 FROM jsonb_each(v_due) AS d),
                       waiting = nullif(v_left, '{}'::jsonb),
                       wait_until = v_next
                 WHERE r.queue = v_run.queue AND r.id = v_run.id
                RETURNING r.* INTO v_run;
                IF treadle._has_every_result(v_run) THEN
                    UPDATE treadle.workflow_runs AS r SET state = 'completed', finished_at = at
                     WHERE r.queue = v_run.queue AND r.id = v_run.id
                    RETURNING r.* INTO v_run;
                    PERFORM treadle._child_run_ended(v_run);  -- 076_workflow_children.sql
                ELSE
                    PERFORM treadle._enqueue_ready(v_run, at);
                END IF;
                CONTINUE;
            END IF;
            v_left := (SELECT jsonb_object_agg(e.key, CASE WHEN (e.value ->> 'until')::timestamptz <= at
                                                          THEN e.value || '{"timed_out": true}'::jsonb
                                                          ELSE e.value END)
                         FROM jsonb_each(v_run.waiting) AS e);
            UPDATE treadle.workflow_runs AS r
               SET state = 'failed', finished_at = at, wait_until = NULL, waiting = v_left
             WHERE r.queue = v_run.queue AND r.id = v_run.id
            RETURNING r.* INTO v_run;
            PERFORM treadle._child_run_ended(v_run);  -- 076_workflow_children.sql
            IF v_run.state = 'compensating' THEN
                PERFORM treadle._run_compensates(v_run.id, v_run.queue);  -- 078_workflow_compensation.sql
            END IF;
        END LOOP;
    END LOOP;
    RETURN v_failed;
END;
$$;
COMMENT ON FUNCTION treadle._time_out_waits(timestamptz) IS
    'Time out the due signal waits of running workflow runs (fail the run, or continue); returns how many runs it took (1000: more may be due).';

--------------------------------------------------------------------------------
-- treadle._signal(run_id, name, payload) -> text
--
-- treadle.signal with its arguments checked and the caller allowed: see there.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._signal(run_id bigint, name text, payload jsonb)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now  timestamptz := treadle.now();
    v_run  treadle.workflow_runs;
    v_step text;
    v_open bigint;
    v_kept bigint;
BEGIN
    -- the run row's lock: fan-in, wait starts and other signals take turns on it
    SELECT * INTO v_run FROM treadle.workflow_runs AS r WHERE r.id = _signal.run_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'unknown';
    END IF;
    IF v_run.state <> 'running' THEN
        RETURN 'finished';
    END IF;
    IF v_run.waits IS NULL THEN
        RETURN 'ignored';
    END IF;

    -- a wait under way for it whose timeout has not passed, the first in step order
    -- (one past it timed out then: treadle.rescue moves it on that path, however late)
    SELECT u.s INTO v_step FROM unnest(v_run.steps) WITH ORDINALITY AS u(s, i)
     WHERE v_run.waiting -> u.s ->> 'signal' = _signal.name
       AND NOT coalesce((v_run.waiting -> u.s ->> 'until')::timestamptz <= v_now, false)
     ORDER BY u.i LIMIT 1;
    IF FOUND THEN
        UPDATE treadle.workflow_runs AS r
           SET results = r.results || jsonb_build_object(v_step, _signal.payload),
               waiting = nullif(r.waiting - v_step, '{}'::jsonb),
               wait_until = (SELECT min((e.value ->> 'until')::timestamptz) FROM jsonb_each(r.waiting - v_step) AS e)
         WHERE r.id = v_run.id
        RETURNING r.* INTO v_run;
        IF treadle._has_every_result(v_run) THEN
            UPDATE treadle.workflow_runs AS r SET state = 'completed', finished_at = v_now
             WHERE r.queue = v_run.queue AND r.id = v_run.id
            RETURNING r.* INTO v_run;
            PERFORM treadle._child_run_ended(v_run);  -- 076_workflow_children.sql
        ELSE
            PERFORM treadle._enqueue_ready(v_run, v_now, v_step);
        END IF;
        RETURN 'delivered';
    END IF;

    -- kept for a wait of its name the run has not reached, one signal per such wait
    SELECT count(*) INTO v_open FROM jsonb_each(v_run.waits) AS w
     WHERE w.value ->> 'signal' = _signal.name
       AND NOT v_run.results ? w.key
       AND NOT coalesce(v_run.waiting, '{}'::jsonb) ? w.key;
    SELECT count(*) INTO v_kept FROM treadle.workflow_signals AS g
     WHERE g.run_id = v_run.id AND g.name = _signal.name;
    IF v_open <= v_kept THEN
        RETURN 'ignored';
    END IF;
    INSERT INTO treadle.workflow_signals (run_id, queue, name, payload, sent_at)
    VALUES (v_run.id, v_run.queue, _signal.name, _signal.payload, v_now);
    RETURN 'kept';
END;
$$;
COMMENT ON FUNCTION treadle._signal(bigint, text, jsonb) IS
    'Deliver a signal to a workflow run, or keep it for a wait the run has not reached.';

--------------------------------------------------------------------------------
-- treadle.signal(run_id, name, payload) -> text
--
-- Transition, in the caller's transaction (rolled back, nothing was delivered),
-- under the run row's lock:
--   'delivered': a wait step of the run waits for this name now (the first in
--     step order when several do): it completes with the payload as its result,
--     and the run moves on as after any completed step (or completes);
--   'kept': a wait step for this name has not started yet: the signal is kept
--     (treadle.workflow_signals) and that wait takes it, the oldest first, when it
--     becomes ready; at most one signal is kept per such wait step;
--   'ignored': the run is running but waits for no (further) signal of this name:
--     no wait step for it, or each has completed, waits already or has a signal
--     kept, or waits past its timeout (it timed out then, on treadle's clock, even
--     before treadle.rescue moves it on its timeout path). Nothing is written;
--   'finished': the run is not running (completed, failed, cancelled,
--     compensating, compensated): nothing is written;
--   'unknown': no such run: nothing is written.
-- Raises 22004: run_id or name null. 22023: name not a valid name; payload
-- neither an object nor an array, over the size limit or nested over 100 levels
-- (null is {}). 42501: a tenant's run outside its queues (naming nothing of it).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.signal(run_id bigint, name text, payload jsonb DEFAULT '{}')
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_payload jsonb;
BEGIN
    IF signal.run_id IS NULL THEN
        RAISE EXCEPTION 'treadle: run_id must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM treadle._check_text(signal.name, 'name');
    v_payload := treadle._payload(signal.payload, 'payload');
    PERFORM treadle._check_row_allowed(r.queue, 'workflow run') FROM treadle.workflow_runs AS r WHERE r.id = signal.run_id;
    RETURN treadle._signal(signal.run_id, signal.name, v_payload);
END;
$$;
COMMENT ON FUNCTION treadle.signal(bigint, text, jsonb) IS
    'Send a named signal to a workflow run: delivered to its wait, kept for it, ignored, finished or unknown.';

--------------------------------------------------------------------------------
-- treadle.signal_by_key(queue, idempotency_key, name, payload) -> text
--
-- treadle.signal for the run started in `queue` with the workflow idempotency key
-- `idempotency_key` (treadle.start_workflow): the same transitions and returns;
-- 'unknown' when no run holds the key.
-- Raises 22004: queue, idempotency_key or name null. 22023: any of them not a
-- valid name; payload as treadle.signal refuses it. 42501: a tenant's queue
-- outside its prefix.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.signal_by_key(queue text, idempotency_key text, name text,
                                                 payload jsonb DEFAULT '{}')
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_payload jsonb;
    v_id      bigint;
BEGIN
    PERFORM treadle._check_text(signal_by_key.queue, 'queue');
    PERFORM treadle._check_text(signal_by_key.idempotency_key, 'idempotency_key');
    PERFORM treadle._check_text(signal_by_key.name, 'name');
    v_payload := treadle._payload(signal_by_key.payload, 'payload');
    PERFORM treadle._check_queue_allowed(signal_by_key.queue);
    SELECT r.id INTO v_id FROM treadle.workflow_runs AS r
     WHERE r.queue = signal_by_key.queue AND r.idempotency_key = signal_by_key.idempotency_key;
    IF NOT FOUND THEN
        RETURN 'unknown';
    END IF;
    RETURN treadle._signal(v_id, signal_by_key.name, v_payload);
END;
$$;
COMMENT ON FUNCTION treadle.signal_by_key(text, text, text, jsonb) IS
    'treadle.signal for the run started in a queue with a workflow idempotency key.';
