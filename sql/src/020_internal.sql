--------------------------------------------------------------------------------
-- The clock, and private helpers.
--
-- Helpers whose names start with _ are executable by the owner only: the public
-- functions that call them run as the owner (SECURITY DEFINER). The small pure
-- ones have SQL-standard bodies (BEGIN ATOMIC): those are bound when they are
-- created, so no search_path can redirect them, and the planner can inline them
-- into the statements that call them.
--
-- Bounds every client meets, whatever language it speaks:
--   names (job, queue, step, workflow, worker id) and idempotency keys: 1 to 200
--     characters, no control characters, not only spaces;
--   args, workflow input, results and progress messages: at most
--     treadle.settings.max_payload_bytes (1 MiB unless the owner says otherwise,
--     treadle.configure) and at most 100 levels of JSON nesting;
--   error text: kept to 16,384 characters (its head and its tail), and the newest
--     20 errors of a job.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._moved_clock(setting) -> timestamptz
--
-- The time the setting treadle.now gives (treadle.now), or null unless the caller
-- may create objects in schema treadle. Strict, and not inlined (its CASE is not):
-- treadle.now() runs it only when the setting is there, and a caller without it
-- pays one call node, not the privilege test's expression. Anyone may call it: it
-- reads the caller's own setting.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._moved_clock(setting text)
RETURNS timestamptz
LANGUAGE sql
STABLE
STRICT
BEGIN ATOMIC
    SELECT CASE
        WHEN has_schema_privilege(coalesce(nullif(current_setting('role'), 'none'), session_user::text)::name,
                                  'treadle', 'CREATE')
        THEN setting::timestamptz
    END;
END;
COMMENT ON FUNCTION treadle._moved_clock(text) IS
    'The time the setting treadle.now gives, for a role that may create in schema treadle; null for any other.';

--------------------------------------------------------------------------------
-- treadle.now() -> timestamptz
--
-- The one clock of every transition: the start of the current statement. Tests
-- move time without sleeping by setting treadle.now in their session; the setting
-- is obeyed only for a role that may create objects in schema treadle (its owner,
-- a superuser), who could change any row anyway. Everyone else gets the server's time.
-- Inlined into each caller's statement: without the setting it costs the setting's
-- read and the statement's time (treadle._moved_clock runs only with it).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.now()
RETURNS timestamptz
LANGUAGE sql
STABLE
BEGIN ATOMIC
    SELECT coalesce(treadle._moved_clock(nullif(current_setting('treadle.now', true), '')), statement_timestamp());
END;
COMMENT ON FUNCTION treadle.now() IS
    'treadle''s clock: statement_timestamp(), or the setting treadle.now in a session of the schema''s owner.';

--------------------------------------------------------------------------------
-- treadle._caller() -> name
--
-- The role a call is made for: the session's role (SET ROLE's, or the login's).
-- Inside a SECURITY DEFINER function current_user is the owner, so tenant rules
-- read this instead. Anyone may call it: it names the caller's own role.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._caller()
RETURNS name
LANGUAGE sql
STABLE
BEGIN ATOMIC
    SELECT coalesce(nullif(current_setting('role'), 'none'), session_user::text)::name;
END;
COMMENT ON FUNCTION treadle._caller() IS
    'The role a call is made for: SET ROLE''s role, or the session''s login role.';

--------------------------------------------------------------------------------
-- treadle._caller_role() -> regrole
--
-- The caller's role (treadle._caller) by its OID: the tenant rule is keyed by
-- OID, so renaming a role does not lift it. Null for a role that no longer exists.
-- Anyone may call it and treadle._caller (the policies in 088_policies.sql do, as
-- the reader): they tell a role of itself only. Neither runs as the owner, so
-- enqueue and claim, which test the tenant rule inline, pay no definer call for it.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._caller_role()
RETURNS regrole
LANGUAGE sql
STABLE
BEGIN ATOMIC
    SELECT pg_catalog.to_regrole(pg_catalog.quote_ident(treadle._caller()));
END;
COMMENT ON FUNCTION treadle._caller_role() IS
    'The role a call is made for, by OID (null when it no longer exists).';

