-- pgtap/053_policies.sql: retry policies and timeouts. A job's own backoff list
-- (enqueue, enqueue_many) with jitter, fail's retryable flag, snooze, and rescue's
-- timeout: a job running past its timeout is taken back even while it heartbeats.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(74);
\ir helpers.psql

SET LOCAL TimeZone = 'UTC';
SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

SELECT has_function('treadle', 'snooze', ARRAY['bigint', 'uuid', 'interval', 'text'], 'treadle.snooze exists');
SELECT function_returns('treadle', 'snooze', ARRAY['bigint', 'uuid', 'interval', 'text'], 'text', 'it returns text');

-- pg_temp.leased_with(timeout, backoff, max_attempts): one job with a policy, claimed by 'w'
CREATE FUNCTION pg_temp.leased_with(timeout interval, backoff interval[], max_attempts integer DEFAULT 25)
RETURNS treadle.jobs
LANGUAGE plpgsql
AS $$
DECLARE
    v_queue text := 'p-' || gen_random_uuid();
    v_job   treadle.jobs;
BEGIN
    PERFORM treadle.enqueue('job', queue => v_queue, max_attempts => leased_with.max_attempts,
                            run_at => '2000-01-01 00:00:00+00', timeout => leased_with.timeout,
                            backoff => leased_with.backoff);
    SELECT * INTO STRICT v_job FROM treadle.claim('w', ARRAY[v_queue]);
    RETURN v_job;
END;
$$;

--------------------------------------------------------------------------------
-- enqueue: timeout and backoff are stored; bad ones are refused, nothing written
--------------------------------------------------------------------------------
SELECT treadle.enqueue('stored', timeout => '90 seconds', backoff => '{10 seconds, 1 minute}') AS stored \gset
SELECT results_eq(format($$ SELECT timeout, backoff FROM treadle.jobs WHERE id = %s $$, :stored),
                  $$ VALUES (interval '90 seconds', ARRAY[interval '10 seconds', interval '1 minute']) $$,
                  'enqueue stores timeout and backoff');
SELECT treadle.enqueue('plain') AS plain \gset
SELECT results_eq(format($$ SELECT timeout, backoff FROM treadle.jobs WHERE id = %s $$, :plain),
                  $$ VALUES (NULL::interval, NULL::interval[]) $$, 'by default both are null');
SELECT results_eq(format($$ SELECT timeout, backoff FROM treadle.job_details WHERE id = %s $$, :stored),
                  $$ VALUES (interval '90 seconds', ARRAY[interval '10 seconds', interval '1 minute']) $$,
                  'job_details shows them');

SELECT count(*) AS before FROM treadle.jobs \gset
SELECT throws_ok($$ SELECT treadle.enqueue('x', timeout => '0 seconds') $$, '22023', NULL, 'a zero timeout is refused');
SELECT throws_ok($$ SELECT treadle.enqueue('x', timeout => '-1 second') $$, '22023', NULL, 'a negative timeout is refused');
SELECT throws_ok($$ SELECT treadle.enqueue('x', timeout => '8 days') $$, '22023', NULL, 'a timeout over 7 days is refused');
SELECT throws_ok($$ SELECT treadle.enqueue('x', backoff => '{}') $$, '22023', NULL, 'an empty backoff is refused');
SELECT throws_ok($$ SELECT treadle.enqueue('x', backoff => '{{1 second}, {2 seconds}}') $$, '22023', NULL,
                 'a two-dimensional backoff is refused');
SELECT throws_ok($$ SELECT treadle.enqueue('x', backoff => array_fill(interval '1 second', ARRAY[101])) $$, '22023', NULL,
                 'a backoff of 101 delays is refused');
SELECT throws_ok($$ SELECT treadle.enqueue('x', backoff => '{1 second, NULL}') $$, '22023', NULL,
                 'a backoff holding a null is refused');
SELECT throws_ok($$ SELECT treadle.enqueue('x', backoff => '{-1 second}') $$, '22023', NULL,
                 'a negative delay is refused');
SELECT throws_ok($$ SELECT treadle.enqueue('x', backoff => '{367 days}') $$, '22023', NULL,
                 'a delay over 366 days is refused');
SELECT lives_ok($$ SELECT treadle.enqueue('edge', backoff => array_fill(interval '0', ARRAY[100]), timeout => '7 days') $$,
                'the bounds themselves pass: 100 zero delays, a timeout of 7 days');
