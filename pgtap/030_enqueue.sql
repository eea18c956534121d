-- pgtap/030_enqueue.sql: treadle.enqueue and treadle.version. The stored row, the
-- defaults, named notation, idempotency keys, and every bad argument.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(64);

-- treadle's clock stands in the future; enqueue's default run_at follows it.
SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

SELECT has_function('treadle', 'enqueue',
    ARRAY['text', 'jsonb', 'text', 'integer', 'timestamp with time zone', 'integer', 'text', 'interval',
          'interval', 'interval[]', 'text', 'text', 'interval', 'jsonb', 'text'],
    'treadle.enqueue exists with the contract''s argument types, then timeout, backoff, the key options, meta and concurrency_key');
SELECT function_returns('treadle', 'enqueue',
    ARRAY['text', 'jsonb', 'text', 'integer', 'timestamp with time zone', 'integer', 'text', 'interval',
          'interval', 'interval[]', 'text', 'text', 'interval', 'jsonb', 'text'],
    'bigint', 'treadle.enqueue returns bigint');
SELECT ok(treadle.version() ~ '^[0-9]+\.[0-9]+\.[0-9]+$'
          AND treadle.version() = coalesce((SELECT extversion FROM pg_extension WHERE extname = 'treadle'), treadle.version()),
          'treadle.version() names the installed SQL API (the extension''s version, when installed as one)');

-- Defaults
SELECT treadle.enqueue('send_email') AS plain \gset
SELECT results_eq(
    format($$ SELECT queue, name, args, state, priority, run_at, attempt, max_attempts,
                     lease_until, lease_token, worker_id, idempotency_key, result, last_error,
                     created_at, finished_at, workflow_run_id, step, every
                FROM treadle.jobs WHERE id = %s $$, :plain),
    $$ VALUES ('default'::text, 'send_email'::text, '{}'::jsonb, 'available'::text, 0, '2999-01-01 12:00:00+00'::timestamptz, 0, 25,
               NULL::timestamptz, NULL::uuid, NULL::text, NULL::text, NULL::jsonb, NULL::text,
               '2999-01-01 12:00:00+00'::timestamptz, NULL::timestamptz, NULL::bigint, NULL::text,
               NULL::interval) $$,
    'a job enqueued with defaults: queue default, args {}, priority 0, due now by treadle''s clock, 25 attempts, available');

-- Named notation and every argument
SELECT treadle.enqueue('resize', args => '{"w": 640}', queue => 'images', priority => -5,
                       run_at => '2999-01-02 00:00:00+00', max_attempts => 3,
                       idempotency_key => 'resize-1', every => '1 hour') AS full \gset
SELECT results_eq(
    format($$ SELECT queue, name, args, priority, run_at, max_attempts, idempotency_key, every, state
                FROM treadle.jobs WHERE id = %s $$, :full),
    $$ VALUES ('images'::text, 'resize'::text, '{"w": 640}'::jsonb, -5, '2999-01-02 00:00:00+00'::timestamptz,
               3, 'resize-1'::text, '1 hour'::interval, 'available'::text) $$,
    'every argument given by name is stored as given');
SELECT cmp_ok(:full::bigint, '>', :plain::bigint, 'ids grow');

-- Payloads: SQL NULL and JSON null become {}; arrays are kept
SELECT treadle.enqueue('n', NULL) AS sql_null \gset
SELECT treadle.enqueue('n', 'null') AS json_null \gset
SELECT treadle.enqueue('n', '[1, 2]') AS arr \gset
SELECT is((SELECT args FROM treadle.jobs WHERE id = :sql_null), '{}'::jsonb, 'SQL NULL args are stored as {}');
SELECT is((SELECT args FROM treadle.jobs WHERE id = :json_null), '{}'::jsonb, 'JSON null args are stored as {}');
SELECT is((SELECT args FROM treadle.jobs WHERE id = :arr), '[1, 2]'::jsonb, 'array args are stored as given');

-- A null run_at means now, by treadle's clock
SELECT treadle.enqueue('n', run_at => NULL) AS null_run_at \gset
SELECT is((SELECT run_at FROM treadle.jobs WHERE id = :null_run_at), '2999-01-01 12:00:00+00'::timestamptz,
          'a null run_at means now');
SELECT is((SELECT state FROM treadle.jobs WHERE id = :null_run_at), 'available', 'a job is available from its enqueue');

