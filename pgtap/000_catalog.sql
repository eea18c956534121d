-- pgtap/000_catalog.sql: the catalog lint. The style rules of the SQL layer as
-- failing tests: every function pins search_path, the functions that write run
-- as the owner and are exactly the public write path, PUBLIC executes only the
-- read-only functions, user data is dumped,
-- every function and view is commented, nothing in the schema is a stray.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(15);

SELECT has_schema('treadle');
SELECT columns_are('treadle', 'jobs', ARRAY[
    'id', 'queue', 'name', 'args', 'state', 'priority', 'run_at', 'attempt', 'max_attempts',
    'lease_until', 'lease_token', 'worker_id', 'idempotency_key', 'result', 'last_error',
    'created_at', 'finished_at', 'workflow_run_id', 'step',
    'every', 'next_id', 'cancel_requested', 'started_at', 'failed_at', 'errors', 'progress',
    'progress_message', 'schedule', 'ready_txid', 'timeout', 'backoff', 'key_scope', 'key_period', 'meta',
    'concurrency_key', 'key_slot', 'run_queue'], 'treadle.jobs has the contract columns, then its own');
SELECT results_eq(
    $$ SELECT attname::text COLLATE "default" FROM pg_attribute
        WHERE attrelid = 'treadle.jobs'::regclass AND attnum > 0 AND NOT attisdropped
        ORDER BY attnum LIMIT 19 $$,
    ARRAY['id', 'queue', 'name', 'args', 'state', 'priority', 'run_at', 'attempt', 'max_attempts',
          'lease_until', 'lease_token', 'worker_id', 'idempotency_key', 'result', 'last_error',
          'created_at', 'finished_at', 'workflow_run_id', 'step'],
    'the contract columns come first, in the contract''s order');

CREATE TEMP VIEW treadle_functions AS
SELECT p.oid, p.oid::regprocedure::text AS signature, p.proname, p.proconfig, p.prosecdef, p.provolatile
  FROM pg_catalog.pg_proc AS p
  JOIN pg_catalog.pg_depend AS d ON d.classid = 'pg_catalog.pg_proc'::regclass
                                 AND d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_catalog.pg_extension AS e ON e.oid = d.refobjid AND e.extname = 'treadle';

SELECT isnt_empty('SELECT * FROM treadle_functions', 'the extension owns functions');
-- SQL-standard bodies (BEGIN ATOMIC) are bound when created: no search_path reaches them
SELECT is_empty(
    $$ SELECT signature FROM treadle_functions
        WHERE NOT coalesce(proconfig @> ARRAY['search_path=pg_catalog, pg_temp'], false)
          AND NOT EXISTS (SELECT 1 FROM pg_proc AS p WHERE p.oid = treadle_functions.oid AND p.prosqlbody IS NOT NULL) $$,
    'every function pins search_path = pg_catalog, pg_temp (or has a SQL-standard body)');
SELECT set_eq(
    $$ SELECT signature FROM treadle_functions WHERE prosecdef $$,
    ARRAY['treadle.enqueue(text,jsonb,text,integer,timestamp with time zone,integer,text,interval,interval,interval[],text,text,interval,jsonb,text)',
          'treadle.enqueue_many(jsonb)',
          'treadle.enqueue_arrays(text[],jsonb[],text[],integer[],timestamp with time zone[],integer[],text[],interval[],interval[],jsonb[],text[])',
          'treadle.claim(text,text[],text[],integer,interval,uuid)', 'treadle.claimed(uuid)',
          'treadle.heartbeat(bigint,uuid,interval,text)', 'treadle.progress(bigint,uuid,double precision,text,text)',
          'treadle.complete(bigint,uuid,jsonb,text)', 'treadle.complete_many(bigint[],uuid[],jsonb[],text[])',
          'treadle.complete_and_claim(bigint[],uuid[],jsonb[],text,text[],text[],integer,interval,uuid,text[])',
          'treadle.heartbeat_many(bigint[],uuid[],interval,text[])',
          'treadle.fail(bigint,uuid,text,interval,boolean,text)', 'treadle.release(bigint,uuid,text)',
          'treadle.snooze(bigint,uuid,interval,text)', 'treadle.rescue()',
          'treadle.step_sleep(bigint,uuid,integer,interval,timestamp with time zone)',
          'treadle.apply_retention(integer)', 'treadle.archive(integer)', 'treadle.cancel(bigint,text)', 'treadle.retry(bigint,text)', 'treadle.prune(interval)',
          'treadle.define_workflow(text,text[],jsonb,jsonb,jsonb,jsonb,jsonb,jsonb,jsonb)',
          'treadle.start_workflow(text,jsonb,text[],text,integer,integer,text,jsonb,jsonb,jsonb,jsonb,jsonb,jsonb,jsonb,jsonb)',
          'treadle.signal(bigint,text,jsonb)', 'treadle.signal_by_key(text,text,text,jsonb)',
          'treadle.cancel_workflow(bigint)', 'treadle.retry_run(bigint)', 'treadle.fork_run(bigint,text,jsonb)', 'treadle.compensate_run(bigint)',
          'treadle.cancel_run(bigint,boolean)',
          'treadle.schedule(text,text,text,jsonb,text,text,integer,integer,boolean)', 'treadle.unschedule(text)',
          'treadle.worker_seen(text,text,integer,text[],integer,integer,text[])', 'treadle.worker_stopped(text)',
          'treadle.estimated_jobs(text,text)',
          'treadle.cron_next(text,text,timestamp with time zone)',
          'treadle.set_queue(text,integer,integer,interval,integer,interval,interval,integer,boolean)',
          'treadle.pause(text)', 'treadle.resume(text)', 'treadle.explain(bigint,text)', 'treadle.explain_run(bigint)',
          'treadle.listen_done(text)', 'treadle.unlisten_done()',
          'treadle._caller_prefix()'],
    'exactly the public functions that write, estimated_jobs (which reads statistics), explain and explain_run (which read worker and queue state), cron_next (for the private parser), listen_done and unlisten_done (which register a waiting session), and _caller_prefix (which the row-level security policies call, through _reader_prefix, to read treadle.tenants), run as the owner (SECURITY DEFINER)');
