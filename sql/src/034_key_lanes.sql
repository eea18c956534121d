--------------------------------------------------------------------------------
-- Concurrency keys and ordered lanes. A job enqueued with a concurrency_key runs
-- only while its key has a free slot: at most key_limit jobs of one key (per queue:
-- tenants' keys never meet) are released at once (treadle.set_queue; 1 when not
-- set), and the others wait in state 'blocked', which no claim reads. The claim is
-- untouched: a queue whose jobs have no key pays nothing, and fair share between
-- keys follows: a heavy key has at most key_limit jobs released, so the claim's
-- FIFO over released jobs interleaves the keys.
--
-- A job holds one of its key's slots (jobs.key_slot) from its release until it
-- leaves: completed, cancelled or discarded. Retries,
-- snoozes and rescues of an expired lease keep the slot: the job is still under
-- way. treadle.key_slots counts the slots held per (queue, key), one row per key
-- with a slot held (deleted when the count reaches zero); writers of a key lock
-- its row, as claims lock a limited queue's row, so no limit is ever passed.
-- Giving a slot back releases the key's next blocked job in the same transaction:
-- the one due longest, then the one due soonest (an ordered lane: the oldest, lowest
-- id, even when it is not due yet). A job scheduled for later that holds a slot
-- gives it to a job of its key due before it (treadle._key_release).
--
-- An ordered queue (key_ordered) makes each key a lane: limit 1, jobs released in
-- enqueue order, and a head that fails for good (discarded) keeps its slot, so the
-- lane stays blocked until the head is retried (treadle.retry) or cancelled
-- (treadle.cancel). Other keys are not held back.
--
-- No trigger and no claim reads a key: the calls that move a keyed job do.
-- enqueue and enqueue_many insert it blocked and call treadle._key_release for its
-- key (enqueue, for a job without an idempotency key whose key has no row in
-- treadle.key_slots, so no slot held and no job blocked, inserts the row with the
-- job's slot and the job available: what the release would do, for less); treadle._follow_up, which every finish calls with the rows it changed, gives
-- a slot back for each keyed row that left (treadle._key_leave_all, keys in
-- (queue, key) order: every path that locks several keys' rows locks them in that
-- order, so finishes of batches with the same keys in other orders never deadlock); treadle.retry takes
-- a slot again for a job that had left (treadle._key_admit); cancel takes a failed
-- head out of its lane. Retention, prune and archive leave a failed head that holds
-- its slot alone. A queue whose jobs have no key runs the same statements as before.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._key_limit(queue) -> integer
--
-- How many jobs of one concurrency key the queue releases at once: 1 in an
-- ordered queue, else its key_limit, else 1.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._key_limit(queue text)
RETURNS integer
LANGUAGE sql
STABLE
BEGIN ATOMIC
    SELECT coalesce((SELECT CASE WHEN s.key_ordered THEN 1 ELSE coalesce(s.key_limit, 1) END
                       FROM treadle.queues AS s WHERE s.queue = _key_limit.queue), 1);
END;
COMMENT ON FUNCTION treadle._key_limit(text) IS
    'The jobs of one concurrency key a queue releases at once.';

--------------------------------------------------------------------------------
-- treadle._key_release(queue, key, given) -> integer
--
-- Transition: blocked -> available, each holding a slot, for the key's next
-- blocked jobs, as many as its room allows once `given` slots are given back. In
-- an ordered queue the next is the oldest (enqueue order: a head that is not due
-- yet holds its lane). Otherwise the next is the one due longest, then the one due
-- soonest (run_at, id); and a job released before its time that has not started
-- (available, never claimed, run_at still ahead) gives its slot to a blocked job
-- due before it: -> blocked again, and that job -> available. So a slot never sits
-- idle for a job scheduled later while a job of its key is due, and no clock is
-- needed: a job scheduled later that holds a slot is the one of its key due
-- soonest. Locks the key's row of treadle.key_slots until commit (writers of one
-- key go one after another) and deletes it when no slot is held. Returns how many
-- jobs it released.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._key_release(queue text, key text, given integer)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now      timestamptz := treadle.now();
    v_limit    integer;
    v_ordered  boolean;
    v_held     integer;
    v_holders  integer;  -- the slots held before this call's release
    v_released integer := 0;
    v_due      boolean := false;
    v_early    treadle.jobs;
    v_next     bigint;
