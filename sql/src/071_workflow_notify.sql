--------------------------------------------------------------------------------
-- Waking workers for workflow steps. A step job is written by the transaction
-- that finishes the step before it, most often a worker's. A transaction that
-- sent NOTIFY takes one lock at commit, the same for every session, and holds it
-- through the commit's WAL flush: finishing workers that notify commit one at a
-- time. So a step's queue is told (NOTIFY treadle_jobs) only when a worker may
-- be idle and waiting for it:
--   - not when a job of the same queue and name has waited, claimable, for
--     50 ms or more: the workers that run it have no free slot (an idle one would
--     have taken it), and each takes the next waiting job when one frees, with
--     the claim that goes along its finish;
--   - not from treadle.complete_and_claim when its own claim took the step: the
--     finishing worker runs it next. The steps it writes are told of after its
--     claim, and only those still waiting (treadle._notify_left_steps).
-- NOTIFY stays a hint: a worker polls anyway (poll_interval), so a wake-up left
-- out on a race delays a step by at most that long.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._notify_steps(ids) -> void
--
-- Step jobs `ids` were just written: NOTIFY treadle_jobs for each queue where
-- one of them waits that no job of its queue and name waiting claimable for
-- 50 ms or more stands before. Inside treadle.complete_and_claim (setting
-- treadle.claim_follows 'on' for the transaction) the ids are kept (setting
-- treadle.steps_written) for treadle._notify_left_steps instead.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._notify_steps(ids bigint[])
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF ids IS NULL OR cardinality(ids) = 0 THEN
        RETURN;
    END IF;
    IF current_setting('treadle.claim_follows', true) = 'on' THEN
        PERFORM set_config('treadle.steps_written',
                           concat_ws(',', nullif(current_setting('treadle.steps_written', true), ''),
                                     array_to_string(ids, ',')),
                           true);
        RETURN;
    END IF;
    PERFORM treadle._notify('treadle_jobs', q.queue)
       FROM (SELECT DISTINCT j.queue
               FROM treadle.jobs AS j
              WHERE j.id = ANY (ids)
                AND j.state = 'available'
                AND NOT EXISTS (SELECT 1 FROM treadle.jobs AS o
                                 WHERE o.queue = j.queue AND o.name = j.name
                                   AND o.state = ANY (ARRAY['available', 'retryable'])
                                   AND o.run_at <= j.run_at - interval '50 milliseconds')) AS q;
END;
$$;
COMMENT ON FUNCTION treadle._notify_steps(bigint[]) IS
    'Wake workers for step jobs just written, unless the queue''s workers are busy or the finishing worker claims them.';

--------------------------------------------------------------------------------
-- treadle._notify_left_steps() -> void
--
-- The end of treadle.complete_and_claim: the step jobs its finish wrote
-- (setting treadle.steps_written) that its claim left waiting are told of as
-- treadle._notify_steps tells them; both settings are cleared for the rest of
-- the transaction.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._notify_left_steps()
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_written text := nullif(current_setting('treadle.steps_written', true), '');
BEGIN
    PERFORM set_config('treadle.claim_follows', '', true);
    IF v_written IS NOT NULL THEN
        PERFORM set_config('treadle.steps_written', '', true);
        PERFORM treadle._notify_steps(string_to_array(v_written, ',')::bigint[]);
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._notify_left_steps() IS
    'Wake workers for the step jobs a complete_and_claim wrote and did not claim itself.';