SELECT set_eq(
    $$ SELECT signature FROM treadle_functions WHERE has_function_privilege('public', oid, 'EXECUTE') $$,
    ARRAY['treadle.version()', 'treadle.now()', 'treadle._moved_clock(text)', 'treadle.workflow_results(bigint)',
          'treadle.workflow_step_results(bigint,text)', 'treadle._step_results(text[],jsonb,jsonb,text)',
          'treadle.cron_next(text,text,timestamp with time zone)',
          'treadle._caller()', 'treadle._caller_role()', 'treadle._caller_prefix()', 'treadle._reader_prefix()',
          'treadle._all_start_with(text[],text)'],
    'PUBLIC executes only the read-only functions that run with the caller''s rights, cron_next and _step_results (which read no table), and the policies'' helpers (each tells a role of itself, or reads no table)');
SELECT set_eq(
    $$ SELECT unnest(extconfig)::regclass::text FROM pg_extension WHERE extname = 'treadle' $$,
    $$ SELECT unnest(ARRAY['treadle.jobs', 'treadle.jobs_id_seq', 'treadle.workflow_runs',
                           'treadle.workflow_runs_id_seq', 'treadle.workflows', 'treadle.settings', 'treadle.tenants',
                           'treadle.cron_schedules', 'treadle.queues', 'treadle.history_slots', 'treadle.key_slots',
                           'treadle.workflow_signals', 'treadle.workflow_signals_id_seq', 'treadle.run_rechecks',
                           'treadle.enqueue_guards'])
       UNION ALL
       SELECT format('treadle.job_history_%s', lpad(n::text, 2, '0')) FROM generate_series(0, 40) AS n $$,
    'tables with user data and their sequences are kept by pg_dump: the history''s 41 partitions too');
SELECT is_empty(
    $$ SELECT c.relname FROM pg_class AS c
        WHERE c.relnamespace = 'treadle'::regnamespace AND c.relkind IN ('r', 'v')
          AND has_table_privilege('public', c.oid, 'INSERT, UPDATE, DELETE') $$,
    'PUBLIC cannot write treadle''s tables');

SELECT is_empty(
    $$ SELECT signature FROM treadle_functions WHERE obj_description(oid, 'pg_proc') IS NULL $$,
    'every function has a COMMENT');
SELECT is_empty(
    $$ SELECT c.relname FROM pg_class AS c
        WHERE c.relnamespace = 'treadle'::regnamespace AND c.relkind = 'v'
          AND obj_description(c.oid, 'pg_class') IS NULL $$,
    'every view has a COMMENT');
SELECT is_empty(
    $$ SELECT p.oid::regprocedure::text FROM pg_proc AS p
        WHERE p.pronamespace = 'treadle'::regnamespace
          AND p.oid NOT IN (SELECT oid FROM treadle_functions)
       UNION ALL
       SELECT c.relname::text FROM pg_class AS c
        WHERE c.relnamespace = 'treadle'::regnamespace AND c.relkind IN ('r', 'v', 'S')
          AND NOT EXISTS (SELECT 1 FROM pg_depend AS d
                           WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype IN ('e', 'a', 'i')) $$,
    'every function, table, view and sequence in schema treadle belongs to the extension');
SELECT results_eq(
    $$ SELECT extrelocatable, extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'treadle' $$,
    $$ VALUES (false, 'treadle'::text) $$,
    'the extension is not relocatable and lives in schema treadle');
SELECT is_empty(
    $$ SELECT state FROM unnest(ARRAY['available', 'retryable']) AS s(state)
        WHERE NOT EXISTS (SELECT 1 FROM pg_indexes
                           WHERE schemaname = 'treadle' AND indexname = 'jobs_claim_idx'
                             AND indexdef LIKE '%WHERE%' || s.state || '%') $$,
    'the claim index is partial, on the claimable states');
SELECT is_empty(
    $$ SELECT i.indexname FROM pg_indexes AS i
        WHERE i.schemaname = 'treadle' AND i.indexname = 'jobs_claim_idx'
          AND (i.indexdef LIKE '%completed%' OR i.indexdef LIKE '%discarded%' OR i.indexdef LIKE '%cancelled%') $$,
    'finished states are not in the claim index');

SELECT * FROM finish();
ROLLBACK;
