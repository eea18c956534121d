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

--------------------------------------------------------------------------------
-- treadle._check_meta(meta) -> jsonb
--
-- Metadata as treadle.enqueue takes it (start_workflow's `meta`): null for SQL or
-- JSON null, else the object itself. A run's meta is copied to each of its step
-- jobs' meta (and to its child runs).
-- Raises 22023: meta not a JSON object, over the payload size limit, or nested
-- more than 100 levels deep.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_meta(meta jsonb)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF meta IS NULL OR jsonb_typeof(meta) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(meta) <> 'object' THEN
        RAISE EXCEPTION 'treadle: meta must be a JSON object, not %', jsonb_typeof(meta)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (pg_column_size(meta) > 1024 AND pg_column_size(meta) > treadle._max_payload_bytes())
       OR treadle._too_deep(meta) THEN
        PERFORM treadle._check_payload(meta, 'meta', treadle._max_payload_bytes());
    END IF;
    RETURN meta;
END;
$$;
COMMENT ON FUNCTION treadle._check_meta(jsonb) IS
    'Check a run''s metadata as enqueue checks a job''s (22023); null for none.';