SELECT is((SELECT count(*) FROM treadle.jobs), :before::bigint + 1, 'the refused calls wrote nothing');

--------------------------------------------------------------------------------
-- enqueue_many: the same keys, as interval strings
--------------------------------------------------------------------------------
SELECT array_agg(id) AS many FROM treadle.enqueue_many(
    '[{"name": "m1", "timeout": "5 minutes", "backoff": ["1 second", "2 seconds", "3 seconds"]},
      {"name": "m2", "backoff": ["1 hour"]},
      {"name": "m3", "timeout": null, "backoff": null}]') AS id \gset
SELECT results_eq(format($$ SELECT timeout, backoff FROM treadle.jobs WHERE id = ANY (%L) ORDER BY id $$, :'many'),
                  $$ VALUES (interval '5 minutes', ARRAY[interval '1 second', interval '2 seconds', interval '3 seconds']),
                            (NULL::interval, ARRAY[interval '1 hour']),
                            (NULL::interval, NULL::interval[]) $$,
                  'enqueue_many stores each job''s timeout and backoff, ragged lists included');
SELECT count(*) AS before FROM treadle.jobs \gset
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "timeout": 5}]') $$, '22023', NULL,
                 'enqueue_many: a timeout that is not a string is refused');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "timeout": "0 seconds"}]') $$, '22023', NULL,
                 'enqueue_many: a zero timeout is refused');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "timeout": "soon"}]') $$, '22023', NULL,
                 'enqueue_many: a timeout that is not an interval is refused');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "backoff": "1 second"}]') $$, '22023', NULL,
                 'enqueue_many: a backoff that is not an array is refused');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "backoff": []}]') $$, '22023', NULL,
                 'enqueue_many: an empty backoff is refused');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "backoff": [1]}]') $$, '22023', NULL,
                 'enqueue_many: a delay that is not a string is refused');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "backoff": ["later"]}]') $$, '22023', NULL,
                 'enqueue_many: a delay that is not an interval is refused');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "ok"}, {"name": "x", "backoff": ["-5 seconds"]}]') $$, '22023', NULL,
                 'enqueue_many: a negative delay is refused');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "backoff": ["1 second", null]}]') $$, '22023', NULL,
                 'enqueue_many: a null delay is refused');
SELECT is((SELECT count(*) FROM treadle.jobs), :before::bigint, 'the refused batches wrote nothing');

--------------------------------------------------------------------------------
-- fail: a job's own backoff, with jitter
--------------------------------------------------------------------------------
SELECT id AS b, lease_token AS b_tok, queue AS b_q FROM pg_temp.leased_with(NULL, '{10 seconds, 1 minute}') \gset
SELECT is(treadle.fail(:b, :'b_tok', 'x'), 'retryable', 'a job with a backoff list fails: retryable');
SELECT ok((pg_temp.job(:b)).run_at BETWEEN '2999-01-01 12:00:05+00' AND '2999-01-01 12:00:10+00',
          'after attempt 1 it waits its first delay, jittered: 5 to 10 s');
SET LOCAL treadle.now = '2999-01-01 12:01:00+00';
SELECT lease_token AS b_tok FROM treadle.claim('w', ARRAY[:'b_q']) \gset
SELECT is(treadle.fail(:b, :'b_tok', 'x'), 'retryable', 'attempt 2 fails');
SELECT ok((pg_temp.job(:b)).run_at BETWEEN '2999-01-01 12:01:30+00' AND '2999-01-01 12:02:00+00',
          'after attempt 2 it waits its second delay: 30 to 60 s');
SET LOCAL treadle.now = '2999-01-01 12:05:00+00';
SELECT lease_token AS b_tok FROM treadle.claim('w', ARRAY[:'b_q']) \gset
SELECT is(treadle.fail(:b, :'b_tok', 'x'), 'retryable', 'attempt 3 fails');
SELECT ok((pg_temp.job(:b)).run_at BETWEEN '2999-01-01 12:05:30+00' AND '2999-01-01 12:06:00+00',
          'past the end of the list, the last delay repeats');
