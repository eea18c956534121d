-- pgtap/078_workflow_compensation.sql: compensations (define_workflow's and
-- start_workflow's `compensations`): a run that fails for good compensates its
-- completed steps one at a time in reverse order of completion and ends
-- `compensated`, or `failed` when a compensation fails for good; the checks.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(61);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

CREATE FUNCTION pg_temp.steps(run_id bigint) RETURNS text[] LANGUAGE sql AS $$
    SELECT coalesce(array_agg(j.step || ':' || j.state ORDER BY j.id), '{}')
      FROM treadle.jobs AS j WHERE j.workflow_run_id = run_id
$$;
CREATE FUNCTION pg_temp.lease(run_id bigint, step_name text) RETURNS treadle.jobs
LANGUAGE plpgsql AS $$
DECLARE
    v_job treadle.jobs;
BEGIN
    UPDATE treadle.jobs AS j SET state = 'running', lease_until = treadle.now() + interval '1 hour',
           lease_token = gen_random_uuid(), worker_id = 'w', attempt = j.attempt + 1
     WHERE j.workflow_run_id = run_id AND j.step = step_name AND j.state = 'available'
    RETURNING j.* INTO STRICT v_job;
    RETURN v_job;
END;
$$;
CREATE FUNCTION pg_temp.finish(run_id bigint, step_name text, step_result jsonb DEFAULT '{}') RETURNS text
LANGUAGE sql AS $$
    SELECT treadle.complete(l.id, l.lease_token, step_result) FROM pg_temp.lease(run_id, step_name) AS l
$$;
CREATE FUNCTION pg_temp.discard(run_id bigint, step_name text) RETURNS text
LANGUAGE sql AS $$
    SELECT treadle.fail(l.id, l.lease_token, 'boom', retryable => false) FROM pg_temp.lease(run_id, step_name) AS l
$$;
CREATE FUNCTION pg_temp.state(run_id bigint) RETURNS text LANGUAGE sql AS $$
    SELECT r.state FROM treadle.workflow_runs AS r WHERE r.id = run_id
$$;
-- each step's finished_at a second apart, so that completion order is plain
CREATE FUNCTION pg_temp.tick() RETURNS void LANGUAGE sql AS $$
    SELECT set_config('treadle.now', (current_setting('treadle.now')::timestamptz + interval '1 second')::text, true)
$$;

--------------------------------------------------------------------------------
-- transfer: reserve -> debit -> credit; credit fails: refund, then release
--------------------------------------------------------------------------------
SELECT lives_ok($$ SELECT treadle.define_workflow('transfer', ARRAY['reserve', 'debit', 'credit'],
                    compensations => '{"reserve": "release", "debit": "refund"}') $$,
                'define_workflow takes compensations');
SELECT is((SELECT compensations FROM treadle.workflows WHERE name = 'transfer'),
          '{"reserve": "release", "debit": "refund"}'::jsonb, 'the definition records them');
SELECT treadle.start_workflow('transfer', '{"amount": 100}', queue => 'bank') AS r1 \gset
SELECT is(pg_temp.finish(:r1, 'reserve', '{"hold": "H1"}'), 'completed', 'reserve completes');
SELECT pg_temp.tick() \gset
SELECT is(pg_temp.finish(:r1, 'debit', '{"debited": 100}'), 'completed', 'debit completes');
SELECT pg_temp.tick() \gset
SELECT is(pg_temp.discard(:r1, 'credit'), 'discarded', 'credit fails for good');
SELECT results_eq(format($$ SELECT state, finished_at IS NULL FROM treadle.workflow_runs WHERE id = %s $$, :r1),
                  $$ VALUES ('compensating'::text, true) $$, 'the run compensates instead of failing');
SELECT is(pg_temp.steps(:r1), ARRAY['reserve:completed', 'debit:completed', 'credit:discarded', 'refund:available'],
          'the step that completed last is compensated first, alone');
SELECT results_eq(format($$ SELECT name, args FROM treadle.jobs WHERE workflow_run_id = %s AND step = 'refund' $$, :r1),
                  $$ VALUES ('workflow:transfer/refund'::text, '{"compensates": "debit", "result": {"debited": 100}}'::jsonb) $$,
                  'a compensation is a step job that receives the step it undoes and that step''s result');
SELECT is(pg_temp.finish(:r1, 'refund', '"refunded"'), 'completed', 'refund completes');
SELECT is(pg_temp.steps(:r1), ARRAY['reserve:completed', 'debit:completed', 'credit:discarded', 'refund:completed',
                                    'release:available'], 'then release starts');
SELECT is(pg_temp.state(:r1), 'compensating', 'the run is still compensating');
SELECT is(treadle.signal(:r1, 'approved', '{"late": true}'), 'finished', 'a signal to a compensating run: finished');
SELECT results_eq(format($$ SELECT (SELECT count(*) FROM treadle.workflow_signals), r.results ? 'approved'
                               FROM treadle.workflow_runs AS r WHERE r.id = %s $$, :r1),
                  $$ VALUES (0::bigint, false) $$, 'and nothing written');
SELECT is(pg_temp.finish(:r1, 'release', '"released"'), 'completed', 'release completes');
SELECT results_eq(format($$ SELECT state, finished_at IS NOT NULL, results FROM treadle.workflow_runs WHERE id = %s $$, :r1),
                  $$ VALUES ('compensated'::text, true, '{"reserve": {"hold": "H1"}, "debit": {"debited": 100},
                             "refund": "refunded", "release": "released"}'::jsonb) $$,
                  'the run ends compensated, with each compensation''s result under its name');
SELECT is(treadle.signal(:r1, 'approved'), 'finished', 'a signal to a compensated run: finished');

--------------------------------------------------------------------------------
-- a compensation that fails for good fails the run; a retry of it compensates on
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('transfer', '{}', queue => 'bank') AS r2 \gset
SELECT is(pg_temp.finish(:r2, 'reserve'), 'completed', 'reserve completes');
SELECT pg_temp.tick() \gset
SELECT is(pg_temp.finish(:r2, 'debit'), 'completed', 'debit completes');
SELECT pg_temp.tick() \gset
SELECT is(pg_temp.discard(:r2, 'credit'), 'discarded', 'credit fails for good');
SELECT is(pg_temp.discard(:r2, 'refund'), 'discarded', 'refund fails for good');
SELECT results_eq(format($$ SELECT state, finished_at IS NOT NULL FROM treadle.workflow_runs WHERE id = %s $$, :r2),
                  $$ VALUES ('failed'::text, true) $$, 'the run fails');
SELECT is(pg_temp.steps(:r2), ARRAY['reserve:completed', 'debit:completed', 'credit:discarded', 'refund:discarded'],
          'and release never starts');
SELECT is(treadle.retry(j.id), true, 'retry of the failed compensation')
  FROM treadle.jobs AS j WHERE j.workflow_run_id = :r2 AND j.step = 'refund';
SELECT is(pg_temp.state(:r2), 'compensating', 'puts the run back to compensating');
SELECT is(pg_temp.finish(:r2, 'refund'), 'completed', 'refund completes on its second attempt');
SELECT is(pg_temp.finish(:r2, 'release'), 'completed', 'release follows');
SELECT is(pg_temp.state(:r2), 'compensated', 'the run ends compensated');
SELECT is(pg_temp.steps(:r2), ARRAY['reserve:completed', 'debit:completed', 'credit:discarded', 'refund:completed',
                                    'release:completed'], 'each compensation ran once it completed, never again');

SELECT treadle.start_workflow('g', '{}', steps => ARRAY['a', 'b', 'c'], queue => 'bank',
                              after => '{"b": ["a"], "c": ["a"]}', compensations => '{"a": "undo_a"}') AS r9 \gset
SELECT is(pg_temp.finish(:r9, 'a'), 'completed', 'a completes');
SELECT is(pg_temp.discard(:r9, 'b'), 'discarded', 'b fails for good (c, waiting, is cancelled)');
SELECT is(pg_temp.discard(:r9, 'undo_a'), 'discarded', 'undo_a fails for good: the run fails');
SELECT is(treadle.retry(j.id), true, 'retry of the failed forward step of the graph')
  FROM treadle.jobs AS j WHERE j.workflow_run_id = :r9 AND j.step = 'b';
SELECT results_eq(format($$ SELECT state FROM treadle.workflow_runs WHERE id = %s $$, :r9),
                  $$ VALUES ('running'::text) $$, 'resumes the run forward');
SELECT is(pg_temp.steps(:r9), ARRAY['a:completed', 'b:available', 'c:available', 'undo_a:discarded'],
          'its cancelled step too, and leaves its failed compensation alone');

--------------------------------------------------------------------------------
-- a graph: waiting steps are cancelled, a running one finishes first and is
-- compensated first
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('trip', '{}', steps => ARRAY['flight', 'hotel', 'car', 'pay'], queue => 'trip',
                              after => '{"pay": ["flight", "hotel", "car"]}',
                              compensations => '{"flight": "cancel_flight", "hotel": "cancel_hotel", "car": "cancel_car"}') AS r3 \gset
SELECT is(pg_temp.finish(:r3, 'flight'), 'completed', 'flight completes');
SELECT pg_temp.tick() \gset
SELECT pg_temp.lease(:r3, 'hotel') IS NOT NULL AS leased \gset
SELECT is(pg_temp.discard(:r3, 'car'), 'discarded', 'car fails for good while hotel runs');
SELECT is(pg_temp.state(:r3), 'compensating', 'the run compensates');
SELECT is(pg_temp.steps(:r3), ARRAY['flight:completed', 'hotel:running', 'car:discarded'],
          'no compensation starts while a step still runs');
SELECT pg_temp.tick() \gset
SELECT is(treadle.complete(j.id, j.lease_token, '"room 7"'), 'completed', 'hotel completes late')
  FROM treadle.jobs AS j WHERE j.workflow_run_id = :r3 AND j.step = 'hotel';
SELECT is(pg_temp.steps(:r3), ARRAY['flight:completed', 'hotel:completed', 'car:discarded', 'cancel_hotel:available'],
          'hotel, which completed last, is compensated first');
SELECT is(pg_temp.finish(:r3, 'cancel_hotel'), 'completed', 'cancel_hotel completes');
SELECT is(pg_temp.finish(:r3, 'cancel_flight'), 'completed', 'cancel_flight follows');
SELECT is(pg_temp.state(:r3), 'compensated', 'the run ends compensated; car, which failed, has nothing to undo');

SELECT treadle.start_workflow('pair', '{}', steps => ARRAY['a', 'b', 'c'], queue => 'trip', after => '{}',
                              compensations => '{"a": "undo_a"}') AS r4 \gset
SELECT is(pg_temp.discard(:r4, 'b'), 'discarded', 'b fails for good while a and c wait');
SELECT is(pg_temp.steps(:r4), ARRAY['a:cancelled', 'b:discarded', 'c:cancelled'], 'the waiting steps are cancelled');
SELECT results_eq(format($$ SELECT state, finished_at IS NOT NULL FROM treadle.workflow_runs WHERE id = %s $$, :r4),
                  $$ VALUES ('compensated'::text, true) $$, 'nothing completed: compensated at once');

--------------------------------------------------------------------------------
-- a child that compensates fails its parent once it is compensated
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('outer', '{}', steps => ARRAY['kid'], queue => 'trip',
                              children => '{"kid": {"workflow": "transfer"}}') AS r5 \gset
SELECT r.id AS c5 FROM treadle.workflow_runs AS r WHERE r.parent_run_id = :r5 \gset
SELECT is(pg_temp.finish(:c5, 'reserve'), 'completed', 'the child''s reserve completes');
SELECT is(pg_temp.discard(:c5, 'debit'), 'discarded', 'the child''s debit fails for good');
SELECT results_eq(format($$ SELECT state FROM treadle.workflow_runs WHERE id IN (%s, %s) ORDER BY id $$, :r5, :c5),
                  $$ VALUES ('running'::text), ('compensating') $$, 'the parent waits while the child compensates');
SELECT is(pg_temp.finish(:c5, 'release'), 'completed', 'the child''s compensation completes');
SELECT results_eq(format($$ SELECT state FROM treadle.workflow_runs WHERE id IN (%s, %s) ORDER BY id $$, :r5, :c5),
                  $$ VALUES ('failed'::text), ('compensated') $$, 'a compensated child fails its parent');

SELECT treadle.start_workflow('mixed', '{}', steps => ARRAY['kid', 'own'], queue => 'trip', after => '{}',
                              children => '{"kid": {"workflow": "transfer"}}', compensations => '{"own": "undo_own"}') AS r6 \gset
SELECT r.id AS c6 FROM treadle.workflow_runs AS r WHERE r.parent_run_id = :r6 \gset
SELECT is(pg_temp.discard(:r6, 'own'), 'discarded', 'the parent''s own step fails for good while its child runs');
SELECT results_eq(format($$ SELECT state FROM treadle.workflow_runs WHERE id IN (%s, %s) ORDER BY id $$, :r6, :c6),
                  $$ VALUES ('compensated'::text), ('cancelled') $$,
                  'a compensating parent cancels its child (and has nothing of its own to undo)');

--------------------------------------------------------------------------------
-- bad definitions: 22023 naming the step, nothing written
--------------------------------------------------------------------------------
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a'], compensations => '["a"]') $$,
                 '22023', 'treadle: compensations must be a JSON object mapping a step to its compensation''s name, not array',
                 'compensations must be an object');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a'], compensations => '{"b": "undo"}') $$,
                 '22023', 'treadle: compensations names step "b", which is not one of the steps', 'an unknown step');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], compensations => '{"a": "b"}') $$,
                 '22023', 'treadle: the compensation of step "a" is named "b", as a step is', 'a name that is a step''s');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], compensations => '{"a": "u", "b": "u"}') $$,
                 '22023', 'treadle: the compensation of step "b" is named "u", as another step''s is', 'a name used twice');
SELECT throws_like($$ SELECT treadle.define_workflow('bad', ARRAY['a'], compensations => '{"a": ""}') $$,
                   '%step "a" must name its compensation with a valid name%', 'an empty name');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], sleeps => '{"a": "1 hour"}', compensations => '{"a": "u"}') $$,
                 '22023', 'treadle: step "a" is a sleep, map, child or wait step and cannot name a compensation', 'a sleep step');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], waits => '{"a": {"signal": "go"}}', compensations => '{"a": "u"}') $$,
                 '22023', 'treadle: step "a" is a sleep, map, child or wait step and cannot name a compensation', 'a wait step');
SELECT is((SELECT count(*) FROM treadle.workflows WHERE name = 'bad'), 0::bigint, 'nothing was defined');

SELECT * FROM finish();
ROLLBACK;
