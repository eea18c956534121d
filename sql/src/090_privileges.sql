--------------------------------------------------------------------------------
-- Version and privileges. The extension creates no roles. Functions that change
-- data are revoked from PUBLIC; treadle.grant_producer, grant_worker and
-- grant_dashboard give a role the functions and table rights it needs (all
-- functions are SECURITY INVOKER, so they run with the caller's rights).
--------------------------------------------------------------------------------

REVOKE ALL ON FUNCTION
    treadle.enqueue(text, jsonb, text, integer, timestamptz, integer, text, interval),
    treadle.enqueue_many(jsonb),
    treadle.claim(text, text[], text[], integer, interval),
    treadle.heartbeat(bigint, uuid, interval),
    treadle.progress(bigint, uuid, double precision, text),
    treadle.complete(bigint, uuid, jsonb),
    treadle.complete_many(bigint[], uuid[], jsonb[]),
    treadle.fail(bigint, uuid, text, interval),
    treadle.release(bigint, uuid),
    treadle.rescue(),
    treadle.cancel(bigint),
    treadle.retry(bigint),
    treadle.prune(interval),
    treadle.define_workflow(text, text[]),
    treadle.start_workflow(text, jsonb, text[], text, integer, integer, text),
    treadle.cancel_workflow(bigint),
    treadle.worker_seen(text, text, integer, text[], integer, integer),
    treadle.worker_stopped(text),
    treadle._advance_run(treadle.jobs),
    treadle._follow_up(treadle.jobs[])
FROM PUBLIC;

--------------------------------------------------------------------------------
-- treadle.grant_producer(role) -> void
--
-- Lets a role enqueue jobs, start workflows, cancel and retry, and read results.
-- Raises 22004: role null. The caller needs the grant option on these objects
-- (the extension's owner has it).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.grant_producer(role regrole)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF role IS NULL THEN
        RAISE EXCEPTION 'treadle: role must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA treadle TO %s', role);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE ON treadle.jobs, treadle.workflow_runs TO %s', role);
    EXECUTE format('GRANT SELECT ON treadle.workflows TO %s', role);
    EXECUTE format('GRANT USAGE ON SEQUENCE treadle.jobs_id_seq, treadle.workflow_runs_id_seq TO %s', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION
        treadle.enqueue(text, jsonb, text, integer, timestamptz, integer, text, interval),
        treadle.enqueue_many(jsonb),
        treadle.start_workflow(text, jsonb, text[], text, integer, integer, text),
        treadle.cancel(bigint),
        treadle.retry(bigint),
        treadle.cancel_workflow(bigint),
        treadle._advance_run(treadle.jobs),
        treadle._follow_up(treadle.jobs[]) TO %s', role);
END;
$$;
COMMENT ON FUNCTION treadle.grant_producer(regrole) IS
    'Grant a role what it needs to enqueue, start workflows, cancel and retry.';

--------------------------------------------------------------------------------
-- treadle.grant_worker(role) -> void
--
-- Everything grant_producer gives, plus claiming, heartbeats, progress,
-- finishing, rescue and workflow definitions.
-- Raises 22004: role null.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.grant_worker(role regrole)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM treadle.grant_producer(role);
    EXECUTE format('GRANT INSERT, UPDATE ON treadle.workflows TO %s', role);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON treadle.workers TO %s', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION
        treadle.claim(text, text[], text[], integer, interval),
        treadle.heartbeat(bigint, uuid, interval),
        treadle.progress(bigint, uuid, double precision, text),
        treadle.complete(bigint, uuid, jsonb),
        treadle.complete_many(bigint[], uuid[], jsonb[]),
        treadle.fail(bigint, uuid, text, interval),
        treadle.release(bigint, uuid),
        treadle.rescue(),
        treadle.define_workflow(text, text[]),
        treadle.worker_seen(text, text, integer, text[], integer, integer),
        treadle.worker_stopped(text) TO %s', role);
END;
$$;
COMMENT ON FUNCTION treadle.grant_worker(regrole) IS
    'Grant a role what a worker needs: grant_producer plus claim, heartbeat, finish and rescue.';

--------------------------------------------------------------------------------
-- treadle.grant_dashboard(role, read_only) -> void
--
-- Lets a role read the views and jobs; unless read_only, also cancel and retry
-- jobs and cancel workflow runs.
-- Raises 22004: role or read_only null.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.grant_dashboard(role regrole, read_only boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF role IS NULL OR read_only IS NULL THEN
        RAISE EXCEPTION 'treadle: role and read_only must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA treadle TO %s', role);
    EXECUTE format('GRANT SELECT ON treadle.jobs, treadle.workflow_runs, treadle.workflows, treadle.workers,
        treadle.queue_stats, treadle.throughput, treadle.recent_failures,
        treadle.workflow_run_overview, treadle.live_workers,
        treadle.job_details, treadle.workflow_run_steps TO %s', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION
        treadle.job_counts(bigint), treadle._estimated_jobs(text, text) TO %s', role);
    IF NOT read_only THEN
        EXECUTE format('GRANT UPDATE ON treadle.jobs, treadle.workflow_runs TO %s', role);
        EXECUTE format('GRANT EXECUTE ON FUNCTION
            treadle.cancel(bigint),
            treadle.retry(bigint),
            treadle.cancel_workflow(bigint),
            treadle._advance_run(treadle.jobs),
            treadle._follow_up(treadle.jobs[]) TO %s', role);
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle.grant_dashboard(regrole, boolean) IS
    'Grant a role what the dashboard needs: the views, and unless read_only, cancel and retry.';

REVOKE ALL ON FUNCTION
    treadle.grant_producer(regrole),
    treadle.grant_worker(regrole),
    treadle.grant_dashboard(regrole, boolean)
FROM PUBLIC;
