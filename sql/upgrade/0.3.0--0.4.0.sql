--------------------------------------------------------------------------------
-- Migration 0.3.0 -> 0.4.0, before the definitions: what CREATE OR REPLACE
-- cannot do. The functions and views that follow come from sql/src, as in a fresh
-- install; sql/upgrade/0.3.0--0.4.0.after.sql finishes after them.
--------------------------------------------------------------------------------

-- The parts each role was given by 0.3.0's grant helpers, read from the ACL of one
-- function of each part (the role's own entry, not what it reaches by membership).
-- The after-script gives each the same parts again: the views are created anew, and
-- a part may hold functions 0.3.0 did not have.
CREATE TEMPORARY TABLE treadle_upgrade_parts ON COMMIT DROP AS
SELECT r.rolname AS role_name, array_agg(p.part ORDER BY p.part) AS parts
  FROM (VALUES ('read',    'treadle.job_counts(bigint)'),
               ('produce', 'treadle.enqueue_many(jsonb)'),
               ('control', 'treadle.cancel(bigint)'),
               ('work',    'treadle.claimed(uuid)'),
               ('queues',  'treadle.pause(text)'),
               ('recover', 'treadle.rescue()'),
               ('prune',   'treadle.prune(interval)')) AS p(part, signature)
  JOIN pg_catalog.pg_proc AS f ON f.oid = p.signature::regprocedure
 CROSS JOIN pg_catalog.aclexplode(f.proacl) AS a
  JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee
 WHERE a.privilege_type = 'EXECUTE'
   AND r.oid <> (SELECT n.nspowner FROM pg_catalog.pg_namespace AS n WHERE n.nspname = 'treadle')
 GROUP BY r.rolname;

-- Views are created again from sql/src.
DROP VIEW treadle.queue_settings, treadle.schedules, treadle.live_workers, treadle.queue_stats,
          treadle.throughput, treadle.recent_failures, treadle.workflow_run_overview,
          treadle.job_details, treadle.workflow_run_steps;

-- Row-level security: 0.4.0's policies (088_policies.sql) read the caller's prefix
-- through treadle._caller_prefix and cover the workflow definitions, the worker
-- registry and the tenants table too; 0.3.0's are dropped first.
DROP POLICY jobs_tenant_read ON treadle.jobs;
DROP POLICY job_history_tenant_read ON treadle.job_history;
DROP POLICY workflow_runs_tenant_read ON treadle.workflow_runs;
DROP POLICY cron_schedules_tenant_read ON treadle.cron_schedules;
DROP POLICY queues_tenant_read ON treadle.queues;
ALTER TABLE treadle.workflows ENABLE ROW LEVEL SECURITY;
ALTER TABLE treadle.workers ENABLE ROW LEVEL SECURITY;
ALTER TABLE treadle.tenants ENABLE ROW LEVEL SECURITY;

-- Tenants are kept by role OID, not name: a rename keeps the rule. 0.3.0 stored the
-- role as regrole's text, which reads back as the same role; a row whose role is
-- gone no longer applies to anyone and goes.
-- 0.3.0's _caller_prefix (a SQL-standard body) depends on the column: it is made
-- again from sql/src.
DROP FUNCTION treadle._caller_prefix();
DELETE FROM treadle.tenants AS t WHERE pg_catalog.to_regrole(t.role_name::text) IS NULL;
ALTER TABLE treadle.tenants RENAME COLUMN role_name TO tenant_role;
ALTER TABLE treadle.tenants ALTER COLUMN tenant_role TYPE regrole USING tenant_role::text::regrole;
-- PostgreSQL 18 names NOT NULL constraints after their column, and a rename keeps the
-- old name: give it the name a fresh install has.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_constraint
                WHERE conrelid = 'treadle.tenants'::pg_catalog.regclass AND conname = 'tenants_role_name_not_null') THEN
        ALTER TABLE treadle.tenants RENAME CONSTRAINT tenants_role_name_not_null TO tenants_tenant_role_not_null;
    END IF;
END
$$;

