-- pgtap/050_finish.sql: the ways a claim ends: complete, complete_many, fail
-- (with the default backoff) and release. Every write is fenced by the lease token.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(99);
\ir helpers.psql

SET LOCAL TimeZone = 'UTC';  -- errors[].at is written in the session's time zone
SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

SELECT has_function('treadle', 'complete', ARRAY['bigint', 'uuid', 'jsonb', 'text'], 'treadle.complete exists');
SELECT has_function('treadle', 'complete_many', ARRAY['bigint[]', 'uuid[]', 'jsonb[]', 'text[]'], 'treadle.complete_many exists');
SELECT has_function('treadle', 'fail', ARRAY['bigint', 'uuid', 'text', 'interval', 'boolean', 'text'], 'treadle.fail exists');
SELECT has_function('treadle', 'release', ARRAY['bigint', 'uuid', 'text'], 'treadle.release exists');

--------------------------------------------------------------------------------
-- complete
--------------------------------------------------------------------------------
SELECT id AS a, lease_token AS a_tok FROM pg_temp.leased() \gset
SELECT is(treadle.complete(:a, :'a_tok', '{"sent": 3}'), 'completed', 'complete with the token: completed');
SELECT results_eq(
    format($$ SELECT state, result, finished_at, lease_until, lease_token, worker_id, attempt
                FROM treadle.jobs WHERE id = %s $$, :a),
    format($$ VALUES ('completed'::text, '{"sent": 3}'::jsonb, '2999-01-01 12:00:00+00'::timestamptz,
                      NULL::timestamptz, %L::uuid, 'w'::text, 1) $$, :'a_tok'),
    'a completed job keeps its result, worker and finishing token, finished now, its lease time cleared');
SET LOCAL treadle.now = '2999-01-01 12:05:00+00';
SELECT is(treadle.complete(:a, :'a_tok', '{"sent": 4}'), 'completed',
          'completing again with the same token (a lost answer) says what the first call did');
SELECT is(treadle.fail(:a, :'a_tok', 'late'), NULL, 'failing a job the token completed returns null');
SELECT is(treadle.complete(:a, gen_random_uuid()), NULL, 'completing with another token returns null');
SELECT results_eq(format($$ SELECT result, finished_at FROM treadle.jobs WHERE id = %s $$, :a),
                  $$ VALUES ('{"sent": 3}'::jsonb, '2999-01-01 12:00:00+00'::timestamptz) $$,
                  'a second complete changes nothing');

SELECT id AS b, lease_token AS b_tok FROM pg_temp.leased() \gset
SELECT is(treadle.complete(:b, gen_random_uuid()), NULL, 'a wrong token returns null');
SELECT results_eq(format($$ SELECT state, lease_token, result FROM treadle.jobs WHERE id = %s $$, :b),
                  format($$ VALUES ('running'::text, %L::uuid, NULL::jsonb) $$, :'b_tok'),
                  'a wrong token changes nothing');
SELECT is(treadle.complete(:b, :'b_tok'), 'completed', 'the right token still completes it');
SELECT is((pg_temp.job(:b)).result, NULL, 'the default result is null');
SELECT is(treadle.complete(-1, gen_random_uuid()), NULL, 'an unknown job returns null');

SELECT treadle.enqueue('waiting', run_at => '2000-01-01 00:00:00+00') AS waiting \gset
SELECT is(treadle.complete(:waiting, gen_random_uuid()), NULL, 'a job that is not running cannot be completed');
SELECT is((pg_temp.job(:waiting)).state, 'available', 'it stays available');

-- An expired lease that nobody took over still holds
SELECT id AS c, lease_token AS c_tok FROM pg_temp.leased() \gset
SET LOCAL treadle.now = '2999-01-01 18:00:00+00';
SELECT is(treadle.complete(:c, :'c_tok'), 'completed', 'an expired lease not taken over still completes');

