--------------------------------------------------------------------------------
-- Successors: the job that a periodic occurrence or a schedule starts. One
-- function inserts every one of them (treadle._follow_up for a periodic job's
-- next occurrence, treadle._schedule_next for a schedule's next one,
-- treadle.schedule for a schedule's first), so they are written once.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._successor(prev_id, queue, name, args, priority, run_at,
--                    max_attempts, every, schedule) -> bigint
--
-- Transition: (none) -> available, a job due at run_at, created now, that
-- follows job prev_id: at most once per predecessor, which records it in its
-- next_id (a retried occurrence that already started its successor starts no
-- second one). With prev_id null the job follows nothing (a schedule's first
-- occurrence); otherwise it takes prev_id's meta and concurrency_key (a keyed
-- successor is inserted blocked and admitted as a keyed enqueue is:
-- treadle._key_release, 034_key_lanes.sql). `every` is a periodic series' period, `schedule` a schedule's
-- name (one of them, or neither). Listeners of treadle_jobs hear the queue when
-- the job is due at once. Returns the new job's id; null when prev_id has a
-- successor already (or is gone). Callers hold prev_id's row lock, and check
-- the arguments: they come from a job or a schedule that was checked.
-- Raises nothing of its own (treadle.jobs' checks hold as for any insert).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._successor(
    prev_id      bigint,
    queue        text,
    name         text,
    args         jsonb,
    priority     integer,
    run_at       timestamptz,
    max_attempts integer,
    every        interval,
    schedule     text
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := treadle.now();
    v_id  bigint;
    v_meta jsonb;
    v_key  text;
BEGIN
    -- the id is drawn first: no volatile call inside the UPDATE (Citus refuses one)
    v_id := nextval('treadle.jobs_id_seq'::regclass);
    IF prev_id IS NOT NULL THEN
        UPDATE treadle.jobs AS j
           SET next_id = v_id
         WHERE j.id = _successor.prev_id AND j.next_id IS NULL
        RETURNING j.meta, j.concurrency_key INTO v_meta, v_key;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
    END IF;
    INSERT INTO treadle.jobs AS j
        (id, queue, name, args, priority, run_at, max_attempts, every, schedule, created_at, meta,
         concurrency_key, state, key_slot)
    VALUES
        (v_id, _successor.queue, _successor.name, _successor.args, _successor.priority, _successor.run_at,
         _successor.max_attempts, _successor.every, _successor.schedule, v_now, v_meta,
         v_key, CASE WHEN v_key IS NULL THEN 'available' ELSE 'blocked' END, CASE WHEN v_key IS NOT NULL THEN false END);
    IF v_key IS NOT NULL THEN
        PERFORM treadle._key_release(_successor.queue, v_key, 0);  -- released (and heard of) as its key has room
    ELSIF _successor.run_at <= v_now THEN
        PERFORM treadle._notify('treadle_jobs', _successor.queue);  -- due at once (a missed time caught up)
    END IF;
    RETURN v_id;
END;
$$;
COMMENT ON FUNCTION treadle._successor(bigint, text, text, jsonb, integer, timestamptz, integer, interval, text) IS
    'Insert the job that follows another (a periodic or scheduled occurrence), once; null when it has one.';
