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
-- treadle._notify_steps(ids, queues, names, priorities, at) -> void
--
-- Step jobs `ids` (in `queues`, named `names`, of `priorities`) were just written
-- at `at`: NOTIFY treadle_jobs for each of their queues unless each of them there
-- stands behind a backlog of its name: a job of the same queue, name and priority
-- that has waited, claimable, since between 2 s and 50 ms before `at` (its
-- workers have no free slot: an idle one would have taken it). That look reads
-- the claim index backwards from 50 ms before `at`, where a backlog's newest jobs
-- wait, and never past 2 s before it, so that the jobs claimed since cannot make
-- it long. Each queue is told, and each backlog looked for, once per transaction
-- (setting treadle.steps_seen). Inside treadle.complete_and_claim (setting treadle.claim_follows 'on'
-- for the transaction) the ids are kept (setting treadle.steps_written) for
-- treadle._notify_left_steps instead.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._notify_steps(ids bigint[], queues text[], names text[], priorities integer[],
                                                 at timestamptz)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- what this transaction settled already, one line each: a queue told, or a
    -- queue, name and priority found behind a backlog (one look per transaction)
    v_seen text := coalesce(current_setting('treadle.steps_seen', true), '');
    v_told text;
    v_busy text;
    v_new  boolean := false;
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
    FOR v_i IN 1 .. cardinality(ids) LOOP
        v_told := E'\ntold ' || queues[v_i] || E'\n';
        v_busy := E'\nbusy ' || queues[v_i] || E'\t' || names[v_i] || E'\t' || priorities[v_i] || E'\n';
        CONTINUE WHEN strpos(v_seen, v_told) > 0 OR strpos(v_seen, v_busy) > 0;
        v_new := true;
        -- a scalar subquery, not EXISTS (which would drop the ORDER BY that reads backwards)
        IF (SELECT true FROM treadle.jobs AS o
             WHERE o.queue = queues[v_i] AND o.name = names[v_i] AND o.priority = priorities[v_i]
               AND o.state = ANY (ARRAY['available', 'retryable'])
               AND o.run_at <= at - interval '50 milliseconds'
               AND o.run_at > at - interval '2 seconds'
             ORDER BY o.priority DESC, o.run_at DESC
             LIMIT 1) THEN
            v_seen := v_seen || v_busy;
        ELSE
            PERFORM treadle._notify('treadle_jobs', queues[v_i]);
            v_seen := v_seen || v_told;
        END IF;
    END LOOP;
    IF v_new THEN
        PERFORM set_config('treadle.steps_seen', v_seen, true);
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._notify_steps(bigint[], text[], text[], integer[], timestamptz) IS
    'Wake workers for step jobs just written, unless their workers are busy or the finishing worker claims them.';

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
    v_written    text := nullif(current_setting('treadle.steps_written', true), '');
    v_at         timestamptz;
    v_ids        bigint[];
    v_queues     text[];
    v_names      text[];
    v_priorities integer[];
    v_id         bigint;
    v_job        record;
BEGIN
    PERFORM set_config('treadle.claim_follows', '', true);
    IF v_written IS NULL THEN
        RETURN;
    END IF;
    PERFORM set_config('treadle.steps_written', '', true);
    IF treadle._on_citus() THEN
        -- Citus pushes no correlated subquery with a LIMIT over a distributed table
        -- down to the shards (the statement below fails there): one lookup per step
        v_ids := '{}';
        FOREACH v_id IN ARRAY string_to_array(v_written, ',')::bigint[] LOOP
            SELECT j.queue, j.name, j.priority, j.run_at INTO v_job
              FROM treadle.jobs AS j WHERE j.id = v_id AND j.state = 'available';
            CONTINUE WHEN NOT FOUND;
            v_ids := v_ids || v_id;
            v_queues := v_queues || v_job.queue;
            v_names := v_names || v_job.name;
            v_priorities := v_priorities || v_job.priority;
            v_at := v_job.run_at;
        END LOOP;
        PERFORM treadle._notify_steps(v_ids, v_queues, v_names, v_priorities, v_at);
        RETURN;
    END IF;
    -- one statement for them all, each row by its key: the state is tested outside the
    -- lookup (`state = 'available'` inside would let the planner read a claim index,
    -- which holds every waiting job, instead of the primary key)
    SELECT array_agg(j.id ORDER BY w.ord), array_agg(j.queue ORDER BY w.ord), array_agg(j.name ORDER BY w.ord),
           array_agg(j.priority ORDER BY w.ord),
           max(j.run_at)  -- the transaction's time: every step it wrote was due then
      INTO v_ids, v_queues, v_names, v_priorities, v_at
      FROM unnest(string_to_array(v_written, ',')::bigint[]) WITH ORDINALITY AS w(id, ord)
     CROSS JOIN LATERAL (SELECT o.id, o.queue, o.name, o.priority, o.run_at, o.state FROM treadle.jobs AS o
                          WHERE o.id = w.id LIMIT 1) AS j
     WHERE j.state = 'available';
    PERFORM treadle._notify_steps(v_ids, v_queues, v_names, v_priorities, v_at);
END;
$$;
COMMENT ON FUNCTION treadle._notify_left_steps() IS
    'Wake workers for the step jobs a complete_and_claim wrote and did not claim itself.';
