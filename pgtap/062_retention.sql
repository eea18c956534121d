-- pgtap/062_retention.sql: treadle.apply_retention and the retention settings
-- (treadle.configure(retain_completed, retain_failed), treadle.queues). Finished work
-- past its retention goes in batches; runs go whole; pending work always stays.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(35);
\ir helpers.psql

SELECT has_function('treadle', 'apply_retention', ARRAY['integer'], 'treadle.apply_retention(integer) exists');
SELECT has_function('treadle', 'configure', ARRAY['interval', 'interval'],
                    'treadle.configure(interval, interval) exists');

-- pg_temp.finished(queue, state): a job in `queue` that ends now in `state`
-- (completed, discarded or cancelled); returns its id.
CREATE FUNCTION pg_temp.finished(queue text, state text, key text DEFAULT NULL) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_job treadle.jobs;
BEGIN
    IF state = 'cancelled' THEN
        v_job.id := treadle.enqueue('r', queue => finished.queue, idempotency_key => finished.key);
        PERFORM treadle.cancel(v_job.id);
        RETURN v_job.id;
    END IF;
    PERFORM treadle.enqueue('r', queue => finished.queue, max_attempts => 1, idempotency_key => finished.key,
                            run_at => '2000-01-01 00:00:00+00');
    SELECT * INTO STRICT v_job FROM treadle.claim('w', ARRAY[finished.queue]);
    IF state = 'completed' THEN
        PERFORM treadle.complete(v_job.id, v_job.lease_token);
    ELSE
        PERFORM treadle.fail(v_job.id, v_job.lease_token, 'boom');
    END IF;
    RETURN v_job.id;
END;
$$;
-- pg_temp.gone(ids): how many of these jobs are gone
CREATE FUNCTION pg_temp.gone(VARIADIC ids bigint[]) RETURNS bigint LANGUAGE sql AS $$
    SELECT cardinality(ids) - (SELECT count(*) FROM treadle.jobs AS j WHERE j.id = ANY (ids))
$$;

-- The defaults, before anyone configures anything
DELETE FROM treadle.settings;
SELECT results_eq($$ SELECT * FROM treadle._retention() $$,
                  $$ VALUES (interval '7 days', interval '30 days') $$,
                  'without settings: completed kept 7 days, discarded and cancelled 30 days');
SELECT treadle.configure(max_payload_bytes => 4096);
SELECT results_eq($$ SELECT max_payload_bytes, retain_completed, retain_failed FROM treadle.settings $$,
                  $$ VALUES (4096, interval '7 days', interval '30 days') $$,
                  'configure(max_payload_bytes) writes the retention defaults with its row');

-- 40 days ago
SET LOCAL treadle.now = '2998-11-22 12:00:00+00';
SELECT pg_temp.finished('mail', 'discarded') AS discarded_40d \gset
SELECT pg_temp.finished('mail', 'cancelled') AS cancelled_40d \gset
SELECT treadle.start_workflow('failing', steps => ARRAY['a', 'b'], queue => 'runs', max_attempts => 1) AS failed_run_40d \gset
SELECT treadle.fail(id, lease_token, 'boom') AS ignored FROM treadle.claim('w', ARRAY['runs']) \gset
-- 10 days ago
SET LOCAL treadle.now = '2998-12-22 12:00:00+00';
SELECT pg_temp.finished('mail', 'completed', 'key-10d') AS completed_10d \gset
SELECT pg_temp.finished('mail', 'completed') AS completed_10d_b \gset
SELECT pg_temp.finished('mail', 'completed') AS completed_10d_c \gset
SELECT pg_temp.finished('mail', 'discarded') AS discarded_10d \gset
SELECT pg_temp.finished('audit', 'completed') AS audit_10d \gset
SELECT pg_temp.finished('audit', 'discarded') AS audit_discarded_10d \gset
SELECT id AS retryable_10d, lease_token AS tok FROM pg_temp.leased() \gset
SELECT treadle.fail(:retryable_10d, :'tok', 'x', '60 days') AS ignored \gset
SELECT treadle.enqueue('later', run_at => '2999-06-01 00:00:00+00') AS available_10d \gset
SELECT treadle.start_workflow('old', steps => ARRAY['a', 'b'], queue => 'runs') AS done_run_10d \gset
SELECT treadle.complete(id, lease_token) AS ignored FROM treadle.claim('w', ARRAY['runs']) \gset
SELECT treadle.complete(id, lease_token) AS ignored FROM treadle.claim('w', ARRAY['runs']) \gset
SELECT treadle.start_workflow('slow', steps => ARRAY['a', 'b'], queue => 'slow-runs') AS running_run \gset
SELECT treadle.complete(id, lease_token) AS ignored FROM treadle.claim('w', ARRAY['slow-runs']) \gset
-- two hours ago
SET LOCAL treadle.now = '2999-01-01 10:00:00+00';
SELECT pg_temp.finished('fast', 'completed') AS fast_2h \gset
SELECT pg_temp.finished('mail', 'completed') AS completed_2h \gset
SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

-- Queues with their own retention: audit keeps completed work 100 years (failures
-- follow the global 30 days), fast keeps completed work one hour.
SELECT treadle.set_queue('audit', retain_completed => '100 years'),
       treadle.set_queue('fast', retain_completed => '1 hour');

-- Bad input first: nothing goes, nothing changes
CREATE TEMP TABLE before AS
SELECT (SELECT count(*) FROM treadle.jobs) AS jobs, (SELECT count(*) FROM treadle.workflow_runs) AS runs,
       (SELECT s FROM treadle.settings AS s) AS settings;
