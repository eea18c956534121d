--------------------------------------------------------------------------------
-- Re-checks: a branch that does not wait for its run. treadle._advance_run locks a
-- run's row to move it, so that a join is enqueued exactly once; two branches of a
-- run that complete at once on two connections took turns on it, and the second
-- waited for the first's commit (its WAL flush). Now a completed step of a graph
-- run (not an element of a map step, not a compensation) tries the row with SKIP
-- LOCKED; when another transaction holds it, the step is written to
-- treadle.run_rechecks in the finishing transaction, which commits without waiting,
-- and wakes its queue. The run is moved later, by treadle._advance_run with the
-- step's row, under the run row's lock, by a transaction that starts after both
-- committed and so sees both steps done: the next claim on the step's queue
-- (treadle.claim, treadle.complete_and_claim at its end) or treadle.rescue. That
-- transaction deletes the re-check with it; re-checks are taken with SKIP LOCKED (two
-- movers never take the same one), and a run another transaction holds keeps its
-- re-checks for the next. A step whose result the run already has is not moved
-- again. Not on Citus (treadle._distributed): there a branch waits, as before.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._may_recheck(after, maps, compensations, step, args) -> boolean
--
-- The one test of which completed steps may be left for a re-check, on what never
-- changes in a run (its after, maps and compensations) and the step's job (its
-- name and args): a step of a graph run (after not null) that is not a map step's
-- element and not a compensation. treadle._recheck_later adds the run's state (a
-- compensating run's steps wait for its row); treadle._lock_batch_runs, which reads
-- the run without its lock, adds compensations null instead, so that a state
-- changed since its read (a run that became compensating) never makes a branch wait
-- for a run row the batch did not lock up front. SQL, inlined where it is used.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._may_recheck(after jsonb, maps jsonb, compensations jsonb, step text, args jsonb)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
RETURN after IS NOT NULL
       AND (maps IS NULL OR NOT maps ? step)
       AND (compensations IS NULL OR NOT args ? 'compensates');
COMMENT ON FUNCTION treadle._may_recheck(jsonb, jsonb, jsonb, text, jsonb) IS
    'Whether a completed step of a run with these after, maps and compensations may be left for a re-check.';

