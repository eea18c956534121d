--------------------------------------------------------------------------------
-- Private helpers. They change no data, so PUBLIC keeps EXECUTE on them: the
-- SECURITY INVOKER functions that call them run as the caller.
--
-- The small pure ones have SQL-standard bodies (BEGIN ATOMIC): those are parsed
-- and bound when they are created, so no search_path can redirect them, and
-- without a SET clause the planner can inline them into the hot statements
-- (claim, enqueue) instead of calling them row by row.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._now() -> timestamptz
--
-- The one clock of every transition: the start of the current statement, or the
-- value of the setting treadle.now when a session sets it (tests move time that
-- way, without sleeping; the setting affects only that session).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._now()
RETURNS timestamptz
LANGUAGE sql
STABLE
BEGIN ATOMIC
    SELECT coalesce(nullif(current_setting('treadle.now', true), '')::timestamptz,
                    statement_timestamp());
END;
COMMENT ON FUNCTION treadle._now() IS
    'treadle''s clock: statement_timestamp(), or the session setting treadle.now when set.';

--------------------------------------------------------------------------------
-- treadle._check_text(value, argument) -> void
--
-- Raises 22004 when value is null, 22023 when it is empty or only white space.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_text(value text, argument text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'treadle: % must not be null', argument
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF btrim(value) = '' THEN
        RAISE EXCEPTION 'treadle: % must not be empty', argument
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._check_text(text, text) IS
    'Raise 22004 for a null text argument, 22023 for an empty one.';

--------------------------------------------------------------------------------
-- treadle._check_names(value, argument) -> void
--
-- A list of queue or job names: raises 22004 when it is null, 22023 when it is
-- empty or holds a null or empty name.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_names(value text[], argument text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'treadle: % must not be null', argument
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF cardinality(value) = 0 THEN
        RAISE EXCEPTION 'treadle: % must not be empty', argument
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(value) AS v(x) WHERE x IS NULL OR btrim(x) = '') THEN
        RAISE EXCEPTION 'treadle: % must not contain null or empty names', argument
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._check_names(text[], text) IS
    'Raise 22004 for a null list of names, 22023 for an empty one or one with an empty name.';

--------------------------------------------------------------------------------
-- treadle._payload(value, argument) -> jsonb
--
-- Job args and workflow input: SQL NULL and JSON null become {}; anything but
-- an object or an array raises 22023.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._payload(value jsonb, argument text)
RETURNS jsonb
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF value IS NULL OR jsonb_typeof(value) = 'null' THEN
        RETURN '{}'::jsonb;
    END IF;
    IF jsonb_typeof(value) <> ALL (ARRAY['object', 'array']) THEN
        RAISE EXCEPTION 'treadle: % must be a JSON object or array, not %', argument, jsonb_typeof(value)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN value;
END;
$$;
COMMENT ON FUNCTION treadle._payload(jsonb, text) IS
    'Normalise job args or workflow input: null becomes {}, scalars raise 22023.';

--------------------------------------------------------------------------------
-- treadle._check_positive(value, argument) -> void
--
-- Raises 22023 when an interval (lease, every) is zero or negative.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_positive(value interval, argument text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF value <= interval '0' THEN
        RAISE EXCEPTION 'treadle: % must be positive, got %', argument, value
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._check_positive(interval, text) IS
    'Raise 22023 for an interval that is zero or negative.';

--------------------------------------------------------------------------------
-- treadle._backoff(attempt) -> interval
--
-- The default delay before a failed attempt runs again: 2^attempt seconds plus up
-- to one second of jitter, capped at one hour.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._backoff(attempt integer)
RETURNS interval
LANGUAGE sql
VOLATILE
BEGIN ATOMIC
    -- 2^12 s already passes the cap; the exponent is bounded so it never overflows
    SELECT make_interval(secs => least(power(2, least(greatest(attempt, 0), 12)) + random(), 3600));
END;
COMMENT ON FUNCTION treadle._backoff(integer) IS
    'Default retry delay: 2^attempt seconds plus up to 1 s of jitter, at most one hour.';

--------------------------------------------------------------------------------
-- treadle._notify(channel, queue) -> void
--
-- A hint to listeners that a queue changed; never the truth, never job data.
-- Channel treadle_jobs: work became claimable. Channel treadle_done: jobs finished.
-- Identical notifications in one transaction are sent once.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._notify(channel text, queue text)
RETURNS void
LANGUAGE sql
VOLATILE
BEGIN ATOMIC
    SELECT pg_notify(channel, queue);
END;
COMMENT ON FUNCTION treadle._notify(text, text) IS
    'Send a LISTEN/NOTIFY wake-up (payload: a queue name).';

--------------------------------------------------------------------------------
-- treadle._is_int(value, low, high) -> boolean
--
-- True when a JSON value is a whole number between low and high.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._is_int(value jsonb, low numeric, high numeric)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
BEGIN ATOMIC
    SELECT CASE WHEN jsonb_typeof(value) = 'number'
                THEN value::numeric = trunc(value::numeric) AND value::numeric BETWEEN low AND high
                ELSE false
           END;
END;
COMMENT ON FUNCTION treadle._is_int(jsonb, numeric, numeric) IS
    'True when a JSON value is a whole number within [low, high].';

--------------------------------------------------------------------------------
-- treadle._check_lease_args(job_id, lease_token) -> void
--
-- Raises 22004 when either half of a fenced write's address is null.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_lease_args(job_id bigint, lease_token uuid)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF job_id IS NULL THEN
        RAISE EXCEPTION 'treadle: job_id must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF lease_token IS NULL THEN
        RAISE EXCEPTION 'treadle: lease_token must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._check_lease_args(bigint, uuid) IS
    'Raise 22004 when a job id or lease token is null.';

--------------------------------------------------------------------------------
-- treadle._append_error(errors, attempt, at, error) -> jsonb
--
-- A job's error history with one more failed attempt; the newest 50 are kept.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._append_error(errors jsonb, attempt integer, at timestamptz, error text)
RETURNS jsonb
LANGUAGE sql
IMMUTABLE
BEGIN ATOMIC
    SELECT CASE WHEN jsonb_array_length(errors) >= 50 THEN errors - 0 ELSE errors END
           || jsonb_build_array(jsonb_build_object('attempt', attempt, 'at', at, 'error', error));
END;
COMMENT ON FUNCTION treadle._append_error(jsonb, integer, timestamptz, text) IS
    'Append one failed attempt to a job''s error history, keeping the newest 50.';
