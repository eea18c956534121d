--------------------------------------------------------------------------------
-- Queues as objects: pause, resume, limits and backpressure (treadle.queues).
--
-- A queue needs no row: one without a row in treadle.queues has no limits and
-- is not paused, and claims on it never read more than one index probe of that
-- table. A row holds what set_queue, pause and resume said:
--   paused        claim takes nothing from the queue; enqueue still works.
--   concurrency   at most N of its jobs running at once, over every worker.
--   rate_limit    at most N claims per rate_period: a token bucket of N tokens
--                 refilled at N per period, so a burst of N, then N per period.
--   max_depth     enqueue and enqueue_many refuse (SQLSTATE TQ001) a job that
--                 would make the queue hold more than N waiting jobs.
--   retain_completed, retain_failed   how long finished jobs are kept (read by
--                 the retention of finished jobs).
--   key_limit     at most N jobs of one concurrency key released at once (null:
--                 1); key_ordered makes each key an ordered lane (034_key_lanes.sql).
-- Claims on a paused or limited queue lock its row (FOR UPDATE) until they
-- commit, so concurrent claimers take their room one after another and never
-- exceed a limit.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._rate_tokens(rate_limit, rate_period, tokens, updated_at, at) -> double precision
--
-- How many claims a queue's token bucket allows at `at`: the tokens left at
-- updated_at plus rate_limit per rate_period since, at most rate_limit.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._rate_tokens(rate_limit integer, rate_period interval,
                                                tokens double precision, updated_at timestamptz,
                                                at timestamptz)
RETURNS double precision
LANGUAGE sql
IMMUTABLE
BEGIN ATOMIC
    SELECT least(rate_limit::double precision,
                 tokens + rate_limit * greatest(extract(epoch FROM at - updated_at), 0)::double precision
                          / extract(epoch FROM rate_period)::double precision);
END;
COMMENT ON FUNCTION treadle._rate_tokens(integer, interval, double precision, timestamptz, timestamptz) IS
    'The claims a rate-limited queue''s token bucket allows at a time.';

--------------------------------------------------------------------------------
-- treadle._queue_settled(queue) -> void
--
-- Removes a queue's row once it holds no setting at all: such a queue is the
-- same as one that never had a row, and claims on it take the unlimited path.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._queue_settled(queue text)
RETURNS void
LANGUAGE sql
VOLATILE
BEGIN ATOMIC
    DELETE FROM treadle.queues AS s
     WHERE s.queue = _queue_settled.queue
       AND NOT s.paused AND s.concurrency IS NULL AND s.rate_limit IS NULL AND s.max_depth IS NULL
       AND s.retain_completed IS NULL AND s.retain_failed IS NULL
       AND s.key_limit IS NULL AND NOT s.key_ordered;
END;
COMMENT ON FUNCTION treadle._queue_settled(text) IS
    'Delete a queue''s settings row when it holds no setting.';

--------------------------------------------------------------------------------
-- treadle._is_admin() -> boolean
--
-- Whether the caller holds the admin part (treadle.grant_admin): the right to
-- prune, which the owner and superusers hold too.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._is_admin()
RETURNS boolean
LANGUAGE sql
STABLE
BEGIN ATOMIC
    SELECT coalesce(pg_catalog.has_function_privilege(treadle._caller_role()::oid,
                                                      'treadle.prune(interval)'::regprocedure, 'EXECUTE'), false);
END;
COMMENT ON FUNCTION treadle._is_admin() IS
    'Whether the caller holds the admin part (the right to prune).';

--------------------------------------------------------------------------------
-- treadle._check_queue_limits(queue, retain_completed, retain_failed) -> void
--
-- What a role without the admin part may not do to queues (treadle.settings):
-- make a settings row for a queue that has none once max_queues queues have one
-- (pausing or limiting arbitrary names would otherwise fill treadle.queues, and
-- every page and scrape that lists the queues), and set a retention below
-- retention_floor (which would prune the queue without the right to prune).
-- Raises 54000: max_queues reached. 42501: a retention below the floor.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_queue_limits(queue text, retain_completed interval,
                                                       retain_failed interval)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_max   integer;
    v_floor interval;
BEGIN
    IF treadle._is_admin() THEN
        RETURN;
    END IF;
    SELECT coalesce(max(s.max_queues), 1000), coalesce(max(s.retention_floor), interval '1 day')
      INTO v_max, v_floor FROM treadle.settings AS s;
    IF _check_queue_limits.retain_completed < v_floor OR _check_queue_limits.retain_failed < v_floor THEN
        RAISE EXCEPTION 'treadle: role % may not set a retention below %', treadle._caller(), v_floor
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'A shorter retention prunes the queue: it needs the admin part (treadle.grant_admin).';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM treadle.queues AS q WHERE q.queue = _check_queue_limits.queue)
       AND (SELECT count(*) FROM treadle.queues) >= v_max THEN
        RAISE EXCEPTION 'treadle: % queues have settings already: role % may not add another', v_max, treadle._caller()
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'An admin (treadle.grant_admin) may, or the owner raises max_queues (treadle.configure).';
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._check_queue_limits(text, interval, interval) IS
    'Raise 54000 past max_queues queue rows, 42501 for a retention below the floor, for a caller without the admin part.';