-- What roles without the admin part may do to queues (treadle.configure(max_queues,
-- retention_floor)).
ALTER TABLE treadle.settings
    ADD COLUMN max_queues integer NOT NULL DEFAULT 1000,
    ADD COLUMN retention_floor interval NOT NULL DEFAULT interval '1 day',
    ADD CONSTRAINT settings_max_queues_check CHECK (max_queues BETWEEN 1 AND 1000000),
    ADD CONSTRAINT settings_retention_floor_check
        CHECK (retention_floor BETWEEN interval '0' AND interval '100 years');
-- Workflows as a graph: each step's dependencies (null keeps a linear list, as
-- every 0.3.0 definition and run is). define_workflow and start_workflow take
-- them as a new argument, so their 0.3.0 signatures go.
-- Sleep steps: how long each waits, and on a run the sleeps under way.
ALTER TABLE treadle.workflows
    ADD COLUMN after jsonb,
    ADD COLUMN sleeps jsonb,
    ADD CONSTRAINT workflows_after_check CHECK (jsonb_typeof(after) = 'object'),
    ADD CONSTRAINT workflows_sleeps_check CHECK (sleeps IS NULL OR (jsonb_typeof(sleeps) = 'object' AND after IS NOT NULL));
ALTER TABLE treadle.workflow_runs
    ADD COLUMN after jsonb,
    ADD COLUMN sleeps jsonb,
    ADD COLUMN wakes jsonb,
    ADD COLUMN wake_at timestamptz,
    ADD CONSTRAINT workflow_runs_after_check CHECK (jsonb_typeof(after) = 'object'),
    ADD CONSTRAINT workflow_runs_sleeps_check CHECK (sleeps IS NULL OR (jsonb_typeof(sleeps) = 'object' AND after IS NOT NULL));
-- Map steps: the step whose result each maps over, and on a run the element jobs
-- of each map step under way that have not completed.
ALTER TABLE treadle.workflows
    ADD COLUMN maps jsonb,
    ADD CONSTRAINT workflows_maps_check CHECK (maps IS NULL OR (jsonb_typeof(maps) = 'object' AND after IS NOT NULL));
ALTER TABLE treadle.workflow_runs
    ADD COLUMN maps jsonb,
    ADD COLUMN map_left jsonb,
    ADD CONSTRAINT workflow_runs_maps_check CHECK (maps IS NULL OR (jsonb_typeof(maps) = 'object' AND after IS NOT NULL));
CREATE INDEX workflow_runs_wake_at_idx ON treadle.workflow_runs (wake_at)
    WHERE wake_at IS NOT NULL AND state = 'running';
DROP FUNCTION treadle.define_workflow(text, text[]);
DROP FUNCTION treadle.start_workflow(text, jsonb, text[], text, integer, integer, text);
-- Claim and rescue cursors are composite types now (sql/src/010_tables.sql has the same definitions).
-- A claim cursor (treadle.claim, sql/src/040_claim.sql), kept as this type's text in
-- a session setting. Times are microseconds since 1970 (treadle._us); a lane is the
-- same subscript of the six lane_ arrays.
CREATE TYPE treadle._claim_cursor AS (
    version       integer,   -- of this layout: 1
    taken_at      bigint,    -- when the claim that wrote it ran (a clock that went back voids it)
    swept_at      bigint,    -- when its lanes were last read from the front of the claim index
    plain         boolean,   -- too many lanes: claims are plain until the next sweep (no more fields)
    xmax          bigint,    -- the snapshot the claim read with: it did not see the ids >= xmax,
    xip           bigint[],  -- nor these (its own among them)
    lane_queue    bigint[],  -- the lane's queue: its number among the claim's queues, sorted
    lane_name     bigint[],  -- its name's number among the claim's names, sorted (0: without names)
    lane_priority bigint[],  -- its priority
    lane_run_at   bigint[],  -- the key (run_at, id) below which the lane has nothing left to take
    lane_id       bigint[]
);
COMMENT ON TYPE treadle._claim_cursor IS
    'A session''s claim cursor: its snapshot and, per (queue, name, priority) lane, where claims resume.';

