--------------------------------------------------------------------------------
-- Workers: a registry of live worker processes, for dashboards and monitoring.
-- It is advisory: leases, not this table, decide who holds a job. A worker
-- reports itself every few seconds; one that stops reporting drops out of
-- treadle.live_workers. The table is with the others in 010_tables.sql.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle.worker_seen(worker_id, host, pid, queues, concurrency, running, names) -> void
--
-- Transition: records (or refreshes) a live worker process, how many jobs it is
-- running now, and the job names it handles (null: not said), which
-- treadle.explain reads.
-- Raises 22004: worker_id, host, pid or queues null. 22023: worker_id, host or a
-- queue not a valid name (treadle._is_name), a name not a valid job name
-- (treadle._are_job_names: up to 410 characters), queues or names empty or
-- over 1000, concurrency < 1, running < 0. 42501: a tenant's queue outside its
-- prefix. 23505: worker_id is another tenant's worker (a tenant's worker serves
-- only its queues, and refreshes or removes only such workers).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.worker_seen(
    worker_id   text,
    host        text,
    pid         integer,
    queues      text[],
    concurrency integer,
    running     integer DEFAULT 0,
    names       text[]  DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := treadle.now();
    v_prefix text := treadle._caller_prefix();  -- '' unless the caller is a tenant
BEGIN
    PERFORM treadle._check_text(worker_seen.worker_id, 'worker_id');
    PERFORM treadle._check_names(worker_seen.queues, 'queues');
    IF worker_seen.names IS NOT NULL THEN
        PERFORM treadle._check_job_names(worker_seen.names, 'names');
    END IF;
    IF worker_seen.host IS NULL OR worker_seen.pid IS NULL THEN
        RAISE EXCEPTION 'treadle: host and pid must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM treadle._check_text(worker_seen.host, 'host');
    IF worker_seen.concurrency IS NULL OR worker_seen.concurrency < 1
       OR worker_seen.running IS NULL OR worker_seen.running < 0 THEN
        RAISE EXCEPTION 'treadle: concurrency must be at least 1 and running at least 0'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    PERFORM treadle._check_queue_allowed(q.q) FROM unnest(worker_seen.queues) AS q(q)
      WHERE NOT starts_with(q.q, v_prefix);

    INSERT INTO treadle.workers AS w (id, host, pid, queues, running, concurrency, started_at, last_seen, names)
    VALUES (worker_seen.worker_id, worker_seen.host, worker_seen.pid, worker_seen.queues,
            worker_seen.running, worker_seen.concurrency, v_now, v_now, worker_seen.names)
    ON CONFLICT (id) DO UPDATE
       SET host = excluded.host, pid = excluded.pid, queues = excluded.queues,
           running = excluded.running, concurrency = excluded.concurrency, last_seen = excluded.last_seen,
           names = excluded.names
     WHERE NOT EXISTS (SELECT 1 FROM unnest(w.queues) AS q(q) WHERE NOT starts_with(q.q, v_prefix));
    IF NOT FOUND THEN
        -- the id is a worker outside the caller's queues: say no more than that it is taken
        RAISE EXCEPTION 'treadle: worker_id % is taken', worker_seen.worker_id
            USING ERRCODE = 'unique_violation';
    END IF;

    -- forget processes that have been silent for a day
    DELETE FROM treadle.workers AS w WHERE w.last_seen < v_now - interval '1 day';
END;
$$;
COMMENT ON FUNCTION treadle.worker_seen(text, text, integer, text[], integer, integer, text[]) IS
    'Record that a worker process is alive, how many jobs it runs, and the job names it handles.';

--------------------------------------------------------------------------------
-- treadle.worker_stopped(worker_id) -> boolean
--
-- Transition: removes a worker that shut down cleanly. False when unknown (or,
-- for a tenant, when it serves a queue outside the tenant's prefix).
-- Raises 22004: worker_id null.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.worker_stopped(worker_id text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM treadle._check_text(worker_stopped.worker_id, 'worker_id');
    DELETE FROM treadle.workers AS w
     WHERE w.id = worker_stopped.worker_id
       AND NOT EXISTS (SELECT 1 FROM unnest(w.queues) AS q(q)
                        WHERE NOT starts_with(q.q, treadle._caller_prefix()));
    RETURN FOUND;
END;
$$;
COMMENT ON FUNCTION treadle.worker_stopped(text) IS 'Remove a worker that shut down cleanly.';

-- Workers seen in the last 30 seconds, with the jobs they hold right now. The running
-- jobs are counted once, by worker (through jobs_lease_idx: lease_until is set exactly
-- while a job runs), not once per worker: on Citus a subquery of treadle.jobs that
-- names a worker of the coordinator's treadle.workers cannot be planned, and this
-- count is one query over the shards whose result the coordinator joins.
CREATE VIEW treadle.live_workers WITH (security_invoker = true) AS
SELECT w.id, w.host, w.pid, w.queues, w.concurrency,
       coalesce(r.running_jobs, 0) AS running_jobs,
       w.started_at, w.last_seen
  FROM treadle.workers AS w
  LEFT JOIN (SELECT j.worker_id, count(*) AS running_jobs
               FROM treadle.jobs AS j
              WHERE j.state = 'running' AND j.lease_until IS NOT NULL
              GROUP BY j.worker_id) AS r ON r.worker_id = w.id
 WHERE w.last_seen > treadle.now() - interval '30 seconds'
 ORDER BY w.started_at, w.id;
COMMENT ON VIEW treadle.live_workers IS
    'Worker processes seen in the last 30 seconds, with the jobs they hold.';
