-- pgtap/075_workers.sql: the worker registry. worker_seen, worker_stopped and the
-- live_workers view, which counts the jobs each live worker holds.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(33);

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

SELECT has_function('treadle', 'worker_seen', ARRAY['text', 'text', 'integer', 'text[]', 'integer', 'integer', 'text[]'],
                    'treadle.worker_seen exists');
SELECT has_function('treadle', 'worker_stopped', ARRAY['text'], 'treadle.worker_stopped exists');
SELECT has_view('treadle', 'live_workers', 'treadle.live_workers exists');
SELECT is_empty('SELECT * FROM treadle.live_workers', 'no worker has reported yet');

SELECT lives_ok($$ SELECT treadle.worker_seen('host-a:101', 'host-a', 101, ARRAY['default', 'mail'], 8) $$,
                'a worker reports itself');
SELECT results_eq(
    $$ SELECT id, host, pid, queues, running, concurrency, started_at, last_seen FROM treadle.workers $$,
    $$ VALUES ('host-a:101'::text, 'host-a'::text, 101, ARRAY['default', 'mail'], 0, 8,
               '2999-01-01 12:00:00+00'::timestamptz, '2999-01-01 12:00:00+00'::timestamptz) $$,
    'the worker is recorded with started_at and last_seen now');

-- It holds jobs: live_workers counts them
SELECT treadle.enqueue('j', run_at => '2000-01-01 00:00:00+00') AS j1 \gset
SELECT treadle.enqueue('j', run_at => '2000-01-01 00:00:00+00') AS j2 \gset
SELECT treadle.enqueue('j', run_at => '2000-01-01 00:00:00+00') AS j3 \gset
CREATE TEMP TABLE held AS SELECT * FROM treadle.claim('host-a:101', batch => 2);
SELECT is((SELECT count(*) FROM treadle.claim('someone-else')), 1::bigint, 'another worker claims the third job');

SET LOCAL treadle.now = '2999-01-01 12:00:20+00';
SELECT lives_ok($$ SELECT treadle.worker_seen('host-a:101', 'host-a', 101, ARRAY['default'], 4, 2) $$,
                'the worker reports again');
SELECT results_eq(
    $$ SELECT queues, running, concurrency, started_at, last_seen FROM treadle.workers WHERE id = 'host-a:101' $$,
    $$ VALUES (ARRAY['default'], 2, 4, '2999-01-01 12:00:00+00'::timestamptz, '2999-01-01 12:00:20+00'::timestamptz) $$,
    'a report refreshes queues, running, concurrency and last_seen, and keeps started_at');
SELECT is((SELECT count(*) FROM treadle.workers), 1::bigint, 'a worker is one row however often it reports');
SELECT results_eq(
    $$ SELECT id, host, pid, queues, concurrency, running_jobs, started_at, last_seen FROM treadle.live_workers $$,
    $$ VALUES ('host-a:101'::text, 'host-a'::text, 101, ARRAY['default'], 4, 2::bigint,
               '2999-01-01 12:00:00+00'::timestamptz, '2999-01-01 12:00:20+00'::timestamptz) $$,
    'live_workers shows the worker and the jobs it holds right now');
SELECT is(treadle.complete(:j1, (SELECT lease_token FROM held WHERE id = :j1)), 'completed', 'one of its jobs completes');
SELECT is((SELECT running_jobs FROM treadle.live_workers), 1::bigint, 'running_jobs counts only running jobs');

SET LOCAL treadle.now = '2999-01-01 12:00:30+00';
SELECT lives_ok($$ SELECT treadle.worker_seen('host-b:7', 'host-b', 7, ARRAY['default'], 1) $$, 'a second worker reports');
SELECT results_eq($$ SELECT id FROM treadle.live_workers $$, ARRAY['host-a:101', 'host-b:7'],
                  'live_workers lists workers by start time');

-- Silent workers drop out of live_workers, and are forgotten after a day
SET LOCAL treadle.now = '2999-01-01 12:00:50+00';
SELECT results_eq($$ SELECT id FROM treadle.live_workers $$, ARRAY['host-b:7'],
                  'a worker silent for more than 30 seconds is not live');
SELECT is((SELECT count(*) FROM treadle.workers), 2::bigint, 'but its row stays');
SET LOCAL treadle.now = '2999-01-02 12:00:30+00';
SELECT lives_ok($$ SELECT treadle.worker_seen('host-c:1', 'host-c', 1, ARRAY['default'], 1) $$, 'a third worker reports a day later');
SELECT results_eq($$ SELECT id FROM treadle.workers ORDER BY id $$, ARRAY['host-b:7', 'host-c:1'],
                  'a report forgets workers silent for more than a day');

-- Stopping
SELECT ok(treadle.worker_stopped('host-c:1'), 'a worker that stops is removed: true');
SELECT ok(NOT treadle.worker_stopped('host-c:1'), 'stopping it again: false');
SELECT ok(NOT treadle.worker_stopped('nobody'), 'an unknown worker: false');

-- Bad input
CREATE TEMP TABLE before AS SELECT * FROM treadle.workers;
SELECT throws_ok($$ SELECT treadle.worker_seen(NULL, 'h', 1, ARRAY['q'], 1) $$, '22004', NULL, 'a null worker_id raises 22004');
SELECT throws_ok($$ SELECT treadle.worker_seen('', 'h', 1, ARRAY['q'], 1) $$, '22023', NULL, 'an empty worker_id raises 22023');
SELECT throws_ok($$ SELECT treadle.worker_seen('x', NULL, 1, ARRAY['q'], 1) $$, '22004', NULL, 'a null host raises 22004');
SELECT throws_ok($$ SELECT treadle.worker_seen('x', 'h', NULL, ARRAY['q'], 1) $$, '22004', NULL, 'a null pid raises 22004');
SELECT throws_ok($$ SELECT treadle.worker_seen('x', 'h', 1, NULL, 1) $$, '22004', NULL, 'null queues raise 22004');
SELECT throws_ok($$ SELECT treadle.worker_seen('x', 'h', 1, ARRAY[]::text[], 1) $$, '22023', NULL, 'empty queues raise 22023');
SELECT throws_ok($$ SELECT treadle.worker_seen('x', 'h', 1, ARRAY['q'], 0) $$, '22023', NULL, 'concurrency 0 raises 22023');
SELECT throws_ok($$ SELECT treadle.worker_seen('x', 'h', 1, ARRAY['q'], 1, -1) $$, '22023', NULL, 'a negative running raises 22023');
SELECT throws_ok($$ SELECT treadle.worker_stopped(NULL) $$, '22004', NULL, 'worker_stopped: a null worker_id raises 22004');
SELECT throws_ok($$ SELECT treadle.worker_stopped('') $$, '22023', NULL, 'worker_stopped: an empty worker_id raises 22023');
SELECT set_eq($$ SELECT * FROM treadle.workers $$, $$ SELECT * FROM before $$, 'no bad call changed the registry');

SELECT * FROM finish();
ROLLBACK;