-- A rescue cursor (treadle.rescue, sql/src/050_finish.sql), kept as this type's text
-- in the session setting treadle.rescue_cursor, as a claim cursor is. Times are
-- microseconds since 1970 (treadle._us).
CREATE TYPE treadle._rescue_cursor AS (
    version     integer,  -- of this layout: 1
    taken_at    bigint,   -- the previous rescue's now (a clock that went back voids the cursor)
    floor       bigint,   -- rescues read the leases that ran out at or above it (null: all)
    next_floor  bigint,   -- where the floor moves once the transactions below have ended
    newest_xid  bigint,   -- the newest transaction id running when next_floor was set (null: none)
    swept_at    bigint    -- when a rescue last read from the floor
);
COMMENT ON TYPE treadle._rescue_cursor IS
    'A session''s rescue cursor: the floor of the expired leases its rescues read, and where it moves next.';

-- Workflow signals: wait steps (each waits for a named signal, with an optional
-- timeout), on a run the waits under way and the earliest timeout, and the signals
-- kept for a run that has not reached its wait yet.
ALTER TABLE treadle.workflows
    ADD COLUMN waits jsonb,
    ADD CONSTRAINT workflows_waits_check CHECK (waits IS NULL OR (jsonb_typeof(waits) = 'object' AND after IS NOT NULL));
ALTER TABLE treadle.workflow_runs
    ADD COLUMN waits jsonb,
    ADD COLUMN waiting jsonb,
    ADD COLUMN wait_until timestamptz,
    ADD CONSTRAINT workflow_runs_waits_check CHECK (waits IS NULL OR (jsonb_typeof(waits) = 'object' AND after IS NOT NULL));
CREATE INDEX workflow_runs_wait_until_idx ON treadle.workflow_runs (wait_until)
    WHERE wait_until IS NOT NULL AND state = 'running';
CREATE TABLE treadle.workflow_signals (
    id      bigint      GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    run_id  bigint      NOT NULL REFERENCES treadle.workflow_runs (id) ON DELETE CASCADE,
    queue   text        NOT NULL,
    name    text        NOT NULL,
    payload jsonb       NOT NULL,
    sent_at timestamptz NOT NULL
);
CREATE INDEX workflow_signals_run_id_idx ON treadle.workflow_signals (run_id, name, id);
ALTER TABLE treadle.workflow_signals ENABLE ROW LEVEL SECURITY;
SELECT pg_catalog.pg_extension_config_dump('treadle.workflow_signals', '');
SELECT pg_catalog.pg_extension_config_dump('treadle.workflow_signals_id_seq', '');

-- Workflow versions and rolling deploys: a definition counts its versions and a
-- run records the one it started with (and the wake times of its steps'
-- ctx.sleep calls); a step job is named
-- 'workflow:<workflow name>/<step>' (workers claim the steps they can run), so the
-- step jobs not finished yet take that name (a 0.3.0 worker's running step still
-- completes with its lease token; finished ones keep the name they ran under).
ALTER TABLE treadle.workflows
    ADD COLUMN version bigint NOT NULL DEFAULT 1,
    ADD CONSTRAINT workflows_version_check CHECK (version >= 1);
ALTER TABLE treadle.workflow_runs
    ADD COLUMN version bigint,
    ADD COLUMN step_sleeps jsonb;
UPDATE treadle.jobs AS j
   SET name = 'workflow:' || r.name || '/' || j.step
  FROM treadle.workflow_runs AS r
 WHERE j.workflow_run_id = r.id
   AND j.state = ANY (ARRAY['available', 'retryable', 'running'])
   AND j.name = 'workflow:' || r.name;

-- Idempotency keys by scope and period, and merging into a waiting holder
-- (sql/src/032_enqueue_keys.sql): two columns at the end of treadle.jobs (and of its
-- history), the key's unique index made again over them, and enqueue with three new
-- parameters (the after-script grants it again with the rest of its part).
ALTER TABLE treadle.jobs
    ADD COLUMN key_scope text,
    ADD COLUMN key_period timestamptz,
    ADD CONSTRAINT jobs_key_scope_check CHECK (key_scope = ANY (ARRAY['waiting', 'active', 'retained', 'released']));
-- the history is LIKE treadle.jobs: its partitions take the same columns
ALTER TABLE treadle.job_history
    ADD COLUMN key_scope text,
    ADD COLUMN key_period timestamptz;
