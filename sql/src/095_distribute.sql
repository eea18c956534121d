--------------------------------------------------------------------------------
-- Citus: spreading treadle over the nodes of a Citus cluster (docs/citus.md).
--
-- A queue is the unit of distribution: every hot statement names one queue, so each
-- is routed to the one shard that holds that queue's rows. The tables that hold jobs
-- and runs are hash-distributed by queue and co-located (a queue's jobs, runs,
-- signals and history share a shard, so a finish that moves a job into its history
-- or advances a run stays on one node); the small tables every statement may read
-- are reference tables (a copy on every node); the tables of the coordinator's own
-- sessions (workers' heartbeats, done_waiters' pids) stay local to the coordinator,
-- so a heartbeat is not a two-phase commit on every node.
--
-- Calls are not delegated to the worker nodes: every function runs on the
-- coordinator, which draws every id from its own sequences (ids never collide) and
-- sends every NOTIFY (a listener on the coordinator hears all of them).
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle.distribute(shard_count) -> text
--
-- Run once on a Citus coordinator, after CREATE EXTENSION treadle: distributes
-- treadle.workflow_runs, treadle.jobs, treadle.workflow_signals,
-- treadle.job_history (with its partitions) and treadle.key_slots by queue,
-- co-located, in shard_count shards (null: Citus's citus.shard_count, 32 unless
-- set); makes treadle.queues, workflows, cron_schedules, settings, tenants and history_slots reference tables;
-- leaves treadle.workers, done_waiters and run_rechecks (unused there: a branch waits for
-- its run's row, 073_workflow_rechecks.sql) local to the coordinator. Rows already
-- there move with their tables. A second call changes nothing and says so, or
-- distributes the tables an earlier build's call left local (key_slots). Each call
-- lets treadle._caller_prefix read treadle.tenants inside a shard's query, on every
-- node (the policies need it for every role but the owner). Returns what it did.
-- Owner only.
-- Raises 22023: shard_count outside 1..1024, or given to a second call that differs
-- from the count the tables have. 55000: the server has no Citus (nothing changes),
-- or this node is not the coordinator, or a node refused that setting.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.distribute(shard_count integer DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_distributed constant regclass[] := ARRAY['treadle.workflow_runs', 'treadle.jobs',
        'treadle.workflow_signals', 'treadle.job_history', 'treadle.key_slots']::regclass[];
    v_reference constant regclass[] := ARRAY['treadle.queues', 'treadle.workflows', 'treadle.cron_schedules',
        'treadle.settings', 'treadle.tenants', 'treadle.history_slots']::regclass[];
    v_table regclass;
    v_kind text;
    v_coordinator boolean;
    v_shards integer;
    v_failed integer;
    v_spread text[] := ARRAY[]::text[];  -- the tables this call distributed
    v_copied text[] := ARRAY[]::text[];  -- and made reference tables
BEGIN
    IF distribute.shard_count NOT BETWEEN 1 AND 1024 THEN
        RAISE EXCEPTION 'treadle: shard_count must be between 1 and 1024, got %', distribute.shard_count
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension AS e WHERE e.extname = 'citus') THEN
        RAISE EXCEPTION 'treadle: distribute needs Citus, and this database has no citus extension'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'On a single server treadle needs nothing more. On a Citus cluster run it on the coordinator, after CREATE EXTENSION citus and treadle (docs/citus.md).';
    END IF;
    -- Citus's functions and catalog are reached through EXECUTE: the function must
    -- install without Citus, and plpgsql_check (make lint, on a server without Citus)
    -- is told to skip what follows (the string is a no-op when it runs)
    PERFORM 'PRAGMA:DISABLE:CHECK';
    EXECUTE 'SELECT pg_catalog.citus_is_coordinator()' INTO v_coordinator;
    IF NOT v_coordinator THEN
        RAISE EXCEPTION 'treadle: distribute runs on the Citus coordinator, and this node is not it'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;

    -- the co-location group's shard count: the first distributed table's, when there is one
    EXECUTE 'SELECT count(*)::integer FROM pg_catalog.pg_dist_shard AS s WHERE s.logicalrelid = $1'
       INTO v_shards USING 'treadle.workflow_runs'::regclass;
    IF v_shards > 0 AND distribute.shard_count IS DISTINCT FROM NULL AND distribute.shard_count <> v_shards THEN
        RAISE EXCEPTION 'treadle: already distributed in % shards, not %', v_shards, distribute.shard_count
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Citus changes a shard count with alter_distributed_table(..., shard_count => n, cascade_to_colocated => true).';
    END IF;

    -- treadle.workflow_runs' trigger (compensation, on its own row) and treadle.tenants'
    -- go to the shards with their tables: Citus calls that unsafe, as a trigger then
    -- runs on the node of the shard (docs/citus.md says why these work there)
    PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
    -- a table already in Citus's metadata is left as it is: a second call, or one that
    -- follows a call that stopped part way, does the rest
    FOREACH v_table IN ARRAY v_distributed LOOP
        EXECUTE 'SELECT p.partmethod::text FROM pg_catalog.pg_dist_partition AS p WHERE p.logicalrelid = $1'
           INTO v_kind USING v_table;
        CONTINUE WHEN v_kind IS NOT NULL;
        IF v_table = 'treadle.workflow_runs'::regclass THEN
            -- the first one makes the co-location group, and fixes its shard count
            EXECUTE 'SELECT pg_catalog.create_distributed_table($1, ''queue'', colocate_with => ''none'',
                                                                shard_count => $2)'
              USING v_table, coalesce(distribute.shard_count,
                                      pg_catalog.current_setting('citus.shard_count')::integer);
        ELSE
            EXECUTE 'SELECT pg_catalog.create_distributed_table($1, ''queue'', colocate_with => ''treadle.workflow_runs'')'
              USING v_table;
        END IF;
        v_spread := v_spread || v_table::text;
    END LOOP;
    FOREACH v_table IN ARRAY v_reference LOOP
        EXECUTE 'SELECT p.partmethod::text FROM pg_catalog.pg_dist_partition AS p WHERE p.logicalrelid = $1'
           INTO v_kind USING v_table;
        CONTINUE WHEN v_kind IS NOT NULL;
        EXECUTE 'SELECT pg_catalog.create_reference_table($1)' USING v_table;
        v_copied := v_copied || v_table::text;
    END LOOP;

    EXECUTE 'SELECT count(*)::integer FROM pg_catalog.pg_dist_shard AS s WHERE s.logicalrelid = $1'
       INTO v_shards USING 'treadle.workflow_runs'::regclass;
    -- The policies call treadle._reader_prefix, whose _caller_prefix reads
    -- treadle.tenants (a reference table, a copy on every node) inside the query
    -- that Citus sends to a shard: a distributed query within a shard's, which Citus
    -- refuses unless that function allows it. It reads only its node's own copy. On
    -- every node, at each call (a node added since gets it from the next call).
    EXECUTE $cmd$SELECT count(*)::integer FROM pg_catalog.run_command_on_all_nodes(
                 'ALTER FUNCTION treadle._caller_prefix() SET citus.allow_nested_distributed_execution = on')
                 WHERE NOT success$cmd$
       INTO v_failed;
    IF v_failed > 0 THEN
        RAISE EXCEPTION 'treadle: % node(s) refused to let treadle._caller_prefix read treadle.tenants in a shard''s query', v_failed
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    PERFORM 'PRAGMA:ENABLE:CHECK';
    IF cardinality(v_spread) + cardinality(v_copied) = 0 THEN
        RETURN format('treadle: already distributed by queue in %s shards; nothing changed', v_shards);
    END IF;
    RETURN concat_ws('; ',
        format('treadle: distributed by queue in %s shards', v_shards),
        'distributed: ' || nullif(array_to_string(v_spread, ', '), ''),
        'reference tables: ' || nullif(array_to_string(v_copied, ', '), ''),
        'treadle.workers and treadle.done_waiters stay on the coordinator');
