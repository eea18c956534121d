-- pgtap/090_grants.sql: the grant helpers. Roles made inside this transaction get
-- grant_producer, grant_worker or grant_dashboard; each then does what its part needs
-- and is refused (42501) what it does not. A role with no grant can do nothing.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(64);

-- No clock setting here: as the roles below, treadle.now() is the server's time.

\ir helpers.psql

CREATE ROLE tap_producer;
CREATE ROLE tap_worker;
CREATE ROLE tap_dashboard;
CREATE ROLE tap_viewer;
CREATE ROLE tap_nobody;

SELECT lives_ok($$ SELECT treadle.grant_producer('tap_producer') $$, 'grant_producer runs');
SELECT lives_ok($$ SELECT treadle.grant_worker('tap_worker') $$, 'grant_worker runs');
SELECT lives_ok($$ SELECT treadle.grant_dashboard('tap_dashboard') $$, 'grant_dashboard runs');
SELECT lives_ok($$ SELECT treadle.grant_dashboard('tap_viewer', read_only => true) $$, 'grant_dashboard read-only runs');
SELECT lives_ok($$ SELECT treadle.grant_worker('tap_worker') $$, 'granting twice is harmless');

--------------------------------------------------------------------------------
-- A producer enqueues, starts workflows, cancels and retries; it does not work jobs
--------------------------------------------------------------------------------
SELECT is(pg_temp.as_role('tap_producer', $$ SELECT treadle.enqueue('p', queue => 'from-producer') $$), 'ok',
          'a producer can enqueue');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE queue = 'from-producer'), 1::bigint, 'its job is there');
SELECT is(pg_temp.as_role('tap_producer', $$ SELECT treadle.enqueue('p', queue => 'from-producer', idempotency_key => 'pk') $$),
          'ok', 'a producer can enqueue with a key');
SELECT is(pg_temp.as_role('tap_producer', $$ SELECT treadle.enqueue('p', queue => 'from-producer', idempotency_key => 'pk') $$),
          'ok', 'and repeat the key');
SELECT is(pg_temp.as_role('tap_producer', $$ SELECT treadle.enqueue_many('[{"name": "p", "queue": "from-producer"}]') $$),
          'ok', 'a producer can enqueue_many');
SELECT is(pg_temp.as_role('tap_producer', $$ SELECT treadle.start_workflow('pw', steps => ARRAY['a', 'b'], queue => 'pw') $$),
          'ok', 'a producer can start a workflow');
SELECT is(pg_temp.as_role('tap_producer', $$ SELECT treadle.workflow_results(max(id)) FROM treadle.workflow_runs $$),
          'ok', 'a producer can read workflow results');
SELECT is(pg_temp.as_role('tap_producer', $$ SELECT treadle.cancel(min(id)) FROM treadle.jobs WHERE queue = 'from-producer' $$),
          'ok', 'a producer can cancel');
SELECT is(pg_temp.as_role('tap_producer', $$ SELECT treadle.retry(min(id)) FROM treadle.jobs WHERE queue = 'from-producer' $$),
          'ok', 'a producer can retry');
SELECT is((SELECT state FROM treadle.jobs WHERE queue = 'from-producer' ORDER BY id LIMIT 1), 'available',
          'its cancel and retry took effect');
SELECT is(pg_temp.as_role('tap_producer', $$ SELECT treadle.cancel_workflow(max(id)) FROM treadle.workflow_runs $$),
          'ok', 'a producer can cancel a workflow run');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE name = 'pw'), 'cancelled', 'the run is cancelled');
SELECT is(pg_temp.as_role('tap_producer', $$ SELECT treadle.claim('w', ARRAY['from-producer']) $$), '42501',
          'a producer cannot claim');
SELECT is(pg_temp.as_role('tap_producer', $$ SELECT treadle.rescue() $$), '42501', 'a producer cannot rescue');
SELECT is(pg_temp.as_role('tap_producer', $$ SELECT treadle.complete(1, gen_random_uuid()) $$), '42501',
          'a producer cannot complete');
SELECT is(pg_temp.as_role('tap_producer', $$ SELECT treadle.define_workflow('x', ARRAY['a']) $$), '42501',
          'a producer cannot define workflows');