-- A cancel requested while running finishes as cancelled, result kept
SELECT id AS d, lease_token AS d_tok FROM pg_temp.leased() \gset
SELECT ok(treadle.cancel(:d), 'a cancel is requested of a running job');
SELECT is(treadle.complete(:d, :'d_tok', '{"partial": true}'), 'cancelled', 'complete after a cancel request: cancelled');
SELECT results_eq(format($$ SELECT state, result, finished_at FROM treadle.jobs WHERE id = %s $$, :d),
                  $$ VALUES ('cancelled'::text, '{"partial": true}'::jsonb, '2999-01-01 18:00:00+00'::timestamptz) $$,
                  'the cancelled job keeps its result and is finished');

SELECT id AS e, lease_token AS e_tok FROM pg_temp.leased() \gset
SELECT throws_ok(format('SELECT treadle.complete(NULL, %L)', :'e_tok'), '22004', NULL, 'a null job_id raises 22004');
SELECT throws_ok(format('SELECT treadle.complete(%s, NULL)', :e), '22004', NULL, 'a null lease_token raises 22004');
SELECT results_eq(format($$ SELECT state, lease_token FROM treadle.jobs WHERE id = %s $$, :e),
                  format($$ VALUES ('running'::text, %L::uuid) $$, :'e_tok'), 'a bad complete changes nothing');

--------------------------------------------------------------------------------
-- complete_many
--------------------------------------------------------------------------------
SET LOCAL treadle.now = '2999-01-02 12:00:00+00';
SELECT id AS m1, lease_token AS m1_tok FROM pg_temp.leased() \gset
SELECT id AS m2, lease_token AS m2_tok FROM pg_temp.leased() \gset
SELECT id AS m3, lease_token AS m3_tok FROM pg_temp.leased() \gset
SELECT id AS m4, lease_token AS m4_tok FROM pg_temp.leased() \gset
SELECT ok(treadle.cancel(:m4), 'a cancel is requested of one of them');
SELECT results_eq(
    format($$ SELECT job_id, state FROM treadle.complete_many(
                  ARRAY[%s, %s, %s, %s]::bigint[], ARRAY[%L, %L, %L, %L]::uuid[],
                  ARRAY['{"n": 3}', '{"n": 1}', '{"n": 2}', '{"n": 4}']::jsonb[]) $$,
           :m3, :m1, :m2, :m4, :'m3_tok', :'m1_tok', gen_random_uuid(), :'m4_tok'),
    format($$ VALUES (%s::bigint, 'completed'::text), (%s, 'completed'), (%s, NULL), (%s, 'cancelled') $$,
           :m3, :m1, :m2, :m4),
    'one row per input in input order: completed, null for a stale token, cancelled where requested');
SELECT results_eq(format($$ SELECT result FROM treadle.jobs WHERE id IN (%s, %s, %s) ORDER BY id $$, :m1, :m3, :m4),
                  $$ VALUES ('{"n": 1}'::jsonb), ('{"n": 3}'::jsonb), ('{"n": 4}'::jsonb) $$,
                  'each result is stored on the job it pairs with');
SELECT results_eq(format($$ SELECT state, lease_token, result FROM treadle.jobs WHERE id = %s $$, :m2),
                  format($$ VALUES ('running'::text, %L::uuid, NULL::jsonb) $$, :'m2_tok'),
                  'the job named with a stale token is untouched');
SELECT is((pg_temp.job(:m1)).finished_at, '2999-01-02 12:00:00+00'::timestamptz, 'finished_at is now');
SELECT results_eq(
    format($$ SELECT job_id, state FROM treadle.complete_many(ARRAY[%s, %s]::bigint[], ARRAY[%L, %L]::uuid[]) $$,
           :m1, :m2, :'m1_tok', :'m2_tok'),
    format($$ VALUES (%s::bigint, 'completed'::text), (%s, 'completed') $$, :m1, :m2),
    'a job the token finished before says so again (a repeat); results may be left out');