SET LOCAL treadle.now = '2999-01-01 12:10:00+00';
SELECT lease_token AS b_tok FROM treadle.claim('w', ARRAY[:'b_q']) \gset
SELECT is(treadle.fail(:b, :'b_tok', 'x', retry_in => '3 hours'), 'retryable', 'attempt 4 fails with retry_in');
SELECT is((pg_temp.job(:b)).run_at, '2999-01-01 15:10:00+00'::timestamptz, 'an explicit retry_in wins, exactly');
SELECT ok((SELECT count(DISTINCT treadle._retry_delay(1, '{100 seconds}')) > 1 FROM generate_series(1, 20)),
          'a job''s own delays are jittered too');
SELECT is_empty($$ SELECT d FROM generate_series(1, 200), LATERAL (SELECT treadle._retry_delay(1, '{100 seconds}') AS d) AS s
                    WHERE d < interval '50 seconds' OR d > interval '100 seconds' $$,
                'every jittered delay lies between half the delay and the delay');
SELECT is(treadle._retry_delay(1, '{0 seconds}'), interval '0', 'a zero delay stays zero');

--------------------------------------------------------------------------------
-- fail(retryable => false): discarded at once
--------------------------------------------------------------------------------
SET LOCAL treadle.now = '2999-01-02 12:00:00+00';
SELECT id AS d, lease_token AS d_tok FROM pg_temp.leased() \gset
SELECT throws_ok(format($$ SELECT treadle.fail(%s, %L, 'x', retryable => NULL) $$, :d, :'d_tok'), '22004', NULL,
                 'retryable null is refused');
SELECT is((pg_temp.job(:d)).state, 'running', 'and the job is untouched');
SELECT is(treadle.fail(:d, :'d_tok', 'bad input', retryable => false), 'discarded',
          'an error that is not retryable discards the job with attempts left');
SELECT results_eq(format($$ SELECT state, attempt, max_attempts, finished_at, last_error, jsonb_array_length(errors),
                                   lease_until FROM treadle.jobs WHERE id = %s $$, :d),
                  $$ VALUES ('discarded'::text, 1, 25, '2999-01-02 12:00:00+00'::timestamptz, 'bad input'::text, 1,
                             NULL::timestamptz) $$,
                  'discarded now: finished, its error recorded, max_attempts unchanged');
SELECT is(treadle.fail(:d, :'d_tok', 'bad input', retryable => false), 'discarded',
          'repeating the call with the same token says what the first did');
SELECT is(treadle.fail(:d, gen_random_uuid(), 'x', retryable => false), NULL, 'a wrong token: null');
SELECT id AS dc, lease_token AS dc_tok FROM pg_temp.leased() \gset
SELECT ok(treadle.cancel(:dc), 'a cancel is requested while it runs');
SELECT is(treadle.fail(:dc, :'dc_tok', 'bad input', retryable => false), 'cancelled',
          'a requested cancel still wins over a discard');
SELECT id AS dw, lease_token AS dw_tok FROM pg_temp.leased(every => '1 hour') \gset
SELECT is(treadle.fail(:dw, :'dw_tok', 'bad input', retryable => false), 'discarded', 'a periodic occurrence is discarded');
SELECT isnt((pg_temp.job(:dw)).next_id, NULL, 'and its series goes on, as after any discard');

--------------------------------------------------------------------------------
-- snooze: run again later without spending an attempt
--------------------------------------------------------------------------------
SELECT id AS s, lease_token AS s_tok FROM pg_temp.leased() \gset
SELECT throws_ok(format($$ SELECT treadle.snooze(%s, %L, NULL) $$, :s, :'s_tok'), '22004', NULL, 'a null delay is refused');
SELECT throws_ok(format($$ SELECT treadle.snooze(NULL, %L, '1 minute') $$, :'s_tok'), '22004', NULL, 'a null job_id is refused');
SELECT throws_ok(format($$ SELECT treadle.snooze(%s, NULL, '1 minute') $$, :s), '22004', NULL, 'a null token is refused');
SELECT throws_ok(format($$ SELECT treadle.snooze(%s, %L, '-1 second') $$, :s, :'s_tok'), '22023', NULL,
                 'a negative delay is refused');
SELECT throws_ok(format($$ SELECT treadle.snooze(%s, %L, '367 days') $$, :s, :'s_tok'), '22023', NULL,
                 'a delay over 366 days is refused');
SELECT results_eq(format($$ SELECT state, attempt FROM treadle.jobs WHERE id = %s $$, :s),
                  $$ VALUES ('running'::text, 1) $$, 'the refused calls changed nothing');