DROP INDEX treadle.jobs_idempotency_key_idx;
CREATE UNIQUE INDEX jobs_idempotency_key_idx
    ON treadle.jobs (queue, idempotency_key, key_period) NULLS NOT DISTINCT
    WHERE idempotency_key IS NOT NULL
      AND (key_scope IS NULL OR key_scope = 'retained'
           OR (key_scope = 'active' AND finished_at IS NULL)
           OR (key_scope = 'waiting' AND started_at IS NULL AND finished_at IS NULL));
DROP FUNCTION treadle.enqueue(text, jsonb, text, integer, timestamptz, integer, text, interval, interval, interval[]);
-- Child workflows: a step that starts a run of another workflow, and on a run the
-- run and step that started it (sql/src/076_workflow_children.sql).
ALTER TABLE treadle.workflows
    ADD COLUMN children jsonb,
    ADD CONSTRAINT workflows_children_check
        CHECK (children IS NULL OR (jsonb_typeof(children) = 'object' AND after IS NOT NULL));
ALTER TABLE treadle.workflow_runs
    ADD COLUMN children jsonb,
    ADD COLUMN parent_run_id bigint,
    ADD COLUMN parent_step text,
    ADD CONSTRAINT workflow_runs_children_check
        CHECK (children IS NULL OR (jsonb_typeof(children) = 'object' AND after IS NOT NULL)),
    ADD CONSTRAINT workflow_runs_parent_check CHECK ((parent_run_id IS NULL) = (parent_step IS NULL));
CREATE UNIQUE INDEX workflow_runs_parent_idx ON treadle.workflow_runs (parent_run_id, parent_step)
    WHERE parent_run_id IS NOT NULL;

-- Compensation: a step's compensating step, and on a run the states compensating
-- (failed, its compensations under way) and compensated
-- (sql/src/078_workflow_compensation.sql).
ALTER TABLE treadle.workflows
    ADD COLUMN compensations jsonb,
    ADD CONSTRAINT workflows_compensations_check CHECK (jsonb_typeof(compensations) = 'object');
ALTER TABLE treadle.workflow_runs
    ADD COLUMN compensations jsonb,
    DROP CONSTRAINT workflow_runs_state_check,
    DROP CONSTRAINT workflow_runs_finished_check,
    ADD CONSTRAINT workflow_runs_state_check
        CHECK (state = ANY (ARRAY['running', 'completed', 'failed', 'cancelled', 'compensating', 'compensated'])),
    ADD CONSTRAINT workflow_runs_finished_check
        CHECK ((state = ANY (ARRAY['running', 'compensating'])) = (finished_at IS NULL)),
    ADD CONSTRAINT workflow_runs_compensations_check CHECK (jsonb_typeof(compensations) = 'object');