-- Idempotency keys
SELECT treadle.enqueue('report', '{"day": 1}', idempotency_key => 'report-day-1') AS keyed \gset
SELECT is(treadle.enqueue('report', '{"day": 1}', idempotency_key => 'report-day-1'), :keyed::bigint,
          'a second enqueue with the key returns the first job''s id');
SELECT is(treadle.enqueue('other', '{"x": 2}', priority => 5, idempotency_key => 'report-day-1'), :keyed::bigint,
          'the key returns its holder''s id whatever the other arguments');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE idempotency_key = 'report-day-1'), 1::bigint,
          'the key holds one row');
SELECT isnt(treadle.enqueue('report', '{"day": 1}', queue => 'q2', idempotency_key => 'report-day-1'), :keyed::bigint,
            'keys are per queue: the same key in another queue makes another job');
SELECT is((SELECT args FROM treadle.jobs WHERE id = :keyed), '{"day": 1}'::jsonb,
          'a repeated key changes nothing on the holder');
SELECT ok(treadle.cancel(:keyed), 'the holder is cancelled');
SELECT is(treadle.enqueue('report', idempotency_key => 'report-day-1'), :keyed::bigint,
          'a finished holder keeps its key');
SELECT isnt(treadle.enqueue('report', idempotency_key => 'report-day-2'), :keyed::bigint,
            'another key makes another job');
SELECT isnt(treadle.enqueue('report'), treadle.enqueue('report'), 'jobs without a key are never merged');

-- The bounds' edges are taken
SELECT lives_ok($$ SELECT treadle.enqueue(repeat('n', 200)) $$, 'a name of 200 characters is taken');
SELECT lives_ok($$ SELECT treadle.enqueue('x', (repeat('[', 100) || repeat(']', 100))::jsonb) $$,
                'args nested 100 deep are taken');

-- Bad input: each raises its SQLSTATE and writes nothing
CREATE TEMP TABLE before AS SELECT count(*) AS jobs, max(id) AS max_id FROM treadle.jobs;

SELECT throws_ok($$ SELECT treadle.enqueue(NULL) $$, '22004', 'treadle: name must not be null', 'a null name raises 22004');
SELECT throws_ok($$ SELECT treadle.enqueue('') $$, '22023',
                 'treadle: name must be 1 to 200 characters, not only spaces, without control characters',
                 'an empty name raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue(repeat('n', 201)) $$, '22023', NULL, 'a name over 200 characters raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue(E'\t\n') $$, '22023', NULL, 'a name of tabs and newlines raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue(E'a\u0001b') $$, '22023', NULL, 'a control character in a name raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('x', queue => repeat('q', 10000)) $$, '22023', NULL,
                 'a queue of 10,000 characters raises 22023, not 54000');
SELECT throws_ok($$ SELECT treadle.enqueue('x', idempotency_key => repeat('k', 10000)) $$, '22023', NULL,
                 'a key of 10,000 characters raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('x', idempotency_key => '') $$, '22023', NULL, 'an empty key raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('x', (repeat('[', 1500) || repeat(']', 1500))::jsonb) $$, '22023',
                 'treadle: args is nested more than 100 levels deep', 'args nested 1,500 deep raise 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('x', (repeat('[', 101) || repeat(']', 101))::jsonb) $$, '22023', NULL,
                 'args nested 101 deep raise 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('x', jsonb_build_object('blob', repeat('b', 1100000))) $$, '22023', NULL,
                 'args over 1 MiB raise 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('   ') $$, '22023', NULL, 'a blank name raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('x', queue => NULL) $$, '22004', NULL, 'a null queue raises 22004');
