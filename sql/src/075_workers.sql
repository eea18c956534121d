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
-- Raises 22004: worker_id, host, pid or queues null. 22023: worker_id, host, a
-- queue or a name not a valid name (treadle._is_name), queues or names empty or
-- over 1000, concurrency < 1, running < 0.
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
    v_now timestamptz := treadle.now();
BEGIN
    PERFORM treadle._check_text(worker_seen.worker_id, 'worker_id');
    PERFORM treadle._check_names(worker_seen.queues, 'queues');
    IF worker_seen.names IS NOT NULL THEN
        PERFORM treadle._check_names(worker_seen.names, 'names');
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

    INSERT INTO treadle.workers AS w (id, host, pid, queues, running, concurrency, started_at, last_seen, names)
    VALUES (worker_seen.worker_id, worker_seen.host, worker_seen.pid, worker_seen.queues,
            worker_seen.running, worker_seen.concurrency, v_now, v_now, worker_seen.names)
    ON CONFLICT (id) DO UPDATE
       SET host = excluded.host, pid = excluded.pid, queues = excluded.queues,
           running = excluded.running, concurrency = excluded.concurrency, last_seen = excluded.last_seen,
           names = excluded.names;

    -- forget processes that have been silent for a day
    DELETE FROM treadle.workers AS w WHERE w.last_seen < v_now - interval '1 day';
END;
$$;
COMMENT ON FUNCTION treadle.worker_seen(text, text, integer, text[], integer, integer, text[]) IS
    'Record that a worker process is alive, how many jobs it runs, and the job names it handles.';

--------------------------------------------------------------------------------
-- treadle.worker_stopped(worker_id) -> boolean
--
-- Transition: removes a worker that shut down cleanly. False when unknown.
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
    DELETE FROM treadle.workers AS w WHERE w.id = worker_stopped.worker_id;
    RETURN FOUND;
END;
$$;
COMMENT ON FUNCTION treadle.worker_stopped(text) IS 'Remove a worker that shut down cleanly.';

-- Workers seen in the last 30 seconds, with the jobs they hold right now.
CREATE VIEW treadle.live_workers WITH (security_invoker = true) AS
SELECT w.id, w.host, w.pid, w.queues, w.concurrency,
       (SELECT count(*) FROM treadle.jobs AS j WHERE j.state = 'running' AND j.worker_id = w.id) AS running_jobs,
       w.started_at, w.last_seen
  FROM treadle.workers AS w
 WHERE w.last_seen > treadle.now() - interval '30 seconds'
 ORDER BY w.started_at, w.id;
COMMENT ON VIEW treadle.live_workers IS
    'Worker processes seen in the last 30 seconds, with the jobs they hold.';