SELECT results_eq(
    format($$ SELECT job_id, state FROM treadle.complete_many(ARRAY[%s]::bigint[], ARRAY[gen_random_uuid()]) $$, :m1),
    format($$ VALUES (%s::bigint, NULL::text) $$, :m1),
    'a job another token finished returns null');
SELECT is((pg_temp.job(:m2)).result, NULL, 'without results the result is null');
SELECT is_empty($$ SELECT * FROM treadle.complete_many(ARRAY[]::bigint[], ARRAY[]::uuid[]) $$,
                'empty arrays return no rows');

SELECT id AS m5, lease_token AS m5_tok FROM pg_temp.leased() \gset
SELECT results_eq(
    format($$ SELECT count(*) FILTER (WHERE state = 'completed'), count(*)
                FROM treadle.complete_many(ARRAY[%s, %s]::bigint[], ARRAY[%L, %L]::uuid[]) $$,
           :m5, :m5, :'m5_tok', :'m5_tok'),
    $$ VALUES (2::bigint, 2::bigint) $$,
    'a job named twice is completed once, and both rows say completed');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE id = :m5 AND state = 'completed'), 1::bigint, 'one job, completed');

-- a workflow step named twice moves its run once, by id alone and with its queue
SELECT treadle.start_workflow('twice', '{}', steps => ARRAY['a', 'b', 'c'], queue => 'twice') AS tw \gset
SELECT id AS tw_a, lease_token AS tw_a_tok FROM treadle.claim('w', ARRAY['twice']) \gset
SELECT results_eq(
    format($$ SELECT state FROM treadle.complete_many(ARRAY[%s, %s]::bigint[], ARRAY[%L, %L]::uuid[],
                                                      ARRAY['{"r": 1}', '{"r": 2}']::jsonb[]) $$,
           :tw_a, :tw_a, :'tw_a_tok', :'tw_a_tok'),
    $$ VALUES ('completed'::text), ('completed') $$, 'a step named twice: both rows say completed');
SELECT results_eq(format($$ SELECT step, state FROM treadle.jobs WHERE workflow_run_id = %s ORDER BY id $$, :tw),
                  $$ VALUES ('a'::text, 'completed'::text), ('b', 'available') $$,
                  'and its run enqueues the next step once');
SELECT is((SELECT jsonb_object_keys(results) FROM treadle.workflow_runs WHERE id = :tw), 'a',
          'the run holds the step''s result');
SELECT id AS tw_b, lease_token AS tw_b_tok FROM treadle.claim('w', ARRAY['twice']) \gset
SELECT results_eq(
    format($$ SELECT state FROM treadle.complete_many(ARRAY[%s, %s]::bigint[], ARRAY[%L, %L]::uuid[],
                                                      job_queues => ARRAY['twice', 'twice']) $$,
           :tw_b, :tw_b, :'tw_b_tok', :'tw_b_tok'),
    $$ VALUES ('completed'::text), ('completed') $$, 'named twice with its queue: both rows say completed');
SELECT results_eq(format($$ SELECT step, state FROM treadle.jobs WHERE workflow_run_id = %s ORDER BY id $$, :tw),
                  $$ VALUES ('a'::text, 'completed'::text), ('b', 'completed'), ('c', 'available') $$,
                  'and its run enqueues the next step once');

SELECT id AS m6, lease_token AS m6_tok FROM pg_temp.leased() \gset
SELECT throws_ok(format('SELECT * FROM treadle.complete_many(ARRAY[%s, 1]::bigint[], ARRAY[%L]::uuid[])', :m6, :'m6_tok'),
                 '22023', NULL, 'job_ids and lease_tokens of different lengths raise 22023');
SELECT throws_ok(format($$ SELECT * FROM treadle.complete_many(ARRAY[%s]::bigint[], ARRAY[%L]::uuid[],
                                                              ARRAY['{}', '{}']::jsonb[]) $$, :m6, :'m6_tok'),
                 '22023', NULL, 'results of another length raise 22023');