SELECT throws_ok($$ SELECT treadle.enqueue('x', queue => '') $$, '22023', NULL, 'an empty queue raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('x', '1') $$, '22023',
                 'treadle: args must be a JSON object or array, not number', 'number args raise 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('x', '"text"') $$, '22023', NULL, 'string args raise 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('x', 'true') $$, '22023', NULL, 'boolean args raise 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('x', priority => NULL) $$, '22004', NULL, 'a null priority raises 22004');
SELECT throws_ok($$ SELECT treadle.enqueue('x', max_attempts => 0) $$, '22023', NULL, 'max_attempts 0 raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('x', max_attempts => -3) $$, '22023', NULL, 'a negative max_attempts raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('x', max_attempts => NULL) $$, '22023', NULL, 'a null max_attempts raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('x', every => '0 seconds') $$, '22023', NULL, 'an every of zero raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('x', every => '-1 minute') $$, '22023', NULL, 'a negative every raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('x', every => '300000 years') $$, '22023',
                 'treadle: every must be positive and at most 10 years, got 300000 years', 'an every over 10 years raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('x', every => '1 year', run_at => '294276-06-01') $$, '22023',
                 'treadle: every is too long: 1 year', 'an every whose next occurrence cannot be stored raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('x', run_at => 'infinity') $$, '22023',
                 'treadle: run_at must be a finite time, got infinity', 'an infinite run_at raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('x', run_at => '-infinity') $$, '22023', NULL,
                 'a run_at of -infinity raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('x', idempotency_key => 'bad-key', max_attempts => 0) $$, '22023', NULL,
                 'a bad call with a key raises 22023');
SELECT results_eq($$ SELECT count(*), max(id) FROM treadle.jobs $$, $$ SELECT jobs, max_id FROM before $$,
                  'no bad call wrote a job');
SELECT treadle.enqueue('x', idempotency_key => 'bad-key') AS after_bad \gset
SELECT cmp_ok(:after_bad::bigint, '>', (SELECT max_id FROM before),
              'a key named in a failed call was not taken: the next enqueue with it inserts');

SELECT is((SELECT state FROM treadle.jobs WHERE id = :plain), 'available', 'bad calls left other jobs alone');

-- Names with any characters are kept as given
SELECT treadle.enqueue('Ünïcödé job', queue => 'Mixed Case') AS odd \gset
SELECT results_eq(format($$ SELECT name, queue FROM treadle.jobs WHERE id = %s $$, :odd),
                  $$ VALUES ('Ünïcödé job'::text, 'Mixed Case'::text) $$, 'names and queues are stored verbatim');

-- Large priorities at both ends of integer
SELECT lives_ok($$ SELECT treadle.enqueue('x', priority => -2147483648) $$, 'the lowest integer priority is allowed');
SELECT lives_ok($$ SELECT treadle.enqueue('x', priority => 2147483647) $$, 'the highest integer priority is allowed');

-- The common call (checked in one expression, the tenant rule and max_depth read by its
-- insert) and the whole way (here: a JSON null meta, or args of 800 bytes or more) write the same row
SELECT treadle.enqueue('same', '{"a": [1, 2]}', queue => 'same_q', priority => 3, max_attempts => 4) AS common \gset
SELECT treadle.enqueue('same', '{"a": [1, 2]}', queue => 'same_q', priority => 3, max_attempts => 4,
                       meta => 'null') AS whole \gset
SELECT is((SELECT to_jsonb(j) - 'id' FROM treadle.jobs AS j WHERE j.id = :common),
          (SELECT to_jsonb(j) - 'id' FROM treadle.jobs AS j WHERE j.id = :whole),
          'the common call stores the row that the whole way stores');
SELECT treadle.enqueue('same', jsonb_build_object('pad', repeat('x', 900)), run_at => '3000-01-01') AS big \gset
SELECT is((SELECT to_jsonb(j) - 'id' - 'args' FROM treadle.jobs AS j WHERE j.id = :big),
          (SELECT to_jsonb(j) - 'id' - 'args' || jsonb_build_object('run_at', '3000-01-01T00:00:00+00:00'::timestamptz)
             FROM treadle.jobs AS j WHERE j.id = :whole) || '{"queue": "default", "priority": 0, "max_attempts": 25}',
          'args of 800 bytes or more go the whole way, to the same row');
SELECT is((SELECT args ->> 'pad' FROM treadle.jobs WHERE id = :big), repeat('x', 900), 'and keep their args');

-- created_at follows treadle's clock
SET LOCAL treadle.now = '2999-01-01 12:30:00+00';
SELECT treadle.enqueue('later') AS later \gset
SELECT is((SELECT created_at FROM treadle.jobs WHERE id = :later), '2999-01-01 12:30:00+00'::timestamptz,
          'created_at is treadle''s clock');
SELECT is((SELECT run_at FROM treadle.jobs WHERE id = :later), '2999-01-01 12:30:00+00'::timestamptz,
          'the default run_at is treadle''s clock');
SELECT is((SELECT finished_at FROM treadle.jobs WHERE id = :later), NULL, 'a new job is not finished');
SELECT is((SELECT errors FROM treadle.jobs WHERE id = :later), '[]'::jsonb, 'a new job has no errors');
SELECT is((SELECT cancel_requested FROM treadle.jobs WHERE id = :later), false, 'a new job has no cancel request');

SELECT * FROM finish();
ROLLBACK;
