--------------------------------------------------------------------------------
-- Privileges. The functions are the only write path: every function that writes
-- runs as the owner (SECURITY DEFINER, search_path pinned, names qualified, no
-- SQL built from input), and no other role holds a right that writes a table or
-- draws from a sequence. Helpers named _* are the owner's alone (but the three that
-- the row-level security policies call, which tell a role of itself). The extension
-- creates no roles: the owner gives roles what their part needs with
--
--   treadle.grant_reader(role)     the views, and the tables' columns but lease tokens
--   treadle.grant_producer(role)   reader + enqueue, workflows, schedules, cancel, retry
--   treadle.grant_worker(role)     producer + claim, heartbeat, finish, rescue, retention, registry
--   treadle.grant_admin(role)      reader + cancel, retry, unschedule, prune, rescue, retention,
--                                  retry_run, fork_run, compensate_run, cancel_run
--   treadle.grant_dashboard(role, read_only)   reader + cancel, retry, unschedule, retry_run,
--                                  fork_run, compensate_run, cancel_run unless read_only
--
-- and keeps a role to the queues under a prefix with treadle.set_tenant.
-- docs/operations.md has the table of who may do what.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._grant_parts(role, parts) -> void
--
-- Grants USAGE on the schema and EXECUTE on the functions of each named part:
--   read     job_counts, estimated_jobs, explain, explain_run, listen_done, unlisten_done
--   produce  enqueue, enqueue_many, enqueue_arrays, start_workflow, schedule, signal, signal_by_key
--   control  cancel, retry, cancel_workflow, unschedule
--   work     claim, claimed, heartbeat, heartbeat_many, progress, complete,
--            complete_many, complete_and_claim, fail, release, snooze, step_sleep,
--            define_workflow, worker_seen, worker_stopped
--   queues   set_queue, pause, resume
--   runs     retry_run, fork_run, compensate_run, cancel_run (the operator's: not a producer's)
--   recover  rescue, apply_retention (the housekeeping every worker does)
--   prune    prune
-- Each function is listed here once; the grant helpers combine the parts.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._grant_parts(role regrole, parts text[])
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_functions text[];
BEGIN
    IF role IS NULL THEN
        RAISE EXCEPTION 'treadle: role must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT array_agg(f.signature) INTO v_functions
      FROM (VALUES
        ('read',    'treadle.job_counts(bigint)'),
        ('read',    'treadle.estimated_jobs(text, text)'),
        ('read',    'treadle.explain(bigint, text)'),
        ('read',    'treadle.explain_run(bigint)'),
        ('read',    'treadle.listen_done(text)'),
        ('read',    'treadle.unlisten_done()'),
        ('produce', 'treadle.enqueue(text, jsonb, text, integer, timestamptz, integer, text, interval, interval, interval[], text, text, interval, jsonb, text)'),
        ('produce', 'treadle.enqueue_many(jsonb)'),
        ('produce', 'treadle.enqueue_arrays(text[], jsonb[], text[], integer[], timestamptz[], integer[], text[], interval[], interval[], jsonb[], text[])'),
        ('produce', 'treadle.start_workflow(text, jsonb, text[], text, integer, integer, text, jsonb, jsonb, jsonb, jsonb, jsonb, jsonb, jsonb, jsonb)'),
        ('produce', 'treadle.signal(bigint, text, jsonb)'),
        ('produce', 'treadle.signal_by_key(text, text, text, jsonb)'),
        ('produce', 'treadle.schedule(text, text, text, jsonb, text, text, integer, integer, boolean)'),
        ('control', 'treadle.cancel(bigint, text)'),
        ('control', 'treadle.retry(bigint, text)'),
        ('control', 'treadle.cancel_workflow(bigint)'),
        ('control', 'treadle.unschedule(text)'),
        ('work',    'treadle.claim(text, text[], text[], integer, interval, uuid)'),
        ('work',    'treadle.claimed(uuid)'),
        ('work',    'treadle.heartbeat(bigint, uuid, interval, text)'),
        ('work',    'treadle.progress(bigint, uuid, double precision, text, text)'),
        ('work',    'treadle.complete(bigint, uuid, jsonb, text)'),
        ('work',    'treadle.complete_many(bigint[], uuid[], jsonb[], text[])'),
        ('work',    'treadle.complete_and_claim(bigint[], uuid[], jsonb[], text, text[], text[], integer, interval, uuid, text[])'),
        ('work',    'treadle.heartbeat_many(bigint[], uuid[], interval, text[])'),
        ('work',    'treadle.fail(bigint, uuid, text, interval, boolean, text)'),
        ('work',    'treadle.release(bigint, uuid, text)'),
        ('work',    'treadle.snooze(bigint, uuid, interval, text)'),
        ('work',    'treadle.step_sleep(bigint, uuid, integer, interval, timestamptz)'),
        ('work',    'treadle.define_workflow(text, text[], jsonb, jsonb, jsonb, jsonb, jsonb, jsonb, jsonb)'),
        ('work',    'treadle.worker_seen(text, text, integer, text[], integer, integer, text[])'),
        ('work',    'treadle.worker_stopped(text)'),
        ('queues',  'treadle.set_queue(text, integer, integer, interval, integer, interval, interval, integer, boolean)'),
        ('queues',  'treadle.pause(text)'),
        ('queues',  'treadle.resume(text)'),
        ('runs',    'treadle.retry_run(bigint)'),
        ('runs',    'treadle.fork_run(bigint, text, jsonb)'),
        ('runs',    'treadle.compensate_run(bigint)'),
        ('runs',    'treadle.cancel_run(bigint, boolean)'),
        ('recover', 'treadle.rescue()'),
        ('recover', 'treadle.apply_retention(integer)'),
        ('recover', 'treadle.archive(integer)'),
        ('prune',   'treadle.prune(interval)')
      ) AS f(part, signature)
     WHERE f.part = ANY (parts);
    EXECUTE format('GRANT USAGE ON SCHEMA treadle TO %s', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s',
                   (SELECT string_agg(f::regprocedure::text, ', ') FROM unnest(v_functions) AS u(f)), role);