SELECT throws_ok(format('SELECT * FROM treadle.complete_many(NULL, ARRAY[%L]::uuid[])', :'m6_tok'),
                 '22004', NULL, 'null job_ids raise 22004');
SELECT throws_ok(format('SELECT * FROM treadle.complete_many(ARRAY[%s]::bigint[], NULL)', :m6),
                 '22004', NULL, 'null lease_tokens raise 22004');
SELECT results_eq(format($$ SELECT state, lease_token FROM treadle.jobs WHERE id = %s $$, :m6),
                  format($$ VALUES ('running'::text, %L::uuid) $$, :'m6_tok'), 'a bad complete_many changes nothing');

--------------------------------------------------------------------------------
-- fail
--------------------------------------------------------------------------------
SET LOCAL treadle.now = '2999-01-03 12:00:00+00';
SELECT id AS f, lease_token AS f_tok FROM pg_temp.leased() \gset
SELECT is(treadle.fail(:f, :'f_tok', 'smtp timeout', '10 minutes'), 'retryable', 'fail with attempts left: retryable');
SELECT results_eq(
    format($$ SELECT state, run_at, attempt, last_error, failed_at, finished_at, lease_until, lease_token, errors
                FROM treadle.jobs WHERE id = %s $$, :f),
    format($$ VALUES ('retryable'::text, '2999-01-03 12:10:00+00'::timestamptz, 1, 'smtp timeout'::text,
               '2999-01-03 12:00:00+00'::timestamptz, NULL::timestamptz, NULL::timestamptz, %L::uuid,
               '[{"attempt": 1, "at": "2999-01-03T12:00:00+00:00", "error": "smtp timeout", "worker": "w",
                  "started_at": "2999-01-03T12:00:00+00:00"}]'::jsonb) $$, :'f_tok'),
    'a retryable job: due at now + retry_in, the error kept with the attempt''s worker and start, the lease time cleared, not finished');
SELECT is(treadle.fail(:f, :'f_tok', 'again'), 'retryable', 'failing again with the same token says what the first call did');
SELECT is(treadle.complete(:f, :'f_tok'), NULL, 'completing a job the token failed returns null');
SELECT is((pg_temp.job(:f)).last_error, 'smtp timeout', 'a stale fail changes nothing');
SET LOCAL treadle.now = '2999-01-03 12:10:00+00';
SELECT is((SELECT lease_token FROM treadle.claim('w', ARRAY[(pg_temp.job(:f)).queue])), (pg_temp.job(:f)).lease_token,
          'the retryable job is claimed again when due');
SELECT is(treadle.fail(:f, (pg_temp.job(:f)).lease_token, 'still down', '0 seconds'), 'retryable',
          'a retry_in of zero is allowed');
SELECT results_eq(
    format($$ SELECT run_at, attempt, jsonb_array_length(errors), errors -> 1 ->> 'error' FROM treadle.jobs WHERE id = %s $$, :f),
    $$ VALUES ('2999-01-03 12:10:00+00'::timestamptz, 2, 2, 'still down'::text) $$,
    'retry_in zero: due now; errors keep every attempt');

SELECT id AS g, lease_token AS g_tok FROM pg_temp.leased() \gset
SELECT is(treadle.fail(:g, gen_random_uuid(), 'nope'), NULL, 'a wrong token returns null');
SELECT results_eq(format($$ SELECT state, lease_token, last_error FROM treadle.jobs WHERE id = %s $$, :g),
                  format($$ VALUES ('running'::text, %L::uuid, NULL::text) $$, :'g_tok'), 'a wrong token changes nothing');
SELECT is(treadle.fail(:g, :'g_tok', NULL), 'retryable', 'a null error is accepted');
SELECT is((pg_temp.job(:g)).last_error, '(no error message)', 'a null error is stored as a placeholder');

