-- pgtap/030_job_shape.sql: treadle.jobs keeps the CHECK constraints of its state
-- machine and of a step's columns (each costs every statement that writes a job,
-- 010_tables.sql), which refuse a bad row with 23514; the shape of what a producer
-- gives is the functions' to guard: enqueue, enqueue_many, enqueue_arrays and
-- progress refuse each bad value that a dropped constraint refused (22023), and
-- write nothing.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(31);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

SELECT is(ARRAY(SELECT conname::text FROM pg_constraint
                 WHERE conrelid = 'treadle.jobs'::regclass AND contype = 'c' ORDER BY conname),
          ARRAY['jobs_finished_check', 'jobs_key_slot_check', 'jobs_lease_check', 'jobs_run_queue_check',
                'jobs_state_check', 'jobs_step_check'],
          'jobs has the CHECK constraints 010_tables.sql keeps, and no other');

--------------------------------------------------------------------------------
-- the kept constraints: the state machine and a step's columns
--------------------------------------------------------------------------------
SELECT treadle.enqueue('shape', queue => 'shape') AS j1 \gset
SELECT throws_ok(format($$ UPDATE treadle.jobs SET state = 'done' WHERE id = %s $$, :j1),
                 '23514', NULL, 'a state that is none of the seven is refused');
SELECT throws_ok(format($$ UPDATE treadle.jobs SET state = 'running' WHERE id = %s $$, :j1),
                 '23514', NULL, 'a running job without a lease is refused');
SELECT throws_ok(format($$ UPDATE treadle.jobs SET lease_until = now() WHERE id = %s $$, :j1),
                 '23514', NULL, 'a lease on a job that is not running is refused');
SELECT throws_ok(format($$ UPDATE treadle.jobs SET state = 'completed' WHERE id = %s $$, :j1),
                 '23514', NULL, 'a finished state without finished_at is refused');
SELECT throws_ok(format($$ UPDATE treadle.jobs SET finished_at = now() WHERE id = %s $$, :j1),
                 '23514', NULL, 'finished_at on a job that has not finished is refused');
SELECT throws_ok(format($$ UPDATE treadle.jobs SET step = 'a' WHERE id = %s $$, :j1),
                 '23514', NULL, 'a step without its run is refused');
SELECT throws_ok(format($$ UPDATE treadle.jobs SET state = 'blocked' WHERE id = %s $$, :j1),
                 '23514', NULL, 'a blocked job without a concurrency key is refused');
SELECT throws_ok(format($$ UPDATE treadle.jobs SET key_slot = true WHERE id = %s $$, :j1),
                 '23514', NULL, 'a slot without a concurrency key is refused');

--------------------------------------------------------------------------------
-- the functions refuse what the dropped constraints refused, and write nothing
--------------------------------------------------------------------------------
SELECT count(*) AS jobs FROM treadle.jobs \gset
SELECT throws_ok($$ SELECT treadle.enqueue('shape', queue => '') $$, '22023', NULL,
                 'enqueue: an empty queue (jobs_queue_check): 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('') $$, '22023', NULL, 'enqueue: an empty name (jobs_name_check): 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('shape', max_attempts => 0) $$, '22023', NULL,
                 'enqueue: max_attempts 0 (jobs_max_attempts_check): 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('shape', every => '0') $$, '22023', NULL,
                 'enqueue: every 0 (jobs_every_check): 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('shape', every => '-1 hour') $$, '22023', NULL,
                 'enqueue: a negative every: 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('shape', timeout => '0') $$, '22023', NULL,
                 'enqueue: timeout 0 (jobs_timeout_check): 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('shape', backoff => ARRAY[]::interval[]) $$, '22023', NULL,
                 'enqueue: an empty backoff (jobs_backoff_check): 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('shape', backoff => array_fill(interval '1 second', ARRAY[101])) $$,
                 '22023', NULL, 'enqueue: a backoff of 101 delays: 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('shape', idempotency_key => 'k', unique_while => 'always') $$, '22023', NULL,
                 'enqueue: an unknown unique_while (jobs_key_scope_check): 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('shape', meta => '[1]') $$, '22023', NULL,
                 'enqueue: meta not an object (jobs_meta_check): 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "shape", "queue": ""}]') $$, '22023', NULL,
                 'enqueue_many: an empty queue: 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": ""}]') $$, '22023', NULL, 'enqueue_many: an empty name: 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "shape", "max_attempts": 0}]') $$, '22023', NULL,
                 'enqueue_many: max_attempts 0: 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "shape", "timeout": "0"}]') $$, '22023', NULL,
                 'enqueue_many: timeout 0: 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "shape", "backoff": []}]') $$, '22023', NULL,
                 'enqueue_many: an empty backoff: 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "shape", "meta": [1]}]') $$, '22023', NULL,
                 'enqueue_many: meta not an object: 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_arrays(ARRAY['shape'], every => ARRAY[interval '0']) $$, '22023', NULL,
                 'enqueue_arrays: every 0: 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_arrays(ARRAY['shape'], max_attempts => ARRAY[0]) $$, '22023', NULL,
                 'enqueue_arrays: max_attempts 0: 22023');
SELECT is((SELECT count(*) FROM treadle.jobs), :jobs::bigint, 'the refusals wrote no job');

SELECT c.id AS j2, c.lease_token AS t2 FROM treadle.claim('shape-worker', ARRAY['shape']) AS c \gset
SELECT throws_ok(format($$ SELECT treadle.progress(%s, %L, 1.5) $$, :j2, :'t2'), '22023', NULL,
                 'progress over 1 (jobs_progress_check): 22023');
SELECT throws_ok(format($$ SELECT treadle.progress(%s, %L, -0.5) $$, :j2, :'t2'), '22023', NULL,
                 'progress under 0: 22023');
SELECT is((SELECT progress FROM treadle.jobs WHERE id = :j2), NULL, 'and the job''s progress is unchanged');

SELECT * FROM finish();
ROLLBACK;
