-- pgtap/070_workflows.sql: workflows in SQL. define_workflow, start_workflow, each
-- step's completion enqueuing the next, failure, retry, cancel, and workflow_results.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(100);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

SELECT has_function('treadle', 'define_workflow', ARRAY['text', 'text[]', 'jsonb', 'jsonb', 'jsonb', 'jsonb', 'jsonb', 'jsonb', 'jsonb'], 'treadle.define_workflow exists');
SELECT has_function('treadle', 'start_workflow', ARRAY['text', 'jsonb', 'text[]', 'text', 'integer', 'integer', 'text', 'jsonb', 'jsonb', 'jsonb', 'jsonb', 'jsonb', 'jsonb', 'jsonb', 'jsonb'],
                    'treadle.start_workflow exists with the contract''s argument types');
SELECT has_function('treadle', 'cancel_workflow', ARRAY['bigint'], 'treadle.cancel_workflow exists');
SELECT has_function('treadle', 'workflow_results', ARRAY['bigint'], 'treadle.workflow_results exists');
SELECT is((SELECT array_agg(column_name::text ORDER BY ordinal_position) FROM information_schema.columns
            WHERE table_schema = 'treadle' AND table_name = 'workflow_runs'
              AND column_name = ANY (ARRAY['id', 'name', 'input', 'state', 'steps'])),
          ARRAY['id', 'name', 'input', 'state', 'steps'], 'treadle.workflow_runs has id, name, input, state, steps');

-- pg_temp.step(run): the run's newest step job
CREATE FUNCTION pg_temp.step(run_id bigint) RETURNS treadle.jobs LANGUAGE sql AS $$
    SELECT * FROM treadle.jobs WHERE workflow_run_id = run_id ORDER BY id DESC LIMIT 1
$$;
-- pg_temp.claim_step(run): claim the run's pending step; its lease token
CREATE FUNCTION pg_temp.claim_step(run_id bigint) RETURNS uuid LANGUAGE sql AS $$
    SELECT c.lease_token
      FROM treadle.claim('w', ARRAY[(pg_temp.step(run_id)).queue], names => ARRAY[(pg_temp.step(run_id)).name], batch => 1000) AS c
     WHERE c.workflow_run_id = run_id
$$;

--------------------------------------------------------------------------------
-- A run from a definition, step by step
--------------------------------------------------------------------------------
SELECT lives_ok($$ SELECT treadle.define_workflow('signup', ARRAY['create', 'email', 'done']) $$,
                'a workflow is defined');
SELECT treadle.start_workflow('signup', '{"user": 7}', queue => 'flows', priority => 2, max_attempts => 3) AS r1 \gset
SELECT results_eq(
    format($$ SELECT name, input, state, steps, results, created_at, finished_at FROM treadle.workflow_runs WHERE id = %s $$, :r1),
    $$ VALUES ('signup'::text, '{"user": 7}'::jsonb, 'running'::text, ARRAY['create', 'email', 'done'], '{}'::jsonb,
               '2999-01-01 12:00:00+00'::timestamptz, NULL::timestamptz) $$,
    'a run records its input and the defined steps, and is running');
SELECT results_eq(
    format($$ SELECT name, args, step, queue, priority, max_attempts, state FROM treadle.jobs WHERE workflow_run_id = %s $$, :r1),
    $$ VALUES ('workflow:signup/create'::text, '{}'::jsonb, 'create'::text, 'flows'::text, 2, 3, 'available'::text) $$,
    'its first step is one job named workflow:<name>/<step> with args {} in the run''s queue');
SELECT is(treadle.workflow_results(:r1), '{}'::jsonb, 'workflow_results is {} before any step finished');
SELECT is(treadle.workflow_results(-1), NULL, 'workflow_results is null for an unknown run');