-- The default backoff: 2^attempt seconds, at most an hour, with equal jitter (half to all of it)
SELECT id AS h, lease_token AS h_tok FROM pg_temp.leased() \gset
SELECT is(treadle.fail(:h, :'h_tok', 'x'), 'retryable', 'fail without retry_in: retryable');
SELECT ok((SELECT run_at - '2999-01-03 12:10:00+00'::timestamptz >= interval '1 second'
              AND run_at - '2999-01-03 12:10:00+00'::timestamptz <= interval '2 seconds'
             FROM treadle.jobs WHERE id = :h),
          'after attempt 1 the default backoff is between 1 and 2 s');
SELECT is_empty(
    $$ SELECT a, b FROM generate_series(0, 11) AS a, generate_series(1, 50) AS sample,
              LATERAL (SELECT extract(epoch FROM treadle._backoff(a)) AS b) AS s
        WHERE b < 2 ^ a / 2 OR b > 2 ^ a $$,
    'for attempts 0 to 11 every backoff lies in [2^attempt / 2, 2^attempt] seconds');
SELECT ok((SELECT min(extract(epoch FROM treadle._backoff(10))) < 640 AND max(extract(epoch FROM treadle._backoff(10))) > 896
             FROM generate_series(1, 200)),
          'the jitter spreads over the range: 200 draws for attempt 10 reach below 5/8 and above 7/8 of 1024 s');
SELECT ok((SELECT count(DISTINCT treadle._backoff(3)) > 1 FROM generate_series(1, 50)), 'the backoff has jitter');
SELECT is_empty(
    $$ SELECT a FROM generate_series(12, 40) AS a
        WHERE treadle._backoff(a) NOT BETWEEN interval '30 minutes' AND interval '1 hour'
       UNION ALL SELECT 2147483647
        WHERE treadle._backoff(2147483647) NOT BETWEEN interval '30 minutes' AND interval '1 hour' $$,
    'from attempt 12 on the backoff is one hour, jittered: 30 to 60 minutes');

-- the cap through fail itself: attempts 1 to 10 fail at once, then 11 and 12 back off
SELECT id AS cap, lease_token AS cap_tok FROM pg_temp.leased(max_attempts => 20) \gset
DO $$
DECLARE
    v_job treadle.jobs := pg_temp.job((SELECT max(id) FROM treadle.jobs));  -- the job just leased
BEGIN
    FOR i IN 1 .. 9 LOOP
        PERFORM treadle.fail(v_job.id, v_job.lease_token, 'again', '0 seconds');
        SELECT * INTO STRICT v_job FROM treadle.claim('w', ARRAY[v_job.queue]);
    END LOOP;
    PERFORM treadle.fail(v_job.id, v_job.lease_token, 'again', '0 seconds');
END;
$$;
SELECT results_eq(format($$ SELECT state, attempt FROM treadle.jobs WHERE id = %s $$, :cap),
                  $$ VALUES ('retryable'::text, 10) $$, 'ten attempts failed');
SELECT lease_token AS cap_tok FROM treadle.claim('w', ARRAY[(pg_temp.job(:cap)).queue]) \gset
SELECT is(treadle.fail(:cap, :'cap_tok', 'x'), 'retryable', 'attempt 11 fails with the default backoff');
SELECT ok((SELECT run_at - '2999-01-03 12:10:00+00'::timestamptz >= interval '1024 seconds'
              AND run_at - '2999-01-03 12:10:00+00'::timestamptz <= interval '2048 seconds'
             FROM treadle.jobs WHERE id = :cap),
          'after attempt 11 the backoff is between 1024 and 2048 s');
SET LOCAL treadle.now = '2999-01-03 13:00:00+00';
SELECT lease_token AS cap_tok FROM treadle.claim('w', ARRAY[(pg_temp.job(:cap)).queue]) \gset
SELECT is(treadle.fail(:cap, :'cap_tok', 'x'), 'retryable', 'attempt 12 fails with the default backoff');
SELECT ok((pg_temp.job(:cap)).run_at BETWEEN '2999-01-03 13:30:00+00' AND '2999-01-03 14:00:00+00',
          'after attempt 12 the backoff is capped at one hour (jittered: 30 to 60 minutes)');

