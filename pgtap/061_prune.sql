-- pgtap/061_prune.sql: treadle.prune. Finished jobs and finished workflow runs older
-- than the cutoff go; pending work and the steps of running runs stay.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(17);
\ir helpers.psql

SELECT has_function('treadle', 'prune', ARRAY['interval'], 'treadle.prune(interval) exists');

-- Ten days ago
SET LOCAL treadle.now = '2998-12-22 12:00:00+00';
SELECT id AS old_done, lease_token AS tok FROM pg_temp.leased() \gset
SELECT treadle.complete(:old_done, :'tok') AS ignored \gset
SELECT id AS old_discarded, lease_token AS tok FROM pg_temp.leased(max_attempts => 1) \gset
SELECT treadle.fail(:old_discarded, :'tok', 'x') AS ignored \gset
SELECT treadle.enqueue('c', idempotency_key => 'old-key') AS old_cancelled \gset
SELECT treadle.cancel(:old_cancelled) AS ignored \gset
SELECT id AS old_retryable, lease_token AS tok FROM pg_temp.leased() \gset
SELECT treadle.fail(:old_retryable, :'tok', 'x', '30 days') AS ignored \gset
SELECT treadle.enqueue('a', run_at => '2999-06-01 00:00:00+00') AS old_available \gset
SELECT treadle.start_workflow('old', steps => ARRAY['a', 'b'], queue => 'old-run') AS old_run \gset
SELECT treadle.complete(id, lease_token) AS ignored FROM treadle.claim('w', ARRAY['old-run']) \gset
SELECT treadle.complete(id, lease_token) AS ignored FROM treadle.claim('w', ARRAY['old-run']) \gset
SELECT treadle.start_workflow('slow', steps => ARRAY['a', 'b'], queue => 'slow-run') AS slow_run \gset
SELECT treadle.complete(id, lease_token) AS ignored FROM treadle.claim('w', ARRAY['slow-run']) \gset

-- A day ago
SET LOCAL treadle.now = '2998-12-31 12:00:00+00';
SELECT id AS recent_done, lease_token AS tok FROM pg_temp.leased() \gset
SELECT treadle.complete(:recent_done, :'tok') AS ignored \gset

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';
SELECT results_eq(format($$ SELECT state FROM treadle.workflow_runs WHERE id IN (%s, %s) ORDER BY id $$, :old_run, :slow_run),
                  ARRAY['completed', 'running'], 'one old run finished, one still runs');

-- Bad input first: nothing goes
CREATE TEMP TABLE before AS SELECT (SELECT count(*) FROM treadle.jobs) AS jobs, (SELECT count(*) FROM treadle.workflow_runs) AS runs;
SELECT throws_ok($$ SELECT treadle.prune(NULL) $$, '22004', NULL, 'a null older_than raises 22004');
SELECT throws_ok($$ SELECT treadle.prune('-1 day') $$, '22023', 'treadle: older_than must be zero or more and at most 100 years, got -1 days',
                 'a negative older_than raises 22023');
SELECT results_eq($$ SELECT (SELECT count(*) FROM treadle.jobs), (SELECT count(*) FROM treadle.workflow_runs) $$,
                  $$ SELECT jobs, runs FROM before $$, 'a bad prune deletes nothing');

SELECT is(treadle.prune(), 5::bigint,
          'prune() deletes three finished jobs and an old finished run''s two steps, and says how many');
SELECT results_eq(
    format($$ SELECT id FROM treadle.jobs WHERE id IN (%s, %s, %s) $$, :old_done, :old_discarded, :old_cancelled),
    $$ SELECT NULL::bigint WHERE false $$,
    'completed, discarded and cancelled jobs finished more than 7 days ago are gone');
SELECT is((SELECT count(*) FROM treadle.workflow_runs WHERE id = :old_run), 0::bigint, 'the old finished run is gone');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE workflow_run_id = :old_run), 0::bigint, 'with its steps');
SELECT results_eq(format($$ SELECT state FROM treadle.jobs WHERE id IN (%s, %s) ORDER BY id $$, :old_retryable, :old_available),
                  ARRAY['retryable', 'available'], 'old jobs that are still pending stay');
SELECT results_eq(format($$ SELECT step, state FROM treadle.jobs WHERE workflow_run_id = %s ORDER BY id $$, :slow_run),
                  $$ VALUES ('a'::text, 'completed'::text), ('b', 'available') $$,
                  'the old finished step of a run that still runs stays');
SELECT is(treadle.workflow_results(:slow_run), '{"a": null}'::jsonb, 'and the run keeps its results');
SELECT is((pg_temp.job(:recent_done)).state, 'completed', 'a job finished a day ago stays');
SELECT isnt(treadle.enqueue('c', idempotency_key => 'old-key'), :old_cancelled::bigint,
            'the key of a pruned job is free again');

SELECT is(treadle.prune('7 days'), 0::bigint, 'a second prune finds nothing');
SELECT is(treadle.prune('0 seconds'), 1::bigint, 'prune(0) deletes every job finished before now');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE finished_at IS NOT NULL AND workflow_run_id IS NULL), 0::bigint,
          'no finished job outside a running run is left');

SELECT * FROM finish();
ROLLBACK;
