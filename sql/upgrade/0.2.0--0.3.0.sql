--------------------------------------------------------------------------------
-- Migration 0.2.0 -> 0.3.0, before the definitions: what CREATE OR REPLACE
-- cannot do. The functions and views that follow come from sql/src, as in a fresh
-- install.
--------------------------------------------------------------------------------

-- Rights on what is dropped here and created again (views, functions whose signature
-- changes), to give back in 0.2.0--0.3.0.after.sql: DROP takes them with it.
CREATE TEMPORARY TABLE treadle_upgrade_rights ON COMMIT DROP AS
SELECT c.oid::regclass::text AS object, a.privilege_type, a.grantee
  FROM pg_catalog.pg_class AS c
 CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
 WHERE c.relnamespace = 'treadle'::regnamespace AND c.relkind = 'v' AND a.grantee <> c.relowner
UNION ALL
SELECT p.proname::text, a.privilege_type, a.grantee
  FROM pg_catalog.pg_proc AS p
 CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) AS a
 WHERE p.oid = ANY (ARRAY['treadle.enqueue(text, jsonb, text, integer, timestamptz, integer, text, interval)'::regprocedure,
                          'treadle.fail(bigint, uuid, text, interval)'::regprocedure])
   AND a.grantee <> p.proowner;

-- Views are created again from sql/src.
DROP VIEW treadle.queue_stats, treadle.throughput, treadle.recent_failures, treadle.workflow_run_overview,
          treadle.job_details, treadle.workflow_run_steps, treadle.schedules, treadle.live_workers;

--------------------------------------------------------------------------------
-- Retry policies and timeouts (docs/retries.md), as in sql/src/010_tables.sql.
--------------------------------------------------------------------------------
ALTER TABLE treadle.jobs ADD COLUMN timeout interval;
ALTER TABLE treadle.jobs ADD COLUMN backoff interval[];
ALTER TABLE treadle.jobs ADD CONSTRAINT jobs_timeout_check CHECK (timeout > interval '0');
ALTER TABLE treadle.jobs ADD CONSTRAINT jobs_backoff_check CHECK (cardinality(backoff) BETWEEN 1 AND 100);
CREATE INDEX jobs_timeout_idx ON treadle.jobs (started_at) WHERE lease_until IS NOT NULL AND timeout IS NOT NULL;
-- enqueue gains timeout and backoff, fail gains retryable: new signatures, so the old ones go.
DROP FUNCTION treadle.enqueue(text, jsonb, text, integer, timestamptz, integer, text, interval);
DROP FUNCTION treadle.fail(bigint, uuid, text, interval);