SELECT is(pg_temp.as_role('tap_producer', $$ SELECT treadle.prune('0 seconds') $$), '42501', 'a producer cannot prune');
SELECT is(pg_temp.as_role('tap_producer', $$ DELETE FROM treadle.jobs $$), '42501', 'a producer cannot delete jobs');
SELECT is(pg_temp.as_role('tap_producer', $$ SELECT treadle.grant_worker('tap_producer') $$), '42501',
          'a producer cannot grant itself more');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE queue = 'from-producer' AND state = 'available'), 3::bigint,
          'the refused calls changed nothing');

--------------------------------------------------------------------------------
-- A worker does all a producer does, and works jobs
--------------------------------------------------------------------------------
SELECT treadle.enqueue('periodic', queue => 'wq', every => '1 hour', run_at => '2000-01-01 00:00:00+00') AS periodic \gset
SELECT treadle.start_workflow('ww', steps => ARRAY['a', 'b'], queue => 'wflow') AS wrun \gset
SELECT treadle.enqueue('other', queue => 'wq2', run_at => '2000-01-01 00:00:00+00', max_attempts => 1) AS other \gset

SELECT is(pg_temp.as_role('tap_worker', $$ SELECT treadle.worker_seen('tap-w', 'h', 1, ARRAY['wq'], 2) $$), 'ok',
          'a worker can report itself');
SELECT is(pg_temp.as_role('tap_worker', $$ SELECT treadle.define_workflow('ww', ARRAY['a', 'b']) $$), 'ok',
          'a worker can define a workflow');
SELECT is(pg_temp.as_role('tap_worker', $$ SELECT treadle.enqueue('x', queue => 'wq-own') $$), 'ok', 'a worker can enqueue');
SELECT is(pg_temp.as_role('tap_worker',
              $$ SELECT treadle.complete(id, lease_token, '{"ok": 1}') FROM treadle.claim('tap-w', ARRAY['wq']) $$),
          'ok', 'a worker can claim and complete a periodic job');
SELECT results_eq($$ SELECT state FROM treadle.jobs WHERE queue = 'wq' ORDER BY id $$, ARRAY['completed', 'available'],
                  'completing it as the worker started the next occurrence');
SELECT is(pg_temp.as_role('tap_worker',
              $$ SELECT treadle.complete_many(ARRAY[id], ARRAY[lease_token]) FROM treadle.claim('tap-w', ARRAY['wflow']) $$),
          'ok', 'a worker can claim and complete_many a workflow step');
SELECT results_eq(format($$ SELECT step, state FROM treadle.jobs WHERE workflow_run_id = %s ORDER BY id $$, :wrun),
                  $$ VALUES ('a'::text, 'completed'::text), ('b', 'available') $$,
                  'completing the step as the worker enqueued the next');
SELECT is(pg_temp.as_role('tap_worker',
              $$ SELECT treadle.heartbeat(id, lease_token), treadle.progress(id, lease_token, 0.5),
                        treadle.release(id, lease_token)
                   FROM treadle.claim('tap-w', ARRAY['wq2']) $$),
          'ok', 'a worker can heartbeat, report progress and release');
SELECT is(pg_temp.as_role('tap_worker',
              $$ SELECT treadle.fail(id, lease_token, 'no') FROM treadle.claim('tap-w', ARRAY['wq2']) $$),
          'ok', 'a worker can fail a job');
SELECT results_eq(format($$ SELECT state, attempt, last_error FROM treadle.jobs WHERE id = %s $$, :other),
                  $$ VALUES ('discarded'::text, 1, 'no'::text) $$,
                  'those calls took effect: the release gave the attempt back, the fail discarded it');
SELECT is(pg_temp.as_role('tap_worker', $$ SELECT treadle.rescue() $$), 'ok', 'a worker can rescue');
SELECT is(pg_temp.as_role('tap_worker', $$ SELECT treadle.worker_stopped('tap-w') $$), 'ok', 'a worker can stop');
SELECT is((SELECT count(*) FROM treadle.workers), 0::bigint, 'and is gone from the registry');
SELECT is(pg_temp.as_role('tap_worker', $$ SELECT treadle.prune('0 seconds') $$), '42501', 'a worker cannot prune');
SELECT is(pg_temp.as_role('tap_worker', $$ DELETE FROM treadle.jobs $$), '42501', 'a worker cannot delete jobs');
SELECT is(pg_temp.as_role('tap_worker', $$ SELECT treadle.grant_dashboard('tap_worker') $$), '42501',
          'a worker cannot grant');

