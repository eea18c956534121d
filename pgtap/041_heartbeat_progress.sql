-- pgtap/041_heartbeat_progress.sql: what a running handler reports: heartbeat
-- (held, cancel, lost) and progress, both fenced by the lease token.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(38);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

SELECT has_function('treadle', 'heartbeat', ARRAY['bigint', 'uuid', 'interval', 'text'], 'treadle.heartbeat exists');
SELECT has_function('treadle', 'progress', ARRAY['bigint', 'uuid', 'double precision', 'text', 'text'], 'treadle.progress exists');

--------------------------------------------------------------------------------
-- heartbeat
--------------------------------------------------------------------------------
SELECT id AS a, lease_token AS a_tok FROM pg_temp.leased() \gset
SET LOCAL treadle.now = '2999-01-01 12:00:20+00';
SELECT is(treadle.heartbeat(:a, :'a_tok'), 'held', 'a heartbeat with the token: held');
SELECT is((pg_temp.job(:a)).lease_until, '2999-01-01 12:00:50+00'::timestamptz, 'the lease moves to now + 30 seconds');
SELECT is(treadle.heartbeat(:a, :'a_tok', '5 minutes'), 'held', 'a heartbeat with a lease of its own: held');
SELECT is((pg_temp.job(:a)).lease_until, '2999-01-01 12:05:20+00'::timestamptz, 'the lease moves to now + lease');
SELECT results_eq(format($$ SELECT state, attempt, lease_token FROM treadle.jobs WHERE id = %s $$, :a),
                  format($$ VALUES ('running'::text, 1, %L::uuid) $$, :'a_tok'),
                  'a heartbeat changes only the lease');

SET LOCAL treadle.now = '2999-01-01 13:00:00+00';
SELECT is(treadle.heartbeat(:a, :'a_tok'), 'held', 'an expired lease nobody took over is still held');
SELECT is((pg_temp.job(:a)).lease_until, '2999-01-01 13:00:30+00'::timestamptz, 'and is extended from now');

SELECT is(treadle.heartbeat(:a, gen_random_uuid()), 'lost', 'a wrong token: lost');
SELECT is((pg_temp.job(:a)).lease_until, '2999-01-01 13:00:30+00'::timestamptz, 'a wrong token does not move the lease');
SELECT is(treadle.heartbeat(-1, gen_random_uuid()), 'lost', 'an unknown job: lost');

SELECT ok(treadle.cancel(:a), 'a cancel is requested');
SELECT is(treadle.heartbeat(:a, :'a_tok'), 'cancel', 'after a cancel request the heartbeat says cancel');
SELECT is((pg_temp.job(:a)).lease_until, '2999-01-01 13:00:30+00'::timestamptz, 'and still extends the lease');
SELECT is(treadle.complete(:a, :'a_tok'), 'cancelled', 'the job finishes as cancelled');
SELECT is(treadle.heartbeat(:a, :'a_tok'), 'lost', 'a finished job: lost');

SELECT id AS b, lease_token AS b_tok FROM pg_temp.leased() \gset
SELECT throws_ok(format('SELECT treadle.heartbeat(%s, %L, %L)', :b, :'b_tok', '0 seconds'), '22023', NULL,
                 'a zero lease raises 22023');
SELECT throws_ok(format('SELECT treadle.heartbeat(%s, %L, %L)', :b, :'b_tok', '-1 minute'), '22023', NULL,
                 'a negative lease raises 22023');
SELECT throws_ok(format('SELECT treadle.heartbeat(%s, %L, NULL)', :b, :'b_tok'), '22004', NULL, 'a null lease raises 22004');
SELECT throws_ok(format('SELECT treadle.heartbeat(NULL, %L)', :'b_tok'), '22004', NULL, 'a null job_id raises 22004');
SELECT throws_ok(format('SELECT treadle.heartbeat(%s, NULL)', :b), '22004', NULL, 'a null lease_token raises 22004');
SELECT is((pg_temp.job(:b)).lease_until, '2999-01-01 13:00:30+00'::timestamptz, 'a bad heartbeat does not move the lease');

--------------------------------------------------------------------------------
-- progress
--------------------------------------------------------------------------------
SELECT ok(treadle.progress(:b, :'b_tok', 0.25, 'a quarter'), 'progress with the token: true');
SELECT results_eq(format($$ SELECT progress, progress_message FROM treadle.jobs WHERE id = %s $$, :b),
                  $$ VALUES (0.25::double precision, 'a quarter'::text) $$, 'the fraction and message are stored');
SELECT ok(treadle.progress(:b, :'b_tok', 1), 'progress 1 without a message: true');
SELECT results_eq(format($$ SELECT progress, progress_message FROM treadle.jobs WHERE id = %s $$, :b),
                  $$ VALUES (1::double precision, NULL::text) $$, 'the message is replaced too');
SELECT ok(treadle.progress(:b, :'b_tok', 0), 'progress 0 is allowed');
SELECT ok(NOT treadle.progress(:b, gen_random_uuid(), 0.9, 'stale'), 'a wrong token: false');
SELECT results_eq(format($$ SELECT progress, progress_message FROM treadle.jobs WHERE id = %s $$, :b),
                  $$ VALUES (0::double precision, NULL::text) $$, 'a wrong token changes nothing');

SELECT throws_ok(format('SELECT treadle.progress(%s, %L, -0.1)', :b, :'b_tok'), '22023', NULL, 'a fraction below 0 raises 22023');
SELECT throws_ok(format('SELECT treadle.progress(%s, %L, 1.5)', :b, :'b_tok'), '22023', NULL, 'a fraction above 1 raises 22023');
SELECT throws_ok(format($$ SELECT treadle.progress(%s, %L, 'NaN') $$, :b, :'b_tok'), '22023', NULL, 'a NaN fraction raises 22023');
SELECT throws_ok(format('SELECT treadle.progress(%s, %L, NULL)', :b, :'b_tok'), '22004', NULL, 'a null fraction raises 22004');
SELECT throws_ok(format('SELECT treadle.progress(NULL, %L, 0.5)', :'b_tok'), '22004', NULL, 'a null job_id raises 22004');
SELECT is((pg_temp.job(:b)).progress, 0::double precision, 'bad progress calls change nothing');

-- A new claim starts with no progress
SELECT is(treadle.release(:b, :'b_tok'), 'available', 'the job is released');
SELECT is((SELECT progress FROM treadle.claim('w', ARRAY[(pg_temp.job(:b)).queue])), NULL,
          'a new claim clears the progress of the last one');

SELECT * FROM finish();
ROLLBACK;
