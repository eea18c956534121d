-- pgtap/060_cancel_retry.sql: the operator's controls. treadle.cancel (at once, or
-- requested of a running job) and treadle.retry (a finished or waiting job runs again).
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(38);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

SELECT has_function('treadle', 'cancel', ARRAY['bigint', 'text'], 'treadle.cancel(bigint, text) exists');
SELECT has_function('treadle', 'retry', ARRAY['bigint', 'text'], 'treadle.retry(bigint, text) exists');

--------------------------------------------------------------------------------
-- cancel
--------------------------------------------------------------------------------
SELECT treadle.enqueue('c', queue => 'cancel') AS avail \gset
SELECT ok(treadle.cancel(:avail), 'an available job is cancelled: true');
SELECT results_eq(format($$ SELECT state, finished_at FROM treadle.jobs WHERE id = %s $$, :avail),
                  $$ VALUES ('cancelled'::text, '2999-01-01 12:00:00+00'::timestamptz) $$,
                  'it is cancelled and finished now');
SELECT ok(NOT treadle.cancel(:avail), 'cancelling it again: false');
SELECT is_empty($$ SELECT * FROM treadle.claim('w', ARRAY['cancel']) $$, 'a cancelled job is never claimed');

SELECT id AS retryable, lease_token AS retryable_tok FROM pg_temp.leased() \gset
SELECT is(treadle.fail(:retryable, :'retryable_tok', 'x', '1 hour'), 'retryable', 'a job waits to retry');
SELECT ok(treadle.cancel(:retryable), 'a retryable job is cancelled: true');
SELECT is((pg_temp.job(:retryable)).state, 'cancelled', 'it is cancelled at once');

SELECT id AS running, lease_token AS running_tok FROM pg_temp.leased() \gset
SELECT ok(treadle.cancel(:running), 'a running job gets a cancel request: true');
SELECT results_eq(format($$ SELECT state, cancel_requested, lease_token, finished_at FROM treadle.jobs WHERE id = %s $$, :running),
                  format($$ VALUES ('running'::text, true, %L::uuid, NULL::timestamptz) $$, :'running_tok'),
                  'it keeps running, with its lease, until its worker finishes it');
SELECT ok(NOT treadle.cancel(:running), 'a second cancel of it: false');
SELECT is(treadle.heartbeat(:running, :'running_tok'), 'cancel', 'its heartbeat says cancel');
SELECT is(treadle.fail(:running, :'running_tok', 'aborted'), 'cancelled', 'its fail finishes it as cancelled');

SELECT id AS done, lease_token AS done_tok FROM pg_temp.leased() \gset
SELECT is(treadle.complete(:done, :'done_tok'), 'completed', 'a job is completed');
SELECT ok(NOT treadle.cancel(:done), 'a completed job cannot be cancelled: false');
SELECT is((pg_temp.job(:done)).state, 'completed', 'it stays completed');
SELECT ok(NOT treadle.cancel(-1), 'an unknown id: false');
SELECT throws_ok('SELECT treadle.cancel(NULL)', '22004', NULL, 'a null job_id raises 22004');

--------------------------------------------------------------------------------
-- retry
--------------------------------------------------------------------------------
SET LOCAL treadle.now = '2999-01-02 12:00:00+00';
SELECT id AS disc, lease_token AS disc_tok FROM pg_temp.leased(max_attempts => 1) \gset
SELECT is(treadle.fail(:disc, :'disc_tok', 'fatal'), 'discarded', 'a job is discarded');
SET LOCAL treadle.now = '2999-01-02 13:00:00+00';
SELECT ok(treadle.retry(:disc), 'a discarded job is retried: true');
SELECT results_eq(format($$ SELECT state, attempt, run_at, finished_at, last_error FROM treadle.jobs WHERE id = %s $$, :disc),
                  $$ VALUES ('available'::text, 0, '2999-01-02 13:00:00+00'::timestamptz, NULL::timestamptz, 'fatal'::text) $$,
                  'it is available now with attempt 0, no longer finished, its last error kept');
SELECT results_eq(format($$ SELECT id, attempt FROM treadle.claim('w', ARRAY[%L]) $$, (pg_temp.job(:disc)).queue),
                  format($$ VALUES (%s::bigint, 1) $$, :disc), 'a retried job is claimed as attempt 1');
SELECT ok(NOT treadle.retry(:disc), 'a running job cannot be retried: false');

SELECT is((pg_temp.job(:avail)).state, 'cancelled', 'a job was cancelled');
SELECT ok(treadle.retry(:avail), 'a cancelled job is retried: true');
SELECT results_eq(format($$ SELECT state, attempt, cancel_requested FROM treadle.jobs WHERE id = %s $$, :avail),
                  $$ VALUES ('available'::text, 0, false) $$, 'it is available again');
SELECT ok(NOT treadle.retry(:avail), 'an available job cannot be retried: false');

SELECT ok(treadle.retry(:running), 'a job cancelled while running is retried: true');
SELECT is((pg_temp.job(:running)).cancel_requested, false, 'its old cancel request is forgotten');
SELECT is(treadle.heartbeat(:running, (SELECT lease_token FROM treadle.claim('w', ARRAY[(pg_temp.job(:running)).queue]))),
          'held', 'claimed again, it is not asked to cancel');

SELECT id AS wait, lease_token AS wait_tok FROM pg_temp.leased() \gset
SELECT is(treadle.fail(:wait, :'wait_tok', 'x', '1 day'), 'retryable', 'a job waits a day to retry');
SELECT ok(treadle.retry(:wait), 'a retryable job is retried: true');
SELECT results_eq(format($$ SELECT state, run_at, attempt FROM treadle.jobs WHERE id = %s $$, :wait),
                  $$ VALUES ('available'::text, '2999-01-02 13:00:00+00'::timestamptz, 0) $$,
                  'it is available now, attempt reset');

SELECT ok(NOT treadle.retry(:done), 'a completed job cannot be retried: false');
SELECT is((pg_temp.job(:done)).state, 'completed', 'it stays completed');
SELECT ok(NOT treadle.retry(-1), 'an unknown id: false');
SELECT throws_ok('SELECT treadle.retry(NULL)', '22004', NULL, 'a null job_id raises 22004');

SELECT * FROM finish();
ROLLBACK;
