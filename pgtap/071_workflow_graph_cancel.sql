-- pgtap/071_workflow_graph_cancel.sql: a graph run cancelled by one of its own steps
-- (a step that ends cancelled however it ends: complete, fail, release,
-- complete_and_claim, treadle.cancel of a waiting step; an element of a map step; a
-- child run that is cancelled) stops the rest of it as treadle.cancel_workflow does:
-- its other waiting steps are cancelled, its running ones asked to stop, its child runs
-- cancelled, its sleeps and waits ended, no claim takes a step of it afterwards, and a
-- run with compensations is cancelled, not compensated, until compensate_run.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(62);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

-- pg_temp.steps(run): the run's step jobs as 'step:state' ('!' when a cancel is requested), in id order
CREATE FUNCTION pg_temp.steps(run_id bigint) RETURNS text[] LANGUAGE sql AS $$
    SELECT coalesce(array_agg(j.step || ':' || j.state || CASE WHEN j.cancel_requested THEN '!' ELSE '' END
                              ORDER BY j.id), '{}')
      FROM treadle.jobs AS j WHERE j.workflow_run_id = run_id
$$;
-- pg_temp.lease(run, step): lease that step's available job as worker 'w'
CREATE FUNCTION pg_temp.lease(run_id bigint, step_name text) RETURNS treadle.jobs
LANGUAGE plpgsql AS $$
DECLARE
    v_job treadle.jobs;
BEGIN
    UPDATE treadle.jobs AS j SET state = 'running', lease_until = treadle.now() + interval '1 hour',
           lease_token = gen_random_uuid(), worker_id = 'w', attempt = 1
     WHERE j.workflow_run_id = run_id AND j.step = step_name AND j.state = 'available'
    RETURNING j.* INTO STRICT v_job;
    RETURN v_job;
END;
$$;
-- pg_temp.stepjob(run, step): that step's job
CREATE FUNCTION pg_temp.stepjob(run_id bigint, step_name text) RETURNS treadle.jobs LANGUAGE sql AS $$
    SELECT * FROM treadle.jobs AS j WHERE j.workflow_run_id = run_id AND j.step = step_name ORDER BY j.id LIMIT 1
$$;
CREATE FUNCTION pg_temp.state(run_id bigint) RETURNS text LANGUAGE sql AS $$
    SELECT r.state FROM treadle.workflow_runs AS r WHERE r.id = run_id
$$;
-- pg_temp.shape(run): what a cancel leaves of a run and its steps, to compare two runs
CREATE FUNCTION pg_temp.shape(run_id bigint) RETURNS text LANGUAGE sql AS $$
    SELECT format('%s %s %s %s %s %s | ', r.state, r.finished_at, r.results, r.wake_at, r.waiting, r.wait_until)
           || coalesce((SELECT string_agg(format('%s:%s:%s:%s:%s', j.step, j.state, j.cancel_requested, j.attempt,
                                                 j.finished_at), ' ' ORDER BY j.step, j.id)
                          FROM treadle.jobs AS j WHERE j.workflow_run_id = run_id), '')
      FROM treadle.workflow_runs AS r WHERE r.id = run_id