-- Finishes notify only when someone waits (sql/src/048_done_waiters.sql): the
-- sessions that wait, as in 010_tables.sql.
CREATE UNLOGGED TABLE treadle.done_waiters (
    pid           integer NOT NULL,
    queue         text,
    queue_prefix  text NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
CREATE INDEX done_waiters_queue_idx ON treadle.done_waiters (queue);


-- Metadata on jobs (sql/src/030_enqueue.sql): a column at the end of treadle.jobs and
-- of its history; enqueue's new last parameter replaces the signature above (it is
-- new in 0.4.0, so nothing of 0.3.0's is dropped for it).
ALTER TABLE treadle.jobs
    ADD COLUMN meta jsonb,
    ADD CONSTRAINT jobs_meta_check CHECK (jsonb_typeof(meta) = 'object');
ALTER TABLE treadle.job_history
    ADD COLUMN meta jsonb;

-- Per-step options (sql/src/079_workflow_step_options.sql): a step's own queue, priority,
-- max_attempts, timeout and backoff, on definitions and runs (define_workflow and
-- start_workflow take them as a new last parameter; both are new in 0.4.0).
ALTER TABLE treadle.workflows
    ADD COLUMN step_options jsonb,
    ADD CONSTRAINT workflows_step_options_check CHECK (jsonb_typeof(step_options) = 'object');
ALTER TABLE treadle.workflow_runs
    ADD COLUMN step_options jsonb,
    ADD CONSTRAINT workflow_runs_step_options_check CHECK (jsonb_typeof(step_options) = 'object');

-- run operations: a forked run names the run and step it was forked from
-- (sql/src/089_workflow_ops.sql: treadle.retry_run, treadle.fork_run).
ALTER TABLE treadle.workflow_runs
    ADD COLUMN forked_from bigint,
    ADD COLUMN forked_step text,
    ADD CONSTRAINT workflow_runs_forked_check CHECK ((forked_from IS NULL) = (forked_step IS NULL));

-- Citus-ready keys and policies (sql/src/010_tables.sql, 088_policies.sql): every
-- primary key is (id, queue), id first; a run's signals reference it by (id, queue);
-- a run's steps have no foreign key (a step may run in another queue), so prune and
-- apply_retention delete them with their run; a child run's unique index names its
-- queue.
ALTER TABLE treadle.jobs DROP CONSTRAINT jobs_workflow_run_id_fkey;
ALTER TABLE treadle.workflow_signals DROP CONSTRAINT workflow_signals_run_id_fkey;
ALTER TABLE treadle.workflow_runs
    DROP CONSTRAINT workflow_runs_pkey,
    ADD CONSTRAINT workflow_runs_pkey PRIMARY KEY (id, queue);
ALTER TABLE treadle.jobs
    DROP CONSTRAINT jobs_pkey,
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (id, queue);
ALTER TABLE treadle.workflow_signals
    DROP CONSTRAINT workflow_signals_pkey,
    ADD CONSTRAINT workflow_signals_pkey PRIMARY KEY (id, queue),
    ADD CONSTRAINT workflow_signals_run_id_fkey FOREIGN KEY (run_id, queue)
        REFERENCES treadle.workflow_runs (id, queue) ON DELETE CASCADE;
DROP INDEX treadle.workflow_runs_parent_idx;
CREATE UNIQUE INDEX workflow_runs_parent_idx ON treadle.workflow_runs (parent_run_id, parent_step, queue)
    WHERE parent_run_id IS NOT NULL;
-- Finishes and controls take the job's queue as a new last parameter (a call by id
-- alone reads the queue first); _left_by too.
DROP FUNCTION treadle.complete(bigint, uuid, jsonb);
DROP FUNCTION treadle.fail(bigint, uuid, text, interval, boolean);
DROP FUNCTION treadle.release(bigint, uuid);
DROP FUNCTION treadle.snooze(bigint, uuid, interval);
DROP FUNCTION treadle.cancel(bigint);
DROP FUNCTION treadle.retry(bigint);
DROP FUNCTION treadle.explain(bigint);
DROP FUNCTION treadle._left_by(bigint, uuid, text[]);
DROP FUNCTION treadle.heartbeat(bigint, uuid, interval);
DROP FUNCTION treadle.progress(bigint, uuid, double precision, text);