-- The error history keeps the newest 20 attempts
SELECT id AS hist FROM pg_temp.leased('history', max_attempts => 60) \gset
DO $$
DECLARE
    v_job treadle.jobs := pg_temp.job((SELECT max(id) FROM treadle.jobs));  -- the job just leased
BEGIN
    FOR i IN 1 .. 54 LOOP
        PERFORM treadle.fail(v_job.id, v_job.lease_token, 'failure ' || i, '0 seconds');
        SELECT * INTO STRICT v_job FROM treadle.claim('w', ARRAY[v_job.queue]);
    END LOOP;
    PERFORM treadle.fail(v_job.id, v_job.lease_token, 'failure 55', '0 seconds');
END;
$$;
SELECT results_eq(
    format($$ SELECT attempt, jsonb_array_length(errors), errors -> 0 ->> 'attempt', errors -> 19 ->> 'error', last_error
                FROM treadle.jobs WHERE id = %s $$, :hist),
    $$ VALUES (55, 20, '36'::text, 'failure 55'::text, 'failure 55'::text) $$,
    'after 55 failures the error history holds the newest 20, oldest first');

-- Attempts spent: discarded
SELECT id AS once, lease_token AS once_tok FROM pg_temp.leased(max_attempts => 1) \gset
SELECT is(treadle.fail(:once, :'once_tok', 'fatal'), 'discarded', 'fail on the last attempt: discarded');
SELECT results_eq(format($$ SELECT state, finished_at, run_at, last_error, lease_token FROM treadle.jobs WHERE id = %s $$, :once),
                  format($$ VALUES ('discarded'::text, '2999-01-03 13:00:00+00'::timestamptz,
                                    '2000-01-01 00:00:00+00'::timestamptz, 'fatal'::text, %L::uuid) $$, :'once_tok'),
                  'a discarded job is finished now, keeps its error, its run_at and its finishing token');
SELECT id AS twice, lease_token AS twice_tok FROM pg_temp.leased(max_attempts => 2) \gset
SELECT is(treadle.fail(:twice, :'twice_tok', 'one', '0 seconds'), 'retryable', 'attempt 1 of 2 fails: retryable');
SELECT lease_token AS twice_tok FROM treadle.claim('w', ARRAY[(pg_temp.job(:twice)).queue]) \gset
SELECT is(treadle.fail(:twice, :'twice_tok', 'two', '0 seconds'), 'discarded', 'attempt 2 of 2 fails: discarded, whatever retry_in');

-- A cancel requested: cancelled
SELECT id AS fc, lease_token AS fc_tok FROM pg_temp.leased() \gset
SELECT ok(treadle.cancel(:fc), 'a cancel is requested');
SELECT is(treadle.fail(:fc, :'fc_tok', 'aborted'), 'cancelled', 'fail after a cancel request: cancelled');
SELECT results_eq(format($$ SELECT state, finished_at, last_error FROM treadle.jobs WHERE id = %s $$, :fc),
                  $$ VALUES ('cancelled'::text, '2999-01-03 13:00:00+00'::timestamptz, 'aborted'::text) $$,
                  'the cancelled job is finished and keeps the error');

-- Bad input
SELECT id AS fb, lease_token AS fb_tok FROM pg_temp.leased() \gset
SELECT throws_ok(format($$ SELECT treadle.fail(%s, %L, 'x', '-1 second') $$, :fb, :'fb_tok'), '22023',
                 'treadle: retry_in must be zero or more and at most 366 days, got -00:00:01', 'a negative retry_in raises 22023');
SELECT throws_ok(format($$ SELECT treadle.fail(%s, %L, 'x', '300000 years') $$, :fb, :'fb_tok'), '22023',
                 'treadle: retry_in must be zero or more and at most 366 days, got 300000 years',
                 'a retry_in past the range raises 22023, not 22008');
