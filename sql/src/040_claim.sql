--------------------------------------------------------------------------------
-- treadle.claim(worker_id, queues, names, batch, lease, lease_token)
--     -> setof treadle.jobs
--
-- Transition: available | retryable (run_at <= now) -> running.
-- Claims up to `batch` due jobs from `queues` (only those named in `names`, when
-- given), in priority, run_at, id order, with FOR UPDATE SKIP LOCKED: concurrent
-- claimers never receive the same job. Each claimed job gets attempt + 1, a lease
-- until now + lease, the worker id and a lease token, which every later write by
-- the worker must name: `lease_token` when given (the same for every job of this
-- call, so that a worker whose answer was lost can ask treadle.claimed what it
-- took), otherwise a fresh random one per job. Returns the claimed rows.
-- Each (queue[, name]) pair is read from its own index range, so a backlog of
-- jobs whose names the claimer does not handle is never walked past.
-- A paused queue gives nothing; a queue with a concurrency or rate limit gives at
-- most the room it has left (treadle._queue_room, treadle.set_queue).
-- Raises 22004: worker_id or queues null. 22023: worker_id or a queue or name
-- that is not a valid name; queues or names empty or over 1000; batch outside
-- 1..1000; lease not positive or over 1 day. 42501: a tenant's queue outside its
-- prefix.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.claim(
    worker_id text,
    queues    text[]   DEFAULT ARRAY['default'],
    names     text[]   DEFAULT NULL,
    batch     integer  DEFAULT 1,
    lease     interval DEFAULT '30 seconds',
    lease_token uuid   DEFAULT NULL
)
RETURNS SETOF treadle.jobs
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
ROWS 10
SET search_path = pg_catalog, pg_temp
-- Planning the claim costs as much as running it, so it is planned once per session.
-- A generic plan does not know the batch and guesses that LIMIT takes a tenth of the
-- rows; with sorts, sequential and bitmap scans off, the one plan left reads each
-- (queue[, name]) range in claim order from its index and stops after `batch` rows,
-- whatever the table holds. The rows to update are found by id = ANY(...), not by a
-- join whose size the planner would have to guess. The penalty those settings add to
-- the plan's cost would start JIT compiling, which never pays off here: off too.
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_now  timestamptz := treadle.now();
    v_ids  bigint[];
    v_room jsonb;  -- what each queue may give, when a requested queue is paused or limited
BEGIN
    PERFORM treadle._check_text(claim.worker_id, 'worker_id');
    PERFORM treadle._check_names(claim.queues, 'queues');
    IF claim.names IS NOT NULL THEN
        PERFORM treadle._check_names(claim.names, 'names');
    END IF;
    IF claim.batch IS NULL OR claim.batch NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'treadle: batch must be between 1 and 1000, got %', coalesce(claim.batch::text, 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF claim.lease IS NULL THEN
        RAISE EXCEPTION 'treadle: lease must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM treadle._check_interval(claim.lease, 'lease', interval '1 day');
    -- treadle._check_queue_allowed's rule, inline: a helper call would cost more than the check
    IF EXISTS (SELECT 1 FROM treadle.tenants AS t, unnest(claim.queues) AS q(q)
                WHERE t.role_name = treadle._caller() AND NOT starts_with(q.q, t.queue_prefix)) THEN
        PERFORM treadle._check_queue_allowed(q.q) FROM unnest(claim.queues) AS q(q);
    END IF;
    -- Paused and limited queues (treadle.queues): claim only from those with room,
    -- and below keep to each one's room. Queues without settings pay this probe only.
    IF EXISTS (SELECT 1 FROM treadle.queues AS s
                WHERE s.queue = ANY (claim.queues)
                  AND (s.paused OR s.concurrency IS NOT NULL OR s.rate_limit IS NOT NULL)) THEN
        v_room := treadle._queue_room(claim.queues, claim.batch);
        claim.queues := ARRAY(SELECT r.key FROM jsonb_each(v_room) AS r WHERE r.value::integer > 0);
        IF cardinality(claim.queues) = 0 THEN
            RETURN;
        END IF;
        claim.batch := least(claim.batch, (SELECT sum(r.value::integer) FROM jsonb_each(v_room) AS r
                                            WHERE r.value::integer > 0));
    END IF;

    -- Lock the candidates: each (queue[, name]) range in claim order, skipping rows
    -- other claimers hold, then the best `batch` of them.
    IF claim.names IS NULL THEN
        v_ids := ARRAY(
            SELECT c.id
              FROM (SELECT DISTINCT u.q FROM unnest(claim.queues) AS u(q)) AS u
             CROSS JOIN LATERAL (
                    SELECT j.id, j.priority, j.run_at
                      FROM treadle.jobs AS j
                     WHERE j.queue = u.q
                       AND j.state = ANY (ARRAY['available', 'retryable'])
                       AND j.run_at <= v_now
                     ORDER BY j.priority, j.run_at, j.id
                     LIMIT claim.batch
                       FOR UPDATE SKIP LOCKED) AS c
             ORDER BY c.priority, c.run_at, c.id
             LIMIT claim.batch);
    ELSE
        v_ids := ARRAY(
            SELECT c.id
              FROM (SELECT DISTINCT u.q FROM unnest(claim.queues) AS u(q)) AS u
             CROSS JOIN (SELECT DISTINCT n.n FROM unnest(claim.names) AS n(n)) AS n
             CROSS JOIN LATERAL (
                    SELECT j.id, j.priority, j.run_at
                      FROM treadle.jobs AS j
                     WHERE j.queue = u.q
                       AND j.name = n.n
                       AND j.state = ANY (ARRAY['available', 'retryable'])
                       AND j.run_at <= v_now
                     ORDER BY j.priority, j.run_at, j.id
                     LIMIT claim.batch
                       FOR UPDATE SKIP LOCKED) AS c
             ORDER BY c.priority, c.run_at, c.id
             LIMIT claim.batch);
    END IF;
    IF v_room IS NOT NULL THEN
        v_ids := treadle._take_room(v_ids, v_room);
    END IF;
    IF cardinality(v_ids) = 0 THEN
        RETURN;
    END IF;

    RETURN QUERY
    WITH claimed AS (
        UPDATE treadle.jobs AS j
           SET state = 'running',
               attempt = j.attempt + 1,
               lease_until = v_now + claim.lease,
               lease_token = coalesce(claim.lease_token, gen_random_uuid()),
               worker_id = claim.worker_id,
               started_at = v_now,
               progress = NULL,
               progress_message = NULL
         WHERE j.id = ANY (v_ids)
        RETURNING j.*
    )
    SELECT * FROM claimed AS d ORDER BY d.priority, d.run_at, d.id;
END;
$$;
COMMENT ON FUNCTION treadle.claim(text, text[], text[], integer, interval, uuid) IS
    'Claim up to batch due jobs (available or retryable -> running) under a lease token.';

--------------------------------------------------------------------------------
-- treadle.claimed(lease_token) -> setof treadle.jobs
--
-- Transition: none. The running jobs that hold lease_token, in claim order: what a
-- claim given that token took, for a worker whose answer to the claim was lost.
-- Empty when the claim did not commit, or its jobs were finished or rescued since.
-- Raises 22004: lease_token null.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.claimed(lease_token uuid)
RETURNS SETOF treadle.jobs
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
ROWS 10
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF claimed.lease_token IS NULL THEN
        RAISE EXCEPTION 'treadle: lease_token must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- running jobs are few (bounded by the workers' concurrency): their index is enough
    RETURN QUERY
    SELECT * FROM treadle.jobs AS j
     WHERE j.state = 'running' AND j.lease_token = claimed.lease_token
     ORDER BY j.priority, j.run_at, j.id;