--------------------------------------------------------------------------------
-- treadle._recheck_later(step, run_queue) -> boolean
--
-- Transition: (none) -> a re-check of the step (treadle.run_rechecks), when the
-- step is a completed step of a graph run, not a map step's element nor a
-- compensation, and its run exists (its row held by another transaction: the
-- caller's SKIP LOCKED found none); its queue's workers hear of it
-- (treadle_jobs) unless they are busy: a claimable job of the queue has waited
-- 50 ms. Returns whether it did; false: the caller waits for the row.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._recheck_later(step treadle.jobs, run_queue text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := treadle.now();
BEGIN
    IF step.state <> 'completed' OR NOT EXISTS (
            SELECT 1 FROM treadle.workflow_runs AS r
             WHERE r.queue = run_queue
               AND r.id = step.workflow_run_id
               AND treadle._may_recheck(r.after, r.maps, r.compensations, step.step, step.args)
               AND (r.compensations IS NULL OR r.state <> 'compensating')) THEN
        RETURN false;
    END IF;
    INSERT INTO treadle.run_rechecks (queue, job_id, run_queue, run_id, added_at)
    VALUES (step.queue, step.id, run_queue, step.workflow_run_id, v_now)
    ON CONFLICT DO NOTHING;
    -- its queue's workers are told unless they are busy: its first claimable job (one
    -- descent of the claim index) has waited 50 ms or more (an idle worker would have
    -- taken it, and the next claim moves this re-check). A transaction that notified
    -- takes one lock at commit, the same for every session (071_workflow_notify.sql).
    IF (SELECT o.run_at > v_now - interval '50 milliseconds' FROM treadle.jobs AS o
         WHERE o.queue = step.queue AND o.state = ANY (ARRAY['available', 'retryable'])
         ORDER BY o.priority, o.run_at, o.id
         LIMIT 1) IS NOT false THEN
        PERFORM treadle._notify('treadle_jobs', step.queue);
    END IF;
    RETURN true;
END;
$$;
COMMENT ON FUNCTION treadle._recheck_later(treadle.jobs, text) IS
    'Leave a completed graph step whose run row another transaction holds for a later move of its run.';

--------------------------------------------------------------------------------
-- treadle._move_rechecks(queues, max) -> integer
--
-- Transition: re-checks of steps of these queues (null: of any queue), oldest
-- first, that no other transaction holds, until `max` of them are done (moved or
-- deleted; a re-check that stays does not count, and at most 2 * max are tried, so
-- stuck ones never hold up those behind them for long): each whose run row no other
-- transaction holds is deleted, and its run moves as after the step
-- (treadle._advance_run with the job's row as it is now), unless the run already
-- has the step's result; a re-check whose run or job is gone is deleted. A re-check
-- whose run another transaction holds stays for the next. A step that ended
-- cancelled cancels its run (treadle._cancel_now), or stays for the next while
-- another transaction holds a job of its run's tree. A re-check that stays goes to
-- the back of the line (added_at: after every re-check of these queues), so that
-- re-checks a long transaction keeps from their runs are not the first tried by
-- every later call while newer ones wait behind them. Returns how many steps
-- moved their runs; the queues of the runs moved hear treadle_done (their waiters,
-- treadle._notify_done). Locks nothing it waits for but what treadle._advance_run does
-- after the run (a parent run, when a child run ends), and a cancelled step's run
-- tree's runs, after its jobs, none of which it waits for. Under REPEATABLE READ or
-- SERIALIZABLE it moves nothing (the next claim in READ COMMITTED does).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._move_rechecks(queues text[], max integer DEFAULT 100)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_queues  text[];
    v_ids     bigint[];
    v_r_queue text[];
    v_r_ids   bigint[];
    v_run     treadle.workflow_runs;
    v_job     treadle.jobs;
    v_moved   integer := 0;
    v_cancel  boolean;
    v_ended   text[] := '{}'::text[];  -- the queues of the runs moved here (treadle_done)
    v_stay_q  text[] := '{}'::text[];  -- the re-checks that stay (their queues and job ids)
    v_stay    bigint[] := '{}'::bigint[];
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN 0;  -- (a run row changed since the transaction's snapshot would raise 40001)
    END IF;
    IF queues IS NULL THEN
        SELECT array_agg(c.queue), array_agg(c.job_id), array_agg(c.run_queue), array_agg(c.run_id)
          INTO v_queues, v_ids, v_r_queue, v_r_ids
          FROM (SELECT c.queue, c.job_id, c.run_queue, c.run_id FROM treadle.run_rechecks AS c
                 ORDER BY c.added_at, c.queue, c.job_id
                 LIMIT 2 * max
                   FOR UPDATE SKIP LOCKED) AS c;
    ELSE
        SELECT array_agg(c.queue), array_agg(c.job_id), array_agg(c.run_queue), array_agg(c.run_id)
          INTO v_queues, v_ids, v_r_queue, v_r_ids
          FROM (SELECT c.queue, c.job_id, c.run_queue, c.run_id FROM treadle.run_rechecks AS c
                 WHERE c.queue = ANY (queues)
                 ORDER BY c.added_at, c.queue, c.job_id  -- (the oldest first: a steady stream never starves one)
                 LIMIT 2 * max
                   FOR UPDATE SKIP LOCKED) AS c;
    END IF;
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;
    FOR i IN 1 .. cardinality(v_ids) LOOP
        EXIT WHEN i - cardinality(v_stay) > max;  -- `max` done: the rest are left for the next
        v_cancel := treadle._cancel_now(v_queues[i], v_ids[i]);  -- 073_workflow_cancel_rechecks.sql
        IF v_cancel IS NOT NULL THEN  -- (a step that ended cancelled: moved, or left for the next)
            v_moved := v_moved + v_cancel::integer;
            IF v_cancel THEN
                v_ended := v_ended || v_r_queue[i];
            ELSE
                v_stay_q := v_stay_q || v_queues[i];
                v_stay := v_stay || v_ids[i];
            END IF;
            CONTINUE;
        END IF;
        SELECT * INTO v_run FROM treadle.workflow_runs AS r
         WHERE r.queue = v_r_queue[i] AND r.id = v_r_ids[i]
           FOR UPDATE SKIP LOCKED;
        IF NOT FOUND AND EXISTS (SELECT 1 FROM treadle.workflow_runs AS r
                                  WHERE r.queue = v_r_queue[i] AND r.id = v_r_ids[i]) THEN
            v_stay_q := v_stay_q || v_queues[i];  -- held: for the next
            v_stay := v_stay || v_ids[i];
            CONTINUE;
        END IF;
        DELETE FROM treadle.run_rechecks AS c WHERE c.queue = v_queues[i] AND c.job_id = v_ids[i];
        CONTINUE WHEN v_run.id IS NULL;  -- the run is gone
        SELECT * INTO v_job FROM treadle.jobs AS j WHERE j.queue = v_queues[i] AND j.id = v_ids[i];
        -- (a step whose result the run has was moved already: once per step)
        IF FOUND AND v_job.state = 'completed' AND NOT ('{}'::jsonb || v_run.results) ? v_job.step THEN
            PERFORM treadle._advance_run(v_job);  -- 050_finish.sql: the run row is this transaction's
            v_moved := v_moved + 1;
            v_ended := v_ended || v_r_queue[i];
        END IF;
        v_run := NULL;
    END LOOP;
    IF cardinality(v_stay) > 0 THEN
        -- to the back of the line: after the newest re-check of these queues (the clock may
        -- stand still, a test's, or step back), so the next call takes the others first
        UPDATE treadle.run_rechecks AS c
           SET added_at = greatest(treadle.now(),
                                   (SELECT max(o.added_at) + interval '1 microsecond' FROM treadle.run_rechecks AS o
                                     WHERE queues IS NULL OR o.queue = ANY (queues)))
          FROM unnest(v_stay_q, v_stay) AS s(q, id)
         WHERE c.queue = s.q AND c.job_id = s.id;
    END IF;
    -- a run moved here may have ended (a cancel, a last join): the step's own finish told
    -- the run's queue's waiters (wait_workflow) while it still ran, and no job finished here
    IF cardinality(v_ended) > 0 THEN
        PERFORM treadle._notify_done(ARRAY(SELECT DISTINCT u.q FROM unnest(v_ended) AS u(q)));
    END IF;
    RETURN v_moved;
END;
$$;
COMMENT ON FUNCTION treadle._move_rechecks(text[], integer) IS
    'Move the workflow runs of completed steps left for a re-check (treadle.run_rechecks) whose runs no one holds.';

--------------------------------------------------------------------------------
-- treadle._recheck_results(run) -> jsonb
--
-- The results of the run's completed steps that were left for a re-check and
-- whose results the run does not have yet ({step: result}; {} for none): steps
-- that completed, whose run has not moved for them yet. What reads a run's
-- results to decide which steps run (treadle.fork_run, treadle._resume_graph)
-- adds these, with the run row locked so that no re-check moves meanwhile; else
-- such a step ran again. The re-checks stay: the one that moves the run later
-- finds the step's result on it and moves nothing (once per step).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._recheck_results(run treadle.workflow_runs)
RETURNS jsonb
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT coalesce(jsonb_object_agg(j.step, j.result), '{}'::jsonb)
      FROM treadle.run_rechecks AS c
      JOIN treadle.jobs AS j ON j.queue = c.queue AND j.id = c.job_id
     WHERE c.run_queue = run.queue
       AND c.run_id = run.id
       AND j.workflow_run_id = run.id
       AND j.state = 'completed'
       AND NOT ('{}'::jsonb || run.results) ? j.step
       AND treadle._may_recheck(run.after, run.maps, run.compensations, j.step, j.args);
END;
COMMENT ON FUNCTION treadle._recheck_results(treadle.workflow_runs) IS
    'The results of a workflow run''s completed steps left for a re-check that the run does not have yet.';
