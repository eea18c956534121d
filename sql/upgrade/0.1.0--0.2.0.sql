--------------------------------------------------------------------------------
-- Migration 0.1.0 -> 0.2.0, before the definitions: what CREATE OR REPLACE
-- cannot do. The functions and views that follow come from sql/src, as in a fresh
-- install; sql/upgrade/0.1.0--0.2.0.after.sql finishes after them.
--------------------------------------------------------------------------------

-- Roles that 0.1.0's grant helpers set up held table and sequence rights that
-- bypass the functions. Remember what each was, take everything back, and let
-- the 0.2.0 helpers give it again at the end (no write rights, no lease tokens).
CREATE TEMPORARY TABLE treadle_upgrade_roles ON COMMIT DROP AS
WITH grantees AS (
    -- roles named in the ACLs of 0.1.0's objects (not those that reach them by membership)
    SELECT a.grantee FROM pg_catalog.pg_class AS c CROSS JOIN aclexplode(c.relacl) AS a
     WHERE c.relnamespace = 'treadle'::regnamespace
    UNION
    SELECT a.grantee FROM pg_catalog.pg_proc AS p CROSS JOIN aclexplode(p.proacl) AS a
     WHERE p.pronamespace = 'treadle'::regnamespace
)
SELECT r.rolname AS role_name,
       CASE WHEN has_function_privilege(r.oid, 'treadle.claim(text, text[], text[], integer, interval)', 'EXECUTE')
                 THEN 'worker'
            WHEN has_function_privilege(r.oid, 'treadle.enqueue(text, jsonb, text, integer, timestamptz, integer, text, interval)', 'EXECUTE')
                 THEN 'producer'
            WHEN has_function_privilege(r.oid, 'treadle.cancel(bigint)', 'EXECUTE')
                 THEN 'dashboard'
            ELSE 'reader' END AS kind
  FROM grantees AS g
  JOIN pg_catalog.pg_roles AS r ON r.oid = g.grantee
 WHERE r.oid <> (SELECT n.nspowner FROM pg_catalog.pg_namespace AS n WHERE n.nspname = 'treadle');

DO $$
DECLARE
    v_role name;
BEGIN
    FOR v_role IN SELECT u.role_name FROM treadle_upgrade_roles AS u LOOP
        EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA treadle FROM %I', v_role);
        EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA treadle FROM %I', v_role);
        EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA treadle FROM %I', v_role);
        EXECUTE format('REVOKE ALL ON SCHEMA treadle FROM %I', v_role);
    END LOOP;
END;
$$;

-- Views are created again from sql/src (they become security_invoker).
DROP VIEW treadle.queue_stats, treadle.throughput, treadle.recent_failures,
          treadle.workflow_run_overview, treadle.job_details, treadle.workflow_run_steps,
          treadle.live_workers;

-- claim gains lease_token: a new signature, so the old one goes.
DROP FUNCTION treadle.claim(text, text[], text[], integer, interval);

-- Finished jobs keep the token of the claim that finished them.
ALTER TABLE treadle.jobs DROP CONSTRAINT jobs_lease_check;
ALTER TABLE treadle.jobs ADD CONSTRAINT jobs_lease_check CHECK (
    (state = 'running') = (lease_until IS NOT NULL)
    AND (state <> 'running' OR (lease_token IS NOT NULL AND worker_id IS NOT NULL)));

-- The lease index by lease_until alone, so that a worker's writes to its running job
-- read the primary key (see sql/src/010_tables.sql).
DROP INDEX treadle.jobs_lease_idx;
CREATE INDEX jobs_lease_idx ON treadle.jobs (lease_until) WHERE lease_until IS NOT NULL;

-- Idempotency keys become per queue (a key global in 0.1.0 is unique per queue too).
DROP INDEX treadle.jobs_idempotency_key_idx;
CREATE UNIQUE INDEX jobs_idempotency_key_idx
    ON treadle.jobs (queue, idempotency_key) WHERE idempotency_key IS NOT NULL;
DROP INDEX treadle.workflow_runs_idempotency_key_idx;
CREATE UNIQUE INDEX workflow_runs_idempotency_key_idx
    ON treadle.workflow_runs (queue, idempotency_key) WHERE idempotency_key IS NOT NULL;

-- The owner's limits and the tenants, as in sql/src/010_tables.sql.
CREATE TABLE treadle.settings (
    only_row          boolean PRIMARY KEY DEFAULT true,
    max_payload_bytes integer NOT NULL,
    CONSTRAINT settings_only_row_check CHECK (only_row),
    CONSTRAINT settings_max_payload_bytes_check CHECK (max_payload_bytes BETWEEN 1024 AND 268435456)
);
CREATE TABLE treadle.tenants (
    role_name    name PRIMARY KEY,
    queue_prefix text NOT NULL,
    CONSTRAINT tenants_queue_prefix_check CHECK (queue_prefix <> '')
);
ALTER TABLE treadle.jobs ENABLE ROW LEVEL SECURITY;
ALTER TABLE treadle.workflow_runs ENABLE ROW LEVEL SECURITY;
CREATE POLICY jobs_tenant_read ON treadle.jobs FOR SELECT
    USING (starts_with(queue, coalesce(
        (SELECT t.queue_prefix FROM treadle.tenants AS t WHERE t.role_name = current_user), '')));
CREATE POLICY workflow_runs_tenant_read ON treadle.workflow_runs FOR SELECT
    USING (starts_with(queue, coalesce(
        (SELECT t.queue_prefix FROM treadle.tenants AS t WHERE t.role_name = current_user), '')));
SELECT pg_catalog.pg_extension_config_dump('treadle.settings', '');
SELECT pg_catalog.pg_extension_config_dump('treadle.tenants', '');

-- Schema: nobody but the owner creates objects in it.
REVOKE ALL ON SCHEMA treadle FROM PUBLIC;

--------------------------------------------------------------------------------
-- Cron schedules (sql/src/072_schedules.sql), as in sql/src/010_tables.sql.
--------------------------------------------------------------------------------
ALTER TABLE treadle.jobs ADD COLUMN schedule text;
CREATE TABLE treadle.cron_schedules (
    name         text        PRIMARY KEY,
    cron         text        NOT NULL,
    tz           text        NOT NULL,
    job          text        NOT NULL,
    args         jsonb       NOT NULL DEFAULT '{}',
    queue        text        NOT NULL,
    priority     integer     NOT NULL,
    max_attempts integer     NOT NULL,
    catch_up     boolean     NOT NULL,
    job_id       bigint,
    next_run_at  timestamptz NOT NULL,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    CONSTRAINT cron_schedules_name_check CHECK (name <> ''),
    CONSTRAINT cron_schedules_max_attempts_check CHECK (max_attempts >= 1)
);
ALTER TABLE treadle.cron_schedules ENABLE ROW LEVEL SECURITY;
CREATE POLICY cron_schedules_tenant_read ON treadle.cron_schedules FOR SELECT
    USING (starts_with(queue, coalesce(
        (SELECT t.queue_prefix FROM treadle.tenants AS t WHERE t.role_name = current_user), '')));
SELECT pg_catalog.pg_extension_config_dump('treadle.cron_schedules', '');