SELECT pg_temp.claim_step(:r1) AS s1_tok \gset
SELECT (pg_temp.step(:r1)).id AS s1 \gset
SET LOCAL treadle.now = '2999-01-01 12:01:00+00';
SELECT is(treadle.complete(:s1, :'s1_tok', '{"account": 70}'), 'completed', 'the first step completes');
SELECT is(treadle.workflow_results(:r1), '{"create": {"account": 70}}'::jsonb, 'its result is stored under its step name');
SELECT results_eq(
    format($$ SELECT step, state, name, run_at, attempt FROM treadle.jobs WHERE workflow_run_id = %s AND id <> %s $$, :r1, :s1),
    $$ VALUES ('email'::text, 'available'::text, 'workflow:signup/email'::text, '2999-01-01 12:01:00+00'::timestamptz, 0) $$,
    'completing a step enqueues the next, due now');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :r1), 'running', 'the run goes on');
SELECT is(treadle.complete(:s1, :'s1_tok', '{"account": 71}'), 'completed',
          'completing the step again with its token (a lost answer) says completed');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE workflow_run_id = :r1), 2::bigint,
          'the repeat enqueues no second next step');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE workflow_run_id = :r1), 2::bigint, 'and no second next step appears');
SELECT is(treadle.workflow_results(:r1), '{"create": {"account": 70}}'::jsonb, 'the stored result is unchanged');

SELECT (pg_temp.step(:r1)).id AS s2 \gset
SELECT pg_temp.claim_step(:r1) AS s2_tok \gset
SELECT is(treadle.fail(:s2, :'s2_tok', 'smtp down', '0 seconds'), 'retryable', 'the second step fails once');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :r1), 'running', 'a retryable step leaves the run running');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE workflow_run_id = :r1), 2::bigint, 'a retryable step enqueues nothing');
SELECT pg_temp.claim_step(:r1) AS s2_tok \gset
SELECT is(treadle.complete(:s2, :'s2_tok', '"sent"'), 'completed', 'the second step completes on its second attempt');

SELECT (pg_temp.step(:r1)).id AS s3 \gset
SELECT is((pg_temp.job(:s3)).step, 'done', 'the last step is enqueued');
SELECT pg_temp.claim_step(:r1) AS s3_tok \gset
SET LOCAL treadle.now = '2999-01-01 12:02:00+00';
SELECT is(treadle.complete(:s3, :'s3_tok'), 'completed', 'the last step completes');
SELECT results_eq(format($$ SELECT state, finished_at FROM treadle.workflow_runs WHERE id = %s $$, :r1),
                  $$ VALUES ('completed'::text, '2999-01-01 12:02:00+00'::timestamptz) $$,
                  'completing the last step completes the run');
SELECT is(treadle.workflow_results(:r1), '{"create": {"account": 70}, "email": "sent", "done": null}'::jsonb,
          'workflow_results holds every step''s result');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE workflow_run_id = :r1), 3::bigint, 'one job per step, nothing after the last');

--------------------------------------------------------------------------------
-- Steps given at start, and definitions replaced
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('signup', steps => ARRAY['only']) AS r_given \gset
SELECT results_eq(format($$ SELECT steps, input, queue, priority, max_attempts FROM treadle.workflow_runs WHERE id = %s $$, :r_given),
                  $$ VALUES (ARRAY['only'], '{}'::jsonb, 'default'::text, 0, 25) $$,
                  'steps given at start win over the definition; the defaults apply');
SELECT is((pg_temp.step(:r_given)).step, 'only', 'the first given step is enqueued');
SELECT treadle.start_workflow('adhoc', NULL, ARRAY['a', 'b']) AS r_adhoc \gset
SELECT is((SELECT input FROM treadle.workflow_runs WHERE id = :r_adhoc), '{}'::jsonb,
          'a workflow needs no definition when steps are given; null input is {}');

