-- pgtap/091_trust.sql: the trust boundary. From the catalog, who may do what with
-- every object (a new function or table that forgets its grants fails here); then
-- each attack on the functions' monopoly of writes, as the real role, refused with
-- nothing changed; the clock no role but the owner can move; tenants.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(70);

\ir helpers.psql

CREATE ROLE trust_reader;    SELECT treadle.grant_reader('trust_reader');
CREATE ROLE trust_producer;  SELECT treadle.grant_producer('trust_producer');
CREATE ROLE trust_worker;    SELECT treadle.grant_worker('trust_worker');
CREATE ROLE trust_admin;     SELECT treadle.grant_admin('trust_admin');
CREATE ROLE trust_dash;      SELECT treadle.grant_dashboard('trust_dash');
CREATE ROLE trust_dash_ro;   SELECT treadle.grant_dashboard('trust_dash_ro', read_only => true);
CREATE ROLE trust_nobody;
CREATE TEMP TABLE roles (role name, part text);
INSERT INTO roles VALUES ('trust_reader', 'reader'), ('trust_producer', 'producer'), ('trust_worker', 'worker'),
                         ('trust_admin', 'admin'), ('trust_dash', 'dashboard'), ('trust_dash_ro', 'dashboard_ro'),
                         ('trust_nobody', 'nobody');
GRANT SELECT ON roles TO PUBLIC;