--------------------------------------------------------------------------------
-- treadle.set_queue(queue, concurrency, rate_limit, rate_period, max_depth,
--                   retain_completed, retain_failed, key_limit, key_ordered) -> void
--
-- Transition: the queue's settings become exactly these (an argument left out or
-- null is no limit); whether it is paused does not change (pause, resume). A
-- queue left with no setting loses its row. Changing the rate empties nothing:
-- the bucket starts full at the new rate; keeping it keeps the bucket.
-- key_limit: jobs of one concurrency key released at once (null: 1); key_ordered
-- (null: false) makes each key an ordered lane of limit 1 (034_key_lanes.sql). A
-- raised key_limit releases blocked jobs into the new room at once.
-- Raises 22004: queue null. 22023: queue not a valid name; concurrency outside
-- 1..100000; rate_limit outside 1..1000000; rate_limit without rate_period or
-- the reverse; rate_period not positive or over 1 day; max_depth outside
-- 1..1000000; a retention negative or over 100 years; key_limit outside
-- 1..100000; key_ordered with a key_limit over 1. 42501: a tenant's queue
-- outside its prefix; a retention below treadle.settings.retention_floor without
-- the admin part. 54000: a new queue past max_queues without the admin part
-- (treadle._check_queue_limits).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.set_queue(
    queue            text,
    concurrency      integer  DEFAULT NULL,
    rate_limit       integer  DEFAULT NULL,
    rate_period      interval DEFAULT NULL,
    max_depth        integer  DEFAULT NULL,
    retain_completed interval DEFAULT NULL,
    retain_failed    interval DEFAULT NULL,
    key_limit        integer  DEFAULT NULL,
    key_ordered      boolean  DEFAULT false
)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := treadle.now();
BEGIN
    PERFORM treadle._check_text(set_queue.queue, 'queue');
    IF set_queue.concurrency NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'treadle: concurrency must be between 1 and 100000, got %', set_queue.concurrency
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (set_queue.rate_limit IS NULL) <> (set_queue.rate_period IS NULL) THEN
        RAISE EXCEPTION 'treadle: rate_limit and rate_period go together: give both or neither'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF set_queue.rate_limit NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'treadle: rate_limit must be between 1 and 1000000, got %', set_queue.rate_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM treadle._check_interval(set_queue.rate_period, 'rate_period', interval '1 day');
    IF set_queue.max_depth NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'treadle: max_depth must be between 1 and 1000000, got %', set_queue.max_depth
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM treadle._check_interval(set_queue.retain_completed, 'retain_completed', interval '100 years', may_be_zero => true);
    PERFORM treadle._check_interval(set_queue.retain_failed, 'retain_failed', interval '100 years', may_be_zero => true);
    IF set_queue.key_limit NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'treadle: key_limit must be between 1 and 100000, got %', set_queue.key_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF set_queue.key_ordered AND set_queue.key_limit > 1 THEN
        RAISE EXCEPTION 'treadle: an ordered queue runs one job of a key at a time: key_limit must be 1 or null, got %',
                        set_queue.key_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM treadle._check_queue_allowed(set_queue.queue);
    PERFORM treadle._check_queue_limits(set_queue.queue, set_queue.retain_completed, set_queue.retain_failed);

    INSERT INTO treadle.queues AS s
        (queue, concurrency, rate_limit, rate_period, max_depth, retain_completed, retain_failed,
         rate_tokens, rate_updated_at, updated_at, key_limit, key_ordered)
    VALUES
        (set_queue.queue, set_queue.concurrency, set_queue.rate_limit, set_queue.rate_period,
         set_queue.max_depth, set_queue.retain_completed, set_queue.retain_failed,
         set_queue.rate_limit, CASE WHEN set_queue.rate_limit IS NOT NULL THEN v_now END, v_now,
         set_queue.key_limit, coalesce(set_queue.key_ordered, false))
    ON CONFLICT (queue) DO UPDATE
       SET concurrency = excluded.concurrency,
           rate_limit = excluded.rate_limit,
           rate_period = excluded.rate_period,
           max_depth = excluded.max_depth,
           retain_completed = excluded.retain_completed,
           retain_failed = excluded.retain_failed,
           -- the same rate keeps its bucket; a new one starts full
           rate_tokens = CASE WHEN (s.rate_limit, s.rate_period) IS NOT DISTINCT FROM (excluded.rate_limit, excluded.rate_period)
                              THEN s.rate_tokens ELSE excluded.rate_tokens END,
           rate_updated_at = CASE WHEN (s.rate_limit, s.rate_period) IS NOT DISTINCT FROM (excluded.rate_limit, excluded.rate_period)
                                  THEN s.rate_updated_at ELSE excluded.rate_updated_at END,
           updated_at = excluded.updated_at,
           key_limit = excluded.key_limit,
           key_ordered = excluded.key_ordered;
    PERFORM treadle._queue_settled(set_queue.queue);
    PERFORM treadle._key_release_queue(set_queue.queue);  -- a raised key_limit has room
    -- a raised or lifted limit may let waiting jobs run now
    PERFORM treadle._notify('treadle_jobs', set_queue.queue);
