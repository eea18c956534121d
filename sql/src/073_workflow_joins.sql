--------------------------------------------------------------------------------
-- Joins last. Two branches of a run that complete at once on two connections
-- take turns on the run row (treadle._advance_run locks it so that a join is
-- enqueued exactly once), and the second waits until the first commits. So
-- inside treadle.complete_and_claim the runs of the steps that may make a join
-- ready (a step that a step with other dependencies runs after; an element of a
-- map step; and the rare others: a compensation, a step of a run that is not
-- running) move after its claim: that lock is held through the commit, not
-- through the claim too. A step whose successors wait for it alone moves its run
-- at once (the claim can take what it enqueued). treadle._advance_run keeps such
-- a step (setting treadle.joins_deferred, one line "<job id><tab><queue>" each)
-- while setting treadle.defer_joins is 'on' (complete_and_claim's finish).
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._advance_deferred() -> void
--
-- The end of treadle.complete_and_claim, after its claim: the steps
-- treadle._advance_run kept move their runs now
-- (treadle._advance_run with each job's row as it is, in id order), and both
-- settings are cleared for the rest of the transaction. The steps these enqueue
-- wake their queues as any step's (treadle._notify_steps).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._advance_deferred()
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_kept text := nullif(current_setting('treadle.joins_deferred', true), '');
    v_job  treadle.jobs;
    v_each text[];
BEGIN
    PERFORM set_config('treadle.defer_joins', '', true);
    IF v_kept IS NULL THEN
        RETURN;
    END IF;
    PERFORM set_config('treadle.joins_deferred', '', true);
    FOR v_each IN
        SELECT string_to_array(k.line, E'\t') FROM unnest(string_to_array(rtrim(v_kept, E'\n'), E'\n')) AS k(line)
         ORDER BY split_part(k.line, E'\t', 1)::bigint
    LOOP
        SELECT * INTO v_job FROM treadle.jobs AS j WHERE j.queue = v_each[2] AND j.id = v_each[1]::bigint;
        IF FOUND THEN
            PERFORM treadle._advance_run(v_job);
        END IF;
    END LOOP;
END;
$$;
COMMENT ON FUNCTION treadle._advance_deferred() IS
    'Move the runs of the workflow steps complete_and_claim kept for after its claim.';