SELECT treadle.start_workflow('signup') AS r_old \gset
SELECT lives_ok($$ SELECT treadle.define_workflow('signup', ARRAY['create', 'welcome']) $$, 'the definition is replaced');
SELECT is((SELECT steps FROM treadle.workflows WHERE name = 'signup'), ARRAY['create', 'welcome'], 'the new steps are stored');
SELECT treadle.start_workflow('signup') AS r_new \gset
SELECT is((SELECT steps FROM treadle.workflow_runs WHERE id = :r_new), ARRAY['create', 'welcome'], 'a new run takes the new steps');
SELECT is((SELECT steps FROM treadle.workflow_runs WHERE id = :r_old), ARRAY['create', 'email', 'done'],
          'an existing run keeps the steps it started with');
SELECT is(treadle.complete((pg_temp.step(:r_old)).id, pg_temp.claim_step(:r_old)), 'completed', 'the old run''s first step completes');
SELECT is((pg_temp.step(:r_old)).step, 'email', 'the old run goes on with its own next step');

--------------------------------------------------------------------------------
-- Idempotency keys: a namespace of their own
--------------------------------------------------------------------------------
SELECT treadle.enqueue('job', idempotency_key => 'order-9') AS keyed_job \gset
SELECT treadle.start_workflow('signup', idempotency_key => 'order-9') AS keyed_run \gset
SELECT is(treadle.start_workflow('signup', '{"again": true}', idempotency_key => 'order-9'), :keyed_run::bigint,
          'a repeated workflow key returns the first run''s id');
SELECT is((SELECT count(*) FROM treadle.workflow_runs WHERE idempotency_key = 'order-9'), 1::bigint, 'one run holds the key');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE workflow_run_id = :keyed_run), 1::bigint, 'a repeat enqueues no second step');
SELECT is((SELECT input FROM treadle.workflow_runs WHERE id = :keyed_run), '{}'::jsonb, 'a repeat changes nothing on the run');
SELECT is((SELECT idempotency_key FROM treadle.jobs WHERE id = :keyed_job), 'order-9', 'a job may hold the same key as a run');
SELECT is(treadle.enqueue('job', idempotency_key => 'order-9'), :keyed_job::bigint, 'and keeps it');

--------------------------------------------------------------------------------
-- A discarded step fails the run; retrying the step resumes it
--------------------------------------------------------------------------------
SET LOCAL treadle.now = '2999-01-01 13:00:00+00';
SELECT treadle.start_workflow('fragile', steps => ARRAY['one', 'two'], queue => 'fragile', max_attempts => 1) AS rf \gset
SELECT (pg_temp.step(:rf)).id AS f1 \gset
SELECT is(treadle.fail(:f1, pg_temp.claim_step(:rf), 'broken'), 'discarded', 'a step with no attempts left is discarded');
SELECT results_eq(format($$ SELECT state, finished_at FROM treadle.workflow_runs WHERE id = %s $$, :rf),
                  $$ VALUES ('failed'::text, '2999-01-01 13:00:00+00'::timestamptz) $$, 'a discarded step fails the run');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE workflow_run_id = :rf), 1::bigint, 'a failed run enqueues nothing more');
SELECT ok(NOT treadle.cancel_workflow(:rf), 'a failed run cannot be cancelled');
SELECT ok(treadle.retry(:f1), 'the discarded step is retried');
SELECT results_eq(format($$ SELECT state, finished_at FROM treadle.workflow_runs WHERE id = %s $$, :rf),
                  $$ VALUES ('running'::text, NULL::timestamptz) $$, 'retrying the step resumes the run');
SELECT is(treadle.complete(:f1, pg_temp.claim_step(:rf), '1'), 'completed', 'the retried step completes');
SELECT is((pg_temp.step(:rf)).step, 'two', 'the resumed run enqueues its next step');
SELECT is(treadle.complete((pg_temp.step(:rf)).id, pg_temp.claim_step(:rf), '2'), 'completed', 'the last step completes');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :rf), 'completed', 'the resumed run completes');
SELECT is(treadle.workflow_results(:rf), '{"one": 1, "two": 2}'::jsonb, 'with both results');