END;
$$;
COMMENT ON FUNCTION treadle.distribute(integer) IS
    'On a Citus coordinator: distribute jobs, runs, signals and history by queue (co-located), make the small tables reference tables.';

-- Owner only (090_privileges.sql revoked from PUBLIC the functions made before it).
REVOKE ALL ON FUNCTION treadle.distribute(integer) FROM PUBLIC;

--------------------------------------------------------------------------------
-- treadle._distributed() -> boolean
--
-- Whether treadle.jobs is distributed by Citus in this database (treadle.distribute
-- ran). The hot paths that plan differently on Citus (treadle.claim) ask it only
-- where Citus is loaded (the setting citus.version exists), so a single server pays
-- one setting's read. A yes is kept for the session (treadle.distributed); a no is
-- asked again, so a session opened before treadle.distribute sees it once it ran.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._distributed()
RETURNS boolean
LANGUAGE plpgsql
VOLATILE  -- (it keeps its answer in a setting)
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_distributed boolean := false;
BEGIN
    IF current_setting('treadle.distributed', true) = 'on' THEN
        RETURN true;
    END IF;
    IF current_setting('citus.version', true) IS NULL
       OR to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
        RETURN false;
    END IF;
    PERFORM 'PRAGMA:DISABLE:CHECK';  -- Citus's catalog: absent where plpgsql_check runs
    EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition AS p WHERE p.logicalrelid = $1)'
       INTO v_distributed USING 'treadle.jobs'::regclass;
    PERFORM 'PRAGMA:ENABLE:CHECK';
    IF v_distributed THEN
        PERFORM set_config('treadle.distributed', 'on', false);
    END IF;
    RETURN v_distributed;
END;
$$;
COMMENT ON FUNCTION treadle._distributed() IS
    'Whether treadle''s tables are distributed by Citus here (kept for the session once they are).';
REVOKE ALL ON FUNCTION treadle._distributed() FROM PUBLIC;