--------------------------------------------------------------------------------
-- treadle._caller_prefix() -> text
--
-- The queue prefix the caller is kept to (treadle.set_tenant), or '' for a role
-- that is not a tenant: every queue starts with ''. It runs as the owner, so the
-- row-level security policies (088_policies.sql), which call it as the reader,
-- read treadle.tenants through it without reading each other; anyone may call it:
-- it tells a role its own prefix only. (PL/pgSQL: a definer SQL function is never
-- inlined, and each call would read and plan its body again; this plans it once per
-- session. The finish paths call it once a statement.)
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._caller_prefix()
RETURNS text
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN coalesce((SELECT t.queue_prefix FROM treadle.tenants AS t WHERE t.tenant_role = treadle._caller_role()), '');
END;
$$;
COMMENT ON FUNCTION treadle._caller_prefix() IS
    'The queue prefix a tenant caller is kept to, or '''' for any other role.';

--------------------------------------------------------------------------------
-- treadle._check_queue_allowed(queue) -> void
--
-- Raises 42501 when the caller is a tenant (treadle.tenants) and the queue, which
-- the caller named, is not one of its queues. enqueue and claim test the same rule
-- inline first (a call costs more than the test) and call this only to raise.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_queue_allowed(queue text)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_prefix text := treadle._caller_prefix();
BEGIN
    IF NOT starts_with(queue, v_prefix) THEN
        RAISE EXCEPTION 'treadle: role % may not use queue %', treadle._caller(), queue
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = format('Its queues start with %L.', v_prefix);
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._check_queue_allowed(text) IS
    'Raise 42501 when a tenant caller names a queue outside its prefix.';

--------------------------------------------------------------------------------
-- treadle._check_row_allowed(queue, what) -> void
--
-- treadle._check_queue_allowed for a row the caller named by id or name (a job, a
-- run, a schedule): the refusal names neither the row's queue nor anything else
-- of it, so a tenant learns nothing of another tenant's rows from it.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_row_allowed(queue text, what text)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_prefix text := treadle._caller_prefix();
BEGIN
    IF NOT starts_with(queue, v_prefix) THEN
        RAISE EXCEPTION 'treadle: role % may not use queue of this %: it is not one of its queues',
                        treadle._caller(), what
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = format('Its queues start with %L.', v_prefix);
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._check_row_allowed(text, text) IS
    'Raise 42501, naming nothing of the row, when a tenant caller names a row outside its queues.';

--------------------------------------------------------------------------------
-- treadle._check_workflow_allowed(name) -> void
--
-- Workflow definitions belong to a tenant: a tenant's workflow names start with
-- its queue prefix, as its queues do. Raises 42501 for any other name.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_workflow_allowed(name text)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_prefix text := treadle._caller_prefix();
BEGIN
    IF NOT starts_with(name, v_prefix) THEN
        RAISE EXCEPTION 'treadle: role % may not use workflow %', treadle._caller(), name
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = format('Its workflows'' names start with %L, as its queues do.', v_prefix);
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._check_workflow_allowed(text) IS
    'Raise 42501 when a tenant caller names a workflow outside its prefix.';

--------------------------------------------------------------------------------
-- treadle._is_name(value) -> boolean
--
-- The rule for names and keys: 1 to 200 characters, not only spaces, no control
-- characters. Null for null.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._is_name(value text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
BEGIN ATOMIC
    SELECT btrim(value) <> '' AND length(value) <= 200 AND value !~ '[[:cntrl:]]';
END;
COMMENT ON FUNCTION treadle._is_name(text) IS
    'True for a name or key of 1 to 200 characters, not only spaces, without control characters.';

--------------------------------------------------------------------------------
-- treadle._check_text(value, argument) -> void
--
-- A name or key: raises 22004 when value is null, 22023 when it is empty, only
-- spaces, longer than 200 characters or holds a control character.
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
    IF NOT treadle._is_name(value) THEN
        RAISE EXCEPTION 'treadle: % must be 1 to 200 characters, not only spaces, without control characters', argument
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._check_text(text, text) IS
    'Raise 22004 for a null name, 22023 for an empty, blank, over-long or control-character one.';

--------------------------------------------------------------------------------
-- treadle._check_names(value, argument) -> void
--
-- A list of queue, job or step names: raises 22004 when it is null, 22023 when it
-- is empty, not one-dimensional, longer than 1,000 names, or holds a name that
-- treadle._check_text refuses.
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
    IF cardinality(value) = 0 OR array_ndims(value) <> 1 OR cardinality(value) > 1000 THEN
        RAISE EXCEPTION 'treadle: % must be a list of 1 to 1000 names', argument
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT treadle._are_names(value) THEN
        RAISE EXCEPTION 'treadle: % must hold names of 1 to 200 characters, not only spaces, without control characters', argument
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._check_names(text[], text) IS
    'Raise 22004 for a null list of names, 22023 for an empty, nested or over-long one or a bad name.';

--------------------------------------------------------------------------------
-- treadle._names_text(value) -> text
-- treadle._are_names(value) -> boolean
--
-- For a list that treadle._check_names accepts (1 to 1,000 names, one dimension,
-- each one treadle._is_name accepts), its names joined by chr(1); null for any
-- other; _are_names: whether there is one. Claims test their lists at every call,
-- so the whole list is tested at once, not name by name (a loop cost 0.35 ms per
-- 1,000 names, a subquery over unnest as much): the names joined, a null written
-- chr(2), and that text matched by two expressions (each name of a non-space and
-- no control character, each of at most 200 characters) once chr(1) is known to
-- occur only between names.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._names_text(value text[])
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_text text;
BEGIN
    IF value IS NULL OR cardinality(value) NOT BETWEEN 1 AND 1000 OR array_ndims(value) <> 1 THEN
        RETURN NULL;
    END IF;
    v_text := array_to_string(value, chr(1), chr(2));
    -- (a name holding chr(1) would pass for two: the separators are counted first)
    IF length(v_text) - length(replace(v_text, chr(1), '')) = cardinality(value) - 1
       AND v_text ~ '^ *[^ [:cntrl:]][^[:cntrl:]]*(?:\x01 *[^ [:cntrl:]][^[:cntrl:]]*)*$'
       AND v_text !~ '[^\x01]{201}' THEN
        RETURN v_text;
    END IF;
    RETURN NULL;
END;
$$;
COMMENT ON FUNCTION treadle._names_text(text[]) IS
    'A valid list of 1 to 1000 names joined by chr(1); null for any other list.';

CREATE OR REPLACE FUNCTION treadle._are_names(value text[])
RETURNS boolean
LANGUAGE sql
IMMUTABLE
RETURN treadle._names_text(value) IS NOT NULL;
COMMENT ON FUNCTION treadle._are_names(text[]) IS
    'True for a list of 1 to 1000 names, one-dimensional, each a valid name.';

--------------------------------------------------------------------------------
-- treadle._max_payload_bytes() -> integer
--
-- The largest args, input, result or progress message accepted, in bytes.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._max_payload_bytes()
RETURNS integer
LANGUAGE sql
STABLE
BEGIN ATOMIC
    SELECT coalesce((SELECT s.max_payload_bytes FROM treadle.settings AS s), 1048576);
END;
COMMENT ON FUNCTION treadle._max_payload_bytes() IS
    'The payload size limit: treadle.settings, or 1 MiB.';

--------------------------------------------------------------------------------
-- treadle._max_map_elements() -> integer
--
-- The most elements a workflow map step fans out over (treadle._enqueue_map).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._max_map_elements()
RETURNS integer
LANGUAGE sql
STABLE
BEGIN ATOMIC
    SELECT coalesce((SELECT s.max_map_elements FROM treadle.settings AS s), 100000);
END;
COMMENT ON FUNCTION treadle._max_map_elements() IS
    'The fan-out limit of a map step: treadle.settings, or 100,000.';

--------------------------------------------------------------------------------
-- treadle._retention() -> (retain_completed, retain_failed)
--
-- How long finished jobs and workflow runs are kept before apply_retention deletes
-- them: completed ones, and discarded or cancelled ones; null keeps them forever.
-- treadle.settings, or the defaults: 7 days for completed work (prune's default: a
-- week of results to look at, and idempotency keys held as long) and 30 days for
-- failures, which someone may still need to read or retry.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._retention(OUT retain_completed interval, OUT retain_failed interval)
LANGUAGE sql
STABLE
BEGIN ATOMIC
    SELECT CASE WHEN s.only_row THEN s.retain_completed ELSE interval '7 days' END,
           CASE WHEN s.only_row THEN s.retain_failed ELSE interval '30 days' END
      FROM (SELECT) AS one
      LEFT JOIN treadle.settings AS s ON true;
END;
COMMENT ON FUNCTION treadle._retention() IS
    'Global retention of finished work: treadle.settings, or 7 days completed and 30 days failed.';

--------------------------------------------------------------------------------
-- treadle._too_deep(value) -> boolean
--
-- True when a JSON value nests objects or arrays more than 100 levels deep (an
-- object or array 100 levels below the top one).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._too_deep(value jsonb)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
BEGIN ATOMIC
    SELECT jsonb_path_exists(value, 'strict $.**{100} ? (@.type() == "object" || @.type() == "array")');
END;
COMMENT ON FUNCTION treadle._too_deep(jsonb) IS
    'True for a JSON value nested more than 100 levels deep.';

--------------------------------------------------------------------------------
-- treadle._check_payload(value, argument, max_bytes) -> void
--
-- Raises 22023 when a JSON value is larger than max_bytes or nested deeper than
-- 100 levels (no client should meet a document its JSON parser cannot read).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_payload(value jsonb, argument text, max_bytes integer)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_column_size(value) > max_bytes THEN
        RAISE EXCEPTION 'treadle: % is % bytes, more than the limit of % bytes', argument, pg_column_size(value), max_bytes
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Store large data elsewhere and pass a reference; the owner sets the limit with treadle.configure.';
    END IF;
    IF treadle._too_deep(value) THEN
        RAISE EXCEPTION 'treadle: % is nested more than 100 levels deep', argument
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._check_payload(jsonb, text, integer) IS
    'Raise 22023 for a JSON value over the size limit or nested more than 100 levels.';

--------------------------------------------------------------------------------
-- treadle._payload(value, argument) -> jsonb
--
-- Job args and workflow input: SQL NULL and JSON null become {}; anything but an
-- object or an array, or a value treadle._check_payload refuses, raises 22023.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._payload(value jsonb, argument text)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
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
    PERFORM treadle._check_payload(value, argument, treadle._max_payload_bytes());
    RETURN value;
END;
$$;
COMMENT ON FUNCTION treadle._payload(jsonb, text) IS
    'Normalise job args or workflow input: null becomes {}; scalars and oversized values raise 22023.';

--------------------------------------------------------------------------------
-- treadle._check_interval(value, argument, at_most, may_be_zero) -> void
--
-- Raises 22023 when an interval is negative (or zero, unless may_be_zero) or
-- longer than at_most. A null value passes: callers decide what null means.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_interval(value interval, argument text, at_most interval,
                                                   may_be_zero boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF value < interval '0' OR (value = interval '0' AND NOT may_be_zero) OR value > at_most THEN
        RAISE EXCEPTION 'treadle: % must be % and at most %, got %', argument,
                        CASE WHEN may_be_zero THEN 'zero or more' ELSE 'positive' END, at_most, value
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._check_interval(interval, text, interval, boolean) IS
    'Raise 22023 for an interval that is negative, zero (unless allowed) or longer than its bound.';

--------------------------------------------------------------------------------
-- treadle._jitter(delay) -> interval
--
-- A retry delay spread out: a time drawn uniformly between half the delay and the
-- whole of it ("equal jitter"). Jobs that failed together (an API went down for
-- all of them at once) would otherwise all retry at the same instant, and fail
-- together again; half the delay is kept so a retry never comes much sooner than
-- asked.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._jitter(delay interval)
RETURNS interval
LANGUAGE sql
VOLATILE
BEGIN ATOMIC
    SELECT delay * (0.5 + random() / 2);
END;
COMMENT ON FUNCTION treadle._jitter(interval) IS
    'A retry delay with equal jitter: uniformly between half the delay and the delay.';

--------------------------------------------------------------------------------
-- treadle._backoff(attempt) -> interval
--
-- The default delay before a failed attempt runs again: 2^attempt seconds, capped
-- at one hour, with jitter (treadle._jitter).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._backoff(attempt integer)
RETURNS interval
LANGUAGE sql
VOLATILE
BEGIN ATOMIC
    -- 2^12 s already passes the cap; the exponent is bounded so it never overflows
    SELECT treadle._jitter(make_interval(secs => least(power(2, least(greatest(attempt, 0), 12)), 3600)));
END;
COMMENT ON FUNCTION treadle._backoff(integer) IS
    'Default retry delay: 2^attempt seconds, at most one hour, with equal jitter.';

--------------------------------------------------------------------------------
-- treadle._retry_delay(attempt, backoff) -> interval
--
-- The delay after failed attempt `attempt` of a job whose backoff column is
-- `backoff`: its attempt-th delay (the last one for every later attempt), with
-- jitter; the default backoff when the job has none.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._retry_delay(attempt integer, backoff interval[])
RETURNS interval
LANGUAGE sql
VOLATILE
BEGIN ATOMIC
    SELECT CASE WHEN backoff IS NULL THEN treadle._backoff(attempt)
                ELSE treadle._jitter(backoff[least(greatest(attempt, 1), cardinality(backoff))]) END;
END;
COMMENT ON FUNCTION treadle._retry_delay(integer, interval[]) IS
    'The jittered delay after a failed attempt: the job''s own backoff list, or the default.';

--------------------------------------------------------------------------------
-- treadle._intervals(value) -> interval[]
--
-- A JSON array of interval strings as interval[] (enqueue_many's backoff); null
-- for null. A string that is not an interval raises its data exception.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._intervals(value jsonb)
RETURNS interval[]
LANGUAGE sql
STABLE
STRICT  -- a job without a backoff (most) costs no call
BEGIN ATOMIC
    SELECT array_agg(e.delay::interval ORDER BY e.ord) FROM jsonb_array_elements_text(value) WITH ORDINALITY AS e(delay, ord);
END;
COMMENT ON FUNCTION treadle._intervals(jsonb) IS
    'A JSON array of interval strings as an interval[].';

--------------------------------------------------------------------------------
-- treadle._check_backoff(value, argument) -> void
--
-- A job's backoff list: raises 22023 when it is empty, not one-dimensional, longer
-- than 100 delays, or holds a null, negative or over-366-day delay. Null passes
-- (the default backoff).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_backoff(value interval[], argument text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF value IS NULL THEN
        RETURN;
    END IF;
    IF cardinality(value) = 0 OR array_ndims(value) <> 1 OR cardinality(value) > 100 THEN
        RAISE EXCEPTION 'treadle: % must be a list of 1 to 100 delays', argument
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(value) AS v(delay)
                WHERE v.delay IS NULL OR v.delay < interval '0' OR v.delay > interval '366 days') THEN
        RAISE EXCEPTION 'treadle: % must hold delays of zero or more and at most 366 days, got %', argument, value
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._check_backoff(interval[], text) IS
    'Raise 22023 for a backoff list that is empty, nested, over 100 long, or holds a bad delay.';

--------------------------------------------------------------------------------
-- treadle._failed_state(cancel_requested, attempt, max_attempts) -> text
--
-- Where a running job goes when its attempt ends without a result (fail, rescue):
-- cancelled when a cancel was asked, discarded when its attempts are spent,
-- retryable otherwise.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._failed_state(cancel_requested boolean, attempt integer, max_attempts integer)
RETURNS text
LANGUAGE sql
IMMUTABLE
BEGIN ATOMIC
    SELECT CASE WHEN cancel_requested THEN 'cancelled'
                WHEN attempt >= max_attempts THEN 'discarded'
                ELSE 'retryable' END;
END;
COMMENT ON FUNCTION treadle._failed_state(boolean, integer, integer) IS
    'The state after an attempt that ended without a result: cancelled, discarded or retryable.';

--------------------------------------------------------------------------------
-- treadle._notify(channel, queue) -> void
--
-- A hint to listeners that a queue changed; never the truth, never job data.
-- Channel treadle_jobs: work became claimable. Channel treadle_done: jobs finished.
-- Channel treadle_cancel (payload: a job id): a cancel was requested of a running job.
-- Identical notifications in one transaction are sent once. A queue name is at
-- most 200 characters, far inside NOTIFY's payload limit.
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
-- treadle._trim_error(error) -> text
--
-- Error text as stored: at most 16,384 characters. A longer one keeps its first
-- and last 8,000 (a traceback's last lines name the exception) with a marker
-- saying how much was cut.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._trim_error(error text)
RETURNS text
LANGUAGE sql
IMMUTABLE
BEGIN ATOMIC
    SELECT CASE WHEN length(error) <= 16384 THEN error
                ELSE left(error, 8000)
                     || format(E'\n[... %s characters cut ...]\n', length(error) - 16000)
                     || right(error, 8000) END;
END;
COMMENT ON FUNCTION treadle._trim_error(text) IS
    'Keep error text to 16,384 characters: its first and last 8,000 when longer.';

--------------------------------------------------------------------------------
-- treadle._append_error(errors, attempt, at, error, worker, started_at) -> jsonb
--
-- A job's error history with one more failed attempt: its number, when it failed,
-- the error, and the worker that ran it and when it started (what the dashboard's
-- attempt history shows); the newest 20 are kept.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._append_error(
    errors jsonb, attempt integer, at timestamptz, error text, worker text, started_at timestamptz
)
RETURNS jsonb
LANGUAGE sql
IMMUTABLE
BEGIN ATOMIC
    SELECT coalesce((SELECT jsonb_agg(e.value ORDER BY e.ord)
                       FROM jsonb_array_elements(errors) WITH ORDINALITY AS e(value, ord)
                      WHERE e.ord > jsonb_array_length(errors) - 19), '[]'::jsonb)
           || jsonb_build_array(jsonb_build_object('attempt', attempt, 'at', at, 'error', error,
                                                   'worker', worker, 'started_at', started_at));
END;
COMMENT ON FUNCTION treadle._append_error(jsonb, integer, timestamptz, text, text, timestamptz) IS
    'Append one failed attempt to a job''s error history, keeping the newest 20.';
