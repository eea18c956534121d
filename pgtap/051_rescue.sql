-- pgtap/051_rescue.sql: treadle.rescue. Expired leases go back to the queue without
-- backoff (or are discarded or cancelled), and the old token is refused from then on.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(31);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

SELECT has_function('treadle', 'rescue', ARRAY[]::text[], 'treadle.rescue() exists');
SELECT function_returns('treadle', 'rescue', ARRAY[]::text[], 'integer', 'it returns integer');
SELECT is(treadle.rescue(), 0, 'nothing to rescue: 0');

SELECT id AS dead, lease_token AS dead_tok FROM pg_temp.leased() \gset
SELECT id AS alive, lease_token AS alive_tok FROM pg_temp.leased(lease => '1 hour') \gset
SELECT id AS spent, lease_token AS spent_tok FROM pg_temp.leased(max_attempts => 1) \gset
SELECT id AS asked, lease_token AS asked_tok FROM pg_temp.leased() \gset
SELECT ok(treadle.cancel(:asked), 'a cancel is requested of one running job');

SET LOCAL treadle.now = '2999-01-01 12:00:30+00';
SELECT is(treadle.rescue(), 0, 'a lease that ends right now has not expired');

SET LOCAL treadle.now = '2999-01-01 12:01:00+00';
SELECT is(treadle.rescue(), 3, 'rescue returns how many expired jobs it moved');
SELECT results_eq(
    format($$ SELECT state, run_at, attempt, lease_until, lease_token, finished_at, failed_at
                FROM treadle.jobs WHERE id = %s $$, :dead),
    $$ VALUES ('retryable'::text, '2999-01-01 12:01:00+00'::timestamptz, 1, NULL::timestamptz, NULL::uuid,
               NULL::timestamptz, '2999-01-01 12:01:00+00'::timestamptz) $$,
    'an expired job with attempts left is retryable now, without backoff, its lease cleared');
SELECT is((pg_temp.job(:dead)).last_error, 'lease expired: worker w stopped heartbeating',
          'the error names the worker that stopped');
SELECT is(jsonb_array_length((pg_temp.job(:dead)).errors), 1, 'the rescue is in the error history');
SELECT results_eq(format($$ SELECT state, finished_at FROM treadle.jobs WHERE id = %s $$, :spent),
                  $$ VALUES ('discarded'::text, '2999-01-01 12:01:00+00'::timestamptz) $$,
                  'an expired job with its attempts spent is discarded');
SELECT results_eq(format($$ SELECT state, finished_at FROM treadle.jobs WHERE id = %s $$, :asked),
                  $$ VALUES ('cancelled'::text, '2999-01-01 12:01:00+00'::timestamptz) $$,
                  'an expired job whose cancel was requested is cancelled');
SELECT results_eq(format($$ SELECT state, lease_token FROM treadle.jobs WHERE id = %s $$, :alive),
                  format($$ VALUES ('running'::text, %L::uuid) $$, :'alive_tok'),
                  'a job whose lease has not expired is untouched');
SELECT is(treadle.rescue(), 0, 'a second rescue finds nothing');

-- The old token is refused everywhere
SELECT is(treadle.complete(:dead, :'dead_tok'), NULL, 'complete with the old token: null');
SELECT is(treadle.fail(:dead, :'dead_tok', 'late'), NULL, 'fail with the old token: null');
SELECT is(treadle.heartbeat(:dead, :'dead_tok'), 'lost', 'heartbeat with the old token: lost');
SELECT ok(NOT treadle.progress(:dead, :'dead_tok', 0.5), 'progress with the old token: false');
SELECT is(treadle.release(:dead, :'dead_tok'), NULL, 'release with the old token: null');
SELECT results_eq(format($$ SELECT state, last_error, progress FROM treadle.jobs WHERE id = %s $$, :dead),
                  $$ VALUES ('retryable'::text, 'lease expired: worker w stopped heartbeating'::text, NULL::double precision) $$,
                  'the old token changed nothing');

-- Claimed again at once, by another worker, with a new token
CREATE TEMP TABLE again AS SELECT * FROM treadle.claim('w2', ARRAY[(pg_temp.job(:dead)).queue]);
SELECT results_eq($$ SELECT id, attempt, worker_id FROM again $$,
                  format($$ VALUES (%s::bigint, 2, 'w2'::text) $$, :dead),
                  'the rescued job is claimed again at once, as attempt 2');
SELECT isnt((SELECT lease_token FROM again), :'dead_tok'::uuid, 'the new claim has a new token');
SELECT is(treadle.complete(:dead, :'dead_tok'), NULL, 'the old token cannot finish the new claim');
SELECT is(treadle.heartbeat(:dead, (SELECT lease_token FROM again)), 'held', 'the new token holds it');
SELECT is(treadle.complete(:dead, (SELECT lease_token FROM again), '{"by": "w2"}'), 'completed', 'the new token completes it');
SELECT is((pg_temp.job(:dead)).result, '{"by": "w2"}'::jsonb, 'the result is the new claimer''s');

-- What follows a rescue: a discarded periodic occurrence starts the next one,
-- a discarded workflow step fails its run, a retryable one leaves the run running
SELECT id AS tick, lease_token AS tick_tok FROM pg_temp.leased(max_attempts => 1, every => '1 hour') \gset
SELECT treadle.start_workflow('flow', steps => ARRAY['one', 'two'], max_attempts => 1) AS run_a \gset
SELECT treadle.start_workflow('flow', steps => ARRAY['one', 'two'], queue => 'flows-b') AS run_b \gset
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['default', 'flows-b'], names => ARRAY['workflow:flow/one'], batch => 2)),
          2::bigint, 'both runs'' first steps are claimed');
SET LOCAL treadle.now = '2999-01-01 13:00:00+00';
SELECT is(treadle.rescue(), 3, 'the periodic job and both steps are rescued');
SELECT results_eq(
    format($$ SELECT state, run_at, every FROM treadle.jobs WHERE name = 'job' AND queue = %L AND id <> %s $$,
           (pg_temp.job(:tick)).queue, :tick),
    $$ VALUES ('available'::text, '2999-01-01 14:00:00+00'::timestamptz, '1 hour'::interval) $$,
    'a rescued periodic occurrence that is discarded starts the next one at now + every');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :run_a), 'failed', 'a step discarded by rescue fails its run');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :run_b), 'running', 'a step rescued with attempts left leaves its run running');
SELECT is((SELECT state FROM treadle.jobs WHERE workflow_run_id = :run_b), 'retryable', 'and the step is retryable');

SELECT * FROM finish();
ROLLBACK;