--------------------------------------------------------------------------------
-- A dashboard reads the views, cancels and retries; a read-only one only reads
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('dw', steps => ARRAY['a'], queue => 'dq') AS drun \gset
SELECT is(pg_temp.as_role('tap_dashboard',
              $$ SELECT (SELECT count(*) FROM treadle.queue_stats), (SELECT count(*) FROM treadle.throughput),
                        (SELECT count(*) FROM treadle.recent_failures), (SELECT count(*) FROM treadle.workflow_run_overview),
                        (SELECT count(*) FROM treadle.live_workers), (SELECT count(*) FROM treadle.jobs),
                        (SELECT count(*) FROM treadle.workflow_runs) $$),
          'ok', 'a dashboard reads every view and the tables');
SELECT is(pg_temp.as_role('tap_dashboard', format('SELECT treadle.cancel_workflow(%s)', :drun)), 'ok',
          'a dashboard can cancel a workflow run');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :drun), 'cancelled', 'the run is cancelled');
SELECT is(pg_temp.as_role('tap_dashboard', format('SELECT treadle.retry(id) FROM treadle.jobs WHERE workflow_run_id = %s', :drun)),
          'ok', 'a dashboard can retry the cancelled step');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :drun), 'running', 'the run resumed');
SELECT is(pg_temp.as_role('tap_dashboard', format('SELECT treadle.cancel(id) FROM treadle.jobs WHERE workflow_run_id = %s', :drun)),
          'ok', 'a dashboard can cancel a job');
SELECT is(pg_temp.as_role('tap_dashboard', $$ SELECT treadle.enqueue('d') $$), '42501', 'a dashboard cannot enqueue');
SELECT is(pg_temp.as_role('tap_dashboard', $$ SELECT treadle.claim('d') $$), '42501', 'a dashboard cannot claim');
SELECT is(pg_temp.as_role('tap_dashboard', $$ SELECT treadle.prune() $$), '42501', 'a dashboard cannot prune');

SELECT is(pg_temp.as_role('tap_viewer',
              $$ SELECT (SELECT count(*) FROM treadle.queue_stats), (SELECT count(*) FROM treadle.workflow_run_overview),
                        (SELECT count(*) FROM treadle.recent_failures), (SELECT count(*) FROM treadle.live_workers) $$),
          'ok', 'a read-only dashboard reads the views');
SELECT is(pg_temp.as_role('tap_viewer', format('SELECT treadle.retry(id) FROM treadle.jobs WHERE workflow_run_id = %s', :drun)),
          '42501', 'a read-only dashboard cannot retry');
SELECT is(pg_temp.as_role('tap_viewer', format('SELECT treadle.cancel_workflow(%s)', :drun)), '42501',
          'a read-only dashboard cannot cancel a run');
SELECT is(pg_temp.as_role('tap_viewer', $$ UPDATE treadle.jobs SET priority = 1 $$), '42501',
          'a read-only dashboard cannot write a table');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :drun), 'cancelled', 'the refused calls changed nothing');

--------------------------------------------------------------------------------
-- A role with no grant can do nothing
--------------------------------------------------------------------------------
SELECT is(pg_temp.as_role('tap_nobody', $$ SELECT treadle.enqueue('n') $$), '42501', 'an ungranted role cannot enqueue');
SELECT is(pg_temp.as_role('tap_nobody', $$ SELECT count(*) FROM treadle.jobs $$), '42501', 'nor read jobs');
SELECT is(pg_temp.as_role('tap_nobody', $$ SELECT count(*) FROM treadle.queue_stats $$), '42501', 'nor read the views');

--------------------------------------------------------------------------------
-- Bad input
--------------------------------------------------------------------------------
SELECT throws_ok($$ SELECT treadle.grant_producer(NULL) $$, '22004', NULL, 'grant_producer: a null role raises 22004');
SELECT throws_ok($$ SELECT treadle.grant_worker(NULL) $$, '22004', NULL, 'grant_worker: a null role raises 22004');
SELECT throws_ok($$ SELECT treadle.grant_dashboard(NULL) $$, '22004', NULL, 'grant_dashboard: a null role raises 22004');
SELECT throws_ok($$ SELECT treadle.grant_dashboard('tap_nobody', NULL) $$, '22004', NULL,
                 'grant_dashboard: a null read_only raises 22004');
SELECT throws_ok($$ SELECT treadle.grant_worker('tap_no_such_role') $$, '42704', NULL, 'an unknown role raises 42704');
SELECT is(pg_temp.as_role('tap_nobody', $$ SELECT count(*) FROM treadle.queue_stats $$), '42501',
          'a failed grant gave nothing');

SELECT * FROM finish();
ROLLBACK;
