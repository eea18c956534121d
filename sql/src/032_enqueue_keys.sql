--------------------------------------------------------------------------------
-- Idempotency keys: what a call does when its key is taken (on_conflict), how
-- long a job holds its key (unique_while) and the period a key is taken for
-- (unique_period). treadle.enqueue and treadle.enqueue_many (030_enqueue.sql)
-- call these helpers only when a caller asks for more than today's default.
--
-- A job holds its key while it is in its scope, which treadle.jobs's unique index
-- jobs_idempotency_key_idx expresses (010_tables.sql):
--   'waiting'  until its first claim (or until it finishes without running);
--   'active'   until it finishes (completed, discarded or cancelled);
--   'retained' as long as its row exists (the default);
--   'released' never again: it gave its key up (see below), or treadle.retry
--              brought it back after its scope had ended.
-- A key that left its scope is free at once, and a job never takes a key back.
-- With unique_period, the key is taken per period of treadle's clock (buckets
-- counted from 2000-01-01 00:00 UTC): the same key in the next period is a new job.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._check_key_options(key, args, on_conflict, unique_while, unique_period) -> void
--
-- Raises 22004: on_conflict or unique_while null. 22023: an unknown
-- on_conflict or unique_while; a unique_period not positive, over 366 days, or
-- counted in months or years; any of them other than the default without an
-- idempotency key; on_conflict 'append' with args that are not a JSON object.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_key_options(key text, args jsonb, on_conflict text,
                                                     unique_while text, unique_period interval)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF on_conflict IS NULL OR unique_while IS NULL THEN
        RAISE EXCEPTION 'treadle: % must not be null', CASE WHEN on_conflict IS NULL THEN 'on_conflict' ELSE 'unique_while' END
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF on_conflict <> ALL (ARRAY['keep', 'replace', 'replace_args', 'append']) THEN
        RAISE EXCEPTION 'treadle: on_conflict must be keep, replace, replace_args or append, got "%"', on_conflict
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF unique_while <> ALL (ARRAY['waiting', 'active', 'retained']) THEN
        RAISE EXCEPTION 'treadle: unique_while must be waiting, active or retained, got "%"', unique_while
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF unique_period IS NOT NULL THEN
        PERFORM treadle._check_interval(unique_period, 'unique_period', interval '366 days');
        IF date_part('month', unique_period) <> 0 OR date_part('year', unique_period) <> 0 THEN
            RAISE EXCEPTION 'treadle: unique_period must be counted in days or less, not months or years, got %', unique_period
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    IF key IS NULL AND (on_conflict <> 'keep' OR unique_while <> 'retained' OR unique_period IS NOT NULL) THEN
        RAISE EXCEPTION 'treadle: on_conflict, unique_while and unique_period need an idempotency_key'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF on_conflict = 'append' AND jsonb_typeof(args) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'treadle: on_conflict append needs args that are a JSON object of arrays, not %',
                        coalesce(jsonb_typeof(args), 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._check_key_options(text, jsonb, text, text, interval) IS
    'Raise 22004 or 22023 for on_conflict, unique_while or unique_period that enqueue refuses.';

--------------------------------------------------------------------------------
-- treadle._append_args(held, more) -> jsonb
--
-- The args of a waiting job that a call with on_conflict 'append' merges into:
-- each member of `more` that is an array is appended to the held array of that
-- name (a missing one starts empty); any other member replaces the held one.
-- Raises 22023: held args not an object, a held member that is not an array
-- where `more` appends to it, or merged args over the size limit; the caller's
-- statement then writes nothing.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._append_args(held jsonb, more jsonb)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_bad    text;
    v_merged jsonb;
BEGIN
    IF jsonb_typeof(held) <> 'object' THEN
        RAISE EXCEPTION 'treadle: on_conflict append needs the waiting job''s args to be a JSON object, not %', jsonb_typeof(held)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT m.key INTO v_bad
      FROM jsonb_each(more) AS m(key, value)
     WHERE jsonb_typeof(m.value) = 'array' AND held ? m.key AND jsonb_typeof(held -> m.key) <> 'array'
     ORDER BY m.key
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'treadle: on_conflict append cannot append to "%": the waiting job''s value there is not an array', v_bad
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT held || coalesce(jsonb_object_agg(m.key, CASE WHEN jsonb_typeof(m.value) = 'array'
                                                         THEN coalesce(held -> m.key, '[]'::jsonb) || m.value
                                                         ELSE m.value END), '{}'::jsonb)
      INTO v_merged
      FROM jsonb_each(more) AS m(key, value);
    PERFORM treadle._check_payload(v_merged, 'args appended to', treadle._max_payload_bytes());
    RETURN v_merged;
END;
$$;
COMMENT ON FUNCTION treadle._append_args(jsonb, jsonb) IS
    'Merge args for on_conflict append: arrays appended by member name, other members replaced.';