SELECT is(treadle.snooze(:s, :'s_tok', '10 minutes'), 'available', 'snooze: available again');
SELECT results_eq(format($$ SELECT state, attempt, run_at, lease_until, finished_at, last_error, errors
                              FROM treadle.jobs WHERE id = %s $$, :s),
                  $$ VALUES ('available'::text, 0, '2999-01-02 12:10:00+00'::timestamptz, NULL::timestamptz,
                             NULL::timestamptz, NULL::text, '[]'::jsonb) $$,
                  'due after the delay, its attempt given back, no error recorded');
SELECT is(treadle.snooze(:s, :'s_tok', '10 minutes'), 'available', 'repeating the call with the same token says what the first did');
SELECT is(treadle.snooze(:s, gen_random_uuid(), '1 minute'), NULL, 'a wrong token: null');
SELECT is(treadle.heartbeat(:s, :'s_tok'), 'lost', 'the snoozed claim''s token no longer holds the job');
SELECT is_empty(format($$ SELECT * FROM treadle.claim('w', ARRAY[%L]) $$, (pg_temp.job(:s)).queue),
                'a snoozed job is not claimed before its time');
SET LOCAL treadle.now = '2999-01-02 12:10:00+00';
SELECT is((SELECT attempt FROM treadle.claim('w', ARRAY[(pg_temp.job(:s)).queue])), 1,
          'at its time it is claimed, as attempt 1 again');
SELECT id AS sc, lease_token AS sc_tok FROM pg_temp.leased() \gset
SELECT ok(treadle.cancel(:sc), 'a cancel is requested while it runs');
SELECT is(treadle.snooze(:sc, :'sc_tok', '1 minute'), 'cancelled', 'snoozing a job whose cancel was asked cancels it');

--------------------------------------------------------------------------------
-- rescue: a job past its timeout is taken back, heartbeats or not
--------------------------------------------------------------------------------
SET LOCAL treadle.now = '2999-01-03 12:00:00+00';
SELECT treadle.rescue() AS earlier \gset
-- (the leases of the jobs above have expired by now: that rescue returned them)
SELECT id AS t, lease_token AS t_tok FROM pg_temp.leased_with('1 minute', '{30 seconds}') \gset
SELECT id AS tl, lease_token AS tl_tok FROM pg_temp.leased_with('1 minute', NULL, max_attempts => 1) \gset
SELECT id AS n, lease_token AS n_tok FROM pg_temp.leased() \gset
SET LOCAL treadle.now = '2999-01-03 12:01:05+00';
SELECT is(treadle.heartbeat(:t, :'t_tok'), 'held', 'a heartbeat past the timeout still answers held');
SELECT is(treadle.heartbeat(:tl, :'tl_tok'), 'held', 'for each job');
SELECT is(treadle.heartbeat(:n, :'n_tok'), 'held', 'and for the job without a timeout');
SELECT is(treadle.rescue(), 0, 'up to 5 s past the timeout, rescue leaves the job to its worker');
SET LOCAL treadle.now = '2999-01-03 12:01:06+00';
SELECT is(treadle.rescue(), 2, 'then rescue takes back both jobs past their timeout, though their leases hold');
SELECT results_eq(format($$ SELECT state, attempt, lease_until, lease_token, last_error FROM treadle.jobs WHERE id = %s $$, :t),
                  $$ VALUES ('retryable'::text, 1, NULL::timestamptz, NULL::uuid,
                             'timed out: attempt 1 ran past its timeout of 00:01:00 on worker w'::text) $$,
                  'retryable, its token dropped, with a timeout error');
SELECT ok((pg_temp.job(:t)).run_at BETWEEN '2999-01-03 12:01:21+00' AND '2999-01-03 12:01:36+00',
          'a timeout is a failure: the retry waits the job''s backoff');
SELECT results_eq(format($$ SELECT state, finished_at FROM treadle.jobs WHERE id = %s $$, :tl),
                  $$ VALUES ('discarded'::text, '2999-01-03 12:01:06+00'::timestamptz) $$,
                  'with its attempts spent, a timed-out job is discarded');
SELECT is((pg_temp.job(:n)).state, 'running', 'a job without a timeout keeps running while its lease holds');
SELECT is(treadle.heartbeat(:t, :'t_tok'), 'lost', 'the timed-out claim''s heartbeat now says lost');
SELECT is(treadle.fail(:t, :'t_tok', 'late'), NULL, 'and its late failure writes nothing');

SELECT * FROM finish();
ROLLBACK;