--------------------------------------------------------------------------------
-- The matrix: every function of the extension, and the parts that may execute it.
--------------------------------------------------------------------------------
CREATE TEMP TABLE may_execute (signature text, parts text[]);
INSERT INTO may_execute VALUES
    ('treadle.version()',                        '{reader,producer,worker,admin,dashboard,dashboard_ro,nobody}'),
    ('treadle.now()',                            '{reader,producer,worker,admin,dashboard,dashboard_ro,nobody}'),
    -- treadle.now()'s helper, inlined with it into the caller's statement: it reads the caller's own setting
    ('treadle._moved_clock(text)',               '{reader,producer,worker,admin,dashboard,dashboard_ro,nobody}'),
    ('treadle.workflow_results(bigint)',         '{reader,producer,worker,admin,dashboard,dashboard_ro,nobody}'),
    ('treadle.workflow_step_results(bigint,text)', '{reader,producer,worker,admin,dashboard,dashboard_ro,nobody}'),
    ('treadle.cron_next(text,text,timestamp with time zone)', '{reader,producer,worker,admin,dashboard,dashboard_ro,nobody}'),
    -- what a workflow step receives, from a run's columns the caller read: it reads no table
    ('treadle._step_results(text[],jsonb,jsonb,text)', '{reader,producer,worker,admin,dashboard,dashboard_ro,nobody}'),
    -- the helpers the row-level security policies call as the reader: each tells a role of itself only
    ('treadle._caller()',                        '{reader,producer,worker,admin,dashboard,dashboard_ro,nobody}'),
    ('treadle._caller_role()',                   '{reader,producer,worker,admin,dashboard,dashboard_ro,nobody}'),
    ('treadle._caller_prefix()',                 '{reader,producer,worker,admin,dashboard,dashboard_ro,nobody}'),
    ('treadle._reader_prefix()',                 '{reader,producer,worker,admin,dashboard,dashboard_ro,nobody}'),
    ('treadle._all_start_with(text[],text)',     '{reader,producer,worker,admin,dashboard,dashboard_ro,nobody}'),
    ('treadle.job_counts(bigint)',               '{reader,producer,worker,admin,dashboard,dashboard_ro}'),
    ('treadle.estimated_jobs(text,text)',        '{reader,producer,worker,admin,dashboard,dashboard_ro}'),
    ('treadle.explain(bigint,text)',             '{reader,producer,worker,admin,dashboard,dashboard_ro}'),
    ('treadle.explain_run(bigint)',              '{reader,producer,worker,admin,dashboard,dashboard_ro}'),
    ('treadle.listen_done(text)',                '{reader,producer,worker,admin,dashboard,dashboard_ro}'),
    ('treadle.unlisten_done()',                  '{reader,producer,worker,admin,dashboard,dashboard_ro}'),
    ('treadle.set_queue(text,integer,integer,interval,integer,interval,interval,integer,boolean)', '{admin,dashboard}'),
    ('treadle.pause(text)',                      '{admin,dashboard}'),
    ('treadle.resume(text)',                     '{admin,dashboard}'),
    ('treadle.enqueue(text,jsonb,text,integer,timestamp with time zone,integer,text,interval,interval,interval[],text,text,interval,jsonb,text)', '{producer,worker}'),
    ('treadle.enqueue_many(jsonb)',              '{producer,worker}'),
    ('treadle.enqueue_arrays(text[],jsonb[],text[],integer[],timestamp with time zone[],integer[],text[],interval[],interval[],jsonb[],text[])', '{producer,worker}'),
    ('treadle.start_workflow(text,jsonb,text[],text,integer,integer,text,jsonb,jsonb,jsonb,jsonb,jsonb,jsonb,jsonb,jsonb)', '{producer,worker}'),
    ('treadle.signal(bigint,text,jsonb)',        '{producer,worker}'),
    ('treadle.signal_by_key(text,text,text,jsonb)', '{producer,worker}'),
    ('treadle.cancel(bigint,text)',              '{producer,worker,admin,dashboard}'),
    ('treadle.retry(bigint,text)',               '{producer,worker,admin,dashboard}'),
    ('treadle.cancel_workflow(bigint)',          '{producer,worker,admin,dashboard}'),
    ('treadle.retry_run(bigint)',                '{admin,dashboard}'),
    ('treadle.fork_run(bigint,text,jsonb)',      '{admin,dashboard}'),
    ('treadle.compensate_run(bigint)',           '{admin,dashboard}'),
    ('treadle.cancel_run(bigint,boolean)',       '{admin,dashboard}'),
    ('treadle.schedule(text,text,text,jsonb,text,text,integer,integer,boolean)', '{producer,worker}'),
    ('treadle.unschedule(text)',                 '{producer,worker,admin,dashboard}'),
    ('treadle.claim(text,text[],text[],integer,interval,uuid)', '{worker}'),
    ('treadle.claimed(uuid)',                    '{worker}'),
    ('treadle.heartbeat(bigint,uuid,interval,text)', '{worker}'),
    ('treadle.progress(bigint,uuid,double precision,text,text)', '{worker}'),
    ('treadle.complete(bigint,uuid,jsonb,text)', '{worker}'),
    ('treadle.complete_many(bigint[],uuid[],jsonb[],text[])', '{worker}'),
    ('treadle.complete_and_claim(bigint[],uuid[],jsonb[],text,text[],text[],integer,interval,uuid,text[])', '{worker}'),
    ('treadle.heartbeat_many(bigint[],uuid[],interval,text[])', '{worker}'),
    ('treadle.fail(bigint,uuid,text,interval,boolean,text)', '{worker}'),
    ('treadle.release(bigint,uuid,text)',        '{worker}'),
    ('treadle.snooze(bigint,uuid,interval,text)', '{worker}'),
    ('treadle.step_sleep(bigint,uuid,integer,interval,timestamp with time zone)', '{worker}'),
    ('treadle.rescue()',                         '{worker,admin}'),
    ('treadle.apply_retention(integer)',         '{worker,admin}'),
    ('treadle.archive(integer)',                 '{worker,admin}'),
    ('treadle.define_workflow(text,text[],jsonb,jsonb,jsonb,jsonb,jsonb,jsonb,jsonb)', '{worker}'),
    ('treadle.worker_seen(text,text,integer,text[],integer,integer,text[])', '{worker}'),
    ('treadle.worker_stopped(text)',             '{worker}'),
    ('treadle.prune(interval)',                  '{admin}');