--------------------------------------------------------------------------------
-- cancel_workflow
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('signup', queue => 'c1') AS rc1 \gset
SELECT ok(treadle.cancel_workflow(:rc1), 'cancel_workflow of a run whose step waits: true');
SELECT is((pg_temp.step(:rc1)).state, 'cancelled', 'the waiting step is cancelled');
SELECT results_eq(format($$ SELECT state, finished_at FROM treadle.workflow_runs WHERE id = %s $$, :rc1),
                  $$ VALUES ('cancelled'::text, '2999-01-01 13:00:00+00'::timestamptz) $$, 'the run is cancelled at once');
SELECT ok(NOT treadle.cancel_workflow(:rc1), 'cancelling it again: false');
SELECT ok(NOT treadle.cancel_workflow(:r1), 'a completed run: false');
SELECT ok(NOT treadle.cancel_workflow(-1), 'an unknown run: false');
SELECT throws_ok('SELECT treadle.cancel_workflow(NULL)', '22004', NULL, 'a null run_id raises 22004');

SELECT treadle.start_workflow('signup', queue => 'c2') AS rc2 \gset
SELECT (pg_temp.step(:rc2)).id AS c2 \gset
SELECT pg_temp.claim_step(:rc2) AS c2_tok \gset
SELECT ok(treadle.cancel_workflow(:rc2), 'cancel_workflow of a run whose step runs: true');
SELECT results_eq(format($$ SELECT state, cancel_requested FROM treadle.jobs WHERE id = %s $$, :c2),
                  $$ VALUES ('running'::text, true) $$, 'the running step gets a cancel request');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :rc2), 'running', 'the run runs until the step finishes');
SELECT ok(NOT treadle.cancel_workflow(:rc2), 'a second cancel_workflow: false');
SELECT is(treadle.heartbeat(:c2, :'c2_tok'), 'cancel', 'the step''s heartbeat says cancel');
SELECT is(treadle.complete(:c2, :'c2_tok', '{"late": true}'), 'cancelled', 'the step finishes as cancelled');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :rc2), 'cancelled', 'then the run is cancelled');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE workflow_run_id = :rc2), 1::bigint, 'no next step is enqueued');
SELECT is(treadle.workflow_results(:rc2), '{}'::jsonb, 'a cancelled step adds no result');

SELECT ok(treadle.retry(:c2), 'the cancelled step is retried');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :rc2), 'running', 'retrying the step resumes the cancelled run');
SELECT is(treadle.complete(:c2, pg_temp.claim_step(:rc2)), 'completed', 'the step completes');
SELECT is((pg_temp.step(:rc2)).step, 'welcome', 'and the run goes on');

-- treadle.cancel of a step job cancels its run the same way
SELECT treadle.start_workflow('signup', queue => 'c3') AS rc3 \gset
SELECT ok(treadle.cancel((pg_temp.step(:rc3)).id), 'treadle.cancel of a waiting step: true');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :rc3), 'cancelled', 'its run is cancelled at once');
SELECT treadle.start_workflow('signup', queue => 'c4') AS rc4 \gset
SELECT (pg_temp.step(:rc4)).id AS c4 \gset
SELECT pg_temp.claim_step(:rc4) AS c4_tok \gset
SELECT ok(treadle.cancel(:c4), 'treadle.cancel of a running step: true');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :rc4), 'running', 'its run runs until the step finishes');
SELECT is(treadle.fail(:c4, :'c4_tok', 'stopped'), 'cancelled', 'the step''s fail finishes it as cancelled');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :rc4), 'cancelled', 'then its run is cancelled');

-- Steps of two runs completed together
SELECT treadle.start_workflow('pair', steps => ARRAY['a', 'b'], queue => 'pairs') AS p1 \gset
SELECT treadle.start_workflow('pair', steps => ARRAY['a', 'b'], queue => 'pairs') AS p2 \gset
CREATE TEMP TABLE pair_claims AS SELECT * FROM treadle.claim('w', ARRAY['pairs'], batch => 10);
SELECT results_eq(
    $$ SELECT state FROM treadle.complete_many(ARRAY(SELECT id FROM pair_claims ORDER BY id),
                                               ARRAY(SELECT lease_token FROM pair_claims ORDER BY id)) $$,
    ARRAY['completed', 'completed'], 'complete_many finishes steps of two runs');
