-- pgtap/089_workflow_cancel_run.sql: treadle.cancel_run cancels a run, and with
-- compensate => true starts undoing its completed steps in the same transaction
-- (a running step's cancel is requested and its compensations wait for it); a
-- cancelled run is compensated as compensate_run does. Refusals carry
-- compensate_run's SQLSTATEs and write nothing; only the operator's roles may call it.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(34);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

SELECT has_function('treadle', 'cancel_run', ARRAY['bigint', 'boolean'], 'treadle.cancel_run exists');

-- pg_temp.step_job(run, step): the latest job that runs a step of a run
CREATE FUNCTION pg_temp.step_job(run_id bigint, step_name text) RETURNS treadle.jobs LANGUAGE sql AS $$
    SELECT * FROM treadle.jobs WHERE workflow_run_id = run_id AND step = step_name ORDER BY id DESC LIMIT 1
$$;
-- pg_temp.claim(run, step): claim that step's job; its lease token
CREATE FUNCTION pg_temp.claim(run_id bigint, step_name text) RETURNS uuid LANGUAGE sql AS $$
    SELECT c.lease_token
      FROM treadle.claim('w', ARRAY[(pg_temp.step_job(run_id, step_name)).queue],
                         names => ARRAY[(pg_temp.step_job(run_id, step_name)).name], batch => 1000) AS c
     WHERE c.workflow_run_id = run_id AND c.step = step_name
$$;
-- pg_temp.finish(run, step, result): claim and complete a step
CREATE FUNCTION pg_temp.finish(run_id bigint, step_name text, result jsonb) RETURNS text LANGUAGE sql AS $$
    SELECT treadle.complete((pg_temp.step_job(run_id, step_name)).id, pg_temp.claim(run_id, step_name), result)
$$;
CREATE FUNCTION pg_temp.state(run_id bigint) RETURNS text LANGUAGE sql AS $$
    SELECT r.state FROM treadle.workflow_runs AS r WHERE r.id = run_id
$$;
-- pg_temp.steps(run): the run's jobs as 'step state', in id order
CREATE FUNCTION pg_temp.steps(run_id bigint) RETURNS text[] LANGUAGE sql AS $$
    SELECT coalesce(array_agg(j.step || ' ' || j.state ORDER BY j.id), '{}')
      FROM treadle.jobs AS j WHERE j.workflow_run_id = run_id
$$;
-- pg_temp.picture(): everything a refusal must leave as it was
CREATE FUNCTION pg_temp.picture() RETURNS text LANGUAGE sql AS $$
    SELECT md5(coalesce((SELECT string_agg(r::text, '|' ORDER BY r.id) FROM treadle.workflow_runs AS r), '')
               || coalesce((SELECT string_agg(j::text, '|' ORDER BY j.id) FROM treadle.jobs AS j), ''))
$$;

--------------------------------------------------------------------------------
-- a running list run whose next step waits: cancelled and compensating at once
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('cr_saga', steps => ARRAY['debit', 'credit'], queue => 'cr',
                              compensations => '{"debit": "refund"}') AS k1 \gset
SELECT is(pg_temp.finish(:k1, 'debit', '{"id": 1}'), 'completed', 'the first step completes');
SELECT is(treadle.cancel_run(:k1, compensate => true), 'compensating', 'cancel_run with compensate: compensating');
SELECT is(pg_temp.steps(:k1), ARRAY['debit completed', 'credit cancelled', 'refund available'],
          'the waiting step is cancelled and the compensation of the completed one waits, in the same call');
SELECT is((pg_temp.step_job(:k1, 'refund')).args, '{"compensates": "debit", "result": {"id": 1}}'::jsonb,
          'the compensation gets the step''s result');
SELECT is(pg_temp.finish(:k1, 'refund', '"refunded"'), 'completed', 'the compensation completes');
SELECT results_eq(format($$ SELECT state, finished_at IS NOT NULL FROM treadle.workflow_runs WHERE id = %s $$, :k1),
                  $$ VALUES ('compensated'::text, true) $$, 'the run ends compensated');

--------------------------------------------------------------------------------
-- a graph run with a step running: its cancel is requested, compensations wait for it
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('cr_graph', steps => ARRAY['a', 'b', 'c'], queue => 'cr',
                              after => '{"c": ["a", "b"]}',
                              compensations => '{"a": "undo_a", "b": "undo_b"}') AS k2 \gset
SELECT is(pg_temp.finish(:k2, 'a', '{"a": 1}'), 'completed', 'a completes');
SELECT pg_temp.claim(:k2, 'b') AS b_token \gset
SELECT is(treadle.cancel_run(:k2, compensate => true), 'compensating', 'cancel_run while b runs: compensating');
SELECT ok((pg_temp.step_job(:k2, 'b')).cancel_requested, 'the running step''s cancel is requested');
SELECT is(pg_temp.steps(:k2), ARRAY['a completed', 'b running'], 'no compensation starts while a step of the run runs');
SELECT is(treadle.complete((pg_temp.step_job(:k2, 'b')).id, :'b_token', '{}'), 'cancelled',
          'the running step ends cancelled');
SELECT is(pg_temp.steps(:k2), ARRAY['a completed', 'b cancelled', 'undo_a available'],
          'then the completed step''s compensation starts, and the join never does');
SELECT is(pg_temp.finish(:k2, 'undo_a', '{}'), 'completed', 'it completes');
SELECT is(pg_temp.state(:k2), 'compensated', 'the run ends compensated');

--------------------------------------------------------------------------------
-- a cancelled run: as compensate_run; nothing done yet: compensated at once
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('cr_saga', steps => ARRAY['debit', 'credit'], queue => 'cr',
                              compensations => '{"debit": "refund"}') AS k3 \gset
SELECT is(pg_temp.finish(:k3, 'debit', '{"id": 3}'), 'completed', 'debit completes');
SELECT ok(treadle.cancel_workflow(:k3), 'the run is cancelled first');
SELECT is(treadle.cancel_run(:k3, compensate => true), 'compensating', 'a cancelled run starts compensating');
SELECT is(pg_temp.steps(:k3), ARRAY['debit completed', 'credit cancelled', 'refund available'], 'with its compensation');
SELECT treadle.start_workflow('cr_saga', steps => ARRAY['debit', 'credit'], queue => 'cr',
                              compensations => '{"debit": "refund"}') AS k4 \gset
SELECT is(treadle.cancel_run(:k4, true), 'compensated', 'nothing completed: compensated at once');

--------------------------------------------------------------------------------
-- compensate false: a cancel that says the run's state
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('cr_plain', steps => ARRAY['one', 'two'], queue => 'cr') AS p1 \gset
SELECT is(treadle.cancel_run(:p1), 'cancelled', 'a run whose step waits is cancelled at once');
SELECT treadle.start_workflow('cr_plain', steps => ARRAY['one', 'two'], queue => 'cr') AS p2 \gset
SELECT pg_temp.claim(:p2, 'one') AS p2_token \gset
SELECT is(treadle.cancel_run(:p2), 'running', 'a run whose step runs is running until that step ends');

--------------------------------------------------------------------------------
-- refusals: compensate_run's SQLSTATEs, nothing written
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('cr_saga', steps => ARRAY['debit', 'credit'], queue => 'cr',
                              compensations => '{"debit": "refund"}') AS k5 \gset
SELECT treadle.start_workflow('cr_plain', steps => ARRAY['one', 'two'], queue => 'cr') AS p3 \gset
SELECT pg_temp.picture() AS before \gset
SELECT throws_ok('SELECT treadle.cancel_run(NULL, true)', '22004', NULL, 'a null id, 22004');
SELECT throws_ok(format('SELECT treadle.cancel_run(%s, NULL)', :k5), '22004', NULL, 'a null compensate, 22004');
SELECT throws_ok('SELECT treadle.cancel_run(-1, true)', 'P0002', NULL, 'an unknown run, P0002');
SELECT throws_ok(format('SELECT treadle.cancel_run(%s, true)', :p3), '55000',
                 format('treadle: workflow run %s has no compensations', :p3), 'compensate and no compensations, 55000');
SELECT throws_ok(format('SELECT treadle.cancel_run(%s, true)', :k1), '55000',
                 format('treadle: workflow run %s is compensated: only a running or cancelled run is cancelled and compensated', :k1),
                 'a compensated run, 55000');
SELECT throws_ok(format('SELECT treadle.cancel_run(%s)', :p1), '55000', NULL, 'cancel of a cancelled run, 55000');
SELECT throws_ok(format('SELECT treadle.cancel_run(%s)', :p2), '55000', NULL, 'cancel of a run being cancelled, 55000');
SELECT is(pg_temp.picture(), :'before', 'the refusals wrote nothing');

--------------------------------------------------------------------------------
-- who may: the operator's roles; a tenant only its queues' runs
--------------------------------------------------------------------------------
CREATE ROLE cr_producer; SELECT treadle.grant_producer('cr_producer');
CREATE ROLE cr_admin;    SELECT treadle.grant_admin('cr_admin');
CREATE ROLE cr_tenant;   SELECT treadle.grant_admin('cr_tenant'); SELECT treadle.set_tenant('cr_tenant', 't.');
SELECT is(pg_temp.as_role('cr_producer', format('SELECT treadle.cancel_run(%s, true)', :k5)), '42501',
          'a producer may not cancel_run');
SELECT is(pg_temp.as_role('cr_tenant', format('SELECT treadle.cancel_run(%s, true)', :k5)), '42501',
          'nor a tenant another queue''s run');
SELECT is(pg_temp.as_role('cr_admin', format('SELECT treadle.cancel_run(%s, true)', :k5)), 'ok', 'an admin may');
SELECT is(pg_temp.state(:k5), 'compensated', 'and the run is compensated');

SELECT * FROM finish();
ROLLBACK;
