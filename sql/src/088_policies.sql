--------------------------------------------------------------------------------
-- Row-level security: what each reader sees. A tenant (treadle.set_tenant) sees the
-- rows of its queues, the workflow definitions named under its prefix, the workers
-- that serve only its queues, and its own tenant row: nothing of another tenant,
-- not even that it exists. A role that is not a tenant sees every row. The owner,
-- whose functions do every write, is not subject to them.
--
-- These policies are PERMISSIVE: an operator who keeps a role to less (one queue,
-- say) adds a RESTRICTIVE policy of its own, which every reader's query then meets
-- as well (docs/operations.md). Each reads the caller's prefix once per plan
-- (treadle._reader_prefix, below), through no subquery: Citus distributes no
-- table whose policy has one. An upgrade drops the previous version's policies
-- before this file makes them again.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._reader_prefix() -> text
--
-- The prefix the policies keep a reader to, declared IMMUTABLE so that the planner
-- computes it once, into the plan, rather than once per row (a STABLE call in a
-- policy runs for every row read: 100,000 jobs counted in 0.5 s instead of 20 ms).
-- What makes that sound: PostgreSQL plans a query under row-level security again
-- when current_user changes (a plan records the role it was made for), and every
-- change to treadle.tenants touches this function's catalog row
-- (treadle._tenants_changed), which makes every session plan again each cached
-- plan that computed it. So the value must depend on current_user and on
-- treadle.tenants only: it is the caller's tenant prefix (treadle._caller_prefix)
-- when current_user is the caller's role, and null (no row passes) inside a
-- SECURITY DEFINER function of another role, whose cached plans would otherwise
-- keep the first caller's prefix for the next. Not a definer itself and not
-- inlined (the SET), so it sees the reader's current_user. Only the policies
-- call it; anyone may: it tells a role its own prefix only.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._reader_prefix()
RETURNS text
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT CASE WHEN CURRENT_USER = treadle._caller() THEN treadle._caller_prefix() END;
END;
COMMENT ON FUNCTION treadle._reader_prefix() IS
    'The reader''s tenant prefix for the row-level security policies, computed once per plan (null inside another role''s definer function).';

--------------------------------------------------------------------------------
-- treadle._tenants_locked() -> trigger
--
-- Before any change to treadle.tenants: its writers take turns (the lock), so that
-- two changes never meet on _reader_prefix's one catalog row (_tenants_changed).
-- On Citus treadle.tenants is a reference table, whose triggers fire on each node's
-- copy: each copy is locked there, before the write.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._tenants_locked()
RETURNS trigger
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- the table the trigger fires on: treadle.tenants, or on Citus each node's copy of it
    -- (a lock on treadle.tenants there would reach every node again, from inside a write)
    EXECUTE format('LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE', TG_RELID::regclass);
    RETURN NULL;
END;
$$;
COMMENT ON FUNCTION treadle._tenants_locked() IS
    'Before a change to the tenants: their writers take turns.';
CREATE OR REPLACE TRIGGER tenants_locked
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON treadle.tenants
    FOR EACH STATEMENT EXECUTE FUNCTION treadle._tenants_locked();

--------------------------------------------------------------------------------
-- treadle._tenants_changed() -> trigger
--
-- After any change to treadle.tenants: a change to treadle._reader_prefix's catalog
-- row that leaves it as it is, so that every session plans again the cached plans
-- that computed a tenant prefix. Its writer must own that function (set_tenant is
-- owner only), and holds the lock _tenants_locked took.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._tenants_changed()
RETURNS trigger
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    ALTER FUNCTION treadle._reader_prefix() IMMUTABLE;  -- on Citus, on each node with a copy
    RETURN NULL;
END;
$$;
COMMENT ON FUNCTION treadle._tenants_changed() IS
    'After a change to the tenants: plans that computed a tenant prefix are made again.';
CREATE OR REPLACE TRIGGER tenants_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON treadle.tenants
    FOR EACH STATEMENT EXECUTE FUNCTION treadle._tenants_changed();

--------------------------------------------------------------------------------
-- treadle._all_start_with(names, prefix) -> boolean
--
-- Whether every one of names starts with prefix (the workers policy: a worker is
-- a tenant's when every queue it serves is).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._all_start_with(names text[], prefix text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
BEGIN ATOMIC
    SELECT NOT EXISTS (SELECT FROM unnest(names) AS n(n) WHERE NOT starts_with(n.n, prefix));
END;
COMMENT ON FUNCTION treadle._all_start_with(text[], text) IS
    'Whether every one of names starts with prefix.';

CREATE POLICY jobs_tenant_read ON treadle.jobs FOR SELECT
    USING (starts_with(queue, treadle._reader_prefix()));
CREATE POLICY job_history_tenant_read ON treadle.job_history FOR SELECT
    USING (starts_with(queue, treadle._reader_prefix()));
CREATE POLICY workflow_runs_tenant_read ON treadle.workflow_runs FOR SELECT
    USING (starts_with(queue, treadle._reader_prefix()));
CREATE POLICY cron_schedules_tenant_read ON treadle.cron_schedules FOR SELECT
    USING (starts_with(queue, treadle._reader_prefix()));
CREATE POLICY queues_tenant_read ON treadle.queues FOR SELECT
    USING (starts_with(queue, treadle._reader_prefix()));
CREATE POLICY workflow_signals_tenant_read ON treadle.workflow_signals FOR SELECT
    USING (starts_with(queue, treadle._reader_prefix()));
CREATE POLICY workflows_tenant_read ON treadle.workflows FOR SELECT
    USING (starts_with(name, treadle._reader_prefix()));
-- a worker is a tenant's when every queue it serves is (worker_seen keeps a tenant's
-- worker to its queues)
CREATE POLICY workers_tenant_read ON treadle.workers FOR SELECT
    USING (treadle._all_start_with(queues, treadle._reader_prefix()));
-- a tenant sees its own row; a role that is not a tenant, every row
CREATE POLICY tenants_tenant_read ON treadle.tenants FOR SELECT
    USING (treadle._reader_prefix() = '' OR tenant_role = treadle._caller_role());
