--------------------------------------------------------------------------------
-- Migration 0.2.0 -> 0.3.0, before the definitions: what CREATE OR REPLACE
-- cannot do. The functions and views that follow come from sql/src, as in a fresh
-- install; sql/upgrade/0.2.0--0.3.0.after.sql finishes after them.
--------------------------------------------------------------------------------

-- The parts each role was given by 0.2.0's grant helpers, read from the ACL of one
-- function of each part (the role's own entry, not what it reaches by membership).
-- The after-script gives each the same parts again: the views are created anew, and
-- a part may hold functions 0.2.0 did not have.
CREATE TEMPORARY TABLE treadle_upgrade_parts ON COMMIT DROP AS
SELECT r.rolname AS role_name, array_agg(p.part ORDER BY p.part) AS parts
  FROM (VALUES ('read',    'treadle.job_counts(bigint)'),
               ('produce', 'treadle.enqueue(text, jsonb, text, integer, timestamptz, integer, text, interval)'),
               ('control', 'treadle.cancel(bigint)'),
               ('work',    'treadle.claim(text, text[], text[], integer, interval, uuid)'),
               ('recover', 'treadle.rescue()'),
               ('prune',   'treadle.prune(interval)')) AS p(part, signature)
  JOIN pg_catalog.pg_proc AS f ON f.oid = p.signature::regprocedure
 CROSS JOIN aclexplode(f.proacl) AS a
  JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee
 WHERE a.privilege_type = 'EXECUTE'
   AND r.oid <> (SELECT n.nspowner FROM pg_catalog.pg_namespace AS n WHERE n.nspname = 'treadle')
 GROUP BY r.rolname;

-- Views are created again from sql/src.
DROP VIEW treadle.queue_stats, treadle.throughput, treadle.recent_failures,
          treadle.workflow_run_overview, treadle.job_details, treadle.workflow_run_steps,
          treadle.live_workers, treadle.schedules;

--------------------------------------------------------------------------------
-- Claims under a held snapshot (sql/src/040_claim.sql): the transaction that last
-- made each job claimable, and its index, as in sql/src/010_tables.sql. Rows of
-- 0.2.0 keep null: a claim's sweep from the front finds them.
--------------------------------------------------------------------------------
ALTER TABLE treadle.jobs ADD COLUMN ready_txid xid8;
ALTER TABLE treadle.jobs ALTER COLUMN ready_txid SET DEFAULT pg_current_xact_id();
CREATE INDEX jobs_ready_txid_idx ON treadle.jobs (ready_txid)
    WHERE state = ANY (ARRAY['available', 'retryable']);

--------------------------------------------------------------------------------
-- cycle: treadle.complete_and_claim and treadle.heartbeat_many are new functions
-- (sql/src/045_cycle.sql) in the work part; no table changes. The after-script's
-- re-grant of each role's parts gives them to the roles that work.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- queues: per-queue settings (pause, limits, backpressure, retention), explain
--------------------------------------------------------------------------------
CREATE TABLE treadle.queues (
    queue            text        PRIMARY KEY,
    paused           boolean     NOT NULL DEFAULT false,
    concurrency      integer,                -- at most this many running at once, over all workers
    rate_limit       integer,                -- at most this many claims per rate_period
    rate_period      interval,
    max_depth        integer,                -- enqueue refused (TQ001) at this many waiting jobs
    retain_completed interval,               -- how long completed jobs are kept (null: the default)
    retain_failed    interval,               -- how long discarded and cancelled jobs are kept
    rate_tokens      double precision,       -- claims the bucket allows, as of rate_updated_at
    rate_updated_at  timestamptz,
    updated_at       timestamptz NOT NULL,
    CONSTRAINT queues_queue_check CHECK (queue <> ''),
    CONSTRAINT queues_concurrency_check CHECK (concurrency BETWEEN 1 AND 100000),
    CONSTRAINT queues_rate_check CHECK (
        (rate_limit IS NULL) = (rate_period IS NULL)
        AND (rate_limit IS NULL) = (rate_tokens IS NULL)
        AND (rate_limit IS NULL) = (rate_updated_at IS NULL)),
    CONSTRAINT queues_rate_limit_check CHECK (rate_limit BETWEEN 1 AND 1000000),
    CONSTRAINT queues_rate_period_check CHECK (rate_period > interval '0' AND rate_period <= interval '1 day'),
    CONSTRAINT queues_max_depth_check CHECK (max_depth BETWEEN 1 AND 1000000),
    CONSTRAINT queues_retain_check CHECK (retain_completed >= interval '0' AND retain_failed >= interval '0')
);
ALTER TABLE treadle.queues ENABLE ROW LEVEL SECURITY;
CREATE POLICY queues_tenant_read ON treadle.queues FOR SELECT
    USING (starts_with(queue, coalesce(
        (SELECT t.queue_prefix FROM treadle.tenants AS t WHERE t.role_name = current_user), '')));
SELECT pg_catalog.pg_extension_config_dump('treadle.queues', '');

-- the worker registry records the job names each worker handles (explain's no_worker)
ALTER TABLE treadle.workers ADD COLUMN names text[];
DROP FUNCTION treadle.worker_seen(text, text, integer, text[], integer, integer);

--------------------------------------------------------------------------------
-- Retention (treadle.apply_retention, treadle.configure(retain_completed, retain_failed))
--------------------------------------------------------------------------------
ALTER TABLE treadle.settings
    ADD COLUMN retain_completed interval
        CONSTRAINT settings_retain_completed_check CHECK (retain_completed BETWEEN interval '0' AND interval '100 years'),
    ADD COLUMN retain_failed interval
        CONSTRAINT settings_retain_failed_check CHECK (retain_failed BETWEEN interval '0' AND interval '100 years');
-- a settings row made by 0.2.0 gets treadle._retention()'s defaults, as a new row does
UPDATE treadle.settings SET retain_completed = interval '7 days', retain_failed = interval '30 days';

CREATE INDEX workflow_runs_finished_at_idx ON treadle.workflow_runs (finished_at) WHERE finished_at IS NOT NULL;

--------------------------------------------------------------------------------
-- Retry policies and timeouts (docs/retries.md), as in sql/src/010_tables.sql.
--------------------------------------------------------------------------------
ALTER TABLE treadle.jobs ADD COLUMN timeout interval;
ALTER TABLE treadle.jobs ADD COLUMN backoff interval[];
ALTER TABLE treadle.jobs ADD CONSTRAINT jobs_timeout_check CHECK (timeout > interval '0');
ALTER TABLE treadle.jobs ADD CONSTRAINT jobs_backoff_check CHECK (cardinality(backoff) BETWEEN 1 AND 100);
CREATE INDEX jobs_timeout_idx ON treadle.jobs (started_at) WHERE lease_until IS NOT NULL AND timeout IS NOT NULL;
-- enqueue gains timeout and backoff, fail gains retryable: new signatures, so the old
-- ones go (after treadle_upgrade_parts above has read who held them).
DROP FUNCTION treadle.enqueue(text, jsonb, text, integer, timestamptz, integer, text, interval);
DROP FUNCTION treadle.fail(bigint, uuid, text, interval);

--------------------------------------------------------------------------------
-- Each failed attempt's entry in jobs.errors records its worker and start.
--------------------------------------------------------------------------------
DROP FUNCTION treadle._append_error(jsonb, integer, timestamptz, text);

--------------------------------------------------------------------------------
-- history: finished jobs move to treadle.job_history (sql/src/062_history.sql),
-- as in sql/src/010_tables.sql. Jobs finished under 0.2.0 move there too, as the
-- housekeeping's treadle.archive reaches them.
--------------------------------------------------------------------------------
-- History: finished jobs that treadle.archive moved out of treadle.jobs, so that the
-- live table stays small and retention empties whole partitions (TRUNCATE: no dead
-- rows, no long delete, whatever snapshots are open) instead of deleting rows. The
-- columns are the time retention deletes the row (finished_at plus the retention in
-- force when it moved; infinity: kept forever) and the partition it is in, then
-- treadle.jobs' in the same order: a column that a later version adds to both tables
-- then stands last in both, in an upgraded database as in a fresh one. Partitions 1..40 each hold the jobs whose purge_at
-- falls in one day (treadle.history_slots); partition 0 holds the rest (a longer
-- retention, or no free partition), which retention deletes row by row. The
-- partitions are made here, once: nothing creates or drops one at run time.
CREATE TABLE treadle.job_history (
    purge_at timestamptz NOT NULL,
    slot     smallint    NOT NULL,
    LIKE treadle.jobs
) PARTITION BY LIST (slot);
DO $$
BEGIN
    FOR n IN 0..40 LOOP
        EXECUTE format('CREATE TABLE treadle.%I PARTITION OF treadle.job_history FOR VALUES IN (%s)',
                       'job_history_' || lpad(n::text, 2, '0'), n);
        PERFORM pg_catalog.pg_extension_config_dump(format('treadle.job_history_%s', lpad(n::text, 2, '0'))::regclass, '');
    END LOOP;
END
$$;
-- treadle.archive reads the jobs it may move, oldest first: a finished job stays in this
-- index for the minute before it moves, so the index stays small, and keyed jobs and
-- workflow steps, which never move, are never walked past.
CREATE INDEX jobs_archive_idx ON treadle.jobs (finished_at)
    WHERE finished_at IS NOT NULL AND idempotency_key IS NULL AND workflow_run_id IS NULL;
CREATE INDEX job_history_id_idx ON treadle.job_history (id);
CREATE INDEX job_history_finished_at_idx ON treadle.job_history (finished_at);
CREATE INDEX job_history_failed_at_idx ON treadle.job_history (failed_at)
    WHERE state = 'discarded' AND last_error IS NOT NULL;
-- partition 0 is deleted from row by row, by purge time (the others go whole)
CREATE INDEX job_history_00_purge_at_idx ON treadle.job_history_00 (purge_at);

-- Which day of purge times each history partition holds; no row: the partition is
-- empty and free.
CREATE TABLE treadle.history_slots (
    slot   smallint    PRIMARY KEY,
    starts timestamptz NOT NULL,
    ends   timestamptz NOT NULL,
    CONSTRAINT history_slots_slot_check CHECK (slot BETWEEN 1 AND 40),
    CONSTRAINT history_slots_window_check CHECK (ends > starts)
);
ALTER TABLE treadle.job_history ENABLE ROW LEVEL SECURITY;
CREATE POLICY job_history_tenant_read ON treadle.job_history FOR SELECT
    USING (starts_with(queue, coalesce(
        (SELECT t.queue_prefix FROM treadle.tenants AS t WHERE t.role_name = current_user), '')));
SELECT pg_catalog.pg_extension_config_dump('treadle.history_slots', '');
