--------------------------------------------------------------------------------
-- What restricts an enqueue, kept in one table (treadle.enqueue_guards) so that
-- enqueue's common call reads one index where it read two (030_enqueue.sql): a row
-- per queue with a max_depth, and a row per tenant under the queue name '' (no
-- queue has it). The triggers below keep it in step with treadle.queues and
-- treadle.tenants in the transaction that changes them, whoever writes them
-- (set_queue, set_tenant, or the owner by hand), so an enqueue sees the rows and
-- the guards of one snapshot. A dump holds the guards with the rows of the two tables
-- (one snapshot), so a restore has them with these triggers off (--disable-triggers)
-- as with them on: a guard the restore's rows make again is there already (ON
-- CONFLICT DO NOTHING).
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._queue_guard() -> trigger (AFTER INSERT, DELETE, UPDATE OF queue,
-- max_depth, TRUNCATE ON treadle.queues)
--
-- A queue's guard row exists while its row has a max_depth.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._queue_guard()
RETURNS trigger
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        DELETE FROM treadle.enqueue_guards AS g WHERE g.tenant_role IS NULL;
        RETURN NULL;
    END IF;
    IF TG_OP <> 'INSERT' AND OLD.max_depth IS NOT NULL THEN
        DELETE FROM treadle.enqueue_guards AS g WHERE g.queue = OLD.queue AND g.tenant_role IS NULL;
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.max_depth IS NOT NULL THEN
        INSERT INTO treadle.enqueue_guards (queue) VALUES (NEW.queue) ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END;
$$;
COMMENT ON FUNCTION treadle._queue_guard() IS
    'Trigger: a queue with a max_depth has its row in treadle.enqueue_guards.';
CREATE OR REPLACE TRIGGER queues_enqueue_guard
    AFTER INSERT OR DELETE OR UPDATE OF queue, max_depth ON treadle.queues
    FOR EACH ROW EXECUTE FUNCTION treadle._queue_guard();
CREATE OR REPLACE TRIGGER queues_enqueue_guard_truncate
    AFTER TRUNCATE ON treadle.queues
    FOR EACH STATEMENT EXECUTE FUNCTION treadle._queue_guard();

--------------------------------------------------------------------------------
-- treadle._tenant_guard() -> trigger (AFTER INSERT, DELETE, UPDATE OF
-- tenant_role, TRUNCATE ON treadle.tenants)
--
-- A tenant has its row in treadle.enqueue_guards (queue '') while it is a tenant.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._tenant_guard()
RETURNS trigger
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        DELETE FROM treadle.enqueue_guards AS g WHERE g.tenant_role IS NOT NULL;
        RETURN NULL;
    END IF;
    IF TG_OP <> 'INSERT' THEN
        DELETE FROM treadle.enqueue_guards AS g WHERE g.queue = '' AND g.tenant_role = OLD.tenant_role;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        INSERT INTO treadle.enqueue_guards (queue, tenant_role) VALUES ('', NEW.tenant_role) ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END;
$$;
COMMENT ON FUNCTION treadle._tenant_guard() IS
    'Trigger: a tenant has its row in treadle.enqueue_guards.';
CREATE OR REPLACE TRIGGER tenants_enqueue_guard
    AFTER INSERT OR DELETE OR UPDATE OF tenant_role ON treadle.tenants
    FOR EACH ROW EXECUTE FUNCTION treadle._tenant_guard();
CREATE OR REPLACE TRIGGER tenants_enqueue_guard_truncate
    AFTER TRUNCATE ON treadle.tenants
    FOR EACH STATEMENT EXECUTE FUNCTION treadle._tenant_guard();