BEGIN
    -- the queue's settings, as treadle._key_limit reads them, in one look
    SELECT coalesce(CASE WHEN s.key_ordered THEN 1 ELSE s.key_limit END, 1), coalesce(s.key_ordered, false)
      INTO v_limit, v_ordered
      FROM (SELECT) AS one
      LEFT JOIN treadle.queues AS s ON s.queue = _key_release.queue;

    INSERT INTO treadle.key_slots AS k (queue, key, held, updated_at)
    VALUES (_key_release.queue, _key_release.key, 0, v_now)
    ON CONFLICT ON CONSTRAINT key_slots_pkey DO UPDATE
       SET held = greatest(k.held - _key_release.given, 0), updated_at = excluded.updated_at
    RETURNING k.held INTO v_held;
    v_holders := v_held;

    IF v_held < v_limit THEN
        -- The next ones: in an ordered queue the oldest (jobs_key_idx); otherwise the one due
        -- longest, then the one due soonest (jobs_key_due_idx). One statement for both, each
        -- order read by its own index (the other's scan is never started), and the slots taken
        -- counted in the key's row.
        WITH oldest AS (
            SELECT j.id FROM treadle.jobs AS j
             WHERE v_ordered
               AND j.queue = _key_release.queue AND j.concurrency_key = _key_release.key AND j.state = 'blocked'
             ORDER BY j.id
             LIMIT v_limit - v_held
               FOR UPDATE
        ), due AS (
            SELECT j.id FROM treadle.jobs AS j
             WHERE NOT v_ordered
               AND j.queue = _key_release.queue AND j.concurrency_key = _key_release.key AND j.state = 'blocked'
             ORDER BY j.run_at, j.id
             LIMIT v_limit - v_held
               FOR UPDATE
        ), released AS (
            UPDATE treadle.jobs AS j
               SET state = 'available',
                   key_slot = true,
                   ready_txid = pg_current_xact_id()  -- claimable now: claims look for it (040_claim.sql)
             WHERE j.queue = _key_release.queue  -- (the queue: one shard on Citus)
               AND j.id IN (SELECT oldest.id FROM oldest UNION ALL SELECT due.id FROM due)
            RETURNING j.run_at
        ), counted AS (
            UPDATE treadle.key_slots AS k SET held = k.held + (SELECT count(*) FROM released)
             WHERE k.queue = _key_release.queue AND k.key = _key_release.key
               AND EXISTS (SELECT FROM released)
        )
        SELECT count(*), coalesce(bool_or(r.run_at <= v_now), false)
          INTO v_released, v_due
          FROM released AS r;
        v_held := v_held + v_released;
    END IF;

    -- the key is full: a blocked job due before a holder that has not started takes its slot
    -- (not when no slot was held before this call: then each holder was released above, due first)
    WHILE NOT v_ordered AND v_holders > 0 AND v_held >= v_limit LOOP
        SELECT * INTO v_early FROM treadle.jobs AS j
         WHERE j.queue = _key_release.queue AND j.concurrency_key = _key_release.key AND j.key_slot
           AND j.state = 'available' AND j.started_at IS NULL AND j.run_at > v_now
         ORDER BY j.run_at DESC, j.id DESC
         LIMIT 1
           FOR UPDATE SKIP LOCKED;  -- one locked is being claimed or cancelled (which then waits for the key's row)
        EXIT WHEN NOT FOUND;
        SELECT j.id INTO v_next FROM treadle.jobs AS j
         WHERE j.queue = _key_release.queue AND j.concurrency_key = _key_release.key AND j.state = 'blocked'
           AND j.run_at < v_early.run_at
         ORDER BY j.run_at, j.id
         LIMIT 1
           FOR UPDATE SKIP LOCKED;
        EXIT WHEN NOT FOUND;
        UPDATE treadle.jobs AS j SET state = 'blocked', key_slot = false
         WHERE j.id = v_early.id AND j.queue = _key_release.queue;
        UPDATE treadle.jobs AS j
           SET state = 'available', key_slot = true, ready_txid = pg_current_xact_id()
         WHERE j.id = v_next AND j.queue = _key_release.queue
        RETURNING v_due OR j.run_at <= v_now INTO v_due;
        v_released := v_released + 1;
    END LOOP;
    IF v_due THEN
        PERFORM treadle._notify('treadle_jobs', _key_release.queue);
    END IF;

    IF v_held = 0 THEN
        DELETE FROM treadle.key_slots AS k WHERE k.queue = _key_release.queue AND k.key = _key_release.key;
    END IF;
    RETURN v_released;
END;
$$;
COMMENT ON FUNCTION treadle._key_release(text, text, integer) IS
    'Give back slots of a concurrency key and release its next blocked jobs into the room (due ones first).';

--------------------------------------------------------------------------------
-- treadle._key_leave(job) -> void
--
-- Transition: a keyed job that held a slot and is now in a state that holds none
-- (completed, cancelled, or discarded outside an ordered queue) gives it back, and
-- its key's next blocked job -> available. `job` is its row as the caller's update
-- left it (treadle._follow_up passes each keyed row it is given). A job still under
-- way (available, running, retryable), or an ordered lane's failed head, keeps it.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._key_leave(job treadle.jobs)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF job.state = ANY (ARRAY['available', 'running', 'retryable'])
       OR (job.state = 'discarded'
           AND EXISTS (SELECT 1 FROM treadle.queues AS s WHERE s.queue = job.queue AND s.key_ordered)) THEN
        RETURN;
    END IF;
    UPDATE treadle.jobs AS j SET key_slot = false WHERE j.queue = job.queue AND j.id = job.id AND j.key_slot;
    IF FOUND THEN
        PERFORM treadle._key_release(job.queue, job.concurrency_key, 1);
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._key_leave(treadle.jobs) IS
    'Give back the slot of a keyed job that left, and release its key''s next blocked job.';

--------------------------------------------------------------------------------
-- treadle._key_leave_all(done treadle.jobs[]) -> void
--
-- Transition: treadle._key_leave for each keyed row of `done` (rows as the
-- caller's update left them), in (queue, key, id) order: a transaction that gives
-- back slots of several keys locks their key_slots rows in the one order every
-- path takes (treadle._key_release_keys, treadle._key_release_queue), so two
-- finishes of batches {A, B} and {B, A} wait for each other instead of deadlocking.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._key_leave_all(done treadle.jobs[])
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job treadle.jobs;
BEGIN
    FOR v_job IN
        SELECT d.* FROM unnest(done) AS d WHERE d.key_slot ORDER BY d.queue, d.concurrency_key, d.id
    LOOP
        PERFORM treadle._key_leave(v_job);
    END LOOP;
END;
$$;
COMMENT ON FUNCTION treadle._key_leave_all(treadle.jobs[]) IS
    'Give back the slots of the keyed jobs that left, keys in (queue, key) order.';

--------------------------------------------------------------------------------
-- treadle._key_admit(job_id) -> void
--
-- Transition: a keyed job made available again without a slot (treadle.retry of
-- one that had left) takes one, or -> blocked when its key is full (and then takes
-- the slot of a holder due after it that has not started: treadle._key_release).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._key_admit(job_id bigint)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job   treadle.jobs;
    v_taken boolean;
    v_limit integer;
BEGIN
    SELECT * INTO v_job FROM treadle.jobs AS j
     WHERE j.id = _key_admit.job_id AND NOT j.key_slot AND j.state = 'available';
    IF NOT FOUND THEN
        RETURN;
    END IF;
    v_limit := treadle._key_limit(v_job.queue);  -- (read apart: Citus runs the insert on the queue's shard)
    INSERT INTO treadle.key_slots AS k (queue, key, held, updated_at)
    VALUES (v_job.queue, v_job.concurrency_key, 1, treadle.now())
    ON CONFLICT ON CONSTRAINT key_slots_pkey DO UPDATE
       SET held = k.held + 1, updated_at = excluded.updated_at
     WHERE k.held < v_limit
    RETURNING true INTO v_taken;
    UPDATE treadle.jobs AS j
       SET key_slot = coalesce(v_taken, false),
           state = CASE WHEN v_taken THEN j.state ELSE 'blocked' END
     WHERE j.queue = v_job.queue AND j.id = v_job.id;
    IF v_taken IS NULL THEN
        PERFORM treadle._key_release(v_job.queue, v_job.concurrency_key, 0);  -- due before a holder not started yet?
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._key_admit(bigint) IS
    'A keyed job made available again takes a slot of its key, or waits blocked.';

--------------------------------------------------------------------------------
-- treadle._key_release_queue(queue) -> void
--
-- Transition: blocked -> available for every key of the queue with room (after
-- set_queue raised its key_limit), keys in order.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._key_release_queue(queue text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_keys text[];
    v_key  text;
BEGIN
    -- the keys read first, then released one by one: on Citus a statement that names
    -- the queue runs whole on its shard, where _key_release's statements cannot
    v_keys := ARRAY(SELECT DISTINCT j.concurrency_key FROM treadle.jobs AS j
                     WHERE j.queue = _key_release_queue.queue AND j.state = 'blocked'
                     ORDER BY 1);
    FOREACH v_key IN ARRAY v_keys LOOP
        PERFORM treadle._key_release(_key_release_queue.queue, v_key, 0);
    END LOOP;
END;
$$;
COMMENT ON FUNCTION treadle._key_release_queue(text) IS
    'Release the blocked jobs of every key of a queue that has room.';

--------------------------------------------------------------------------------
-- treadle._key_explain(job_id) -> table(reason, message, at)
--
-- Why a job of a concurrency key waits or blocks its lane (treadle.explain):
--   blocked: key_full (N of N slots held, by jobs ...), lane_blocked (an ordered
--     lane whose head failed for good: retry or cancel it), or key_waiting
--     (released by the next slot given back, behind K jobs of the key: older
--     ones in an ordered queue, else those due before it);
--   discarded holding its slot: lane_blocked (it blocks its lane).
-- No rows for any other job.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._key_explain(job_id bigint)
RETURNS TABLE (reason text, message text, at timestamptz)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_job   treadle.jobs;
    v_limit integer;
    v_held  bigint;
    v_ids   text;
    v_head  treadle.jobs;
    v_ahead bigint;
BEGIN
    SELECT * INTO v_job FROM treadle.jobs AS j WHERE j.id = _key_explain.job_id;
    IF NOT FOUND OR v_job.concurrency_key IS NULL THEN
        RETURN;
    END IF;
    IF v_job.state = 'discarded' AND v_job.key_slot THEN
        RETURN QUERY SELECT 'lane_blocked',
                            format('it failed for good and blocks the ordered lane of key %s in queue %s: retry or '
                                   'cancel it to let the lane go on', v_job.concurrency_key, v_job.queue),
                            v_job.finished_at;
        RETURN;
    END IF;
    IF v_job.state <> 'blocked' THEN
        RETURN;
    END IF;
    v_limit := treadle._key_limit(v_job.queue);
    SELECT count(*), string_agg('#' || h.id, ', ' ORDER BY h.id)
      INTO v_held, v_ids
      FROM (SELECT j.id FROM treadle.jobs AS j
             WHERE j.queue = v_job.queue AND j.concurrency_key = v_job.concurrency_key AND j.key_slot
             ORDER BY j.id LIMIT 20) AS h;
    SELECT * INTO v_head FROM treadle.jobs AS j
     WHERE j.queue = v_job.queue AND j.concurrency_key = v_job.concurrency_key AND j.key_slot
       AND j.state = 'discarded'
     ORDER BY j.id LIMIT 1;
    IF FOUND THEN
        RETURN QUERY SELECT 'lane_blocked',
                            format('lane blocked by failed head #%s: key %s of queue %s is an ordered lane and its '
                                   'head failed for good; retry or cancel #%s to let the lane go on',
                                   v_head.id, v_job.concurrency_key, v_job.queue, v_head.id),
                            v_head.finished_at;
    ELSIF v_held >= v_limit THEN
        RETURN QUERY SELECT 'key_full',
                            format('key full: %s of %s held by jobs %s (key %s of queue %s); it is released when one '
                                   'of them finishes', v_held, v_limit, v_ids, v_job.concurrency_key, v_job.queue),
                            NULL::timestamptz;
    END IF;
    SELECT count(*) INTO v_ahead FROM treadle.jobs AS j
     WHERE j.queue = v_job.queue AND j.concurrency_key = v_job.concurrency_key AND j.state = 'blocked'
       AND CASE WHEN EXISTS (SELECT 1 FROM treadle.queues AS s WHERE s.queue = v_job.queue AND s.key_ordered)
                THEN j.id < v_job.id
                ELSE (j.run_at, j.id) < (v_job.run_at, v_job.id) END;  -- the order _key_release takes
    IF v_ahead > 0 THEN
        RETURN QUERY SELECT 'key_waiting',
                            format('%s job(s) of key %s wait for a slot before it', v_ahead, v_job.concurrency_key),
                            NULL::timestamptz;
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._key_explain(bigint) IS
    'Why a job of a concurrency key waits (key full, lane blocked) or blocks its lane.';
