--------------------------------------------------------------------------------
-- Step keys. A workflow step whose step_options name a concurrency_key
-- (079_workflow_step_options.sql) runs its jobs in that key's lane, as a job
-- enqueued with the key does (034_key_lanes.sql): the step job is inserted
-- blocked (treadle._enqueue_steps, treadle._enqueue_map, treadle._compensate_next)
-- and released while its key has room; it gives its slot back when it leaves,
-- through treadle._follow_up as any keyed job. A run whose keyed step waits shows
-- it in treadle.explain_run (key_full, key_waiting) as treadle.explain does.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._key_release_keys(queues, keys) -> void
--
-- Transition: blocked -> available for the keys of jobs just inserted blocked
-- (queues[i], keys[i] the queue and key of the i-th; null keys skipped): each
-- (queue, key) once, in order, as its room allows (treadle._key_release).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._key_release_keys(queues text[], keys text[])
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM treadle._key_release(k.queue, k.key, 0)
       FROM (SELECT DISTINCT u.queue, u.key FROM unnest(queues, keys) AS u(queue, key)
              WHERE u.key IS NOT NULL) AS k
      ORDER BY k.queue, k.key;
END;
$$;
COMMENT ON FUNCTION treadle._key_release_keys(text[], text[]) IS
    'Release the blocked jobs of each (queue, concurrency key) given, as their room allows.';
