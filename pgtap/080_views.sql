-- pgtap/080_views.sql: the read interface. Each view's contract columns, in order,
-- and what it shows for a known set of jobs and runs.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(20);

-- pg_temp.leading_columns(view, n): a view's first n column names, in order
CREATE FUNCTION pg_temp.leading_columns(view regclass, n integer) RETURNS text[] LANGUAGE sql AS $$
    SELECT array_agg(attname::text ORDER BY attnum)
      FROM pg_attribute WHERE attrelid = view AND attnum BETWEEN 1 AND n AND NOT attisdropped
$$;

SELECT is(pg_temp.leading_columns('treadle.queue_stats', 4), ARRAY['queue', 'state', 'jobs', 'oldest_available_age'],
          'queue_stats starts with queue, state, jobs, oldest_available_age');
SELECT is(pg_temp.leading_columns('treadle.throughput', 3), ARRAY['minute', 'completed', 'discarded'],
          'throughput starts with minute, completed, discarded');
SELECT is(pg_temp.leading_columns('treadle.recent_failures', 8),
          ARRAY['id', 'queue', 'name', 'state', 'attempt', 'max_attempts', 'last_error', 'failed_at'],
          'recent_failures starts with its contract columns');
SELECT is(pg_temp.leading_columns('treadle.workflow_run_overview', 8),
          ARRAY['id', 'name', 'state', 'current_step', 'steps_done', 'steps_total', 'created_at', 'finished_at'],
          'workflow_run_overview starts with its contract columns');

-- Jobs at known times
SET LOCAL treadle.now = '2999-01-01 10:30:00+00';
SELECT treadle.enqueue('old', queue => 'qs-b', run_at => '2000-01-01 00:00:00+00') AS old \gset
SELECT treadle.complete(:old, (SELECT lease_token FROM treadle.claim('w', ARRAY['qs-b']))) IS NOT NULL AS done \gset

SET LOCAL treadle.now = '2999-01-01 11:30:00+00';
SELECT treadle.enqueue('x', queue => 'qs-a', run_at => '2999-01-01 11:00:00+00') AS x1 \gset
SELECT treadle.fail(:x1, (SELECT lease_token FROM treadle.claim('w', ARRAY['qs-a'])), 'x1 broke', '5 minutes') AS x1_state \gset
SELECT treadle.enqueue('x', queue => 'qs-a', run_at => '2999-01-01 11:40:00+00') AS x2 \gset
SELECT treadle.enqueue('x', queue => 'qs-a', run_at => '2999-01-01 13:00:00+00') AS x3 \gset
SELECT treadle.enqueue('y', queue => 'qs-b', run_at => '2000-01-01 00:00:00+00') AS x4 \gset
SELECT treadle.complete(:x4, (SELECT lease_token FROM treadle.claim('w', ARRAY['qs-b']))) AS x4_state \gset

SET LOCAL treadle.now = '2999-01-01 11:58:30+00';
SELECT treadle.enqueue('z', queue => 'qs-c', run_at => '2000-01-01 00:00:00+00', max_attempts => 1) AS z1 \gset
SELECT treadle.enqueue('z', queue => 'qs-c', run_at => '2000-01-01 00:00:00+00', max_attempts => 1) AS z2 \gset
SELECT treadle.enqueue('z', queue => 'qs-c', run_at => '2000-01-01 00:00:00+00') AS z3 \gset
CREATE TEMP TABLE zc AS SELECT * FROM treadle.claim('w', ARRAY['qs-c'], batch => 3);
SELECT treadle.complete(:z1, (SELECT lease_token FROM zc WHERE id = :z1)) AS z1_state \gset
SELECT treadle.fail(:z3, (SELECT lease_token FROM zc WHERE id = :z3), 'z3 first try', '0 seconds') AS z3_state \gset
SET LOCAL treadle.now = '2999-01-01 11:59:10+00';
SELECT treadle.fail(:z2, (SELECT lease_token FROM zc WHERE id = :z2), 'z2 gave up') AS z2_state \gset
SELECT treadle.complete(:z3, (SELECT lease_token FROM treadle.claim('w', ARRAY['qs-c']))) AS z3_state \gset
SELECT treadle.enqueue('c', queue => 'qs-c') AS cancelled \gset
SELECT treadle.cancel(:cancelled) AS cancelled_done \gset

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

--------------------------------------------------------------------------------
-- queue_stats
--------------------------------------------------------------------------------
SELECT results_eq(
    $$ SELECT queue, state, jobs, oldest_available_age FROM treadle.queue_stats WHERE queue IN ('qs-a', 'qs-b') $$,
    $$ VALUES ('qs-a'::text, 'available'::text, 2::bigint, interval '25 minutes'),
              ('qs-a', 'retryable', 1, interval '25 minutes'),
              ('qs-b', 'completed', 2, NULL) $$,
    'queue_stats: one row per queue and state, with the age of the queue''s oldest due job (null for none)');
SELECT results_eq(
    $$ SELECT state, jobs FROM treadle.queue_stats WHERE queue = 'qs-c' $$,
    $$ VALUES ('cancelled'::text, 1::bigint), ('completed', 2), ('discarded', 1) $$,
    'queue_stats counts finished states too');
SET LOCAL treadle.now = '2999-01-01 11:45:00+00';
SELECT is((SELECT DISTINCT oldest_available_age FROM treadle.queue_stats WHERE queue = 'qs-a'), interval '10 minutes',
          'the age follows the clock and counts only jobs already due');
SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

--------------------------------------------------------------------------------
-- throughput
--------------------------------------------------------------------------------
SELECT results_eq(
    $$ SELECT count(*), min(minute), max(minute) FROM treadle.throughput $$,
    $$ VALUES (60::bigint, '2999-01-01 11:01:00+00'::timestamptz, '2999-01-01 12:00:00+00'::timestamptz) $$,
    'throughput has a row for each of the last 60 minutes');
SELECT results_eq(
    $$ SELECT minute, completed, discarded FROM treadle.throughput WHERE completed + discarded > 0 $$,
    $$ VALUES ('2999-01-01 11:30:00+00'::timestamptz, 1::bigint, 0::bigint),
              ('2999-01-01 11:58:00+00', 1, 0),
              ('2999-01-01 11:59:00+00', 1, 1) $$,
    'throughput counts completed and discarded jobs in the minute they finished, not cancelled ones, not older ones');
SELECT is((SELECT sum(completed) + sum(discarded) FROM treadle.throughput WHERE completed + discarded = 0), 0::numeric,
          'the other minutes are zero');

--------------------------------------------------------------------------------
-- recent_failures
--------------------------------------------------------------------------------
SELECT results_eq(
    $$ SELECT id, queue, name, state, attempt, max_attempts, last_error, failed_at FROM treadle.recent_failures $$,
    format($$ VALUES (%s::bigint, 'qs-c'::text, 'z'::text, 'discarded'::text, 1, 1, 'z2 gave up'::text,
                      '2999-01-01 11:59:10+00'::timestamptz),
                     (%s, 'qs-a', 'x', 'retryable', 1, 25, 'x1 broke', '2999-01-01 11:30:00+00') $$, :z2, :x1),
    'recent_failures: retryable and discarded jobs with an error, newest first; a completed job with an old error is not shown');

SELECT is((SELECT last_error FROM treadle.jobs WHERE id = :z3), 'z3 first try', 'the completed job does keep its old error');

--------------------------------------------------------------------------------
-- workflow_run_overview
--------------------------------------------------------------------------------
SET LOCAL treadle.now = '2999-01-01 12:10:00+00';
SELECT treadle.start_workflow('etl', steps => ARRAY['extract', 'transform', 'load'], queue => 'etl') AS fresh \gset
SELECT treadle.start_workflow('etl', steps => ARRAY['extract', 'transform', 'load'], queue => 'etl') AS halfway \gset
SELECT treadle.start_workflow('short', steps => ARRAY['only'], queue => 'short') AS done_run \gset
CREATE TEMP TABLE steps AS SELECT * FROM treadle.claim('w', ARRAY['etl', 'short'], batch => 10);
SET LOCAL treadle.now = '2999-01-01 12:11:00+00';
SELECT count(*) AS completed_steps FROM steps AS s,
       LATERAL treadle.complete(s.id, s.lease_token, '{}') AS c
 WHERE s.workflow_run_id IN (:halfway, :done_run) \gset
SELECT is(:completed_steps::bigint, 2::bigint, 'two runs had a step completed');
SELECT results_eq(
    format($$ SELECT id, name, state, current_step, steps_done, steps_total, created_at, finished_at
                FROM treadle.workflow_run_overview WHERE id IN (%s, %s, %s) $$, :fresh, :halfway, :done_run),
    format($$ VALUES (%s::bigint, 'short'::text, 'completed'::text, 'only'::text, 1, 1,
                      '2999-01-01 12:10:00+00'::timestamptz, '2999-01-01 12:11:00+00'::timestamptz),
                     (%s, 'etl', 'running', 'transform', 1, 3, '2999-01-01 12:10:00+00', NULL),
                     (%s, 'etl', 'running', 'extract', 0, 3, '2999-01-01 12:10:00+00', NULL) $$,
           :done_run, :halfway, :fresh),
    'workflow_run_overview: newest first, with the current step and steps done of total');
SELECT ok(treadle.cancel_workflow(:fresh), 'a cancel is requested of a run whose step runs');
SELECT is((SELECT treadle.complete(id, lease_token) FROM steps WHERE workflow_run_id = :fresh), 'cancelled',
          'its step finishes as cancelled');
SELECT results_eq(format($$ SELECT state, current_step, finished_at FROM treadle.workflow_run_overview WHERE id = %s $$, :fresh),
                  $$ VALUES ('cancelled'::text, 'extract'::text, '2999-01-01 12:11:00+00'::timestamptz) $$,
                  'a cancelled run shows the step it stopped at');

--------------------------------------------------------------------------------
-- The views read the clock, and are ordered for display
--------------------------------------------------------------------------------
SET LOCAL treadle.now = '2999-01-01 13:00:00+00';
SELECT is((SELECT sum(completed) + sum(discarded) FROM treadle.throughput), 2::numeric,
          'an hour on, only the two steps finished at 12:11 are in the last hour');
SELECT results_eq($$ SELECT queue, state FROM treadle.queue_stats WHERE queue LIKE 'qs-%' $$,
                  $$ SELECT queue, state FROM treadle.queue_stats WHERE queue LIKE 'qs-%' ORDER BY queue, state $$,
                  'queue_stats is ordered by queue and state');
SELECT results_eq($$ SELECT id FROM treadle.workflow_run_overview $$,
                  $$ SELECT id FROM treadle.workflow_runs ORDER BY id DESC $$,
                  'workflow_run_overview shows every run, newest first');

SELECT * FROM finish();
ROLLBACK;