SELECT throws_ok($$ SELECT treadle.apply_retention(NULL) $$, '22004', 'treadle: batch must not be null',
                 'a null batch raises 22004');
SELECT throws_ok($$ SELECT treadle.apply_retention(0) $$, '22023', 'treadle: batch must be between 1 and 100000, got 0',
                 'a zero batch raises 22023');
SELECT throws_ok($$ SELECT treadle.apply_retention(-5) $$, '22023', NULL, 'a negative batch raises 22023');
SELECT throws_ok($$ SELECT treadle.apply_retention(100001) $$, '22023', NULL, 'a batch over 100000 raises 22023');
SELECT throws_ok($$ SELECT treadle.configure(retain_completed => '-1 day', retain_failed => NULL) $$, '22023',
                 'treadle: retain_completed must be zero or more and at most 100 years, got -1 days',
                 'a negative retain_completed raises 22023');
SELECT throws_ok($$ SELECT treadle.configure(retain_completed => NULL, retain_failed => '101 years') $$, '22023', NULL,
                 'a retain_failed over 100 years raises 22023');
SELECT throws_ok($$ SELECT treadle.configure(retain_completed => '1 day') $$, '42883', NULL,
                 'configure names the whole policy: both periods are given');
SELECT results_eq($$ SELECT (SELECT count(*) FROM treadle.jobs), (SELECT count(*) FROM treadle.workflow_runs),
                            (SELECT s FROM treadle.settings AS s)::text $$,
                  $$ SELECT jobs, runs, settings::text FROM before $$, 'bad input deletes and changes nothing');

-- Global null keeps forever, unless a queue says otherwise
SELECT treadle.configure(retain_completed => NULL, retain_failed => NULL);
SELECT results_eq($$ SELECT max_payload_bytes, retain_completed, retain_failed FROM treadle.settings $$,
                  $$ VALUES (4096, NULL::interval, NULL::interval) $$,
                  'configure(retention) keeps max_payload_bytes and stores null as forever');
SELECT is(treadle.apply_retention(), 1::bigint, 'with the global kept forever, only the fast queue''s own hour applies');
SELECT is(pg_temp.gone(:fast_2h), 1::bigint, 'the fast queue''s job completed two hours ago is gone');
SELECT treadle.set_queue('fast');  -- no setting left: the queue's row goes
SELECT treadle.set_queue('audit');
SELECT is(treadle.apply_retention(), 0::bigint, 'with every retention null nothing goes');

-- The defaults again: completed 7 days, failed 30 days; audit keeps completed work 100 years
SELECT treadle.configure(retain_completed => '7 days', retain_failed => '30 days');
SELECT treadle.set_queue('audit', retain_completed => '100 years');
SELECT is(treadle.apply_retention(batch => 2), 2::bigint,
          'a batch of 2: the oldest run (failed 40 days ago, one step job) and the oldest job');
SELECT is((SELECT count(*) FROM treadle.workflow_runs WHERE id = :failed_run_40d), 0::bigint,
          'the run failed 40 days ago is gone first');
SELECT is((SELECT count(*) FROM treadle.workflow_runs WHERE id = :done_run_10d), 1::bigint,
          'the next run stays: its two steps do not fit the batch''s room left');
SELECT is(treadle.apply_retention(batch => 2), 2::bigint, 'the next batch: that run and its two steps');
SELECT is(treadle.apply_retention(batch => 2), 2::bigint, 'then 2 more jobs');
SELECT is(treadle.apply_retention(batch => 2), 2::bigint, 'and the last 2');
SELECT is(treadle.apply_retention(batch => 2), 0::bigint, 'then nothing is left: fewer than the batch, caught up');

SELECT is(pg_temp.gone(:discarded_40d, :cancelled_40d), 2::bigint,
          'discarded and cancelled jobs finished 40 days ago are gone');
SELECT is(pg_temp.gone(:completed_10d, :completed_10d_b, :completed_10d_c), 3::bigint,
          'jobs completed 10 days ago are gone');
SELECT is((SELECT count(*) FROM treadle.workflow_runs WHERE id = :done_run_10d), 0::bigint,
          'a run completed 10 days ago is gone');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE workflow_run_id = :done_run_10d), 0::bigint, 'with its steps');
SELECT is(pg_temp.gone(:discarded_10d), 0::bigint, 'a job discarded 10 days ago stays (30 days)');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE workflow_run_id = :failed_run_40d), 0::bigint,
          'the failed run''s step went with it');
SELECT is(pg_temp.gone(:audit_10d), 0::bigint, 'the audit queue keeps its completed job (100 years)');
SELECT is(pg_temp.gone(:audit_discarded_10d), 0::bigint, 'and its failure, under the global 30 days');
SELECT is(pg_temp.gone(:retryable_10d, :available_10d), 0::bigint, 'old jobs still pending stay');
SELECT results_eq(format($$ SELECT step, state FROM treadle.jobs WHERE workflow_run_id = %s ORDER BY id $$, :running_run),
                  $$ VALUES ('a'::text, 'completed'::text), ('b', 'available') $$,
                  'the old finished step of a run that still runs stays');
SELECT is(pg_temp.gone(:completed_2h), 0::bigint, 'a job completed two hours ago stays');
SELECT isnt(treadle.enqueue('c', queue => 'mail', idempotency_key => 'key-10d'), :completed_10d::bigint,
            'the idempotency key of a deleted job is free again');