END;
$$;
COMMENT ON FUNCTION treadle.claimed(uuid) IS
    'The running jobs holding a lease token: what a claim whose answer was lost took.';

--------------------------------------------------------------------------------
-- treadle.heartbeat(job_id, lease_token, lease) -> text
--
-- Transition: none (running stays running; the lease moves to now + lease).
-- Returns 'held', 'cancel' (held, and a cancel was requested: abort the handler)
-- or 'lost' (the token no longer holds the job). An expired lease that nobody
-- took over is still held.
-- Raises 22004: job_id, lease_token or lease null. 22023: lease not positive or
-- over 1 day.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.heartbeat(
    job_id      bigint,
    lease_token uuid,
    lease       interval DEFAULT '30 seconds'
)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_cancel boolean;
BEGIN
    PERFORM treadle._check_lease_args(heartbeat.job_id, heartbeat.lease_token);
    IF heartbeat.lease IS NULL THEN
        RAISE EXCEPTION 'treadle: lease must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM treadle._check_interval(heartbeat.lease, 'lease', interval '1 day');

    UPDATE treadle.jobs AS j
       SET lease_until = treadle.now() + heartbeat.lease
     WHERE j.id = heartbeat.job_id
       AND j.state = 'running'
       AND j.lease_token = heartbeat.lease_token
    RETURNING j.cancel_requested INTO v_cancel;

    IF NOT FOUND THEN
        RETURN 'lost';
    END IF;
    RETURN CASE WHEN v_cancel THEN 'cancel' ELSE 'held' END;
END;
$$;
COMMENT ON FUNCTION treadle.heartbeat(bigint, uuid, interval) IS
    'Extend a running job''s lease; returns held, cancel or lost.';

--------------------------------------------------------------------------------
-- treadle.progress(job_id, lease_token, fraction, message) -> boolean
--
-- Transition: none; records how far a running job has come (0..1, and a note),
-- shown by the views. Returns false when the token no longer holds the job.
-- Raises 22004: job_id, lease_token or fraction null. 22023: fraction outside 0..1,
-- message over the payload size limit.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.progress(
    job_id      bigint,
    lease_token uuid,
    fraction    double precision,
    message     text DEFAULT NULL
)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM treadle._check_lease_args(progress.job_id, progress.lease_token);
    IF octet_length(progress.message) > treadle._max_payload_bytes() THEN
        RAISE EXCEPTION 'treadle: message is % bytes, more than the limit of % bytes',
                        octet_length(progress.message), treadle._max_payload_bytes()
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF progress.fraction IS NULL THEN
        RAISE EXCEPTION 'treadle: fraction must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT (progress.fraction BETWEEN 0 AND 1) THEN
        RAISE EXCEPTION 'treadle: fraction must be between 0 and 1, got %', progress.fraction
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    UPDATE treadle.jobs AS j
       SET progress = progress.fraction,
           progress_message = progress.message
     WHERE j.id = progress.job_id
       AND j.state = 'running'
       AND j.lease_token = progress.lease_token;
    RETURN FOUND;
END;
$$;
COMMENT ON FUNCTION treadle.progress(bigint, uuid, double precision, text) IS
    'Record a running job''s progress (0..1) and a message; false when the lease is lost.';