END;
$$;
COMMENT ON FUNCTION treadle._grant_parts(regrole, text[]) IS
    'Grant schema usage and the functions of the named parts (read, produce, control, work, queues, runs, recover, prune) to a role.';

--------------------------------------------------------------------------------
-- treadle.grant_reader(role) -> void
--
-- Lets a role read: the views, every column of the tables but the lease token of
-- jobs and job_history (a worker's write credential), and the job count estimates. Row-level security
-- keeps a tenant to its queues. Raises 22004: role null. Owner only.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.grant_reader(role regrole)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_table regclass;
BEGIN
    PERFORM treadle._grant_parts(role, ARRAY['read']);
    FOR v_table IN SELECT unnest(ARRAY['treadle.jobs', 'treadle.job_history']::regclass[]) LOOP
        EXECUTE format('GRANT SELECT (%s) ON %s TO %s',
                       (SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum)
                          FROM pg_catalog.pg_attribute AS a
                         WHERE a.attrelid = v_table AND a.attnum > 0
                           AND NOT a.attisdropped AND a.attname <> 'lease_token'),
                       v_table, role);
    END LOOP;
    EXECUTE format('GRANT SELECT ON treadle.workflow_runs, treadle.workflow_signals, treadle.workflows, treadle.workers,
        treadle.tenants, treadle.settings, treadle.history_slots,
        treadle.queue_stats, treadle.throughput, treadle.recent_failures, treadle.workflow_run_overview,
        treadle.live_workers, treadle.job_details, treadle.workflow_run_steps,
        treadle.cron_schedules, treadle.schedules, treadle.queues, treadle.queue_settings TO %s', role);
END;
$$;
COMMENT ON FUNCTION treadle.grant_reader(regrole) IS
    'Grant a role what reading needs: the views and the tables but lease tokens.';

--------------------------------------------------------------------------------
-- treadle.grant_producer(role) -> void
--
-- grant_reader, plus enqueueing, starting workflows, and cancelling and retrying
-- jobs and runs. Raises 22004: role null. Owner only.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.grant_producer(role regrole)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM treadle.grant_reader(role);
    PERFORM treadle._grant_parts(role, ARRAY['produce', 'control']);
END;
$$;
COMMENT ON FUNCTION treadle.grant_producer(regrole) IS
    'Grant a role what it needs to enqueue, start workflows, cancel and retry.';

--------------------------------------------------------------------------------
-- treadle.grant_worker(role) -> void
--
-- grant_producer (handlers enqueue follow-up work), plus claiming, heartbeats,
-- progress, finishing, rescue, retention, workflow definitions and the worker registry.
-- Raises 22004: role null. Owner only.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.grant_worker(role regrole)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM treadle.grant_producer(role);
    PERFORM treadle._grant_parts(role, ARRAY['work', 'recover']);
END;
$$;
COMMENT ON FUNCTION treadle.grant_worker(regrole) IS
    'Grant a role what a worker needs: grant_producer plus claim, heartbeat, finish and rescue.';

--------------------------------------------------------------------------------
-- treadle.grant_admin(role) -> void
--
-- grant_reader, plus the operator's controls: cancel, retry, prune, rescue,
-- apply_retention, the queues' pause, resume and limits, and retrying, forking and
-- compensating workflow runs. Raises 22004: role null. Owner only.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.grant_admin(role regrole)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM treadle.grant_reader(role);
    PERFORM treadle._grant_parts(role, ARRAY['control', 'queues', 'runs', 'recover', 'prune']);
END;
$$;
COMMENT ON FUNCTION treadle.grant_admin(regrole) IS
    'Grant a role the operator''s controls: reading, cancel, retry, prune and rescue.';

--------------------------------------------------------------------------------
-- treadle.grant_dashboard(role, read_only) -> void
--
-- What the dashboard needs: grant_reader, and unless read_only, cancelling and
-- retrying jobs, cancelling, retrying, forking and compensating workflow runs, and pausing,
-- resuming and limiting queues.
-- Raises 22004: role or read_only null. Owner only.
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
    PERFORM treadle.grant_reader(role);
    IF NOT read_only THEN
        PERFORM treadle._grant_parts(role, ARRAY['control', 'queues', 'runs']);
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle.grant_dashboard(regrole, boolean) IS
    'Grant a role what the dashboard needs: the views, and unless read_only, cancel and retry.';

--------------------------------------------------------------------------------
-- treadle.set_tenant(role, queue_prefix) -> void
--
-- Keeps a role (by OID: a rename keeps the rule) to the queues whose names start
-- with queue_prefix: it sees only their jobs, runs and schedules, the workflow
-- definitions named under the prefix, the workers that serve only its queues and
-- its own tenant row (row-level security, 088_policies.sql); every function that
-- names a queue, a workflow or a worker refuses it any other (42501). A null
-- prefix lifts the rule. Idempotency keys are per queue, so tenants never share
-- one. Owner only.
-- Raises 22004: role null. 22023: a prefix that is not a valid name.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.set_tenant(role regrole, queue_prefix text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF role IS NULL THEN
        RAISE EXCEPTION 'treadle: role must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF queue_prefix IS NULL THEN
        DELETE FROM treadle.tenants AS t WHERE t.tenant_role = role;
        RETURN;
    END IF;
    PERFORM treadle._check_text(queue_prefix, 'queue_prefix');
    INSERT INTO treadle.tenants AS t (tenant_role, queue_prefix) VALUES (role, queue_prefix)
    ON CONFLICT (tenant_role) DO UPDATE SET queue_prefix = excluded.queue_prefix;
END;
$$;
COMMENT ON FUNCTION treadle.set_tenant(regrole, text) IS
    'Keep a role to the queues under a prefix (null lifts it).';

--------------------------------------------------------------------------------
-- treadle.configure(max_payload_bytes, max_map_elements) -> void
--
-- The owner's limits: the largest args, workflow input, result or progress
-- message accepted, in bytes (default 1 MiB); the most elements a workflow map
-- step fans out over (default 100,000). A null leaves that limit as it is, so
-- either may be given alone. Owner only.
-- Raises 22004: both null. 22023: max_payload_bytes outside 1 KiB..256 MiB,
-- max_map_elements outside 1..1000000.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.configure(max_payload_bytes integer DEFAULT NULL,
                                             max_map_elements integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF configure.max_payload_bytes IS NULL AND configure.max_map_elements IS NULL THEN
        RAISE EXCEPTION 'treadle: max_payload_bytes and max_map_elements must not both be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF configure.max_payload_bytes NOT BETWEEN 1024 AND 268435456 THEN
        RAISE EXCEPTION 'treadle: max_payload_bytes must be between 1024 and 268435456, got %', configure.max_payload_bytes
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF configure.max_map_elements NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'treadle: max_map_elements must be between 1 and 1000000, got %', configure.max_map_elements
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO treadle.settings AS s (max_payload_bytes, retain_completed, retain_failed, max_map_elements)
    SELECT coalesce(configure.max_payload_bytes, treadle._max_payload_bytes()), r.retain_completed, r.retain_failed,
           coalesce(configure.max_map_elements, treadle._max_map_elements())
      FROM treadle._retention() AS r
    ON CONFLICT (only_row) DO UPDATE SET max_payload_bytes = excluded.max_payload_bytes,
                                         max_map_elements = excluded.max_map_elements;
END;
$$;
COMMENT ON FUNCTION treadle.configure(integer, integer) IS
    'Set the owner''s limits (max_payload_bytes, max_map_elements); a null leaves one as it is.';

--------------------------------------------------------------------------------
-- treadle.configure(retain_completed, retain_failed) -> void
--
-- The global retention that treadle.apply_retention applies to queues that set
-- none of their own (treadle.queues): how long completed jobs and runs are kept,
-- and how long discarded and cancelled jobs and failed and cancelled runs are.
-- Null keeps them forever. Both are given, so a call says the whole policy.
-- Defaults until the first call: 7 days and 30 days (treadle._retention). Owner only.
-- Raises 22023: a period negative or over 100 years.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.configure(retain_completed interval, retain_failed interval)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM treadle._check_interval(configure.retain_completed, 'retain_completed', interval '100 years',
                                    may_be_zero => true);
    PERFORM treadle._check_interval(configure.retain_failed, 'retain_failed', interval '100 years',
                                    may_be_zero => true);
    INSERT INTO treadle.settings AS s (max_payload_bytes, retain_completed, retain_failed)
    VALUES (treadle._max_payload_bytes(), configure.retain_completed, configure.retain_failed)
    ON CONFLICT (only_row) DO UPDATE SET retain_completed = excluded.retain_completed,
                                         retain_failed = excluded.retain_failed;
END;
$$;
COMMENT ON FUNCTION treadle.configure(interval, interval) IS
    'Set how long finished work is kept (completed, failed); null keeps it forever.';

--------------------------------------------------------------------------------
-- treadle.configure(max_queues, retention_floor) -> void
--
-- What a role without the admin part (treadle.grant_admin: the dashboard's) may do
-- to queues: make settings rows (set_queue, pause) for at most max_queues queues in
-- all (default 1000), and set no queue's retention below retention_floor (default
-- 1 day). Admins, the owner and superusers are not held to either. Both are given,
-- so a call says the whole policy. Owner only.
-- Raises 22004: either null. 22023: max_queues outside 1..1000000, retention_floor
-- negative or over 100 years.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.configure(max_queues integer, retention_floor interval)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF configure.max_queues IS NULL OR configure.retention_floor IS NULL THEN
        RAISE EXCEPTION 'treadle: max_queues and retention_floor must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF configure.max_queues NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'treadle: max_queues must be between 1 and 1000000, got %', configure.max_queues
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM treadle._check_interval(configure.retention_floor, 'retention_floor', interval '100 years',
                                    may_be_zero => true);
    INSERT INTO treadle.settings AS s (max_payload_bytes, retain_completed, retain_failed, max_queues, retention_floor)
    SELECT treadle._max_payload_bytes(), r.retain_completed, r.retain_failed,
           configure.max_queues, configure.retention_floor
      FROM treadle._retention() AS r
    ON CONFLICT (only_row) DO UPDATE SET max_queues = excluded.max_queues,
                                         retention_floor = excluded.retention_floor;
END;
$$;
COMMENT ON FUNCTION treadle.configure(integer, interval) IS
    'Set what roles without the admin part may do to queues (max_queues, retention_floor).';

--------------------------------------------------------------------------------
-- Every function, table and sequence: nothing for PUBLIC, but the read-only
-- functions that run with the caller's rights (they show only what the caller may
-- see). This file comes last, so it covers every object the sources create.
--------------------------------------------------------------------------------
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA treadle FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA treadle FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA treadle FROM PUBLIC;

-- Read-only functions that run with the caller's rights: anyone may call them, and
-- see only what the caller may see. And cron_next, which reads no table.
GRANT EXECUTE ON FUNCTION treadle.version(), treadle.now(), treadle.workflow_results(bigint),
    treadle.workflow_step_results(bigint, text),
    treadle.cron_next(text, text, timestamptz) TO PUBLIC;
-- What a workflow step receives, from a run's columns the caller read: it reads no
-- table (the worker's query of its claimed steps' runs calls it).
GRANT EXECUTE ON FUNCTION treadle._step_results(text[], jsonb, jsonb, text) TO PUBLIC;
-- treadle.now()'s helper, inlined with it into the caller's statement: it reads the
-- caller's own setting.
GRANT EXECUTE ON FUNCTION treadle._moved_clock(text) TO PUBLIC;
-- The helpers the row-level security policies call as the reader: each tells a role
-- of itself only (its name, its OID, its own tenant prefix).
GRANT EXECUTE ON FUNCTION treadle._caller(), treadle._caller_role(), treadle._caller_prefix(), treadle._reader_prefix(),
    treadle._all_start_with(text[], text) TO PUBLIC;
