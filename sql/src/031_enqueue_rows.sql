--------------------------------------------------------------------------------
-- treadle._enqueue_rows(name, args, queue, priority, run_at, max_attempts,
--                       idempotency_key, every, timeout, backoff, on_conflict,
--                       unique_while, unique_period, meta, concurrency_key, now)
--                       -> bigint[]
--
-- Transition: (none) -> available (or blocked), for enqueue_many's rows, one array
-- per column, element i of each being job i (a null array: every job takes the
-- default; on_conflict, unique_while and unique_period null when no job names one).
-- What enqueue_many and enqueue_arrays share once each has checked its rows'
-- shapes: the checks across rows, the one INSERT, the keys, the NOTIFY. Returns
-- the ids in input order.
-- Raises 22023: a timeout, every or run_at out of range, key options as
-- treadle._check_key_options refuses them. 42501: a tenant's queue outside its prefix. TQ001: a queue would
-- pass its max_depth. Nothing is written then.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._enqueue_rows(
    a_name     text[],
    a_args     jsonb[],
    a_queue    text[],
    a_priority integer[],
    a_run_at   timestamptz[],
    a_max      integer[],
    a_key      text[],
    a_every    interval[],
    a_timeout  interval[],
    a_backoff  jsonb[],
    a_mode     text[],
    a_while    text[],
    a_period   interval[],
    a_meta     jsonb[],
    a_ckey     text[],
    v_now      timestamptz
)
RETURNS bigint[]
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    a_bucket   timestamptz[];  -- the start of each key's period
    a_id       bigint[];     -- each row's id, drawn before the insert
    h_id       bigint[];     -- the jobs holding the batch's keys after the insert, and their keys
    h_queue    text[];
    h_key      text[];
    h_period   timestamptz[];
    v_queues   text[];       -- on Citus, the batch's queues in order; else one null: all at once
    v_queue    text;
    v_single   boolean;      -- every row names the same queue
    v_foreign  boolean;      -- (then) a tenant names a queue outside its prefix
    v_max_depth integer;     -- (then) its max_depth
    v_ids      bigint[];
    v_i        bigint;
