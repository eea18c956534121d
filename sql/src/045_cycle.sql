--------------------------------------------------------------------------------
-- A worker's cycle in one statement. A worker that finishes a batch and then
-- claims the next pays two round trips and two commits per batch; these pay one.
-- They add no rule of their own: complete_and_claim is treadle.complete_many
-- followed by treadle.claim in one transaction, and heartbeat_many is
-- treadle.heartbeat for many jobs.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle.complete_and_claim(job_ids, lease_tokens, results, worker_id, queues,
--                            names, batch, lease, lease_token, job_queues)
--     -> table(finished_id, finished_state, job)
--
-- Transition: as treadle.complete_many for the jobs given (running -> completed,
-- or cancelled when a cancel was requested), then as treadle.claim for up to
-- `batch` more (available | retryable -> running), in one transaction: a
-- workflow's next step or a periodic job's next occurrence written by the finish
-- can be claimed by the same call; a step that may make a join ready (a step
-- with other dependencies runs after it, or it is a map element) moves its run
-- after the claim, which holds the run row's lock through the commit only. Returns first one row per finished input, in
-- input order (finished_id, finished_state: null where the token does not hold
-- the job; job null), then one row per claimed job (finished_id and
-- finished_state null; job the claimed row), in claim order.
-- A lost answer is recovered as for each half: repeating complete_many with the
-- same arrays returns what the finish did, and treadle.claimed(lease_token)
-- returns what the claim took (so give a lease_token).
-- batch 0 only finishes; empty arrays only claim. job_queues, when given, is
-- each finished job's queue (as for treadle.complete_many: each statement then
-- names one queue).
-- Raises 22004: job_ids, lease_tokens, worker_id, queues, batch or lease null, a
-- null in job_queues.
-- 22023: arrays of different lengths; a result over the payload size limit or
-- nested over 100 levels; batch outside 0..1000; worker_id, queues, names or
-- lease as treadle.claim refuses them. 42501: a tenant's queue outside its
-- prefix. Nothing is written when it raises.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.complete_and_claim(
    job_ids      bigint[],
    lease_tokens uuid[],
    results      jsonb[],
    worker_id    text,
    queues       text[]   DEFAULT ARRAY['default'],
    names        text[]   DEFAULT NULL,
    batch        integer  DEFAULT 1,
    lease        interval DEFAULT '30 seconds',
    lease_token  uuid     DEFAULT NULL,
    job_queues   text[]   DEFAULT NULL
)
RETURNS TABLE (finished_id bigint, finished_state text, job treadle.jobs)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
ROWS 20
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF complete_and_claim.batch IS NULL THEN
        RAISE EXCEPTION 'treadle: batch must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF complete_and_claim.batch NOT BETWEEN 0 AND 1000 THEN
        RAISE EXCEPTION 'treadle: batch must be between 0 and 1000, got %', complete_and_claim.batch
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF complete_and_claim.job_ids IS NULL OR complete_and_claim.lease_tokens IS NULL THEN
        RAISE EXCEPTION 'treadle: job_ids and lease_tokens must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF complete_and_claim.batch = 0 THEN
        -- treadle.claim is not called, so its arguments are checked here
        PERFORM treadle._check_text(complete_and_claim.worker_id, 'worker_id');
        PERFORM treadle._check_names(complete_and_claim.queues, 'queues');
        IF complete_and_claim.names IS NOT NULL THEN
            PERFORM treadle._check_job_names(complete_and_claim.names, 'names');
        END IF;
        IF complete_and_claim.lease IS NULL THEN
            RAISE EXCEPTION 'treadle: lease must not be null' USING ERRCODE = 'null_value_not_allowed';
        END IF;
        PERFORM treadle._check_interval(complete_and_claim.lease, 'lease', interval '1 day');
    END IF;

    IF cardinality(complete_and_claim.job_ids) > 0 OR cardinality(complete_and_claim.lease_tokens) > 0
       OR cardinality(complete_and_claim.results) > 0 THEN
        IF complete_and_claim.batch > 0 THEN
            -- workflow steps the finish writes are told of after the claim, if it left them;
            -- the steps that may make a join ready move their runs after it (073_workflow_joins.sql)
            PERFORM set_config('treadle.claim_follows', 'on', true), set_config('treadle.steps_written', '', true),
                    set_config('treadle.defer_joins', 'on', true), set_config('treadle.joins_deferred', '', true);
        END IF;
        RETURN QUERY
        SELECT m.job_id, m.state, NULL::treadle.jobs
          FROM treadle.complete_many(complete_and_claim.job_ids, complete_and_claim.lease_tokens,
                                     complete_and_claim.results, complete_and_claim.job_queues) AS m;
        PERFORM set_config('treadle.defer_joins', '', true);
    END IF;

    IF complete_and_claim.batch > 0 THEN
        RETURN QUERY
        SELECT NULL::bigint, NULL::text, c
          FROM treadle.claim(complete_and_claim.worker_id, complete_and_claim.queues, complete_and_claim.names,
                             complete_and_claim.batch, complete_and_claim.lease,
                             complete_and_claim.lease_token) AS c;
        PERFORM treadle._notify_left_steps();
        IF current_setting('treadle.joins_deferred', true) <> '' THEN
            PERFORM treadle._advance_deferred();
        END IF;
    END IF;
    -- completed steps of these queues left for a re-check, last: this transaction then
    -- takes no lock it waits for (073_workflow_rechecks.sql)
    IF NOT treadle._on_citus()
       AND EXISTS (SELECT 1 FROM treadle.run_rechecks) THEN  -- (any at all: the list's own probe sorts it, which costs with 1,000 queues)
        PERFORM treadle._move_rechecks(complete_and_claim.queues);
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle.complete_and_claim(bigint[], uuid[], jsonb[], text, text[], text[], integer, interval, uuid, text[]) IS
    'Finish a batch of running jobs (as complete_many) and claim up to batch more (as claim) in one statement.';

--------------------------------------------------------------------------------
-- treadle.heartbeat_many(job_ids, lease_tokens, lease, job_queues)
--     -> table(job_id, answer)
--
-- Transition: none (as treadle.heartbeat, for many jobs in one statement: each
-- lease the token holds moves to now + lease). Returns one row per input, in
-- input order: 'held', 'cancel' (held, and a cancel was requested) or 'lost'.
-- job_queues, when given, is each job's queue (a job of another queue is lost):
-- the leases are then moved queue by queue, each statement naming one queue (one
-- shard on Citus); without it, by id alone.
-- Raises 22004: job_ids, lease_tokens or lease null, or a null element (of
-- job_queues too). 22023: arrays of different lengths or over 10,000 elements;
-- lease not positive or over 1 day.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.heartbeat_many(
    job_ids      bigint[],
    lease_tokens uuid[],
    lease        interval DEFAULT '30 seconds',
    job_queues   text[]   DEFAULT NULL
)
RETURNS TABLE (job_id bigint, answer text)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_until  timestamptz;
    v_each   text[];  -- the queues whose leases move one statement each; {null}: by id alone
    v_queue  text;
    v_ids    bigint[] := '{}'::bigint[];   -- the leases held: their jobs,
    v_tokens uuid[] := '{}'::uuid[];       -- tokens,
    v_cancel boolean[] := '{}'::boolean[]; -- and whether a cancel was requested
    v_i      bigint[];
    v_t      uuid[];
    v_c      boolean[];
    v_prefix text;  -- a tenant's: its tokens hold only its own queues' jobs (another's is lost)
BEGIN
    IF heartbeat_many.job_ids IS NULL OR heartbeat_many.lease_tokens IS NULL OR heartbeat_many.lease IS NULL THEN
        RAISE EXCEPTION 'treadle: job_ids, lease_tokens and lease must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF cardinality(heartbeat_many.job_ids) <> cardinality(heartbeat_many.lease_tokens)
       OR cardinality(heartbeat_many.job_ids) > 10000 THEN
        RAISE EXCEPTION 'treadle: job_ids and lease_tokens must have the same length, at most 10000'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF array_position(heartbeat_many.job_ids, NULL) IS NOT NULL
       OR array_position(heartbeat_many.lease_tokens, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'treadle: job_ids and lease_tokens must not hold nulls'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF heartbeat_many.job_queues IS NULL THEN
        v_each := ARRAY[NULL::text];
    ELSIF cardinality(heartbeat_many.job_queues) <> cardinality(heartbeat_many.job_ids) THEN
        RAISE EXCEPTION 'treadle: job_ids and job_queues must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF array_position(heartbeat_many.job_queues, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'treadle: job_queues must not hold nulls' USING ERRCODE = 'null_value_not_allowed';
    ELSIF cardinality(heartbeat_many.job_queues) > 0
          AND heartbeat_many.job_queues[1] = ALL (heartbeat_many.job_queues) THEN
        v_each := heartbeat_many.job_queues[1:1];  -- (one queue: most workers)
    ELSE
        v_each := ARRAY(SELECT DISTINCT q.q FROM unnest(heartbeat_many.job_queues) AS q(q));
    END IF;
    PERFORM treadle._check_interval(heartbeat_many.lease, 'lease', interval '1 day');
    v_until := treadle.now() + heartbeat_many.lease;  -- computed here: no clock call inside the UPDATE
    v_prefix := treadle._caller_prefix();

    FOREACH v_queue IN ARRAY v_each LOOP
        IF v_queue IS NULL THEN
            WITH input AS (
                SELECT i.id, i.token, i.ord
                  FROM unnest(heartbeat_many.job_ids, heartbeat_many.lease_tokens) WITH ORDINALITY AS i(id, token, ord)
            ), held AS (
                UPDATE treadle.jobs AS j
                   SET lease_until = v_until
                  FROM input AS i
                 WHERE j.id = i.id
                   AND j.state = 'running'
                   AND j.lease_token = i.token
                   AND starts_with(j.queue, v_prefix)
                RETURNING j.id, j.lease_token, j.cancel_requested
            )
            SELECT array_agg(h.id), array_agg(h.lease_token), array_agg(h.cancel_requested)
              INTO v_i, v_t, v_c
              FROM held AS h;
        ELSE
            WITH input AS (
                SELECT i.id, i.token, i.ord
                  FROM unnest(heartbeat_many.job_ids, heartbeat_many.lease_tokens, heartbeat_many.job_queues)
                       WITH ORDINALITY AS i(id, token, queue, ord)
                 WHERE i.queue = v_queue
            ), held AS (
                UPDATE treadle.jobs AS j
                   SET lease_until = v_until
                  FROM input AS i
                 WHERE j.queue = v_queue
                   AND j.id = i.id
                   AND j.state = 'running'
                   AND j.lease_token = i.token
                   AND starts_with(j.queue, v_prefix)
                RETURNING j.id, j.lease_token, j.cancel_requested
            )
            SELECT array_agg(h.id), array_agg(h.lease_token), array_agg(h.cancel_requested)
              INTO v_i, v_t, v_c
              FROM held AS h;
        END IF;
        v_ids := v_ids || v_i;
        v_tokens := v_tokens || v_t;
        v_cancel := v_cancel || v_c;
    END LOOP;

    RETURN QUERY
    SELECT i.id, CASE WHEN h.id IS NULL THEN 'lost' WHEN h.cancel_requested THEN 'cancel' ELSE 'held' END
      FROM unnest(heartbeat_many.job_ids, heartbeat_many.lease_tokens) WITH ORDINALITY AS i(id, token, ord)
      LEFT JOIN unnest(v_ids, v_tokens, v_cancel) AS h(id, lease_token, cancel_requested)
             ON h.id = i.id AND h.lease_token = i.token
     ORDER BY i.ord;
END;
$$;
COMMENT ON FUNCTION treadle.heartbeat_many(bigint[], uuid[], interval, text[]) IS
    'Extend many running jobs'' leases in one statement; held, cancel or lost for each.';