$$;
-- pg_temp.claimable(queue): the jobs a claim of that queue takes now (rolled back: it claims nothing)
CREATE FUNCTION pg_temp.claimable(q text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_n bigint;
BEGIN
    SELECT count(*) INTO v_n FROM treadle.claim('w2', ARRAY[q], batch => 100);
    RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = v_n::text;
EXCEPTION WHEN raise_exception THEN
    RETURN SQLERRM::bigint;
END;
$$;

SELECT lives_ok($$ SELECT treadle.define_workflow('fan', ARRAY['a', 'b', 'c', 'j'], after => '{"j": ["a", "b", "c"]}') $$,
                'a graph: a, b and c at once, j after all three');
SELECT ok(NOT has_function_privilege('public', 'treadle._cancel_under_way(bigint, text, boolean)', 'execute'),
          'the helper is the owner''s alone');

--------------------------------------------------------------------------------
-- a running step whose cancel was requested (treadle.cancel) ends: the run is cancelled,
-- and its waiting and running siblings stop as cancel_workflow stops them
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('fan', '{}', queue => 'gc1') AS r1 \gset
SELECT l.id AS a1, l.lease_token AS a1_tok FROM pg_temp.lease(:r1, 'a') AS l \gset
SELECT l.id AS c1, l.lease_token AS c1_tok FROM pg_temp.lease(:r1, 'c') AS l \gset
SELECT ok(treadle.cancel(:a1), 'a cancel is requested on a running step');
SELECT is(pg_temp.state(:r1), 'running', 'the run runs on while that step runs');
SELECT is(treadle.complete(:a1, :'a1_tok', '{}'), 'cancelled', 'the step ends cancelled');
SELECT is(pg_temp.state(:r1), 'cancelled', 'its run is cancelled');
SELECT is(pg_temp.steps(:r1), ARRAY['a:cancelled!', 'b:cancelled', 'c:running!'],
          'its waiting sibling is cancelled, its running sibling is asked to stop');
SELECT is(pg_temp.claimable('gc1'), 0::bigint, 'no claim takes a step of the cancelled run');
SELECT is(treadle.heartbeat(:c1, :'c1_tok'), 'cancel', 'the running sibling''s heartbeat says cancel');
SELECT is(treadle.complete(:c1, :'c1_tok', '{"late": 1}'), 'cancelled', 'and it ends cancelled');
SELECT is(pg_temp.steps(:r1), ARRAY['a:cancelled!', 'b:cancelled', 'c:cancelled!'], 'the join never starts');

-- the same run cancelled by cancel_workflow at the same point: left the same way
SELECT treadle.start_workflow('fan', '{}', queue => 'gc2') AS r2 \gset
SELECT l.id AS a2, l.lease_token AS a2_tok FROM pg_temp.lease(:r2, 'a') AS l \gset
SELECT l.id AS c2, l.lease_token AS c2_tok FROM pg_temp.lease(:r2, 'c') AS l \gset
SELECT ok(treadle.cancel_workflow(:r2), 'cancel_workflow of the twin run');
SELECT is(treadle.complete(:a2, :'a2_tok', '{}'), 'cancelled', 'its step a ends cancelled');
SELECT is(treadle.complete(:c2, :'c2_tok', '{"late": 1}'), 'cancelled', 'its step c ends cancelled');
SELECT is(pg_temp.shape(:r1), pg_temp.shape(:r2), 'the step''s cancel leaves the run and its steps as cancel_workflow');
SELECT is(treadle.retry_run(:r1), 'running', 'retry_run resumes the run a step cancelled');
SELECT is(treadle.retry_run(:r2), 'running', 'and the twin');
SELECT is(pg_temp.shape(:r1), pg_temp.shape(:r2), 'both resume the same way');
SELECT is(pg_temp.steps(:r1), ARRAY['a:available', 'b:available', 'c:available'], 'every branch runs again');

--------------------------------------------------------------------------------
-- the other ends of a step that cancel its run
--------------------------------------------------------------------------------
-- treadle.cancel of a waiting step
SELECT treadle.start_workflow('fan', '{}', queue => 'gc3') AS r3 \gset
SELECT l.id AS a3 FROM pg_temp.lease(:r3, 'a') AS l \gset
SELECT ok(treadle.cancel((pg_temp.stepjob(:r3, 'b')).id), 'treadle.cancel of a waiting step');
SELECT is(pg_temp.state(:r3), 'cancelled', 'cancels its run at once');
SELECT is(pg_temp.steps(:r3), ARRAY['a:running!', 'b:cancelled', 'c:cancelled'], 'and stops its siblings');
SELECT is(pg_temp.claimable('gc3'), 0::bigint, 'nothing of it is claimed');
SELECT ok(NOT treadle.cancel_workflow(:r3), 'cancel_workflow then finds nothing to do');

-- fail of a step whose cancel was requested
SELECT treadle.start_workflow('fan', '{}', queue => 'gc4') AS r4 \gset
SELECT l.id AS a4, l.lease_token AS a4_tok FROM pg_temp.lease(:r4, 'a') AS l \gset
SELECT ok(treadle.cancel(:a4), 'a cancel is requested');
SELECT is(treadle.fail(:a4, :'a4_tok', 'stopped'), 'cancelled', 'fail ends the step cancelled');
SELECT is(pg_temp.steps(:r4), ARRAY['a:cancelled!', 'b:cancelled', 'c:cancelled'], 'its siblings are cancelled');
SELECT is(pg_temp.state(:r4), 'cancelled', 'and its run');

-- release (a worker's hand-back) of a step whose cancel was requested
SELECT treadle.start_workflow('fan', '{}', queue => 'gc5') AS r5 \gset
SELECT l.id AS a5, l.lease_token AS a5_tok FROM pg_temp.lease(:r5, 'a') AS l \gset
SELECT ok(treadle.cancel(:a5), 'a cancel is requested');
SELECT is(treadle.release(:a5, :'a5_tok'), 'cancelled', 'release ends the step cancelled');
SELECT is(pg_temp.steps(:r5), ARRAY['a:cancelled!', 'b:cancelled', 'c:cancelled'], 'its siblings are cancelled');

-- complete_and_claim: the claim of the same call takes no sibling
SELECT treadle.start_workflow('fan', '{}', queue => 'gc6') AS r6 \gset
SELECT l.id AS a6, l.lease_token AS a6_tok FROM pg_temp.lease(:r6, 'a') AS l \gset
SELECT ok(treadle.cancel(:a6), 'a cancel is requested');
SELECT results_eq(format($$ SELECT finished_id, finished_state, (job).id FROM treadle.complete_and_claim(
                                ARRAY[%s]::bigint[], ARRAY[%L]::uuid[], ARRAY['{}']::jsonb[], 'w', ARRAY['gc6'], batch => 10) $$,
                         :a6, :'a6_tok'),
                  format($$ VALUES (%s::bigint, 'cancelled'::text, NULL::bigint) $$, :a6),
                  'complete_and_claim ends the step cancelled and claims none of its siblings');
SELECT is(pg_temp.steps(:r6), ARRAY['a:cancelled!', 'b:cancelled', 'c:cancelled'], 'they are cancelled');

-- an element of a map step
SELECT lives_ok($$ SELECT treadle.define_workflow('thumbs', ARRAY['load', 'resize', 'side'],
                                                  after => '{"resize": ["load"]}', maps => '{"resize": "load"}') $$,
                'a map step beside a plain branch');
SELECT treadle.start_workflow('thumbs', '{}', queue => 'gc7') AS r7 \gset
SELECT l.id AS s7 FROM pg_temp.lease(:r7, 'side') AS l \gset
SELECT is(treadle.complete(l.id, l.lease_token, '[1, 2, 3]'), 'completed', 'load completes') FROM pg_temp.lease(:r7, 'load') AS l;
SELECT ok(treadle.cancel((pg_temp.stepjob(:r7, 'resize')).id), 'treadle.cancel of one element job');
SELECT is(pg_temp.steps(:r7), ARRAY['load:completed', 'side:running!', 'resize:cancelled', 'resize:cancelled', 'resize:cancelled'],
          'the other elements are cancelled, the running branch asked to stop');
SELECT is(pg_temp.state(:r7), 'cancelled', 'the run is cancelled');

--------------------------------------------------------------------------------
-- a child run that is cancelled cancels its parent: the parent's other steps stop too
--------------------------------------------------------------------------------
SELECT lives_ok($$ SELECT treadle.define_workflow('inner', ARRAY['x']) $$, 'the child workflow');
SELECT lives_ok($$ SELECT treadle.define_workflow('outer', ARRAY['kid', 'side', 'last'],
                    after => '{"last": ["kid", "side"]}', children => '{"kid": {"workflow": "inner"}}') $$,
                'a parent whose child step runs beside a plain one');
SELECT treadle.start_workflow('outer', '{}', queue => 'gc8') AS r8 \gset
SELECT r.id AS k8 FROM treadle.workflow_runs AS r WHERE r.parent_run_id = :r8 \gset
SELECT ok(treadle.cancel((pg_temp.stepjob(:k8, 'x')).id), 'the child''s step is cancelled');
SELECT results_eq(format($$ SELECT pg_temp.state(%s), pg_temp.state(%s) $$, :k8, :r8),
                  $$ VALUES ('cancelled', 'cancelled') $$, 'the child is cancelled, and with it the parent');
SELECT is(pg_temp.steps(:r8), ARRAY['side:cancelled'], 'the parent''s waiting step is cancelled');
SELECT is(pg_temp.claimable('gc8'), 0::bigint, 'nothing of either run is claimed');

--------------------------------------------------------------------------------
-- sleeps and signal waits under way end, as cancel_workflow ends them
--------------------------------------------------------------------------------
SELECT lives_ok($$ SELECT treadle.define_workflow('nap', ARRAY['a', 'zz', 'gate', 'j'],
                    after => '{"j": ["a", "zz", "gate"]}', sleeps => '{"zz": "1 hour"}',
                    waits => '{"gate": {"signal": "go", "timeout": "2 hours"}}') $$,
                'a graph with a sleep and a wait beside a step');
SELECT treadle.start_workflow('nap', '{}', queue => 'gc9') AS r9 \gset
SELECT treadle.start_workflow('nap', '{}', queue => 'gc9') AS r10 \gset
SELECT l.id AS a9, l.lease_token AS a9_tok FROM pg_temp.lease(:r9, 'a') AS l \gset
SELECT l.id AS a10, l.lease_token AS a10_tok FROM pg_temp.lease(:r10, 'a') AS l \gset
SELECT ok(treadle.cancel(:a9), 'a cancel is requested on the step');
SELECT is(treadle.complete(:a9, :'a9_tok', '{}'), 'cancelled', 'it ends cancelled');
SELECT ok(treadle.cancel_workflow(:r10), 'the twin is cancelled by cancel_workflow');
SELECT is(treadle.complete(:a10, :'a10_tok', '{}'), 'cancelled', 'its step ends cancelled');
SELECT results_eq(format($$ SELECT state, wake_at, waiting, wait_until FROM treadle.workflow_runs WHERE id = %s $$, :r9),
                  $$ VALUES ('cancelled', NULL::timestamptz, NULL::jsonb, NULL::timestamptz) $$,
                  'the run is cancelled, its sleep and its wait ended');
SELECT is(pg_temp.shape(:r9), pg_temp.shape(:r10), 'as cancel_workflow leaves them');
SET LOCAL treadle.now = '2999-01-01 15:00:00+00';
SELECT lives_ok('SELECT treadle.rescue()', 'rescue after the sleep and the wait would have ended');
SELECT is(treadle.signal(:r9, 'go'), 'finished', 'a signal finds the run finished');
SELECT is(pg_temp.steps(:r9), ARRAY['a:cancelled!'], 'nothing started');
SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

--------------------------------------------------------------------------------
-- a run with compensations is cancelled, not compensated, as by cancel_workflow
--------------------------------------------------------------------------------
SELECT lives_ok($$ SELECT treadle.define_workflow('saga', ARRAY['a', 'b', 'c'], after => '{}',
                    compensations => '{"a": "undo_a"}') $$, 'three steps at once, a with a compensation');
SELECT treadle.start_workflow('saga', '{}', queue => 'gc11') AS r11 \gset
SELECT is(treadle.complete(l.id, l.lease_token, '{"did": 1}'), 'completed', 'a completes') FROM pg_temp.lease(:r11, 'a') AS l;
SELECT l.id AS b11, l.lease_token AS b11_tok FROM pg_temp.lease(:r11, 'b') AS l \gset
SELECT ok(treadle.cancel(:b11), 'a cancel is requested on b');
SELECT is(treadle.complete(:b11, :'b11_tok', '{}'), 'cancelled', 'b ends cancelled');
SELECT is(pg_temp.state(:r11), 'cancelled', 'the run is cancelled, not compensating');
SELECT is(pg_temp.steps(:r11), ARRAY['a:completed', 'b:cancelled!', 'c:cancelled'], 'its waiting step is cancelled');
SELECT is(treadle.compensate_run(:r11), 'compensating', 'compensate_run then undoes it');

SELECT * FROM finish();
ROLLBACK;