END;
$$;
COMMENT ON FUNCTION treadle.set_queue(text, integer, integer, interval, integer, interval, interval, integer, boolean) IS
    'Set a queue''s limits (concurrency, rate, max_depth, key_limit, key_ordered) and retention; a setting left out is none.';

--------------------------------------------------------------------------------
-- treadle.pause(queue) -> boolean
--
-- Transition: the queue is paused: claims take none of its jobs (those running
-- go on); enqueue still works. True when it was not paused before.
-- Raises 22004: queue null. 22023: queue not a valid name. 42501: a tenant's
-- queue outside its prefix. 54000: a new queue past max_queues without the admin
-- part (treadle._check_queue_limits).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.pause(queue text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := treadle.now();
    v_changed boolean;
BEGIN
    PERFORM treadle._check_text(pause.queue, 'queue');
    PERFORM treadle._check_queue_allowed(pause.queue);
    PERFORM treadle._check_queue_limits(pause.queue, NULL, NULL);
    INSERT INTO treadle.queues AS s (queue, paused, updated_at)
    VALUES (pause.queue, true, v_now)
    ON CONFLICT (queue) DO UPDATE
       SET paused = true, updated_at = excluded.updated_at
     WHERE NOT s.paused
    RETURNING true INTO v_changed;
    RETURN coalesce(v_changed, false);
END;
$$;
COMMENT ON FUNCTION treadle.pause(text) IS
    'Pause a queue: claims take none of its jobs, enqueue still works; true when it was not paused.';

--------------------------------------------------------------------------------
-- treadle.resume(queue) -> boolean
--
-- Transition: a paused queue is claimable again (and workers are woken). True
-- when it was paused.
-- Raises 22004: queue null. 22023: queue not a valid name. 42501: a tenant's
-- queue outside its prefix.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.resume(queue text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := treadle.now();
BEGIN
    PERFORM treadle._check_text(resume.queue, 'queue');
    PERFORM treadle._check_queue_allowed(resume.queue);
    UPDATE treadle.queues AS s
       SET paused = false, updated_at = v_now
     WHERE s.queue = resume.queue AND s.paused;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM treadle._queue_settled(resume.queue);
    PERFORM treadle._notify('treadle_jobs', resume.queue);
    RETURN true;
END;
$$;
COMMENT ON FUNCTION treadle.resume(text) IS
    'Resume a paused queue; true when it was paused.';

--------------------------------------------------------------------------------
-- treadle._queue_room(queues, batch) -> jsonb
--
-- What a claim may take from each requested queue, as {queue: count}: 0 from a
-- paused one, the room left under its concurrency and rate limits from a
-- limited one, batch from any other. Locks the limited queues' rows until the
-- claim commits, in queue order (claimers never deadlock), and counts running
-- jobs only after the lock is held: that statement's snapshot then sees every
-- claim that committed while this one waited.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._queue_room(queues text[], batch integer)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now     timestamptz := treadle.now();
    v_room    jsonb := '{}'::jsonb;
    v_row     record;
    v_running bigint;
BEGIN
    PERFORM 1 FROM treadle.queues AS s
      WHERE s.queue = ANY (queues) AND NOT s.paused
        AND (s.concurrency IS NOT NULL OR s.rate_limit IS NOT NULL)
      ORDER BY s.queue
        FOR UPDATE;
    -- a queue at a time: each count of running jobs names its queue (one shard on Citus)
    FOR v_row IN
        SELECT u.q, s.paused, s.concurrency, s.rate_limit, s.rate_period, s.rate_tokens, s.rate_updated_at
          FROM (SELECT DISTINCT q.q FROM unnest(queues) AS q(q)) AS u
          LEFT JOIN treadle.queues AS s ON s.queue = u.q
    LOOP
        v_running := NULL;
        IF v_row.concurrency IS NOT NULL AND NOT v_row.paused THEN
            -- running jobs hold a lease (jobs_lease_check): their index is small
            SELECT count(*) INTO v_running FROM treadle.jobs AS j
             WHERE j.queue = v_row.q AND j.lease_until IS NOT NULL;
        END IF;
        v_room := v_room || jsonb_build_object(v_row.q, CASE
                      WHEN v_row.paused THEN 0
                      ELSE least(batch, v_row.concurrency - v_running,
                                 floor(treadle._rate_tokens(v_row.rate_limit, v_row.rate_period, v_row.rate_tokens,
                                                            v_row.rate_updated_at, v_now))::integer)
                  END);
    END LOOP;
    RETURN v_room;
END;
$$;
COMMENT ON FUNCTION treadle._queue_room(text[], integer) IS
    'What a claim may take from each queue ({queue: count}), locking the limited queues'' rows.';

--------------------------------------------------------------------------------
-- treadle._take_room(ids, room) -> bigint[]
--
-- Of the jobs a claim locked, the best of each queue up to its room (priority,
-- run_at, id order), and spends their rate tokens. Called while _queue_room's
-- locks are held, with the same clock.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._take_room(ids bigint[], room jsonb)
RETURNS bigint[]
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now   timestamptz := treadle.now();
    v_ids   bigint[] := '{}'::bigint[];
    v_queue text;
    v_room  integer;
    v_got   bigint[];
BEGIN
    -- a queue at a time: each statement names its queue (one shard on Citus)
    FOR v_queue, v_room IN SELECT r.key, r.value::integer FROM jsonb_each_text(room) AS r LOOP
        CONTINUE WHEN v_room IS NULL OR v_room <= 0;
        v_got := ARRAY(SELECT j.id FROM treadle.jobs AS j
                        WHERE j.queue = v_queue AND j.id = ANY (ids)
                        ORDER BY j.priority, j.run_at, j.id
                        LIMIT v_room);
        CONTINUE WHEN cardinality(v_got) = 0;
        v_ids := v_ids || v_got;
        UPDATE treadle.queues AS s
           SET rate_tokens = treadle._rate_tokens(s.rate_limit, s.rate_period, s.rate_tokens, s.rate_updated_at, v_now)
                             - cardinality(v_got),
               rate_updated_at = greatest(s.rate_updated_at, v_now)
         WHERE s.queue = v_queue AND s.rate_limit IS NOT NULL;
    END LOOP;
    RETURN v_ids;
END;
$$;
COMMENT ON FUNCTION treadle._take_room(bigint[], jsonb) IS
    'Keep each queue''s best claimed jobs up to its room, and spend their rate tokens.';

--------------------------------------------------------------------------------
-- treadle._check_depth(queue, max_depth, adding) -> void
--
-- Backpressure: raises TQ001 when a queue holding its waiting jobs (available,
-- retryable or blocked, due or not) plus `adding` more would pass max_depth. Counts at most
-- max_depth index entries.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_depth(queue text, max_depth integer, adding integer)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_waiting bigint;
BEGIN
    SELECT count(*) INTO v_waiting
      FROM (SELECT 1 FROM treadle.jobs AS j
             WHERE j.queue = _check_depth.queue
               AND j.state = ANY (ARRAY['available', 'retryable'])
             LIMIT max_depth) AS w;
    -- jobs waiting for their concurrency key's slot (034_key_lanes.sql), from their own index
    v_waiting := v_waiting + (SELECT count(*) FROM (SELECT 1 FROM treadle.jobs AS j
                                                   WHERE j.queue = _check_depth.queue AND j.state = 'blocked'
                                                   LIMIT max_depth) AS b);
    IF v_waiting + adding > max_depth THEN
        RAISE EXCEPTION 'treadle: queue % is full: % waiting jobs, its max_depth is %', queue, v_waiting, max_depth
            USING ERRCODE = 'TQ001',
                  DETAIL = format('Adding %s would pass it.', adding),
                  HINT = 'Retry later, or raise max_depth with treadle.set_queue.';
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._check_depth(text, integer, integer) IS
    'Raise TQ001 when a queue''s waiting jobs plus those being added would pass its max_depth.';

-- Each queue that has settings, as readers see it (tenants: their queues only).
CREATE VIEW treadle.queue_settings WITH (security_invoker = true) AS
SELECT s.queue, s.paused, s.concurrency, s.rate_limit, s.rate_period, s.max_depth,
       s.retain_completed, s.retain_failed, s.updated_at, s.key_limit, s.key_ordered
  FROM treadle.queues AS s
 ORDER BY s.queue;
COMMENT ON VIEW treadle.queue_settings IS
    'Queues that have settings: paused, concurrency, rate limit, max_depth, retention.';
