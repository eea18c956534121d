--------------------------------------------------------------------------------
-- treadle.enqueue(name, args, queue, priority, run_at, max_attempts,
--                 idempotency_key, every, timeout, backoff,
--                 on_conflict, unique_while, unique_period, meta,
--                 concurrency_key) -> bigint
--
-- Transition: (none) -> available, in the caller's transaction; with a key held
-- by a waiting job and on_conflict other than 'keep': that job's args (and run_at)
-- change instead.
-- Returns the new job's id. With an idempotency key that a job holds (see
-- 032_enqueue_keys.sql: the job holds it while it waits ('waiting'), waits or runs
-- ('active') or until retention ('retained', the default), per unique_period
-- bucket of treadle's clock when one is given), on_conflict chooses:
--   'keep'         returns the holder's id, whatever its state; inserts nothing;
--   'replace'      a waiting holder (available or retryable) takes the new args
--                  and run_at (debounce: the last call wins, the timer restarts;
--                  a keyed holder's slot then goes to its key's job due longest);
--   'replace_args' a waiting holder takes the new args, keeps its run_at (throttle);
--   'append'       a waiting holder's args (an object) get each array member of
--                  the new args appended to theirs (batch; treadle._append_args).
-- With the last three, a holder that runs or has finished is never changed: it
-- gives its key up (key_scope 'released') and a new job takes it. A caller that
-- meets another's uncommitted insert or change of the key waits for it, then acts
-- on what it committed. Keys are per queue. With `every`, the
-- job starts a periodic series (see treadle._follow_up). `timeout` bounds how long
-- one attempt may run (treadle.rescue takes back a job still running past it);
-- `backoff` lists the delays before retries 1, 2, ... (the last one repeats), each
-- with jitter (treadle._retry_delay); null means the default backoff. `meta` is
-- the producer's metadata (a JSON object, e.g. trace context; SQL or JSON null:
-- none): stored on the job, read by its handler, copied to a periodic job's next
-- occurrence; a merge into a held key's job keeps that job's meta.
-- `concurrency_key` puts the job in that key's lane (034_key_lanes.sql): it
-- starts blocked, and is released (available) while the key has room under its
-- queue's key_limit (treadle.set_queue), oldest first.
-- Raises 22004: name, queue or priority null. 22023: name, queue or key empty,
-- blank, over 200 characters or with a control character; args neither an object
-- nor an array, over the size limit or nested over 100 levels; max_attempts < 1;
-- run_at infinite; every not positive, over 10 years, or so long that the next
-- occurrence is past the last time PostgreSQL can hold; timeout not positive or
-- over 7 days; backoff empty, over 100 delays, or with a null, negative or
-- over-366-day delay; on_conflict, unique_while or unique_period as
-- treadle._check_key_options refuses them; merged args as treadle._append_args
-- refuses them; meta not an object, over the size limit or nested over 100
-- levels; concurrency_key empty, blank, over 200 characters or with a control
-- character. 22004 also: on_conflict or unique_while null. 42501: a tenant's
-- queue outside its prefix. TQ001: the queue holds its max_depth of waiting jobs
-- (treadle.set_queue); nothing is written.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.enqueue(
    name            text,
    args            jsonb       DEFAULT '{}',
    queue           text        DEFAULT 'default',
    priority        integer     DEFAULT 0,
    run_at          timestamptz DEFAULT treadle.now(),  -- now, by treadle's one clock
    max_attempts    integer     DEFAULT 25,
    idempotency_key text        DEFAULT NULL,
    every           interval    DEFAULT NULL,
    timeout         interval    DEFAULT NULL,
    backoff         interval[]  DEFAULT NULL,
    on_conflict     text        DEFAULT 'keep',
    unique_while    text        DEFAULT 'retained',
    unique_period   interval    DEFAULT NULL,
    meta            jsonb       DEFAULT NULL,
    concurrency_key text        DEFAULT NULL
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now  timestamptz := treadle.now();
    v_args jsonb;
    v_id   bigint;
    v_foreign   boolean;  -- a tenant names a queue outside its prefix
    v_max_depth integer;
    v_period    timestamptz;  -- the start of the key's period (unique_period)
    v_run_at    timestamptz;
    v_meta      jsonb;
    v_key       text;     -- a merge: the concurrency key of the job merged into
    v_xid       xid8;     -- on_conflict 'replace': the transaction's id, the merged job's ready_txid
    v_new_id    bigint;   -- on_conflict other than 'keep': the id a new job takes (another one returned: a merge)
    v_held      jsonb;    -- on_conflict 'append': the holder's args, before the merge
    v_slot      boolean;  -- a concurrency key of no other job: the new job took its first slot
BEGIN
    -- The common call (no key, no option but queue, priority, run_at and max_attempts,
    -- small args): its checks in one expression, and the tenant rule and max_depth read
    -- by the insert itself: first from treadle.enqueue_guards alone (066_enqueue_guards.sql:
    -- one index for the queue's max_depth and for any tenant), and when a guard is there,
    -- from treadle.tenants (by the caller's role) and treadle.queues. Anything else, or a
    -- queue with a tenant rule against the caller or a max_depth (nothing inserted then),
    -- goes the whole way below, which raises what it raises. Under 800 bytes, args are inside the size limit (never
    -- under 1 KiB) and cannot nest 100 levels (8 bytes a level) unless they came
    -- compressed (read from a table: their size is then no bound on their depth).
    -- Not on Citus, where an INSERT ... SELECT goes through the coordinator and the
    -- insert below is routed.
    IF current_setting('citus.version', true) IS NULL
       AND enqueue.idempotency_key IS NULL AND enqueue.concurrency_key IS NULL AND enqueue.meta IS NULL
       AND enqueue.every IS NULL AND enqueue.timeout IS NULL AND enqueue.backoff IS NULL
       AND enqueue.unique_period IS NULL AND enqueue.on_conflict = 'keep' AND enqueue.unique_while = 'retained'
       AND enqueue.priority IS NOT NULL AND enqueue.max_attempts >= 1 AND isfinite(enqueue.run_at)
       AND treadle._is_name(enqueue.name) AND treadle._is_name(enqueue.queue)
       AND jsonb_typeof(enqueue.args) = ANY (ARRAY['object', 'array']) AND pg_column_size(enqueue.args) < 800
       AND pg_column_compression(enqueue.args) IS NULL THEN
        INSERT INTO treadle.jobs AS j (queue, name, args, priority, run_at, max_attempts, created_at, state)
        SELECT enqueue.queue, enqueue.name, enqueue.args, enqueue.priority, enqueue.run_at,
               enqueue.max_attempts, v_now, 'available'
         WHERE NOT EXISTS (SELECT 1 FROM treadle.enqueue_guards AS g
                            WHERE g.queue = ANY (ARRAY[enqueue.queue, '']))
        RETURNING j.id INTO v_id;
        IF v_id IS NULL THEN
            INSERT INTO treadle.jobs AS j (queue, name, args, priority, run_at, max_attempts, created_at, state)
            SELECT enqueue.queue, enqueue.name, enqueue.args, enqueue.priority, enqueue.run_at,
                   enqueue.max_attempts, v_now, 'available'
             WHERE NOT EXISTS (SELECT 1 FROM treadle.tenants AS t
                                WHERE t.tenant_role = treadle._caller_role()
                                  AND NOT starts_with(enqueue.queue, t.queue_prefix))
               AND NOT EXISTS (SELECT 1 FROM treadle.queues AS s
                                WHERE s.queue = enqueue.queue AND s.max_depth IS NOT NULL)
            RETURNING j.id INTO v_id;
        END IF;
        IF v_id IS NOT NULL THEN
            IF enqueue.run_at <= v_now THEN
                PERFORM treadle._notify('treadle_jobs', enqueue.queue);
            END IF;
            RETURN v_id;
        END IF;
    END IF;

    -- Still a hot path, and a PL/pgSQL helper call costs as much as the insert: the
    -- checks are inline expressions, and a helper runs only to raise.
    IF enqueue.name IS NULL OR enqueue.queue IS NULL OR enqueue.priority IS NULL THEN
        RAISE EXCEPTION 'treadle: % must not be null',
                        CASE WHEN enqueue.name IS NULL THEN 'name'
                             WHEN enqueue.queue IS NULL THEN 'queue' ELSE 'priority' END
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- a bad name raises in _check_text, which is called only then
    IF NOT treadle._is_name(enqueue.name) THEN
        PERFORM treadle._check_text(enqueue.name, 'name');
    END IF;
    IF NOT treadle._is_name(enqueue.queue) THEN
        PERFORM treadle._check_text(enqueue.queue, 'queue');
    END IF;
    IF NOT treadle._is_name(enqueue.idempotency_key) THEN
        PERFORM treadle._check_text(enqueue.idempotency_key, 'idempotency_key');
    END IF;
    IF enqueue.concurrency_key IS NOT NULL AND NOT treadle._is_name(enqueue.concurrency_key) THEN
        PERFORM treadle._check_text(enqueue.concurrency_key, 'concurrency_key');
    END IF;
    IF enqueue.on_conflict IS DISTINCT FROM 'keep' OR enqueue.unique_while IS DISTINCT FROM 'retained'
       OR enqueue.unique_period IS NOT NULL THEN
        PERFORM treadle._check_key_options(enqueue.idempotency_key, enqueue.args, enqueue.on_conflict,
                                           enqueue.unique_while, enqueue.unique_period);
        IF enqueue.unique_period IS NOT NULL THEN
            v_period := date_bin(enqueue.unique_period, v_now, timestamptz '2000-01-01 00:00:00+00');
        END IF;
    END IF;
    v_args := CASE WHEN enqueue.args IS NULL OR jsonb_typeof(enqueue.args) = 'null' THEN '{}' ELSE enqueue.args END;
    IF jsonb_typeof(v_args) <> ALL (ARRAY['object', 'array']) THEN
        RAISE EXCEPTION 'treadle: args must be a JSON object or array, not %', jsonb_typeof(v_args)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- the limit is read only for args that could pass it: it is never under 1 KiB; and
    -- a JSON value nested over 100 levels takes at least 800 bytes (8 a level), unless
    -- it came compressed (from a table)
    IF (pg_column_size(v_args) > 1024 AND pg_column_size(v_args) > treadle._max_payload_bytes())
       OR ((pg_column_size(v_args) >= 800 OR pg_column_compression(v_args) IS NOT NULL)
           AND treadle._too_deep(v_args)) THEN
        PERFORM treadle._check_payload(v_args, 'args', treadle._max_payload_bytes());
    END IF;
    IF enqueue.meta IS NOT NULL AND jsonb_typeof(enqueue.meta) <> 'null' THEN
        IF jsonb_typeof(enqueue.meta) <> 'object' THEN
            RAISE EXCEPTION 'treadle: meta must be a JSON object, not %', jsonb_typeof(enqueue.meta)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF (pg_column_size(enqueue.meta) > 1024 AND pg_column_size(enqueue.meta) > treadle._max_payload_bytes())
           OR ((pg_column_size(enqueue.meta) >= 800 OR pg_column_compression(enqueue.meta) IS NOT NULL)
               AND treadle._too_deep(enqueue.meta)) THEN
            PERFORM treadle._check_payload(enqueue.meta, 'meta', treadle._max_payload_bytes());
        END IF;
        v_meta := enqueue.meta;
    END IF;
    IF enqueue.max_attempts IS NULL OR enqueue.max_attempts < 1 THEN
        RAISE EXCEPTION 'treadle: max_attempts must be at least 1, got %', coalesce(enqueue.max_attempts::text, 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.every IS NOT NULL THEN
        PERFORM treadle._check_interval(enqueue.every, 'every', interval '10 years');
    END IF;
    IF enqueue.timeout IS NOT NULL THEN
        PERFORM treadle._check_interval(enqueue.timeout, 'timeout', interval '7 days');
    END IF;
    IF enqueue.backoff IS NOT NULL THEN
        PERFORM treadle._check_backoff(enqueue.backoff, 'backoff');
    END IF;
    -- an infinite run_at never comes, and breaks every age the views compute
    IF NOT isfinite(enqueue.run_at) THEN
        RAISE EXCEPTION 'treadle: run_at must be a finite time, got %', enqueue.run_at
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- a next occurrence that cannot be stored would make every finish of the job fail
    IF enqueue.every IS NOT NULL THEN
        BEGIN
            PERFORM coalesce(enqueue.run_at, v_now) + enqueue.every;
        EXCEPTION WHEN datetime_field_overflow THEN
            RAISE EXCEPTION 'treadle: every is too long: %', enqueue.every
                USING ERRCODE = 'invalid_parameter_value';
        END;
    END IF;

    -- One statement reads both: treadle._check_queue_allowed's rule, inline (a helper call
    -- would cost more than the check), and the queue's max_depth, if it has one.
    SELECT EXISTS (SELECT 1 FROM treadle.tenants AS t
                    WHERE t.tenant_role = treadle._caller_role() AND NOT starts_with(enqueue.queue, t.queue_prefix)),
           (SELECT s.max_depth FROM treadle.queues AS s WHERE s.queue = enqueue.queue)
      INTO v_foreign, v_max_depth;
    IF v_foreign THEN
        PERFORM treadle._check_queue_allowed(enqueue.queue);
    END IF;
    -- backpressure: only a queue with a max_depth (treadle.set_queue) counts its waiting jobs
    IF v_max_depth IS NOT NULL THEN
        PERFORM treadle._check_depth(enqueue.queue, v_max_depth, 1);
    END IF;

    -- Without an idempotency key nothing can conflict: a plain insert (a speculative one
    -- costs a probe of the key's index and a WAL record more). A job with a concurrency
    -- key of no other job (no row in treadle.key_slots: no slot held, none blocked) takes
    -- a slot at once and is inserted available, as treadle._key_release would release it.
    IF enqueue.idempotency_key IS NULL THEN
        IF enqueue.concurrency_key IS NOT NULL THEN
            INSERT INTO treadle.key_slots AS k (queue, key, held, updated_at)
            VALUES (enqueue.queue, enqueue.concurrency_key, 1, v_now)
            ON CONFLICT ON CONSTRAINT key_slots_pkey DO NOTHING
            RETURNING true INTO v_slot;
        END IF;
        INSERT INTO treadle.jobs AS j
            (queue, name, args, priority, run_at, max_attempts, every, created_at,
             timeout, backoff, meta, concurrency_key, state, key_slot)
        VALUES
            (enqueue.queue, enqueue.name, v_args, enqueue.priority, coalesce(enqueue.run_at, v_now),
             enqueue.max_attempts, enqueue.every, v_now, enqueue.timeout, enqueue.backoff, v_meta,
             enqueue.concurrency_key,
             CASE WHEN enqueue.concurrency_key IS NULL OR v_slot THEN 'available' ELSE 'blocked' END,
             CASE WHEN enqueue.concurrency_key IS NOT NULL THEN coalesce(v_slot, false) END)
        RETURNING j.id INTO v_id;
        IF enqueue.concurrency_key IS NOT NULL AND v_slot IS NULL THEN
            -- the key has a row: wait in its lane (034_key_lanes.sql), released if it has room
            PERFORM treadle._key_release(enqueue.queue, enqueue.concurrency_key, 0);
        ELSIF coalesce(enqueue.run_at, v_now) <= v_now THEN
            PERFORM treadle._notify('treadle_jobs', enqueue.queue);
        END IF;
        RETURN v_id;
    END IF;

    IF enqueue.on_conflict IS DISTINCT FROM 'keep' THEN
        -- (a key and a known mode: checked above)
        -- The DO UPDATE below calls no function (Citus allows only immutable ones there):
        -- the transaction id is read before, and 'append' keeps the holder's args there,
        -- locking it, and merges them by its id after. The new job's id is drawn just
        -- before each insert (as its default would be), so that another id returned is a merge.
        IF enqueue.on_conflict = 'replace' THEN
            v_xid := pg_current_xact_id();
        END IF;
        LOOP
            v_new_id := nextval('treadle.jobs_id_seq'::regclass);
            INSERT INTO treadle.jobs AS j
                (id, queue, name, args, priority, run_at, max_attempts, idempotency_key, every, created_at,
                 timeout, backoff, key_scope, key_period, meta, concurrency_key, state, key_slot)
            VALUES
                (v_new_id, enqueue.queue, enqueue.name, v_args, enqueue.priority, coalesce(enqueue.run_at, v_now),
                 enqueue.max_attempts, enqueue.idempotency_key, enqueue.every, v_now,
                 enqueue.timeout, enqueue.backoff, enqueue.unique_while, v_period, v_meta, enqueue.concurrency_key,
                 CASE WHEN enqueue.concurrency_key IS NULL THEN 'available' ELSE 'blocked' END,
                 CASE WHEN enqueue.concurrency_key IS NOT NULL THEN false END)
            ON CONFLICT (queue, idempotency_key, key_period)
               WHERE idempotency_key IS NOT NULL
                 AND (key_scope IS NULL OR key_scope = 'retained'
                      OR (key_scope = 'active' AND finished_at IS NULL)
                      OR (key_scope = 'waiting' AND started_at IS NULL AND finished_at IS NULL))
            DO UPDATE
               SET args = CASE WHEN enqueue.on_conflict = 'append' THEN j.args ELSE excluded.args END,
                   run_at = CASE WHEN enqueue.on_conflict = 'replace' THEN excluded.run_at ELSE j.run_at END,
                   -- a run_at moved earlier must be found by claims that resume (040_claim.sql)
                   ready_txid = CASE WHEN enqueue.on_conflict = 'replace' THEN v_xid ELSE j.ready_txid END
             WHERE j.state = ANY (ARRAY['available', 'retryable', 'blocked'])
            RETURNING j.id, j.run_at, CASE WHEN enqueue.on_conflict = 'append' THEN j.args END, j.concurrency_key
                 INTO v_id, v_run_at, v_held, v_key;

            IF v_id IS NOT NULL THEN
                IF enqueue.on_conflict = 'append' AND v_id <> v_new_id THEN
                    -- 'append' into the holder, which the insert locked
                    UPDATE treadle.jobs AS j
                       SET args = treadle._append_args(v_held, v_args)
                     WHERE j.queue = enqueue.queue AND j.id = v_id;
                END IF;
                -- the key of the job that holds the idempotency key (a merge keeps it, whatever
                -- key the call names): a run_at moved may hand its slot on (034_key_lanes.sql)
                IF v_key IS NOT NULL THEN
                    PERFORM treadle._key_release(enqueue.queue, v_key, 0);
                END IF;
                IF v_run_at <= v_now THEN
                    PERFORM treadle._notify('treadle_jobs', enqueue.queue);
                END IF;
                RETURN v_id;
            END IF;

            -- The holder runs or has finished (the insert locked it): it gives its key up,
            -- unchanged otherwise, and the next insert takes the key.
            UPDATE treadle.jobs AS j
               SET key_scope = 'released'
             WHERE j.queue = enqueue.queue AND j.idempotency_key = enqueue.idempotency_key
               AND j.key_period IS NOT DISTINCT FROM v_period
               AND (j.key_scope IS NULL OR j.key_scope = 'retained'
                    OR (j.key_scope = 'active' AND j.finished_at IS NULL)
                    OR (j.key_scope = 'waiting' AND j.started_at IS NULL AND j.finished_at IS NULL))
               AND j.state <> ALL (ARRAY['available', 'retryable', 'blocked']);
        END LOOP;
    END IF;

    LOOP
        INSERT INTO treadle.jobs AS j
            (queue, name, args, priority, run_at, max_attempts, idempotency_key, every, created_at,
             timeout, backoff, key_scope, key_period, meta, concurrency_key, state, key_slot)
        VALUES
            (enqueue.queue, enqueue.name, v_args, enqueue.priority, coalesce(enqueue.run_at, v_now),
             enqueue.max_attempts, enqueue.idempotency_key, enqueue.every, v_now,
             enqueue.timeout, enqueue.backoff,
             CASE WHEN enqueue.idempotency_key IS NOT NULL THEN enqueue.unique_while END, v_period, v_meta,
             enqueue.concurrency_key,
             -- a job with a concurrency key starts blocked, released below if its key has room
             CASE WHEN enqueue.concurrency_key IS NULL THEN 'available' ELSE 'blocked' END,
             CASE WHEN enqueue.concurrency_key IS NOT NULL THEN false END)
        ON CONFLICT (queue, idempotency_key, key_period)
           WHERE idempotency_key IS NOT NULL
             AND (key_scope IS NULL OR key_scope = 'retained'
                  OR (key_scope = 'active' AND finished_at IS NULL)
                  OR (key_scope = 'waiting' AND started_at IS NULL AND finished_at IS NULL))
        DO NOTHING
        RETURNING j.id INTO v_id;

        IF v_id IS NOT NULL THEN
            IF enqueue.concurrency_key IS NOT NULL THEN
                PERFORM treadle._key_release(enqueue.queue, enqueue.concurrency_key, 0);  -- 034_key_lanes.sql
            END IF;
            IF coalesce(enqueue.run_at, v_now) <= v_now THEN
                PERFORM treadle._notify('treadle_jobs', enqueue.queue);
            END IF;
            RETURN v_id;
        END IF;

        -- The key is taken: by a committed job, or by one whose insert we waited for.
        SELECT j.id INTO v_id FROM treadle.jobs AS j
         WHERE j.queue = enqueue.queue AND j.idempotency_key = enqueue.idempotency_key
           AND j.key_period IS NOT DISTINCT FROM v_period
           AND (j.key_scope IS NULL OR j.key_scope = 'retained'
                OR (j.key_scope = 'active' AND j.finished_at IS NULL)
                OR (j.key_scope = 'waiting' AND j.started_at IS NULL AND j.finished_at IS NULL));
        IF FOUND THEN
            RETURN v_id;
        END IF;
        -- The holder was deleted, or left its scope, between the two statements: try to insert again.
    END LOOP;
END;
$$;
COMMENT ON FUNCTION treadle.enqueue(text, jsonb, text, integer, timestamptz, integer, text, interval,
                                    interval, interval[], text, text, interval, jsonb, text) IS
    'Enqueue a job in the caller''s transaction and return its id (a held idempotency key returns its holder''s id, or merges into it: on_conflict).';

--------------------------------------------------------------------------------
-- treadle.enqueue_many(jobs jsonb) -> setof bigint
--
-- Transition: (none) -> available, for many jobs in one statement.
-- jobs is a JSON array of objects whose keys are enqueue's argument names; a
-- missing key takes enqueue's default, run_at is an ISO 8601 string, every an
-- interval string ("5 minutes"), run_in an interval string counted from now (an
-- alternative to run_at), timeout an interval string, backoff an array of them,
-- on_conflict and unique_while strings and unique_period an interval string, as
-- enqueue takes them. Returns the ids in input order; a key repeated in the
-- array for the same queue, or already held by a job there, returns the first
-- job's id (with on_conflict other than 'keep', the later elements merge into it
-- as enqueue's would, in input order). Concurrent calls sharing keys, in any
-- order, never deadlock.
-- Raises 22004: jobs null. 22023: jobs not an array, or any element bad (not an
-- object, an unknown key, a value of the wrong type or out of range, a name,
-- queue, key or args that enqueue refuses, both run_at and run_in, an infinite
-- run_at, an every, timeout, backoff, on_conflict, unique_while or
-- unique_period as enqueue refuses it, a meta that is not an object, too large
-- or too deep, a concurrency_key that is not a valid key); nothing is written then. 42501: a tenant's queue outside its prefix. TQ001: a queue would
-- pass its max_depth (every element counts, keyed or not); nothing is written.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.enqueue_many(jobs jsonb)
RETURNS SETOF bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- The planner cannot count rows in unnest'ed arrays and takes a large batch for a huge
-- one: JIT compiling then costs more than the insert itself (300 ms at 10,000 jobs).
SET jit = off
AS $$
DECLARE
    c_keys CONSTANT text[] := ARRAY['name', 'args', 'queue', 'priority', 'run_at', 'run_in', 'max_attempts',
                                    'idempotency_key', 'every', 'timeout', 'backoff', 'on_conflict',
                                    'unique_while', 'unique_period', 'meta', 'concurrency_key'];
    v_now      timestamptz := treadle.now();
    v_max_size integer := treadle._max_payload_bytes();
    v_big      boolean;  -- the whole array is over the size limit, so an element may be
    v_deep     boolean;  -- the whole array nests deep enough for an element's args to be too deep
    v_bad      record;
    a_name     text[];
    a_args     jsonb[];
    a_queue    text[];
    a_priority integer[];
    a_run_at   timestamptz[];
    a_max      integer[];
    a_key      text[];
    a_every    interval[];
    a_timeout  interval[];
    a_backoff  jsonb[];      -- each job's backoff as a JSON array (interval[][] cannot be ragged)
    v_keyed    boolean;  -- some element names on_conflict, unique_while or unique_period
    a_mode     text[];       -- on_conflict (null, as the three below, when no element names one)
    a_while    text[];       -- unique_while
    a_period   interval[];   -- unique_period
    a_meta     jsonb[];
    a_ckey     text[];       -- concurrency_key
    v_ids      bigint[];
BEGIN
    IF jobs IS NULL THEN
        RAISE EXCEPTION 'treadle: jobs must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF jsonb_typeof(jobs) <> 'array' THEN
        RAISE EXCEPTION 'treadle: jobs must be a JSON array of objects, not %', jsonb_typeof(jobs)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Size and depth are tested on the whole array first (an element's args lie two
    -- levels down): only a batch that could hold a bad one pays for a test per element.
    v_big := pg_column_size(jobs) > v_max_size;
    v_deep := jsonb_path_exists(jobs, 'strict $.**{102} ? (@.type() == "object" || @.type() == "array")');
    -- The key options are read only from a batch that names one: the others pay nothing for them.
    v_keyed := jsonb_path_exists(jobs, 'strict $[*] ? (exists(@.on_conflict) || exists(@.unique_while) || exists(@.unique_period))');

    -- The shape of every element, in one pass; the first bad one is reported.
    SELECT e.ord, e.problem INTO v_bad
      FROM (SELECT s.ord, CASE
                WHEN jsonb_typeof(s.spec) <> 'object' THEN 'is not an object'
                -- (what is left once every known key is removed: one call, not a subquery per element)
                WHEN s.spec - c_keys <> '{}'::jsonb
                    THEN 'has a key that is not an enqueue argument'
                WHEN jsonb_typeof(s.spec -> 'name') IS DISTINCT FROM 'string' OR NOT treadle._is_name(s.spec ->> 'name')
                    THEN 'needs a "name" of 1 to 200 characters, not only spaces, without control characters'
                WHEN s.spec ? 'queue' AND (jsonb_typeof(s.spec -> 'queue') <> 'string' OR NOT treadle._is_name(s.spec ->> 'queue'))
                    THEN 'has a "queue" that is not 1 to 200 characters, not only spaces, without control characters'
                WHEN s.spec ? 'args' AND jsonb_typeof(s.spec -> 'args') <> ALL (ARRAY['object', 'array', 'null'])
                    THEN 'has "args" that are neither an object nor an array'
                WHEN v_big AND pg_column_size(s.spec -> 'args') > v_max_size
                    THEN format('has "args" larger than the limit of %s bytes', v_max_size)
                WHEN v_deep AND treadle._too_deep(s.spec -> 'args')
                    THEN 'has "args" nested more than 100 levels deep'
                WHEN s.spec ? 'priority' AND NOT treadle._is_int(s.spec -> 'priority', -2147483648, 2147483647)
                    THEN 'has a "priority" that is not an integer'
                WHEN s.spec ? 'max_attempts' AND NOT treadle._is_int(s.spec -> 'max_attempts', 1, 2147483647)
                    THEN 'has a "max_attempts" that is not an integer of at least 1'
                WHEN s.spec ? 'run_at' AND jsonb_typeof(s.spec -> 'run_at') <> ALL (ARRAY['string', 'null'])
                    THEN 'has a "run_at" that is not an ISO 8601 string'
                WHEN s.spec ? 'run_in' AND jsonb_typeof(s.spec -> 'run_in') <> ALL (ARRAY['string', 'null'])
                    THEN 'has a "run_in" that is not an interval string'
                WHEN jsonb_typeof(s.spec -> 'run_at') = 'string' AND jsonb_typeof(s.spec -> 'run_in') = 'string'
                    THEN 'has both "run_at" and "run_in"'
                WHEN s.spec ? 'idempotency_key' AND jsonb_typeof(s.spec -> 'idempotency_key') <> ALL (ARRAY['string', 'null'])
                    THEN 'has an "idempotency_key" that is not a string'
                WHEN jsonb_typeof(s.spec -> 'idempotency_key') = 'string' AND NOT treadle._is_name(s.spec ->> 'idempotency_key')
                    THEN 'has an "idempotency_key" that is not 1 to 200 characters, not only spaces, without control characters'
                WHEN s.spec ? 'every' AND jsonb_typeof(s.spec -> 'every') <> ALL (ARRAY['string', 'null'])
                    THEN 'has an "every" that is not an interval string'
                WHEN s.spec ? 'timeout' AND jsonb_typeof(s.spec -> 'timeout') <> ALL (ARRAY['string', 'null'])
                    THEN 'has a "timeout" that is not an interval string'
                WHEN s.spec ? 'backoff' AND jsonb_typeof(s.spec -> 'backoff') <> ALL (ARRAY['array', 'null'])
                    THEN 'has a "backoff" that is not an array of interval strings'
                WHEN jsonb_typeof(s.spec -> 'backoff') = 'array'
                     AND (jsonb_array_length(s.spec -> 'backoff') NOT BETWEEN 1 AND 100
                          OR EXISTS (SELECT 1 FROM jsonb_array_elements(s.spec -> 'backoff') AS b(delay)
                                      WHERE jsonb_typeof(b.delay) <> 'string'))
                    THEN 'has a "backoff" that is not an array of 1 to 100 interval strings'
                WHEN v_keyed AND s.spec ? 'on_conflict' AND jsonb_typeof(s.spec -> 'on_conflict') <> 'string'
                    THEN 'has an "on_conflict" that is not a string'
                WHEN v_keyed AND s.spec ? 'unique_while' AND jsonb_typeof(s.spec -> 'unique_while') <> 'string'
                    THEN 'has a "unique_while" that is not a string'
                WHEN v_keyed AND s.spec ? 'unique_period' AND jsonb_typeof(s.spec -> 'unique_period') <> ALL (ARRAY['string', 'null'])
                    THEN 'has a "unique_period" that is not an interval string'
                WHEN s.spec ? 'meta' AND jsonb_typeof(s.spec -> 'meta') <> ALL (ARRAY['object', 'null'])
                    THEN 'has a "meta" that is not an object'
                WHEN v_big AND pg_column_size(s.spec -> 'meta') > v_max_size
                    THEN format('has a "meta" larger than the limit of %s bytes', v_max_size)
                WHEN v_deep AND treadle._too_deep(s.spec -> 'meta')
                    THEN 'has a "meta" nested more than 100 levels deep'
                WHEN s.spec ? 'concurrency_key' AND jsonb_typeof(s.spec -> 'concurrency_key') <> ALL (ARRAY['string', 'null'])
                    THEN 'has a "concurrency_key" that is not a string'
                WHEN jsonb_typeof(s.spec -> 'concurrency_key') = 'string' AND NOT treadle._is_name(s.spec ->> 'concurrency_key')
                    THEN 'has a "concurrency_key" that is not 1 to 200 characters, not only spaces, without control characters'
                END AS problem
              FROM jsonb_array_elements(jobs) WITH ORDINALITY AS s(spec, ord)) AS e
     WHERE e.problem IS NOT NULL
     ORDER BY e.ord
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'treadle: jobs element % %', v_bad.ord - 1, v_bad.problem
            USING ERRCODE = 'invalid_parameter_value', DETAIL = 'Elements are counted from 0.';
    END IF;

    -- Typed columns; a malformed time or interval text raises here.
    BEGIN
        SELECT array_agg(s.spec ->> 'name' ORDER BY s.ord),
               array_agg(coalesce(nullif(s.spec -> 'args', 'null'::jsonb), '{}'::jsonb) ORDER BY s.ord),
               array_agg(coalesce(s.spec ->> 'queue', 'default') ORDER BY s.ord),
               array_agg(coalesce((s.spec ->> 'priority')::numeric::integer, 0) ORDER BY s.ord),
               array_agg(coalesce((s.spec ->> 'run_at')::timestamptz, v_now + (s.spec ->> 'run_in')::interval, v_now)
                         ORDER BY s.ord),
               array_agg(coalesce((s.spec ->> 'max_attempts')::numeric::integer, 25) ORDER BY s.ord),
               array_agg(s.spec ->> 'idempotency_key' ORDER BY s.ord),
               array_agg((s.spec ->> 'every')::interval ORDER BY s.ord),
               array_agg((s.spec ->> 'timeout')::interval ORDER BY s.ord),
               array_agg(nullif(s.spec -> 'backoff', 'null'::jsonb) ORDER BY s.ord),
               array_agg(coalesce(s.spec ->> 'on_conflict', 'keep') ORDER BY s.ord) FILTER (WHERE v_keyed),
               array_agg(coalesce(s.spec ->> 'unique_while', 'retained') ORDER BY s.ord) FILTER (WHERE v_keyed),
               array_agg((s.spec ->> 'unique_period')::interval ORDER BY s.ord) FILTER (WHERE v_keyed),
               array_agg(nullif(s.spec -> 'meta', 'null'::jsonb) ORDER BY s.ord),
               array_agg(s.spec ->> 'concurrency_key' ORDER BY s.ord)
          INTO a_name, a_args, a_queue, a_priority, a_run_at, a_max, a_key, a_every, a_timeout, a_backoff,
               a_mode, a_while, a_period, a_meta, a_ckey
          FROM jsonb_array_elements(jobs) WITH ORDINALITY AS s(spec, ord);
        PERFORM treadle._check_backoff(treadle._intervals(b.delays), 'a "backoff" in jobs')
           FROM unnest(a_backoff) AS b(delays)
          WHERE b.delays IS NOT NULL;
    EXCEPTION WHEN data_exception THEN
        IF SQLSTATE = '22023' THEN
            RAISE;  -- already says what is wrong
        END IF;
        RAISE EXCEPTION 'treadle: jobs has a bad run_at, run_in, every, timeout, backoff or unique_period: %', SQLERRM
            USING ERRCODE = 'invalid_parameter_value';
    END;
    v_ids := treadle._enqueue_rows(a_name, a_args, a_queue, a_priority, a_run_at, a_max, a_key, a_every,
                                   a_timeout, a_backoff, a_mode, a_while, a_period, a_meta, a_ckey, v_now);  -- 031
    RETURN QUERY SELECT u.id FROM unnest(v_ids) WITH ORDINALITY AS u(id, ord) ORDER BY u.ord;
END;
$$;
COMMENT ON FUNCTION treadle.enqueue_many(jsonb) IS
    'Enqueue a JSON array of jobs in one statement; returns their ids in input order.';
