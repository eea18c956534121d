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
-- cycle: treadle.complete_and_claim and treadle.heartbeat_many are new functions
-- (sql/src/045_cycle.sql) in the work part; no table changes. The after-script's
-- re-grant of each role's parts gives them to the roles that work.
--------------------------------------------------------------------------------

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