SELECT results_eq(
    format($$ SELECT workflow_run_id, step, state FROM treadle.jobs
               WHERE workflow_run_id IN (%s, %s) AND step = 'b' ORDER BY workflow_run_id $$, :p1, :p2),
    format($$ VALUES (%s::bigint, 'b'::text, 'available'::text), (%s, 'b', 'available') $$, :p1, :p2),
    'each run gets its own next step');

--------------------------------------------------------------------------------
-- Bad input: each raises its SQLSTATE and writes nothing
--------------------------------------------------------------------------------
CREATE TEMP TABLE before AS
SELECT (SELECT count(*) FROM treadle.workflow_runs) AS runs, (SELECT count(*) FROM treadle.jobs) AS jobs,
       (SELECT count(*) FROM treadle.workflows) AS definitions;
SELECT throws_ok($$ SELECT treadle.start_workflow('nobody-defined-me') $$, '22023',
                 'treadle: unknown workflow nobody-defined-me', 'an unknown workflow raises 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow(NULL, steps => ARRAY['a']) $$, '22004', NULL, 'a null name raises 22004');
SELECT throws_ok($$ SELECT treadle.start_workflow('', steps => ARRAY['a']) $$, '22023', NULL, 'an empty name raises 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('w', steps => ARRAY['a'], queue => NULL) $$, '22004', NULL,
                 'a null queue raises 22004');
SELECT throws_ok($$ SELECT treadle.start_workflow('w', steps => ARRAY['a'], queue => ' ') $$, '22023', NULL,
                 'an empty queue raises 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('w', '3', ARRAY['a']) $$, '22023', NULL, 'a scalar input raises 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('w', steps => ARRAY['a'], max_attempts => 0) $$, '22023', NULL,
                 'max_attempts 0 raises 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('w', steps => ARRAY['a'], priority => NULL) $$, '22004', NULL,
                 'a null priority raises 22004');
SELECT throws_ok($$ SELECT treadle.start_workflow('w', steps => ARRAY[]::text[]) $$, '22023', NULL, 'empty steps raise 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('w', steps => ARRAY['a', 'b', 'a']) $$, '22023', NULL,
                 'repeated steps raise 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('w', steps => ARRAY['a', '']) $$, '22023', NULL, 'an empty step name raises 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('w', steps => ARRAY['a', NULL]) $$, '22023', NULL, 'a null step name raises 22023');
SELECT throws_ok($$ SELECT treadle.define_workflow(NULL, ARRAY['a']) $$, '22004', NULL, 'define_workflow: a null name raises 22004');
SELECT throws_ok($$ SELECT treadle.define_workflow('', ARRAY['a']) $$, '22023', NULL, 'define_workflow: an empty name raises 22023');
SELECT throws_ok($$ SELECT treadle.define_workflow('w', NULL) $$, '22004', NULL, 'define_workflow: null steps raise 22004');
SELECT throws_ok($$ SELECT treadle.define_workflow('w', ARRAY[]::text[]) $$, '22023', NULL, 'define_workflow: empty steps raise 22023');
SELECT throws_ok($$ SELECT treadle.define_workflow('signup', ARRAY['x', 'x']) $$, '22023', NULL,
                 'define_workflow: repeated steps raise 22023');
SELECT results_eq(
    $$ SELECT (SELECT count(*) FROM treadle.workflow_runs), (SELECT count(*) FROM treadle.jobs),
              (SELECT count(*) FROM treadle.workflows) $$,
    $$ SELECT runs, jobs, definitions FROM before $$,
    'no bad call wrote a run, a job or a definition');
SELECT is((SELECT steps FROM treadle.workflows WHERE name = 'signup'), ARRAY['create', 'welcome'],
          'a bad define_workflow left the definition alone');

SELECT * FROM finish();
ROLLBACK;
