--------------------------------------------------------------------------------
-- History: finished jobs move out of treadle.jobs into treadle.job_history
-- (010_tables.sql), whose partitions retention empties whole. Readers see both
-- tables through the views (job_details, recent_failures, throughput, queue_stats).
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._history_partition(slot) -> regclass
--
-- The history partition that holds a slot's rows.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._history_partition(slot smallint)
RETURNS regclass
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
RETURN ('treadle.job_history_' || lpad(slot::text, 2, '0'))::regclass;
COMMENT ON FUNCTION treadle._history_partition(smallint) IS
    'The partition of treadle.job_history that holds a slot''s rows.';

--------------------------------------------------------------------------------
-- treadle._history_day(purge_at) -> timestamptz
--
-- The start of the day (UTC) that purge_at falls in; infinity for infinity.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._history_day(purge_at timestamptz)
RETURNS timestamptz
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN isfinite(purge_at)
            THEN date_bin(interval '1 day', purge_at, timestamptz '2000-01-01 00:00+00')
            ELSE purge_at END;
COMMENT ON FUNCTION treadle._history_day(timestamptz) IS
    'The start of the UTC day purge_at falls in; infinity for infinity.';

--------------------------------------------------------------------------------
-- treadle._history_slot(purge_at, now) -> smallint
--
-- The partition for a job that retention deletes at purge_at: the one that holds
-- purge_at's day, taking a free one for a new day; 0 (deleted row by row) for a
-- day 40 days or more after now, infinity, or when all 40 are taken (the 40 days
-- ahead need at most 40: days that far ahead would take them from nearer ones), and
-- when another transaction is taking a partition for a new day.
-- Locks the slot's row FOR SHARE, so that apply_retention cannot empty it before
-- this transaction commits.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._history_slot(purge_at timestamptz, now timestamptz)
RETURNS smallint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_starts timestamptz;
    v_slot   smallint;
BEGIN
    IF NOT isfinite(_history_slot.purge_at) OR _history_slot.purge_at >= _history_slot.now + interval '40 days' THEN
        RETURN 0;
    END IF;
    v_starts := treadle._history_day(_history_slot.purge_at);
    SELECT s.slot INTO v_slot FROM treadle.history_slots AS s WHERE s.starts = v_starts
     ORDER BY s.slot LIMIT 1 FOR SHARE;
    IF FOUND THEN
        RETURN v_slot;
    END IF;
    -- A new day: one archiver at a time takes a free partition for it. Another that
    -- meets it then puts its rows in partition 0 rather than wait for its commit.
    IF NOT pg_try_advisory_xact_lock(hashtext('treadle.history_slots')) THEN
        RETURN 0;
    END IF;
    SELECT s.slot INTO v_slot FROM treadle.history_slots AS s WHERE s.starts = v_starts
     ORDER BY s.slot LIMIT 1 FOR SHARE;
    IF FOUND THEN
        RETURN v_slot;
    END IF;
    INSERT INTO treadle.history_slots AS s (slot, starts, ends)
    SELECT n, v_starts, v_starts + interval '1 day'
      FROM generate_series(1, 40) AS n
     WHERE NOT EXISTS (SELECT FROM treadle.history_slots AS t WHERE t.slot = n)
     ORDER BY n
     LIMIT 1
    RETURNING s.slot INTO v_slot;
    RETURN coalesce(v_slot, 0);
END;
$$;
COMMENT ON FUNCTION treadle._history_slot(timestamptz, timestamptz) IS
    'The history partition for a job deleted at purge_at: its day''s, a free one, or 0.';