SELECT throws_ok(format($$ SELECT treadle.fail(NULL, %L, 'x') $$, :'fb_tok'), '22004', NULL, 'a null job_id raises 22004');
SELECT throws_ok(format($$ SELECT treadle.fail(%s, NULL, 'x') $$, :fb), '22004', NULL, 'a null lease_token raises 22004');
SELECT results_eq(format($$ SELECT state, lease_token, last_error, errors FROM treadle.jobs WHERE id = %s $$, :fb),
                  format($$ VALUES ('running'::text, %L::uuid, NULL::text, '[]'::jsonb) $$, :'fb_tok'),
                  'a bad fail changes nothing');

--------------------------------------------------------------------------------
-- release
--------------------------------------------------------------------------------
SET LOCAL treadle.now = '2999-01-04 12:00:00+00';
SELECT id AS r, lease_token AS r_tok FROM pg_temp.leased() \gset
SELECT is(treadle.release(:r, :'r_tok'), 'available', 'release with the token: available');
SELECT results_eq(format($$ SELECT state, attempt, run_at, lease_until, lease_token, finished_at FROM treadle.jobs WHERE id = %s $$, :r),
                  format($$ VALUES ('available'::text, 0, '2999-01-04 12:00:00+00'::timestamptz, NULL::timestamptz,
                                    %L::uuid, NULL::timestamptz) $$, :'r_tok'),
                  'a released job is due now with its attempt given back');
SELECT is(treadle.release(:r, :'r_tok'), 'available', 'releasing again with the same token says what the first call did');
SELECT results_eq(format($$ SELECT id, attempt FROM treadle.claim('w2', ARRAY[%L]) $$, (pg_temp.job(:r)).queue),
                  format($$ VALUES (%s::bigint, 1) $$, :r), 'a released job is claimed again as attempt 1');
SELECT is(treadle.release(:r, :'r_tok'), NULL, 'the old token cannot release the new claim');
SELECT is((pg_temp.job(:r)).worker_id, 'w2', 'the new claim is untouched');
SELECT is(treadle.complete(:r, :'r_tok'), NULL, 'nor complete it');

SELECT id AS r2, lease_token AS r2_tok FROM pg_temp.leased() \gset
SELECT is(treadle.fail(:r2, :'r2_tok', 'x', '0 seconds'), 'retryable', 'attempt 1 failed');
SELECT lease_token AS r2_tok FROM treadle.claim('w', ARRAY[(pg_temp.job(:r2)).queue]) \gset
SELECT is(treadle.release(:r2, :'r2_tok'), 'available', 'attempt 2 released');
SELECT is((pg_temp.job(:r2)).attempt, 1, 'release gives back only the attempt its claim took');

SELECT id AS r3, lease_token AS r3_tok FROM pg_temp.leased() \gset
SELECT is(treadle.release(:r3, gen_random_uuid()), NULL, 'a wrong token returns null');
SELECT is((pg_temp.job(:r3)).state, 'running', 'a wrong token changes nothing');
SELECT ok(treadle.cancel(:r3), 'a cancel is requested');
SELECT is(treadle.release(:r3, :'r3_tok'), 'cancelled', 'release after a cancel request: cancelled');
SELECT results_eq(format($$ SELECT state, finished_at, attempt FROM treadle.jobs WHERE id = %s $$, :r3),
                  $$ VALUES ('cancelled'::text, '2999-01-04 12:00:00+00'::timestamptz, 1) $$,
                  'the released cancelled job is finished');

SELECT id AS r4, lease_token AS r4_tok FROM pg_temp.leased() \gset
SELECT throws_ok(format('SELECT treadle.release(NULL, %L)', :'r4_tok'), '22004', NULL, 'a null job_id raises 22004');
SELECT throws_ok(format('SELECT treadle.release(%s, NULL)', :r4), '22004', NULL, 'a null lease_token raises 22004');
SELECT is((pg_temp.job(:r4)).lease_token, :'r4_tok'::uuid, 'a bad release changes nothing');

SELECT * FROM finish();
ROLLBACK;
