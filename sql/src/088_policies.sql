--------------------------------------------------------------------------------
-- Row-level security: what each reader sees. A tenant (treadle.set_tenant) sees the
-- rows of its queues, the workflow definitions named under its prefix, the workers
-- that serve only its queues, and its own tenant row: nothing of another tenant,
-- not even that it exists. A role that is not a tenant sees every row. The owner,
-- whose functions do every write, is not subject to them.
--
-- These policies are PERMISSIVE: an operator who keeps a role to less (one queue,
-- say) adds a RESTRICTIVE policy of its own, which every reader's query then meets
-- as well (docs/operations.md). Each reads the caller's prefix once per query
-- (treadle._caller_prefix, which runs as the owner, so that no policy reads
-- treadle.tenants through another). An upgrade drops the previous version's
-- policies before this file makes them again.
--------------------------------------------------------------------------------
CREATE POLICY jobs_tenant_read ON treadle.jobs FOR SELECT
    USING (starts_with(queue, (SELECT treadle._caller_prefix())));
CREATE POLICY job_history_tenant_read ON treadle.job_history FOR SELECT
    USING (starts_with(queue, (SELECT treadle._caller_prefix())));
CREATE POLICY workflow_runs_tenant_read ON treadle.workflow_runs FOR SELECT
    USING (starts_with(queue, (SELECT treadle._caller_prefix())));
CREATE POLICY cron_schedules_tenant_read ON treadle.cron_schedules FOR SELECT
    USING (starts_with(queue, (SELECT treadle._caller_prefix())));
CREATE POLICY queues_tenant_read ON treadle.queues FOR SELECT
    USING (starts_with(queue, (SELECT treadle._caller_prefix())));
CREATE POLICY workflow_signals_tenant_read ON treadle.workflow_signals FOR SELECT
    USING (starts_with(queue, (SELECT treadle._caller_prefix())));
CREATE POLICY workflows_tenant_read ON treadle.workflows FOR SELECT
    USING (starts_with(name, (SELECT treadle._caller_prefix())));
-- a worker is a tenant's when every queue it serves is (worker_seen keeps a tenant's
-- worker to its queues)
CREATE POLICY workers_tenant_read ON treadle.workers FOR SELECT
    USING (NOT EXISTS (SELECT 1 FROM unnest(queues) AS q(q) WHERE NOT starts_with(q.q, (SELECT treadle._caller_prefix()))));
-- a tenant sees its own row; a role that is not a tenant, every row
CREATE POLICY tenants_tenant_read ON treadle.tenants FOR SELECT
    USING ((SELECT treadle._caller_prefix()) = '' OR tenant_role = (SELECT treadle._caller_role()));