--------------------------------------------------------------------------------
-- treadle.archive(batch) -> bigint
--
-- Transition: moves at most `batch` finished jobs (completed, discarded,
-- cancelled) that finished over a minute ago from treadle.jobs to
-- treadle.job_history, oldest first, each with the time its retention ends
-- (its queue's or the global retention now; never: infinity). Jobs stay in
-- treadle.jobs while they hold an idempotency key (the key stays unique there)
-- or belong to a workflow run (they go with their run), and when their
-- retention has already passed (apply_retention deletes them). Rows another
-- transaction holds are skipped (SKIP LOCKED). The workers' housekeeping calls
-- it after apply_retention. Returns how many jobs moved: less than `batch` means
-- it caught up.
-- Raises 22004: batch null. 22023: batch outside 1..100000.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.archive(batch integer DEFAULT 1000)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now       timestamptz := treadle.now();
    v_completed interval;
    v_failed    interval;
    v_ids       bigint[];
    v_purge     timestamptz[];
    v_slots     smallint[];
    v_moved     bigint := 0;
    v_queue     text;
    v_count     bigint;
    v_keep_completed interval;
    v_keep_failed    interval;
BEGIN
    IF archive.batch IS NULL THEN
        RAISE EXCEPTION 'treadle: batch must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF archive.batch NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'treadle: batch must be between 1 and 100000, got %', archive.batch
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT r.retain_completed, r.retain_failed INTO v_completed, v_failed FROM treadle._retention() AS r;

    -- Queue by queue (on Citus each statement is then one shard's, and a job moves
    -- within its shard: jobs and job_history are co-located): the oldest candidates
    -- are read without a lock, and from each of their queues as many are then locked
    -- and moved by key, oldest first.
    FOR v_queue, v_count, v_keep_completed, v_keep_failed IN
        SELECT c.queue, c.jobs, c.keep_completed, c.keep_failed
          FROM treadle._oldest_by_queue(v_now - interval '1 minute', archive.batch, false,
                                        v_completed, v_failed, v_now) AS c  -- 061_housekeeping.sql
    LOOP
        SELECT array_agg(p.id), array_agg(p.purge_at)
          INTO v_ids, v_purge
          FROM (SELECT e.id,
                       coalesce(e.finished_at + CASE WHEN e.state = 'completed' THEN v_keep_completed
                                                     ELSE v_keep_failed END,
                                'infinity') AS purge_at
                  FROM treadle.jobs AS e
                 WHERE e.queue = v_queue
                   AND e.finished_at < v_now - interval '1 minute'
                   AND e.workflow_run_id IS NULL
                   AND e.idempotency_key IS NULL
                   AND treadle._may_go(e.key_slot)
                 ORDER BY e.finished_at
                 LIMIT v_count
                   FOR UPDATE SKIP LOCKED) AS p
         WHERE p.purge_at > v_now;
        CONTINUE WHEN v_ids IS NULL;

        -- One partition per day of purge times: look each day up once.
        SELECT array_agg(d.slot ORDER BY u.n) INTO v_slots
          FROM unnest(v_purge) WITH ORDINALITY AS u(purge_at, n)
          JOIN (SELECT w.day, treadle._history_slot(w.day, v_now) AS slot
                  FROM (SELECT DISTINCT treadle._history_day(x.purge_at) AS day
                          FROM unnest(v_purge) AS x(purge_at)) AS w) AS d
            ON d.day = treadle._history_day(u.purge_at);

        -- Rows locked above by this transaction cannot move before the delete.
        WITH moved AS (
            DELETE FROM treadle.jobs AS j WHERE j.queue = v_queue AND j.id = ANY (v_ids) RETURNING j.*
        )
        INSERT INTO treadle.job_history
        SELECT p.purge_at, p.slot, m.*
          FROM moved AS m
          JOIN unnest(v_ids, v_purge, v_slots) AS p(id, purge_at, slot) ON p.id = m.id;
        GET DIAGNOSTICS v_count = ROW_COUNT;
        v_moved := v_moved + v_count;
    END LOOP;
    RETURN v_moved;
END;
$$;
COMMENT ON FUNCTION treadle.archive(integer) IS
    'Move at most batch finished jobs to treadle.job_history; returns how many moved.';

--------------------------------------------------------------------------------
-- treadle._empty_slot(slot) -> bigint
--
-- Transition: empties a history partition whose day of purge times has ended
-- (TRUNCATE) and frees its slot; returns how many jobs went. The rows of a
-- partition are the ones treadle.archive put there for that day: all are due.
-- Raises 55P03 at once when anyone holds the partition (a reader's open
-- transaction): it never waits for the lock, so no reader of the history ever
-- queues behind a pending ACCESS EXCLUSIVE request of its.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._empty_slot(slot smallint)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_partition regclass := treadle._history_partition(_empty_slot.slot);
    v_jobs      bigint;
BEGIN
    EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE NOWAIT', v_partition);
    -- the answer, from the id index where vacuum has marked the pages all-visible; the
    -- lock keeps anyone from adding or taking rows meanwhile
    SELECT count(*) INTO v_jobs FROM treadle.job_history AS h WHERE h.slot = _empty_slot.slot;
    EXECUTE format('TRUNCATE %s', v_partition);
    DELETE FROM treadle.history_slots AS s WHERE s.slot = _empty_slot.slot;
    RETURN v_jobs;
END;
$$;
COMMENT ON FUNCTION treadle._empty_slot(smallint) IS
    'Empty a history partition whose day has ended, and free its slot; returns how many jobs went.';

--------------------------------------------------------------------------------
-- treadle._purge_history(now, batch) -> bigint
--
-- Transition: empties history partitions whose day of purge times has ended
-- (treadle._empty_slot), oldest first, until `batch` jobs have gone, so that one
-- transaction holds few of them; then deletes what is left of `batch` in rows of
-- partition 0 whose purge_at has passed. A partition that a reader holds, or that
-- another call is emptying, is left for a later call at once (no lock wait).
-- Returns how many jobs went.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._purge_history(now timestamptz, batch integer)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_slot  smallint;
    v_count bigint;
    v_jobs  bigint := 0;
    v_queue text;
    v_due   bigint;
BEGIN
    FOR v_slot IN
        SELECT s.slot FROM treadle.history_slots AS s WHERE s.ends <= _purge_history.now
         ORDER BY s.ends FOR UPDATE SKIP LOCKED
    LOOP
        BEGIN
            v_jobs := v_jobs + treadle._empty_slot(v_slot);
        EXCEPTION WHEN lock_not_available THEN
            NULL;  -- a reader holds it: the next call empties it
        END;
        EXIT WHEN v_jobs >= _purge_history.batch;
    END LOOP;
    IF v_jobs >= _purge_history.batch THEN
        RETURN v_jobs;
    END IF;

    -- Queue by queue (on Citus each statement is then one shard's): the oldest due
    -- rows are read without a lock, and from each of their queues as many are then
    -- locked and deleted by id, oldest first.
    FOR v_queue, v_due IN
        SELECT e.queue, count(*)
          FROM (SELECT e.queue FROM treadle.job_history_00 AS e
                 WHERE e.purge_at <= _purge_history.now
                 ORDER BY e.purge_at
                 LIMIT _purge_history.batch - v_jobs) AS e
         GROUP BY e.queue
    LOOP
        DELETE FROM treadle.job_history_00 AS h
         WHERE h.queue = v_queue
           AND h.id = ANY (ARRAY(
            SELECT e.id FROM treadle.job_history_00 AS e
             WHERE e.queue = v_queue AND e.purge_at <= _purge_history.now
             ORDER BY e.purge_at
             LIMIT v_due
               FOR UPDATE SKIP LOCKED));
        GET DIAGNOSTICS v_count = ROW_COUNT;
        v_jobs := v_jobs + v_count;
    END LOOP;
    RETURN v_jobs;
END;
$$;
COMMENT ON FUNCTION treadle._purge_history(timestamptz, integer) IS
    'Empty the history partitions whose day has ended, and delete expired rows of partition 0.';