-- concurrency keys
-- Concurrency keys and ordered lanes (sql/src/034_key_lanes.sql): two columns at the
-- end of treadle.jobs (and of its history), the state 'blocked', two queue settings
-- at the end of treadle.queues (set_queue takes them as new last parameters, so
-- 0.3.0's signature goes), and the slots held per key, as in 010_tables.sql.
ALTER TABLE treadle.jobs
    ADD COLUMN concurrency_key text,
    ADD COLUMN key_slot boolean,
    DROP CONSTRAINT jobs_state_check,
    ADD CONSTRAINT jobs_state_check CHECK (state = ANY (ARRAY[
        'available', 'running', 'retryable', 'completed', 'discarded', 'cancelled', 'blocked'])),
    ADD CONSTRAINT jobs_key_slot_check CHECK (
        (concurrency_key IS NULL) = (key_slot IS NULL)
        AND (state <> 'blocked' OR concurrency_key IS NOT NULL));
ALTER TABLE treadle.job_history
    ADD COLUMN concurrency_key text,
    ADD COLUMN key_slot boolean;
ALTER TABLE treadle.queues
    ADD COLUMN key_limit integer,
    ADD COLUMN key_ordered boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT queues_key_limit_check CHECK (key_limit BETWEEN 1 AND 100000 AND NOT (key_ordered AND key_limit > 1));
DROP FUNCTION treadle.set_queue(text, integer, integer, interval, integer, interval, interval);
CREATE TABLE treadle.key_slots (
    queue      text        NOT NULL,
    key        text        NOT NULL,
    held       integer     NOT NULL,  -- jobs of the key holding a slot (0 only inside a transaction)
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (queue, key),
    CONSTRAINT key_slots_held_check CHECK (held >= 0)
);
SELECT pg_catalog.pg_extension_config_dump('treadle.key_slots', '');
CREATE INDEX jobs_key_idx ON treadle.jobs (queue, concurrency_key, id) WHERE state = 'blocked' OR key_slot;

-- step keys and meta: a workflow run's metadata (start_workflow's new last
-- parameter meta; 0.3.0's signature is dropped above), at the end of
-- treadle.workflow_runs, as in 010_tables.sql.
ALTER TABLE treadle.workflow_runs
    ADD COLUMN meta jsonb,
    ADD CONSTRAINT workflow_runs_meta_check CHECK (jsonb_typeof(meta) = 'object');

-- Citus, the worker's loop: the batch finishes and heartbeats take each job's queue
-- (job_queues) as a new last parameter.
DROP FUNCTION treadle.complete_and_claim(bigint[], uuid[], jsonb[], text, text[], text[], integer, interval, uuid);
DROP FUNCTION treadle.complete_many(bigint[], uuid[], jsonb[]);
DROP FUNCTION treadle.heartbeat_many(bigint[], uuid[], interval);

-- run tree bounds: each child run names the root of its tree (root_run_id, root_queue), and a
-- root counts the runs of its tree (tree_runs, null: 1; treadle._start_child keeps it
-- to 10,000), at the end of treadle.workflow_runs, as in 010_tables.sql. 0.3.0 had
-- no child runs, so every run in flight is a root of one run: all three null. (No
-- default: a default would have to be checked against the functions that take the
-- table's row type.)
ALTER TABLE treadle.workflow_runs
    ADD COLUMN root_run_id bigint,
    ADD COLUMN tree_runs integer,
    ADD COLUMN root_queue text,
    ADD CONSTRAINT workflow_runs_tree_runs_check CHECK (tree_runs >= 1),
    ADD CONSTRAINT workflow_runs_root_check CHECK ((root_run_id IS NULL) = (root_queue IS NULL));

-- concurrency keys, due first: a key's blocked jobs by run_at (034_key_lanes.sql), as in
-- 010_tables.sql.
CREATE INDEX jobs_key_due_idx ON treadle.jobs (queue, concurrency_key, run_at, id)
    WHERE state = 'blocked' OR (state = 'available' AND key_slot);

-- Workflow routing (issue 23): a step job put in another queue than its run's by a
-- step option names its run's queue (run_queue, at the end of treadle.jobs and of
-- its history, as in 010_tables.sql), so that every statement that moves a run
-- names the run's queue too. 0.3.0 put every step job in its run's queue: no row
-- needs it.
ALTER TABLE treadle.jobs
    ADD COLUMN run_queue text,
    ADD CONSTRAINT jobs_run_queue_check CHECK (run_queue IS NULL OR (workflow_run_id IS NOT NULL AND run_queue <> queue));
ALTER TABLE treadle.job_history
    ADD COLUMN run_queue text;

-- A child run that ends moves its parent on Citus (issue 24): a child run names its
-- parent's queue (parent_queue, its key with parent_run_id), at the end of
-- treadle.workflow_runs, as in 010_tables.sql, so that the statements on the parent
-- name its queue. 0.3.0 had no child runs: no row needs it.
ALTER TABLE treadle.workflow_runs
    ADD COLUMN parent_queue text,
    ADD CONSTRAINT workflow_runs_parent_queue_check CHECK ((parent_run_id IS NULL) = (parent_queue IS NULL));

-- The CHECK constraints of treadle.workflow_runs and treadle.jobs (issues 23 and
-- 25): PostgreSQL prepares each again at every statement that writes the table, and
-- a run's row is written at every step, a job's at every enqueue, claim and finish.
-- Kept on runs: the state with finished_at (one constraint now, in place of
-- workflow_runs_state_check and workflow_runs_finished_check) and the columns that
-- go in pairs; on jobs: the state machine and a step's columns. The others hold by
-- construction (010_tables.sql says where each is enforced), as in 010_tables.sql.
ALTER TABLE treadle.workflow_runs
    DROP CONSTRAINT workflow_runs_state_check,
    DROP CONSTRAINT workflow_runs_finished_check,
    DROP CONSTRAINT workflow_runs_steps_check,
    DROP CONSTRAINT workflow_runs_after_check,
    DROP CONSTRAINT workflow_runs_sleeps_check,
    DROP CONSTRAINT workflow_runs_maps_check,
    DROP CONSTRAINT workflow_runs_waits_check,
    DROP CONSTRAINT workflow_runs_children_check,
    DROP CONSTRAINT workflow_runs_compensations_check,
    DROP CONSTRAINT workflow_runs_step_options_check,
    DROP CONSTRAINT workflow_runs_meta_check,
    DROP CONSTRAINT workflow_runs_tree_runs_check,
    ADD CONSTRAINT workflow_runs_state_check CHECK (state = ANY (CASE WHEN finished_at IS NULL
        THEN '{running,compensating}'::text[] ELSE '{completed,failed,cancelled,compensated}'::text[] END));
ALTER TABLE treadle.jobs
    DROP CONSTRAINT jobs_queue_check,
    DROP CONSTRAINT jobs_name_check,
    DROP CONSTRAINT jobs_attempt_check,
    DROP CONSTRAINT jobs_max_attempts_check,
    DROP CONSTRAINT jobs_every_check,
    DROP CONSTRAINT jobs_progress_check,
    DROP CONSTRAINT jobs_timeout_check,
    DROP CONSTRAINT jobs_backoff_check,
    DROP CONSTRAINT jobs_key_scope_check,
    DROP CONSTRAINT jobs_meta_check;

-- The fan-out limit of a map step (issue 23): the most elements a map step fans
-- out over, which the owner sets with treadle.configure(max_map_elements), at the
-- end of treadle.settings, as in 010_tables.sql. configure's 0.3.0 signature
-- (max_payload_bytes alone) goes: configure(max_payload_bytes, max_map_elements)
-- takes either or both.
ALTER TABLE treadle.settings
    ADD COLUMN max_map_elements integer NOT NULL DEFAULT 100000,
    ADD CONSTRAINT settings_max_map_elements_check CHECK (max_map_elements BETWEEN 1 AND 1000000);
DROP FUNCTION treadle.configure(integer);

-- Re-checks of workflow runs (issue 23, lock waits of parallel branches;
-- sql/src/073_workflow_rechecks.sql), as in 010_tables.sql: a new table.
CREATE TABLE treadle.run_rechecks (
    queue     text        NOT NULL,
    job_id    bigint      NOT NULL,
    run_queue text        NOT NULL,
    run_id    bigint      NOT NULL,
    added_at  timestamptz NOT NULL,
    PRIMARY KEY (queue, job_id)
);
SELECT pg_catalog.pg_extension_config_dump('treadle.run_rechecks', '');

-- What restricts an enqueue, in one table (issue 25, goal 6; sql/src/066_enqueue_guards.sql),
-- as in 010_tables.sql, filled from the queues and tenants there are; its triggers
-- keep it from here on.
CREATE TABLE treadle.enqueue_guards (
    queue       text    NOT NULL,
    tenant_role regrole,
    CONSTRAINT enqueue_guards_kind_check CHECK ((queue = '') = (tenant_role IS NOT NULL))
);
CREATE UNIQUE INDEX enqueue_guards_key ON treadle.enqueue_guards (queue, tenant_role) NULLS NOT DISTINCT;
INSERT INTO treadle.enqueue_guards (queue)
SELECT s.queue FROM treadle.queues AS s WHERE s.max_depth IS NOT NULL;
INSERT INTO treadle.enqueue_guards (queue, tenant_role)
SELECT '', t.tenant_role FROM treadle.tenants AS t;

-- treadle.enqueue_guards as in 010_tables.sql: a replica identity (a publication FOR ALL
-- TABLES publishes its deletes), and dumped with treadle.queues and treadle.tenants.
ALTER TABLE treadle.enqueue_guards REPLICA IDENTITY FULL;
SELECT pg_catalog.pg_extension_config_dump('treadle.enqueue_guards', '');
