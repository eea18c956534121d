--------------------------------------------------------------------------------
-- Compensation (sagas): a step of a run may name a compensating step
-- (run.compensations: step -> compensation name). When the run fails for good,
-- it becomes `compensating` instead of `failed`: its waiting step jobs are
-- cancelled, and the compensations of its completed steps run one at a time, in
-- reverse order of completion, each a job named 'workflow:<workflow name>/<compensation>' whose
-- `step` is the compensation's name and whose args are {"compensates": step,
-- "result": that step's result}, with the run's attempts. Each runs at least once
-- and never again once completed (its result is recorded on the run under its
-- name). The run ends `compensated` when every one completed, or `failed` when
-- one fails for good (or is cancelled); a retry of that one (treadle.retry) puts
-- the run back to `compensating`, and a retry of a forward step of such a run
-- resumes it forward without running its compensations again.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._check_compensations(steps, sleeps, maps, children, compensations, waits) -> jsonb
--
-- The compensations of a workflow: null or {} is none (null). Otherwise a JSON
-- object mapping a step to the name of its compensating step. Returns the map.
-- Raises 22023, naming the step: compensations not an object; a key that is not
-- a step, or is a sleep, map, child or wait step; a value that is not a valid name
-- (treadle._is_name), is one of the steps, or names another step's compensation
-- too; compensations over the payload size limit.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_compensations(steps text[], sleeps jsonb, maps jsonb, children jsonb,
                                                        compensations jsonb, waits jsonb DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_step  text;
    v_value jsonb;
    v_seen  text[] := '{}'::text[];
BEGIN
    IF compensations IS NULL OR compensations = '{}'::jsonb THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(compensations) <> 'object' THEN
        RAISE EXCEPTION 'treadle: compensations must be a JSON object mapping a step to its compensation''s name, not %',
                        jsonb_typeof(compensations)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM treadle._check_payload(compensations, 'compensations', treadle._max_payload_bytes());
    FOR v_step, v_value IN SELECT e.key, e.value FROM jsonb_each(compensations) AS e ORDER BY e.key LOOP
        IF NOT v_step = ANY (steps) THEN
            RAISE EXCEPTION 'treadle: compensations names step "%", which is not one of the steps', v_step
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF (sleeps IS NOT NULL AND sleeps ? v_step) OR (maps IS NOT NULL AND maps ? v_step)
           OR (children IS NOT NULL AND children ? v_step) OR (waits IS NOT NULL AND waits ? v_step) THEN
            RAISE EXCEPTION 'treadle: step "%" is a sleep, map, child or wait step and cannot name a compensation', v_step
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF jsonb_typeof(v_value) IS DISTINCT FROM 'string' OR NOT coalesce(treadle._is_name(v_value #>> '{}'), false) THEN
            RAISE EXCEPTION 'treadle: step "%" must name its compensation with a valid name, not %', v_step,
                            left(v_value::text, 200)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF (v_value #>> '{}') = ANY (steps) THEN
            RAISE EXCEPTION 'treadle: the compensation of step "%" is named "%", as a step is', v_step, v_value #>> '{}'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF (v_value #>> '{}') = ANY (v_seen) THEN
            RAISE EXCEPTION 'treadle: the compensation of step "%" is named "%", as another step''s is',
                            v_step, v_value #>> '{}'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_seen := v_seen || (v_value #>> '{}');
    END LOOP;
    RETURN compensations;
END;
$$;
COMMENT ON FUNCTION treadle._check_compensations(text[], jsonb, jsonb, jsonb, jsonb, jsonb) IS
    'Check the compensations of a workflow''s steps (22023 naming the step); null for none.';

--------------------------------------------------------------------------------
-- treadle._compensate_next(run_id, at, queue) -> void
--
-- Transition for a `compensating` run (its row locked by the caller): while one
-- of its jobs is waiting or running (a compensation under way, or a step that
-- ran when the run failed), nothing; otherwise the compensation of the completed
-- step that completed last and is not compensated yet -> a job, available now;
-- none left -> the run becomes `compensated`. `queue`: the run's queue, which
-- every statement on the run then names (one shard on Citus); null: found by id.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._compensate_next(run_id bigint, at timestamptz, queue text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_run  treadle.workflow_runs;
    v_step text;
    v_comp text;
    v_queue text;
    v_key  text;
BEGIN
    IF _compensate_next.queue IS NULL THEN
        SELECT * INTO v_run FROM treadle.workflow_runs AS r WHERE r.id = _compensate_next.run_id;
    ELSE
        SELECT * INTO v_run FROM treadle.workflow_runs AS r
         WHERE r.queue = _compensate_next.queue AND r.id = _compensate_next.run_id;
    END IF;
    IF NOT FOUND OR v_run.state <> 'compensating' THEN
        RETURN;
    END IF;
    PERFORM 1 FROM treadle.jobs AS j
     WHERE j.workflow_run_id = v_run.id AND j.state = ANY (ARRAY['available', 'retryable', 'running', 'blocked']);
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT j.step INTO v_step
      FROM treadle.jobs AS j
     WHERE j.workflow_run_id = v_run.id AND j.state = 'completed'
       AND NOT j.args ? 'compensates'
       AND v_run.compensations ? j.step
       AND v_run.results ? j.step
       AND NOT v_run.results ? (v_run.compensations ->> j.step)
     ORDER BY j.finished_at DESC, j.id DESC
     LIMIT 1;
    IF NOT FOUND THEN
        UPDATE treadle.workflow_runs AS r SET state = 'compensated', finished_at = at
         WHERE r.queue = v_run.queue AND r.id = v_run.id
        RETURNING r.* INTO v_run;
        PERFORM treadle._child_run_ended(v_run);  -- 076_workflow_children.sql
        RETURN;
    END IF;
    v_comp := v_run.compensations ->> v_step;
    v_queue := coalesce(v_run.step_options -> v_comp ->> 'queue', v_run.queue);
    v_key := v_run.step_options -> v_comp ->> 'concurrency_key';
    INSERT INTO treadle.jobs
        (queue, name, args, priority, run_at, max_attempts, created_at, workflow_run_id, step, timeout, backoff,
         concurrency_key, state, key_slot, meta, run_queue)
    VALUES
        (v_queue, 'workflow:' || v_run.name || '/' || v_comp,
         jsonb_build_object('compensates', v_step, 'result', v_run.results -> v_step),
         coalesce((v_run.step_options -> v_comp ->> 'priority')::integer, v_run.priority), at,
         coalesce((v_run.step_options -> v_comp ->> 'max_attempts')::integer, v_run.max_attempts), at, v_run.id, v_comp,
         (v_run.step_options -> v_comp ->> 'timeout')::interval,
         treadle._intervals(v_run.step_options -> v_comp -> 'backoff'),
         v_key, CASE WHEN v_key IS NULL THEN 'available' ELSE 'blocked' END, CASE WHEN v_key IS NOT NULL THEN false END,
         v_run.meta, nullif(v_run.queue, v_queue));
    IF v_key IS NULL THEN
        PERFORM treadle._notify('treadle_jobs', v_queue);
    ELSE
        PERFORM treadle._key_release(v_queue, v_key, 0);  -- blocked until its key has room (034_key_lanes.sql)
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._compensate_next(bigint, timestamptz, text) IS
    'Enqueue the next compensation of a compensating workflow run, or end it compensated.';

--------------------------------------------------------------------------------
-- treadle._advance_compensation(run, step) -> void
--
-- treadle._advance_run for a run with compensations when it is `compensating`
-- or the job is a compensation (args ? 'compensates'), the run row locked:
--   a compensation completed: its result is recorded under its name, and the next
--     one starts (treadle._compensate_next);
--   a compensation discarded or cancelled: the run becomes `failed`;
--   a step that ran when the run failed completed: its result is recorded (it is
--     compensated first, having completed last), and compensating goes on.
-- A compensation of a run that is not compensating changes nothing.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._advance_compensation(run treadle.workflow_runs, step treadle.jobs)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := treadle.now();
BEGIN
    IF run.state <> 'compensating' THEN
        RETURN;
    END IF;
    IF step.args ? 'compensates' THEN
        IF step.state = 'completed' THEN
            UPDATE treadle.workflow_runs AS r SET results = r.results || jsonb_build_object(step.step, step.result)
             WHERE r.queue = run.queue AND r.id = run.id;
        ELSIF step.state = ANY (ARRAY['discarded', 'cancelled']) THEN
            UPDATE treadle.workflow_runs AS r SET state = 'failed', finished_at = v_now
             WHERE r.queue = run.queue AND r.id = run.id
            RETURNING r.* INTO run;
            PERFORM treadle._child_run_ended(run);  -- 076_workflow_children.sql
            RETURN;
        END IF;
    ELSIF step.state = 'completed' AND NOT (run.maps IS NOT NULL AND run.maps ? step.step) THEN
        UPDATE treadle.workflow_runs AS r SET results = r.results || jsonb_build_object(step.step, step.result)
         WHERE r.queue = run.queue AND r.id = run.id;
    END IF;
    PERFORM treadle._compensate_next(run.id, v_now, run.queue);
END;
$$;
COMMENT ON FUNCTION treadle._advance_compensation(treadle.workflow_runs, treadle.jobs) IS
    'Move a compensating workflow run on after one of its jobs changed state.';

--------------------------------------------------------------------------------
-- treadle._run_fails() -> trigger (BEFORE UPDATE OF state ON workflow_runs)
--
-- A running run with compensations that some path makes `failed` becomes
-- `compensating` instead (not finished); that statement's caller then calls
-- treadle._run_compensates.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._run_fails()
RETURNS trigger
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    NEW.state := 'compensating';
    NEW.finished_at := NULL;
    RETURN NEW;
END;
$$;
COMMENT ON FUNCTION treadle._run_fails() IS
    'Trigger: a failing workflow run with compensations becomes compensating instead of failed.';

CREATE TRIGGER workflow_runs_fail_compensates
    BEFORE UPDATE OF state ON treadle.workflow_runs
    FOR EACH ROW
    WHEN (OLD.state = 'running' AND NEW.state = 'failed' AND NEW.compensations IS NOT NULL)
    EXECUTE FUNCTION treadle._run_fails();
COMMENT ON TRIGGER workflow_runs_fail_compensates ON treadle.workflow_runs IS
    'A failing run with compensations compensates (treadle._run_fails).';

--------------------------------------------------------------------------------
-- treadle._run_compensates(run_id, queue) -> void
--
-- Called by each statement that fails a running run, when the run became
-- `compensating` instead (treadle._run_fails): its waiting step jobs are
-- cancelled and its child runs under way are cancelled (treadle.cancel_workflow):
-- nothing goes forward; the first compensation starts once no step of it runs
-- (treadle._compensate_next). `queue`: the run's queue. A function its callers
-- call, not a trigger: on Citus a trigger runs on the run's shard, where it may not
-- reach the other shards' jobs and runs.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._run_compensates(run_id bigint, queue text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM treadle.cancel(j.id)
       FROM treadle.jobs AS j
      WHERE j.workflow_run_id = _run_compensates.run_id AND j.state = ANY (ARRAY['available', 'retryable', 'blocked'])
      ORDER BY j.queue, j.concurrency_key, j.id;  -- keys' slots in the one order (034_key_lanes.sql)
    PERFORM treadle.cancel_workflow(c.id)
       FROM treadle.workflow_runs AS c
      WHERE c.parent_run_id = _run_compensates.run_id AND c.state = 'running'
      ORDER BY c.id;
    PERFORM treadle._compensate_next(_run_compensates.run_id, treadle.now(), _run_compensates.queue);
END;
$$;
COMMENT ON FUNCTION treadle._run_compensates(bigint, text) IS
    'A workflow run that began compensating: cancel its waiting steps and start its first compensation.';