-- every function in schema treadle, whether installed as an extension or as plain SQL
CREATE TEMP VIEW extension_functions AS
SELECT p.oid, p.oid::regprocedure::text AS signature, p.proname
  FROM pg_proc AS p
 WHERE p.pronamespace = 'treadle'::regnamespace;

SELECT set_eq(
    $$ SELECT f.signature, r.part FROM extension_functions AS f CROSS JOIN roles AS r
        WHERE has_function_privilege(r.role, f.oid, 'EXECUTE') $$,
    $$ SELECT m.signature, unnest(m.parts) FROM may_execute AS m $$,
    'each part executes exactly the functions the privilege design gives it');
SELECT is_empty(
    $$ SELECT f.signature FROM extension_functions AS f
        WHERE f.proname NOT LIKE '\_%' AND f.proname NOT LIKE 'grant\_%'
          AND f.proname NOT IN ('set_tenant', 'configure', 'distribute')
          AND f.signature NOT IN (SELECT signature FROM may_execute) $$,
    'every public function is in the matrix: a new one must say who may call it');
SELECT is_empty(
    $$ SELECT f.signature, r.part FROM extension_functions AS f CROSS JOIN roles AS r
        WHERE (f.proname LIKE '\_%' OR f.proname LIKE 'grant\_%' OR f.proname IN ('set_tenant', 'configure', 'distribute'))
          AND f.proname NOT IN ('_caller', '_caller_role', '_caller_prefix', '_reader_prefix', '_all_start_with',
                                '_moved_clock', '_step_results')
          AND has_function_privilege(r.role, f.oid, 'EXECUTE') $$,
    'internal helpers (but the policies'' five, the clock''s and _step_results), grant helpers, set_tenant, configure and distribute are the owner''s alone');