BEGIN
    -- (checks over whole arrays are expressions, not statements: this runs at every call)
    IF interval '0' >= ANY (a_timeout) OR interval '7 days' < ANY (a_timeout) THEN
        RAISE EXCEPTION 'treadle: jobs has a "timeout" that is not positive or is longer than 7 days'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF interval '0' >= ANY (a_every) OR interval '10 years' < ANY (a_every) THEN
        RAISE EXCEPTION 'treadle: jobs has an "every" that is not positive or is longer than 10 years'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF 'infinity'::timestamptz = ANY (a_run_at) OR '-infinity'::timestamptz = ANY (a_run_at) THEN
        RAISE EXCEPTION 'treadle: jobs has a "run_at" that is not a finite time'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cardinality(array_remove(a_every, NULL)) > 0 THEN  -- (a block with EXCEPTION costs a subtransaction)
        BEGIN
            PERFORM max(u.run_at + u.every) FROM unnest(a_run_at, a_every) AS u(run_at, every);
        EXCEPTION WHEN datetime_field_overflow THEN
            RAISE EXCEPTION 'treadle: jobs has an "every" so long that the next occurrence cannot be stored'
                USING ERRCODE = 'invalid_parameter_value';
        END;
    END IF;
    IF a_name IS NULL THEN
        RETURN ARRAY[]::bigint[];  -- an empty array
    END IF;
    v_single := a_queue[1] = ALL (a_queue);  -- one queue: no set to make of the queues
    IF a_mode IS NOT NULL THEN
        PERFORM treadle._check_key_options(u.key, u.args, u.mode, u.scope, u.period)
           FROM unnest(a_key, a_args, a_mode, a_while, a_period) AS u(key, args, mode, scope, period)
          WHERE u.mode <> 'keep' OR u.scope <> 'retained' OR u.period IS NOT NULL;
        SELECT array_agg(date_bin(u.period, v_now, timestamptz '2000-01-01 00:00:00+00') ORDER BY u.ord)
          INTO a_bucket
          FROM unnest(a_period) WITH ORDINALITY AS u(period, ord);
    END IF;
    -- The rules, read first from treadle.enqueue_guards alone (066_enqueue_guards.sql), as
    -- enqueue's common call reads them: with no guard for the batch's queue and no tenant
    -- anywhere, nothing restricts the batch, and treadle.tenants and treadle.queues are not
    -- read. A batch of several queues takes that way only while there is no guard at all:
    -- the guards tested against each of its rows cost more than the checks below (a plan
    -- kept for the next call tests every element of the array against every guard row).
    -- With a guard (or on Citus, where the guards are not read: docs/citus.md), the checks
    -- below read the rules.
    IF NOT treadle._on_citus()
       AND NOT EXISTS (SELECT 1 FROM treadle.enqueue_guards AS g WHERE g.queue = ANY (ARRAY['', a_queue[1]]))
       AND (v_single OR NOT EXISTS (SELECT 1 FROM treadle.enqueue_guards AS g)) THEN
        NULL;  -- nothing to check
    ELSIF v_single THEN
        -- one statement reads both, as enqueue does: a tenant's rule, and the queue's max_depth
        SELECT EXISTS (SELECT 1 FROM treadle.tenants AS t
                        WHERE t.tenant_role = treadle._caller_role() AND NOT starts_with(a_queue[1], t.queue_prefix)),
               (SELECT s.max_depth FROM treadle.queues AS s WHERE s.queue = a_queue[1])
          INTO v_foreign, v_max_depth;
        IF v_foreign THEN
            PERFORM treadle._check_queue_allowed(a_queue[1]);
        END IF;
        IF v_max_depth IS NOT NULL THEN
            PERFORM treadle._check_depth(a_queue[1], v_max_depth, cardinality(a_queue));
        END IF;
    ELSE
        PERFORM treadle._check_queue_allowed(q.queue) FROM (SELECT DISTINCT u.queue FROM unnest(a_queue) AS u(queue)) AS q;
        PERFORM treadle._check_depth(q.queue, s.max_depth, q.adding)
           FROM (SELECT u.queue, count(*)::integer AS adding FROM unnest(a_queue) AS u(queue) GROUP BY u.queue) AS q
           JOIN treadle.queues AS s ON s.queue = q.queue AND s.max_depth IS NOT NULL;
    END IF;

    -- Ids are drawn first, in a statement of their own, so that each input row knows
    -- its own (Citus refuses nextval inside INSERT ... SELECT).
    SELECT array_agg(nextval('treadle.jobs_id_seq'::regclass)) INTO a_id
      FROM generate_series(1, cardinality(a_name));
    -- One INSERT for all rows, in key order (the first of a repeated key wins), so that
    -- concurrent batches that share keys wait for each other in the same order and never
    -- deadlock. Rows with on_conflict other than 'keep' go through enqueue below. On
    -- Citus, where one statement writes its shards at once, one INSERT per queue, in
    -- queue order: each names its one queue's shard, and the order holds across queues.
    v_queues := ARRAY[NULL::text];
    IF treadle._distributed() THEN
        SELECT array_agg(DISTINCT u.queue ORDER BY u.queue) INTO v_queues FROM unnest(a_queue) AS u(queue);
    END IF;
    FOREACH v_queue IN ARRAY v_queues LOOP
    INSERT INTO treadle.jobs AS j
        (id, queue, name, args, priority, run_at, max_attempts, idempotency_key, every, created_at,
         timeout, backoff, key_scope, key_period, meta, concurrency_key, state, key_slot)
    SELECT i.id, i.queue, i.name, i.args, i.priority, i.run_at, i.max_attempts,
           i.idempotency_key, i.every, v_now, i.timeout, treadle._intervals(i.backoff),
           CASE WHEN i.idempotency_key IS NOT NULL THEN coalesce(i.scope, 'retained') END, i.bucket, i.meta,
           i.ckey, CASE WHEN i.ckey IS NULL THEN 'available' ELSE 'blocked' END,
           CASE WHEN i.ckey IS NOT NULL THEN false END
      FROM unnest(a_id, a_name, a_args, a_queue, a_priority, a_run_at, a_max, a_key, a_every, a_timeout, a_backoff,
                  a_mode, a_while, a_bucket, a_meta, a_ckey)
           WITH ORDINALITY AS i(id, name, args, queue, priority, run_at, max_attempts, idempotency_key, every,
                                timeout, backoff, mode, scope, bucket, meta, ckey, ord)
     WHERE (i.mode IS NULL OR i.mode = 'keep') AND (v_queue IS NULL OR i.queue = v_queue)
     ORDER BY i.queue, i.idempotency_key, i.ord
    ON CONFLICT (queue, idempotency_key, key_period)
       WHERE idempotency_key IS NOT NULL
         AND (key_scope IS NULL OR key_scope = 'retained'
              OR (key_scope = 'active' AND finished_at IS NULL)
              OR (key_scope = 'waiting' AND started_at IS NULL AND finished_at IS NULL))
    DO NOTHING;
    END LOOP;

    IF coalesce(cardinality(array_remove(a_key, NULL)), 0) = 0 THEN
        v_ids := a_id;  -- no keys: every row was inserted
    ELSE
        -- A keyed row's id is its key's holder's: its own row, an earlier element's, or a
        -- job that held the key already (committed, or committed while the insert waited
        -- for it: this statement's snapshot is newer). The holders are read by queue and
        -- key alone, then matched here (no correlated subquery, which Citus refuses).
        IF v_queues = ARRAY[NULL::text] THEN
            -- one server: the batch's (queue, key) pairs joined to the key index
            SELECT array_agg(j.id), array_agg(j.queue), array_agg(j.idempotency_key), array_agg(j.key_period)
              INTO h_id, h_queue, h_key, h_period
              FROM (SELECT DISTINCT u.queue, u.key FROM unnest(a_queue, a_key) AS u(queue, key)
                     WHERE u.key IS NOT NULL) AS k
              JOIN treadle.jobs AS j ON j.queue = k.queue AND j.idempotency_key = k.key
             WHERE j.key_scope IS NULL OR j.key_scope = 'retained'
                OR (j.key_scope = 'active' AND j.finished_at IS NULL)
                OR (j.key_scope = 'waiting' AND j.started_at IS NULL AND j.finished_at IS NULL);
        ELSE
            -- Citus joins no local rows to a distributed table: the queues and keys as arrays
            SELECT array_agg(j.id), array_agg(j.queue), array_agg(j.idempotency_key), array_agg(j.key_period)
              INTO h_id, h_queue, h_key, h_period
              FROM treadle.jobs AS j
             WHERE j.queue = ANY (v_queues) AND j.idempotency_key = ANY (a_key)
               AND (j.key_scope IS NULL OR j.key_scope = 'retained'
                    OR (j.key_scope = 'active' AND j.finished_at IS NULL)
                    OR (j.key_scope = 'waiting' AND j.started_at IS NULL AND j.finished_at IS NULL));
        END IF;
        SELECT array_agg(CASE WHEN i.key IS NULL THEN i.id
                              WHEN i.mode IS NULL OR i.mode = 'keep' THEN h.id END ORDER BY i.ord)
          INTO v_ids
          FROM unnest(a_id, a_queue, a_key, a_bucket, a_mode) WITH ORDINALITY AS i(id, queue, key, bucket, mode, ord)
          LEFT JOIN unnest(h_id, h_queue, h_key, h_period) AS h(id, queue, key, period)
                 ON i.key IS NOT NULL AND h.queue = i.queue AND h.key = i.key
                AND h.period IS NOT DISTINCT FROM i.bucket;
    END IF;

    -- Jobs with a concurrency key were inserted blocked: each key releases what its room
    -- allows (034_key_lanes.sql), keys in order, so that concurrent batches never deadlock.
    IF cardinality(array_remove(a_ckey, NULL)) > 0 THEN
        PERFORM treadle._key_release(k.queue, k.key, 0)
           FROM (SELECT DISTINCT u.queue, u.key FROM unnest(a_queue, a_ckey) AS u(queue, key)
                  WHERE u.key IS NOT NULL) AS k
          ORDER BY k.queue, k.key;
    END IF;

    -- A key whose holder committed while this statement waited is not in its snapshot:
    -- look it up again with a fresh one. Rows that merge into a held key's job go
    -- here too. Key order again, so that concurrent batches never deadlock.
    IF array_position(v_ids, NULL) IS NOT NULL THEN
        FOR v_i IN SELECT u.ord FROM unnest(v_ids, a_queue, a_key) WITH ORDINALITY AS u(id, queue, key, ord)
                    WHERE u.id IS NULL ORDER BY u.queue, u.key, u.ord LOOP
            v_ids[v_i] := treadle.enqueue(a_name[v_i], a_args[v_i], a_queue[v_i], a_priority[v_i],
                                          a_run_at[v_i], a_max[v_i], a_key[v_i], a_every[v_i],
                                          a_timeout[v_i], treadle._intervals(a_backoff[v_i]),
                                          coalesce(a_mode[v_i], 'keep'), coalesce(a_while[v_i], 'retained'),
                                          a_period[v_i], a_meta[v_i], a_ckey[v_i]);
        END LOOP;
    END IF;

    IF v_single THEN
        IF v_now >= ANY (a_run_at) THEN
            PERFORM treadle._notify('treadle_jobs', a_queue[1]);
        END IF;
    ELSE
        PERFORM treadle._notify('treadle_jobs', q.queue)
           FROM (SELECT DISTINCT u.queue FROM unnest(a_queue, a_run_at) AS u(queue, run_at) WHERE u.run_at <= v_now) AS q;
    END IF;

    RETURN v_ids;
END;
$$;
COMMENT ON FUNCTION treadle._enqueue_rows(text[], jsonb[], text[], integer[], timestamptz[], integer[], text[],
                                          interval[], interval[], jsonb[], text[], text[], interval[], jsonb[],
                                          text[], timestamptz) IS
    'enqueue_many''s and enqueue_arrays'' rows, one array per column, checked across rows and inserted; ids in input order.';

--------------------------------------------------------------------------------
-- treadle.enqueue_arrays(name, args, queue, priority, run_at, max_attempts,
--                        idempotency_key, every, timeout, meta, concurrency_key)
--                        -> setof bigint
--
-- Transition: (none) -> available, for many jobs in one statement, as
-- enqueue_many, from one array per column (element i of each is job i) rather than
-- one JSON document: what a client sends as it holds them, with nothing to unpack.
-- name is required; any other array may be null (every job takes enqueue's
-- default), and a null element takes the default for that job. For backoff,
-- on_conflict, unique_while and unique_period, use enqueue_many. Returns the ids
-- in input order, with enqueue_many's rules for keys repeated or already held.
-- Raises 22004: name null. 22023: an array longer or shorter than name or with
-- more than one dimension; any job bad as enqueue_many would refuse its element,
-- with the same words (elements counted from 0: a name, queue, key or
-- concurrency_key that enqueue refuses, args neither an object nor an array, or
-- too large or too deep, max_attempts under 1, an infinite run_at, an every or
-- timeout out of range, a meta that is not an object, too large or too deep);
-- nothing is written then. 42501: a tenant's queue outside its prefix. TQ001: a
-- queue would pass its max_depth; nothing is written.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.enqueue_arrays(
    name            text[],
    args            jsonb[]       DEFAULT NULL,
    queue           text[]        DEFAULT NULL,
    priority        integer[]     DEFAULT NULL,
    run_at          timestamptz[] DEFAULT NULL,
    max_attempts    integer[]     DEFAULT NULL,
    idempotency_key text[]        DEFAULT NULL,
    every           interval[]    DEFAULT NULL,
    timeout         interval[]    DEFAULT NULL,
    meta            jsonb[]       DEFAULT NULL,
    concurrency_key text[]        DEFAULT NULL
)
RETURNS SETOF bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off  -- (as enqueue_many: the planner takes a batch for a huge one)
AS $$
DECLARE
    v_now      timestamptz := treadle.now();
    v_n        integer := cardinality(enqueue_arrays.name);
    v_max_size integer;
    v_bad      record;
    v_wrong    text;
    a_args     jsonb[];
    a_queue    text[];
    a_priority integer[];
    a_run_at   timestamptz[];
    a_max      integer[];
    a_meta     jsonb[];
BEGIN
    IF enqueue_arrays.name IS NULL THEN
        RAISE EXCEPTION 'treadle: name must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    v_wrong := CASE
        WHEN array_ndims(enqueue_arrays.name) > 1 OR array_lower(enqueue_arrays.name, 1) <> 1 THEN 'name'
        WHEN cardinality(enqueue_arrays.args) <> v_n OR array_ndims(enqueue_arrays.args) > 1 OR array_lower(enqueue_arrays.args, 1) <> 1 THEN 'args'
        WHEN cardinality(enqueue_arrays.queue) <> v_n OR array_ndims(enqueue_arrays.queue) > 1 OR array_lower(enqueue_arrays.queue, 1) <> 1 THEN 'queue'
        WHEN cardinality(enqueue_arrays.priority) <> v_n OR array_ndims(enqueue_arrays.priority) > 1 OR array_lower(enqueue_arrays.priority, 1) <> 1 THEN 'priority'
        WHEN cardinality(enqueue_arrays.run_at) <> v_n OR array_ndims(enqueue_arrays.run_at) > 1 OR array_lower(enqueue_arrays.run_at, 1) <> 1 THEN 'run_at'
        WHEN cardinality(enqueue_arrays.max_attempts) <> v_n OR array_ndims(enqueue_arrays.max_attempts) > 1 OR array_lower(enqueue_arrays.max_attempts, 1) <> 1
            THEN 'max_attempts'
        WHEN cardinality(enqueue_arrays.idempotency_key) <> v_n OR array_ndims(enqueue_arrays.idempotency_key) > 1 OR array_lower(enqueue_arrays.idempotency_key, 1) <> 1
            THEN 'idempotency_key'
        WHEN cardinality(enqueue_arrays.every) <> v_n OR array_ndims(enqueue_arrays.every) > 1 OR array_lower(enqueue_arrays.every, 1) <> 1 THEN 'every'
        WHEN cardinality(enqueue_arrays.timeout) <> v_n OR array_ndims(enqueue_arrays.timeout) > 1 OR array_lower(enqueue_arrays.timeout, 1) <> 1 THEN 'timeout'
        WHEN cardinality(enqueue_arrays.meta) <> v_n OR array_ndims(enqueue_arrays.meta) > 1 OR array_lower(enqueue_arrays.meta, 1) <> 1 THEN 'meta'
        WHEN cardinality(enqueue_arrays.concurrency_key) <> v_n OR array_ndims(enqueue_arrays.concurrency_key) > 1 OR array_lower(enqueue_arrays.concurrency_key, 1) <> 1
            THEN 'concurrency_key'
        END;
    IF v_wrong IS NOT NULL THEN
        RAISE EXCEPTION 'treadle: % must be a one-dimensional array, counted from 1, of as many elements as name (%)', v_wrong, v_n
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_n = 0 THEN
        RETURN;
    END IF;

    -- Every job's values, checked and given their defaults in one pass; the first bad
    -- job is reported in enqueue_many's words. A JSON value nested 100 levels deep
    -- takes at least 800 bytes, so only a larger one is walked for its depth.
    v_max_size := treadle._max_payload_bytes();
    SELECT e.ord, e.problem INTO v_bad
      FROM (SELECT r.ord, CASE
                WHEN NOT coalesce(treadle._is_name(r.name), false)
                    THEN 'needs a "name" of 1 to 200 characters, not only spaces, without control characters'
                WHEN NOT treadle._is_name(r.queue)
                    THEN 'has a "queue" that is not 1 to 200 characters, not only spaces, without control characters'
                WHEN jsonb_typeof(r.args) <> ALL (ARRAY['object', 'array', 'null'])
                    THEN 'has "args" that are neither an object nor an array'
                WHEN pg_column_size(r.args) > v_max_size
                    THEN format('has "args" larger than the limit of %s bytes', v_max_size)
                WHEN pg_column_size(r.args) >= 800 AND treadle._too_deep(r.args)
                    THEN 'has "args" nested more than 100 levels deep'
                WHEN r.max_attempts < 1
                    THEN 'has a "max_attempts" that is not an integer of at least 1'
                WHEN NOT isfinite(r.run_at)
                    THEN 'has a "run_at" that is not a finite time'
                WHEN NOT treadle._is_name(r.idempotency_key)
                    THEN 'has an "idempotency_key" that is not 1 to 200 characters, not only spaces, without control characters'
                WHEN r.every <= interval '0' OR r.every > interval '10 years'
                    THEN 'has an "every" that is not positive or is longer than 10 years'
                WHEN r.timeout <= interval '0' OR r.timeout > interval '7 days'
                    THEN 'has a "timeout" that is not positive or is longer than 7 days'
                WHEN jsonb_typeof(r.meta) <> ALL (ARRAY['object', 'null'])
                    THEN 'has a "meta" that is not an object'
                WHEN pg_column_size(r.meta) > v_max_size
                    THEN format('has a "meta" larger than the limit of %s bytes', v_max_size)
                WHEN pg_column_size(r.meta) >= 800 AND treadle._too_deep(r.meta)
                    THEN 'has a "meta" nested more than 100 levels deep'
                WHEN NOT treadle._is_name(r.concurrency_key)
                    THEN 'has a "concurrency_key" that is not 1 to 200 characters, not only spaces, without control characters'
                END AS problem
              FROM unnest(enqueue_arrays.name, enqueue_arrays.args, enqueue_arrays.queue, enqueue_arrays.priority,
                          enqueue_arrays.run_at, enqueue_arrays.max_attempts, enqueue_arrays.idempotency_key,
                          enqueue_arrays.every, enqueue_arrays.timeout, enqueue_arrays.meta,
                          enqueue_arrays.concurrency_key)
                   WITH ORDINALITY AS r(name, args, queue, priority, run_at, max_attempts, idempotency_key, every,
                                        timeout, meta, concurrency_key, ord)) AS e
     WHERE e.problem IS NOT NULL
     ORDER BY e.ord
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'treadle: jobs element % %', v_bad.ord - 1, v_bad.problem
            USING ERRCODE = 'invalid_parameter_value', DETAIL = 'Elements are counted from 0.';
    END IF;

    -- The defaults: a whole column at once where it was left out; element by element
    -- only in a column that holds a null.
    a_args := CASE WHEN enqueue_arrays.args IS NULL THEN array_fill('{}'::jsonb, ARRAY[v_n])
                   WHEN array_position(enqueue_arrays.args, NULL) IS NULL
                        AND array_position(enqueue_arrays.args, 'null'::jsonb) IS NULL THEN enqueue_arrays.args
                   ELSE (SELECT array_agg(coalesce(nullif(u.v, 'null'::jsonb), '{}'::jsonb) ORDER BY u.o)
                           FROM unnest(enqueue_arrays.args) WITH ORDINALITY AS u(v, o)) END;
    a_queue := CASE WHEN enqueue_arrays.queue IS NULL THEN array_fill('default'::text, ARRAY[v_n])
                    WHEN array_position(enqueue_arrays.queue, NULL) IS NULL THEN enqueue_arrays.queue
                    ELSE (SELECT array_agg(coalesce(u.v, 'default') ORDER BY u.o)
                            FROM unnest(enqueue_arrays.queue) WITH ORDINALITY AS u(v, o)) END;
    a_priority := CASE WHEN enqueue_arrays.priority IS NULL THEN array_fill(0, ARRAY[v_n])
                       WHEN array_position(enqueue_arrays.priority, NULL) IS NULL THEN enqueue_arrays.priority
                       ELSE (SELECT array_agg(coalesce(u.v, 0) ORDER BY u.o)
                               FROM unnest(enqueue_arrays.priority) WITH ORDINALITY AS u(v, o)) END;
    a_run_at := CASE WHEN enqueue_arrays.run_at IS NULL THEN array_fill(v_now, ARRAY[v_n])
                     WHEN array_position(enqueue_arrays.run_at, NULL) IS NULL THEN enqueue_arrays.run_at
                     ELSE (SELECT array_agg(coalesce(u.v, v_now) ORDER BY u.o)
                             FROM unnest(enqueue_arrays.run_at) WITH ORDINALITY AS u(v, o)) END;
    a_max := CASE WHEN enqueue_arrays.max_attempts IS NULL THEN array_fill(25, ARRAY[v_n])
                  WHEN array_position(enqueue_arrays.max_attempts, NULL) IS NULL THEN enqueue_arrays.max_attempts
                  ELSE (SELECT array_agg(coalesce(u.v, 25) ORDER BY u.o)
                          FROM unnest(enqueue_arrays.max_attempts) WITH ORDINALITY AS u(v, o)) END;
    a_meta := CASE WHEN array_position(enqueue_arrays.meta, 'null'::jsonb) IS NULL THEN enqueue_arrays.meta
                   ELSE (SELECT array_agg(nullif(u.v, 'null'::jsonb) ORDER BY u.o)
                           FROM unnest(enqueue_arrays.meta) WITH ORDINALITY AS u(v, o)) END;

    RETURN QUERY
    SELECT u.id
      FROM unnest(treadle._enqueue_rows(enqueue_arrays.name, a_args, a_queue, a_priority, a_run_at, a_max,
                                        enqueue_arrays.idempotency_key, enqueue_arrays.every, enqueue_arrays.timeout,
                                        NULL, NULL, NULL, NULL, a_meta, enqueue_arrays.concurrency_key, v_now))
           WITH ORDINALITY AS u(id, ord)
     ORDER BY u.ord;
END;
$$;
COMMENT ON FUNCTION treadle.enqueue_arrays(text[], jsonb[], text[], integer[], timestamptz[], integer[], text[],
                                           interval[], interval[], jsonb[], text[]) IS
    'Enqueue many jobs in one statement from one array per column; returns their ids in input order.';