-- Tables, views and sequences: no part may write anything, or read a lease token.
SELECT is_empty(
    $$ SELECT c.relname, r.part, p.priv FROM pg_class AS c CROSS JOIN roles AS r
        CROSS JOIN unnest(ARRAY['INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) AS p(priv)
        WHERE c.relnamespace = 'treadle'::regnamespace AND c.relkind IN ('r', 'v', 'p')
          AND has_table_privilege(r.role, c.oid, p.priv) $$,
    'no part holds a write privilege on any table or view');
SELECT is_empty(
    $$ SELECT c.relname, r.part FROM pg_class AS c CROSS JOIN roles AS r
        WHERE c.relnamespace = 'treadle'::regnamespace AND c.relkind = 'S'
          AND has_sequence_privilege(r.role, c.oid, 'USAGE, SELECT, UPDATE') $$,
    'no part may use a sequence');
SELECT is_empty(
    $$ SELECT r.part FROM roles AS r WHERE has_column_privilege(r.role, 'treadle.jobs', 'lease_token', 'SELECT') $$,
    'no part may read lease tokens');
SELECT is_empty(
    $$ SELECT r.part, c.relname FROM roles AS r CROSS JOIN pg_class AS c
        WHERE c.relnamespace = 'treadle'::regnamespace AND c.relkind = 'v' AND r.part <> 'nobody'
          AND NOT has_table_privilege(r.role, c.oid, 'SELECT') $$,
    'every part but nobody reads every view');
SELECT is_empty(
    $$ SELECT c.relname, pg_temp.as_role('trust_reader', format('SELECT * FROM %s LIMIT 0', c.oid::regclass)) AS sqlstate
         FROM pg_class AS c
        WHERE c.relnamespace = 'treadle'::regnamespace AND c.relkind = 'v'
          AND pg_temp.as_role('trust_reader', format('SELECT * FROM %s LIMIT 0', c.oid::regclass)) <> 'ok' $$,
    'a reader can select every column of every view (none reaches a lease token)');
SELECT is_empty(
    $$ SELECT c.relname FROM pg_class AS c
        WHERE c.relnamespace = 'treadle'::regnamespace AND c.relkind = 'v'
          AND NOT coalesce(c.reloptions @> ARRAY['security_invoker=true'], false) $$,
    'every view runs with the caller''s rights, so row-level security applies through it');
SELECT is_empty(
    $$ SELECT r.part FROM roles AS r WHERE has_schema_privilege(r.role, 'treadle', 'CREATE') $$,
    'no part may create objects in schema treadle');
SELECT is_empty(
    $$ SELECT c.relname FROM pg_class AS c
        WHERE c.oid IN ('treadle.jobs'::regclass, 'treadle.job_history'::regclass, 'treadle.workflow_runs'::regclass,
                        'treadle.cron_schedules'::regclass, 'treadle.queues'::regclass,
                        'treadle.workflow_signals'::regclass)
          AND NOT c.relrowsecurity $$,
    'row-level security is on for jobs, their history, workflow runs, schedules and queue settings');

--------------------------------------------------------------------------------
-- The attacks of a producer on the tables, each refused, nothing changed
--------------------------------------------------------------------------------
SELECT treadle.enqueue('victim', '{"tenant": "other"}', queue => 'trust') AS victim \gset
SELECT id AS running, lease_token AS running_tok FROM treadle.claim('honest', ARRAY['trust']) \gset
SELECT treadle.enqueue('waiting', queue => 'trust') AS waiting \gset
CREATE TEMP TABLE before AS SELECT * FROM treadle.jobs;

SELECT is(pg_temp.as_role('trust_producer', format(
              $$ UPDATE treadle.jobs SET lease_token = gen_random_uuid() WHERE id = %s $$, :running)),
          '42501', 'a producer cannot take a running job''s lease');
SELECT is(pg_temp.as_role('trust_producer', format(
              $$ UPDATE treadle.jobs SET state = 'completed', result = '{"forged": true}', finished_at = now(),
                 lease_until = NULL WHERE id = %s $$, :waiting)),
          '42501', 'a producer cannot mark a job completed');
SELECT is(pg_temp.as_role('trust_producer',
              $$ INSERT INTO treadle.jobs (queue, name, state, run_at, lease_until, lease_token, worker_id, created_at)
                 VALUES ('trust', 'forged', 'running', now(), now() + interval '100 years', gen_random_uuid(), 'x', now()) $$),
          '42501', 'a producer cannot insert a running job');
SELECT is(pg_temp.as_role('trust_producer', format(
              $$ UPDATE treadle.jobs SET args = '{"tenant": "me"}' WHERE id = %s $$, :victim)),
          '42501', 'a producer cannot rewrite another job''s args');
SELECT is(pg_temp.as_role('trust_producer', $$ LOCK TABLE treadle.jobs IN ACCESS EXCLUSIVE MODE $$),
          '42501', 'a producer cannot lock the jobs table against claims');
SELECT is(pg_temp.as_role('trust_producer', $$ SELECT nextval('treadle.jobs_id_seq') $$),
          '42501', 'a producer cannot draw job ids');
SELECT is(pg_temp.as_role('trust_producer', $$ SELECT nextval('treadle.workflow_runs_id_seq') $$),
          '42501', 'a producer cannot draw run ids');
SELECT is(pg_temp.as_role('trust_producer', $$ INSERT INTO treadle.workflow_runs (name, steps, queue, priority, max_attempts, created_at)
                                                VALUES ('x', '{a}', 'q', 0, 1, now()) $$),
          '42501', 'a producer cannot insert a workflow run');
SELECT is(pg_temp.as_role('trust_producer', format($$ SELECT treadle._follow_up(ARRAY[j]) FROM treadle.jobs AS j WHERE id = %s $$, :victim)),
          '42501', 'a producer cannot call _follow_up');
SELECT is(pg_temp.as_role('trust_producer', $$ SELECT treadle._advance_run(NULL::treadle.jobs) $$),
          '42501', 'a producer cannot call _advance_run');
SELECT is(pg_temp.as_role('trust_producer', format($$ SELECT lease_token FROM treadle.jobs WHERE id = %s $$, :running)),
          '42501', 'a producer cannot read a lease token');
SELECT is(pg_temp.as_role('trust_producer', $$ SELECT * FROM treadle.jobs $$),
          '42501', 'a producer cannot select every column of jobs (lease tokens among them)');
SELECT is(pg_temp.as_role('trust_producer', format($$ SELECT state, args, result FROM treadle.jobs WHERE id = %s $$, :running)),
          'ok', 'a producer reads the other columns of its jobs');
SELECT is(pg_temp.as_role('trust_dash_ro', format($$ SELECT * FROM treadle.job_details WHERE id = %s $$, :running)),
          'ok', 'a read-only dashboard reads job_details');
SELECT is(pg_temp.as_role('trust_dash_ro', $$ SELECT lease_token FROM treadle.jobs LIMIT 1 $$),
          '42501', 'a read-only dashboard cannot read lease tokens');
SELECT is(pg_temp.as_role('trust_dash', format($$ UPDATE treadle.jobs SET state = 'cancelled' WHERE id = %s $$, :waiting)),
          '42501', 'a dashboard cannot update jobs but through cancel and retry');
SELECT is(pg_temp.as_role('trust_worker', format($$ UPDATE treadle.jobs SET lease_until = now() WHERE id = %s $$, :running)),
          '42501', 'a worker cannot write the table either');
SELECT is(pg_temp.as_role('trust_producer', $$ CREATE FUNCTION treadle.enqueue_many(jobs json) RETURNS void LANGUAGE sql AS 'SELECT' $$),
          '42501', 'a producer cannot plant an overload in schema treadle');
SELECT is(pg_temp.as_role('trust_producer', $$ SELECT treadle.configure(max_payload_bytes => 1024) $$),
          '42501', 'a producer cannot change the limits');
SELECT is(pg_temp.as_role('trust_producer', $$ SELECT treadle.set_tenant('trust_producer', NULL) $$),
          '42501', 'a producer cannot lift a tenant rule');
SELECT set_eq($$ SELECT * FROM treadle.jobs $$, $$ SELECT * FROM before $$, 'the refused attacks changed no job');

--------------------------------------------------------------------------------
-- The clock: only the owner's sessions can move it
--------------------------------------------------------------------------------
SET LOCAL treadle.now = '2100-01-01 00:00:00+00';
SELECT is(treadle.now(), '2100-01-01 00:00:00+00'::timestamptz, 'the owner (superuser here) moves the clock');
SELECT ok(pg_temp.as_role_value('trust_worker', 'SELECT treadle.now()')::timestamptz < '2100-01-01',
          'a worker''s session setting does not move treadle''s clock');
SELECT is(pg_temp.as_role_value('trust_worker', 'SELECT treadle.rescue()'), '0',
          'so a worker cannot rescue a live lease by moving time');
SELECT treadle.enqueue('later', queue => 'trust-later', run_at => '2099-01-01 00:00:00+00') AS later \gset
SELECT is(pg_temp.as_role_value('trust_worker', $$ SELECT count(*) FROM treadle.claim('w', ARRAY['trust-later']) $$), '0',
          'nor claim a job scheduled for later');
SET LOCAL treadle.now = 'infinity';
SELECT is(pg_temp.as_role('trust_worker', $$ SELECT treadle.claim('w', ARRAY['trust']) $$), 'ok',
          'an infinite setting is ignored for a worker');
SELECT ok((SELECT isfinite(lease_until) FROM treadle.jobs WHERE id = :waiting),
          'the lease it wrote is finite: it will be rescued');
RESET treadle.now;

--------------------------------------------------------------------------------
-- Tenants: a role kept to a queue prefix sees and acts on only its queues
--------------------------------------------------------------------------------
CREATE ROLE trust_tenant_a; SELECT treadle.grant_producer('trust_tenant_a');
CREATE ROLE trust_tenant_b; SELECT treadle.grant_producer('trust_tenant_b');
SELECT lives_ok($$ SELECT treadle.set_tenant('trust_tenant_a', 'a.') $$, 'set_tenant keeps a role to a prefix');
SELECT treadle.set_tenant('trust_tenant_b', 'b.');
SELECT pg_temp.as_role_value('trust_tenant_b',
           $$ SELECT treadle.enqueue('b-job', queue => 'b.mail', idempotency_key => 'order-7') $$) AS b_job \gset
SELECT is((SELECT queue FROM treadle.jobs WHERE id = :b_job), 'b.mail', 'tenant b enqueues into its queue');
SELECT treadle.start_workflow('b-flow', steps => ARRAY['one'], queue => 'b.flows') AS b_run \gset
SELECT is(pg_temp.as_role('trust_tenant_a', $$ SELECT treadle.enqueue('x', queue => 'b.mail') $$), '42501',
          'tenant a cannot enqueue into tenant b''s queue');
SELECT is(pg_temp.as_role('trust_tenant_a', $$ SELECT treadle.enqueue_many('[{"name": "x", "queue": "b.mail"}]') $$), '42501',
          'nor with enqueue_many');
SELECT is(pg_temp.as_role('trust_tenant_a', $$ SELECT treadle.enqueue_arrays(ARRAY['x', 'y'], queue => ARRAY['a.mail', 'b.mail']) $$), '42501',
          'nor with enqueue_arrays, one queue of two outside its prefix');
SELECT is(pg_temp.as_role('trust_tenant_a', $$ SELECT treadle.start_workflow('x', steps => ARRAY['s'], queue => 'b.flows') $$), '42501',
          'nor start a workflow there');
SELECT is(pg_temp.as_role('trust_tenant_a', $$ SELECT treadle.enqueue('x', queue => 'a.mail') $$), 'ok',
          'tenant a enqueues into its own queue');
SELECT isnt(pg_temp.as_role_value('trust_tenant_a',
                $$ SELECT treadle.enqueue('a-job', queue => 'a.mail', idempotency_key => 'order-7') $$)::bigint,
            :b_job::bigint, 'the same key in tenant a''s queue is tenant a''s own job: keys cannot suppress across tenants');
SELECT is(pg_temp.as_role_value('trust_tenant_a', $$ SELECT count(*) FROM treadle.job_details WHERE queue NOT LIKE 'a.%' $$),
          '0', 'tenant a sees no job outside its queues through the views');
SELECT is(pg_temp.as_role_value('trust_tenant_a', $$ SELECT count(*) FROM treadle.jobs WHERE queue LIKE 'b.%' $$),
          '0', 'nor through the table');
SELECT is(pg_temp.as_role_value('trust_tenant_a', $$ SELECT count(*) FROM treadle.workflow_run_overview $$),
          '0', 'nor tenant b''s workflow runs');
SELECT is(pg_temp.as_role_value('trust_tenant_a', format($$ SELECT treadle.workflow_results(%s) $$, :b_run)), NULL,
          'nor their results');
SELECT is(pg_temp.as_role_value('trust_tenant_a', format($$ SELECT treadle.workflow_step_results(%s, 'one') $$, :b_run)), NULL,
          'nor the results one of their steps receives');
SELECT is(pg_temp.as_role('trust_tenant_a', format($$ SELECT treadle.cancel(%s) $$, :b_job)), '42501',
          'tenant a cannot cancel tenant b''s job');
SELECT is(pg_temp.as_role('trust_tenant_a', format($$ SELECT treadle.retry(%s) $$, :b_job)), '42501',
          'nor retry it');
SELECT is(pg_temp.as_role('trust_tenant_a', format($$ SELECT treadle.cancel_workflow(%s) $$, :b_run)), '42501',
          'nor cancel tenant b''s run');
SELECT is((SELECT state FROM treadle.jobs WHERE id = :b_job), 'available', 'tenant b''s job is untouched');
SELECT is(pg_temp.as_role_value('trust_tenant_b', $$ SELECT count(*) FROM treadle.job_details $$), '2',
          'tenant b sees its two jobs: its own and its workflow''s step');
SELECT is(pg_temp.as_role_value('trust_producer', $$ SELECT count(*) > 3 FROM treadle.job_details $$), 'true',
          'a producer that is not a tenant sees every queue');
CREATE ROLE trust_tenant_worker; SELECT treadle.grant_worker('trust_tenant_worker');
SELECT treadle.set_tenant('trust_tenant_worker', 'a.');
SELECT is(pg_temp.as_role('trust_tenant_worker', $$ SELECT treadle.claim('w', ARRAY['b.mail']) $$), '42501',
          'a tenant''s worker cannot claim another tenant''s queue');
SELECT is(pg_temp.as_role_value('trust_tenant_a',
              $$ SELECT count(*) FROM treadle.job_counts() WHERE queue NOT LIKE 'a.%' $$), '0',
          'job_counts shows tenant a only its queues');
SELECT is(pg_temp.as_role_value('trust_tenant_a',
              $$ SELECT sum(jobs) FROM treadle.job_counts() WHERE queue IS NULL $$), '2',
          'and totals over its queues only');
SELECT is(pg_temp.as_role_value('trust_tenant_a', $$ SELECT treadle.estimated_jobs('b.mail', 'available') $$), '0',
          'estimated_jobs of another tenant''s queue is 0');
SELECT lives_ok($$ SELECT treadle.set_tenant('trust_tenant_a', NULL) $$, 'a null prefix lifts the rule');
SELECT is(pg_temp.as_role('trust_tenant_a', format($$ SELECT treadle.cancel(%s) $$, :b_job)), 'ok',
          'and the role may act on every queue again');
SELECT throws_ok($$ SELECT treadle.set_tenant('trust_tenant_a', '') $$, '22023', NULL, 'an empty prefix raises 22023');
SELECT throws_ok($$ SELECT treadle.set_tenant(NULL, 'a.') $$, '22004', NULL, 'a null role raises 22004');

--------------------------------------------------------------------------------
-- configure: the owner's payload limit
--------------------------------------------------------------------------------
SELECT lives_ok($$ SELECT treadle.configure(max_payload_bytes => 2048) $$, 'the owner sets the payload limit');
SELECT throws_ok($$ SELECT treadle.enqueue('big', jsonb_build_object('blob', repeat('b', 3000))) $$, '22023', NULL,
                 'args over the configured limit raise 22023');
SELECT throws_ok($$ SELECT treadle.configure(max_payload_bytes => 10) $$, '22023', NULL, 'a limit under 1 KiB raises 22023');

--------------------------------------------------------------------------------
-- Estimates on a large table: a reader gets the owner's figure (row-level
-- security would hide the statistics from it and bend the planner's guess)
--------------------------------------------------------------------------------
SELECT treadle.enqueue_many((SELECT jsonb_agg(jsonb_build_object('name', 'est', 'queue', 'estimates'))
                               FROM generate_series(1, 3000)));
ANALYZE treadle.jobs;
SELECT is(pg_temp.as_role_value('trust_reader', $$ SELECT treadle.estimated_jobs('estimates', 'available') $$),
          (SELECT treadle.estimated_jobs('estimates', 'available'))::text,
          'a reader''s estimate is the owner''s');
SELECT ok((SELECT treadle.estimated_jobs('estimates', 'available')) BETWEEN 2700 AND 3300,
          'and close to the 3,000 jobs there');

SELECT * FROM finish();
ROLLBACK;
