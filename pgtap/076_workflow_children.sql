-- pgtap/076_workflow_children.sql: child steps (define_workflow's and
-- start_workflow's `children`): a step that starts a run of another workflow when it
-- becomes ready, completes with the child's results when the child completes, fails
-- or is cancelled with it, and is cancelled with its parent; the checks at define
-- and start time, the depth bound, tenants.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(89);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

-- pg_temp.steps(run): the run's step jobs as 'step:state', in id order
CREATE FUNCTION pg_temp.steps(run_id bigint) RETURNS text[] LANGUAGE sql AS $$
    SELECT coalesce(array_agg(j.step || ':' || j.state ORDER BY j.id), '{}')
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
-- pg_temp.finish(run, step, result): lease that step's job and complete it
CREATE FUNCTION pg_temp.finish(run_id bigint, step_name text, step_result jsonb DEFAULT '{}') RETURNS text
LANGUAGE sql AS $$
    SELECT treadle.complete(l.id, l.lease_token, step_result) FROM pg_temp.lease(run_id, step_name) AS l
$$;
-- pg_temp.discard(run, step): lease that step's job and fail it for good
CREATE FUNCTION pg_temp.discard(run_id bigint, step_name text) RETURNS text
LANGUAGE sql AS $$
    SELECT treadle.fail(l.id, l.lease_token, 'boom', retryable => false) FROM pg_temp.lease(run_id, step_name) AS l
$$;
-- pg_temp.child(run, step): the id of the child run a step started
CREATE FUNCTION pg_temp.child(run_id bigint, step_name text) RETURNS bigint LANGUAGE sql AS $$
    SELECT r.id FROM treadle.workflow_runs AS r WHERE r.parent_run_id = run_id AND r.parent_step = step_name
$$;
-- pg_temp.state(run): a run's state
CREATE FUNCTION pg_temp.state(run_id bigint) RETURNS text LANGUAGE sql AS $$
    SELECT r.state FROM treadle.workflow_runs AS r WHERE r.id = run_id
$$;

--------------------------------------------------------------------------------
-- charge (a child workflow of two steps); order: reserve -> pay (child: charge) -> ship
--------------------------------------------------------------------------------
SELECT lives_ok($$ SELECT treadle.define_workflow('charge', ARRAY['authorize', 'capture']) $$, 'the child workflow is defined');
SELECT lives_ok($$ SELECT treadle.define_workflow('order', ARRAY['reserve', 'pay', 'ship'],
                                                  children => '{"pay": {"workflow": "charge"}}') $$,
                'define_workflow takes the child steps of a list');
SELECT results_eq($$ SELECT after, children FROM treadle.workflows WHERE name = 'order' $$,
                  $$ VALUES ('{"reserve": [], "pay": ["reserve"], "ship": ["pay"]}'::jsonb,
                             '{"pay": {"workflow": "charge"}}'::jsonb) $$,
                  'the definition records the child step and spells out the list as a graph');
SELECT treadle.start_workflow('order', '{"order": 7}', queue => 'shop') AS r1 \gset
SELECT is(pg_temp.steps(:r1), ARRAY['reserve:available'], 'the run starts with reserve');
SELECT is(pg_temp.finish(:r1, 'reserve', '{"held": true}'), 'completed', 'reserve completes');
SELECT is(pg_temp.steps(:r1), ARRAY['reserve:completed'], 'pay is no job of the parent');
SELECT isnt(pg_temp.child(:r1, 'pay'), NULL, 'pay started a child run in the same transaction');
SELECT pg_temp.child(:r1, 'pay') AS c1 \gset
SELECT is((SELECT r.parent_queue FROM treadle.workflow_runs AS r WHERE r.id = :c1), 'shop',
          'the child run names its parent''s queue');
SELECT results_eq(format($$ SELECT name, state, queue, input, parent_run_id, parent_step FROM treadle.workflow_runs WHERE id = %s $$, :c1),
                  format($$ VALUES ('charge'::text, 'running'::text, 'shop'::text, '{"reserve": {"held": true}}'::jsonb, %s::bigint, 'pay'::text) $$, :r1),
                  'the child runs charge in the parent''s queue, with the results pay runs after as its input');
SELECT is(pg_temp.steps(:c1), ARRAY['authorize:available'], 'the child''s first step is enqueued');
SELECT is(pg_temp.finish(:c1, 'authorize', '{"auth": "A1"}'), 'completed', 'the child''s first step completes');
SELECT is(pg_temp.state(:r1), 'running', 'the parent waits for the child');
SELECT is(pg_temp.finish(:c1, 'capture', '{"captured": 10}'), 'completed', 'the child''s last step completes');
SELECT is(pg_temp.state(:c1), 'completed', 'the child completed');
SELECT results_eq(format($$ SELECT results -> 'pay' FROM treadle.workflow_runs WHERE id = %s $$, :r1),
                  $$ VALUES ('{"authorize": {"auth": "A1"}, "capture": {"captured": 10}}'::jsonb) $$,
                  'the parent''s step completes with the child''s results');
SELECT is(pg_temp.steps(:r1), ARRAY['reserve:completed', 'ship:available'], 'the parent moves on to ship');
SELECT is(pg_temp.finish(:r1, 'ship'), 'completed', 'ship completes');
SELECT is(pg_temp.state(:r1), 'completed', 'the parent completes');
SELECT is(treadle.workflow_step_results(:r1, 'ship') -> 'pay' -> 'capture', '{"captured": 10}'::jsonb,
          'the steps after the child step receive its result');

--------------------------------------------------------------------------------
-- a child step that runs after nothing starts with the run, with the run's input,
-- in the queue it names; a child's failure fails the parent
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('fanout', '{"n": 1}', steps => ARRAY['kid', 'other'], queue => 'shop',
                              after => '{}', children => '{"kid": {"workflow": "charge", "queue": "payments"}}') AS r2 \gset
SELECT pg_temp.child(:r2, 'kid') AS c2 \gset
SELECT results_eq(format($$ SELECT queue, input FROM treadle.workflow_runs WHERE id = %s $$, :c2),
                  $$ VALUES ('payments'::text, '{"n": 1}'::jsonb) $$,
                  'a child step without dependencies starts with the run, with its input, in the queue it names');
SELECT is(pg_temp.steps(:r2), ARRAY['other:available'], 'the other first step is a job as before');
SELECT is(pg_temp.discard(:c2, 'authorize'), 'discarded', 'the child''s step fails for good');
SELECT is(pg_temp.state(:c2), 'failed', 'the child fails');
SELECT is(pg_temp.state(:r2), 'failed', 'the parent fails with it');
SELECT ok((SELECT finished_at IS NOT NULL FROM treadle.workflow_runs WHERE id = :r2), 'the failed parent has finished_at');
SELECT is(pg_temp.finish(:r2, 'other', '{"late": 1}'), 'completed', 'the parent''s other branch completes anyway');
SELECT is(pg_temp.state(:r2), 'failed', 'the failed parent stays failed');

--------------------------------------------------------------------------------
-- cancelling: the parent cancels the child; a cancelled child cancels the parent
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('order', '{}', queue => 'shop') AS r3 \gset
SELECT is(pg_temp.finish(:r3, 'reserve'), 'completed', 'reserve completes');
SELECT pg_temp.child(:r3, 'pay') AS c3 \gset
SELECT is(treadle.cancel_workflow(:r3), true, 'cancel_workflow on a parent whose child is under way');
SELECT is(pg_temp.state(:c3), 'cancelled', 'the child is cancelled');
SELECT is(pg_temp.steps(:c3), ARRAY['authorize:cancelled'], 'the child''s pending step is cancelled');
SELECT is(pg_temp.state(:r3), 'cancelled', 'the parent is cancelled');
SELECT is(treadle.cancel_workflow(:r3), false, 'a second cancel finds nothing to do');

SELECT treadle.start_workflow('order', '{}', queue => 'shop') AS r4 \gset
SELECT is(pg_temp.finish(:r4, 'reserve'), 'completed', 'reserve completes');
SELECT pg_temp.child(:r4, 'pay') AS c4 \gset
SELECT pg_temp.lease(:c4, 'authorize') IS NOT NULL AS leased \gset
SELECT is(treadle.cancel_workflow(:r4), true, 'cancel_workflow on a parent whose child''s step runs');
SELECT is(pg_temp.state(:r4), 'running', 'the parent runs until the child''s running step ends');
SELECT is(treadle.cancel_workflow(:r4), false, 'a second cancel: the child''s cancel is requested already');
SELECT is(treadle.complete(j.id, j.lease_token, '{}'), 'cancelled', 'the child''s running step ends cancelled')
  FROM treadle.jobs AS j WHERE j.workflow_run_id = :c4;
SELECT is(pg_temp.state(:c4), 'cancelled', 'the child is cancelled');
SELECT is(pg_temp.state(:r4), 'cancelled', 'and with it the parent');

SELECT treadle.start_workflow('order', '{}', queue => 'shop') AS r5 \gset
SELECT is(pg_temp.finish(:r5, 'reserve'), 'completed', 'reserve completes');
SELECT is(treadle.cancel_workflow(pg_temp.child(:r5, 'pay')), true, 'cancel_workflow on the child itself');
SELECT is(pg_temp.state(:r5), 'cancelled', 'a cancelled child cancels its parent');

--------------------------------------------------------------------------------
-- retry: resuming a child resumes its parent; resuming a parent resumes its children
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('order', '{}', queue => 'shop') AS r7 \gset
SELECT is(pg_temp.finish(:r7, 'reserve'), 'completed', 'reserve completes');
SELECT pg_temp.child(:r7, 'pay') AS c7 \gset
SELECT is(pg_temp.discard(:c7, 'authorize'), 'discarded', 'the child''s step fails for good');
SELECT is(pg_temp.state(:r7), 'failed', 'the parent fails with its child');
SELECT is(treadle.retry(j.id), true, 'retry of the child''s failed step')
  FROM treadle.jobs AS j WHERE j.workflow_run_id = :c7 AND j.step = 'authorize';
SELECT results_eq(format($$ SELECT state, finished_at IS NULL FROM treadle.workflow_runs WHERE id IN (%s, %s) ORDER BY id $$, :r7, :c7),
                  $$ VALUES ('running'::text, true), ('running', true) $$, 'resumes the child and its parent');
SELECT is(pg_temp.finish(:c7, 'authorize'), 'completed', 'the retried step completes');
SELECT is(pg_temp.finish(:c7, 'capture'), 'completed', 'the child''s last step completes');
SELECT is(pg_temp.steps(:r7), ARRAY['reserve:completed', 'ship:available'], 'the resumed parent moves on');
SELECT is((SELECT count(*) FROM treadle.workflow_runs WHERE parent_run_id = :r7), 1::bigint, 'with the one child it had');

SELECT treadle.start_workflow('twins', '{}', steps => ARRAY['kid', 'own'], queue => 'shop', after => '{}',
                              children => '{"kid": {"workflow": "charge"}}') AS r8 \gset
SELECT pg_temp.child(:r8, 'kid') AS c8 \gset
SELECT is(pg_temp.discard(:r8, 'own'), 'discarded', 'the parent''s own step fails for good');
SELECT is(pg_temp.discard(:c8, 'authorize'), 'discarded', 'and so does the child''s');
SELECT results_eq(format($$ SELECT state FROM treadle.workflow_runs WHERE id IN (%s, %s) ORDER BY id $$, :r8, :c8),
                  $$ VALUES ('failed'::text), ('failed') $$, 'both failed');
SELECT is(treadle.retry(j.id), true, 'retry of the parent''s failed step')
  FROM treadle.jobs AS j WHERE j.workflow_run_id = :r8 AND j.step = 'own';
SELECT results_eq(format($$ SELECT state FROM treadle.workflow_runs WHERE id IN (%s, %s) ORDER BY id $$, :r8, :c8),
                  $$ VALUES ('running'::text), ('running') $$, 'resumes the parent and its failed child');
SELECT is(pg_temp.steps(:c8), ARRAY['authorize:available'], 'whose failed step is available again');

--------------------------------------------------------------------------------
-- one child per step, ever; nesting; the depth bound
--------------------------------------------------------------------------------
SELECT throws_ok(format($$ INSERT INTO treadle.workflow_runs (name, steps, queue, priority, max_attempts, created_at,
                                                               parent_run_id, parent_step, parent_queue)
                           VALUES ('charge', ARRAY['a'], 'shop', 0, 1, now(), %s, 'pay', 'shop') $$, :r1),
                 '23505', NULL, 'a second child run of the same step is refused by the unique index');
SELECT throws_ok(format($$ INSERT INTO treadle.workflow_runs (name, steps, queue, priority, max_attempts, created_at,
                                                               parent_run_id, parent_step)
                           VALUES ('charge', ARRAY['a'], 'other', 0, 1, now(), %s, 'pay') $$, :r1),
                 '23514', NULL, 'a child run that names no parent queue is refused');
SELECT lives_ok($$ SELECT treadle.define_workflow('outer', ARRAY['inner'], children => '{"inner": {"workflow": "order"}}') $$,
                'a workflow whose only step is a child');
SELECT treadle.start_workflow('outer', '{"o": 1}', queue => 'shop') AS r6 \gset
SELECT pg_temp.child(:r6, 'inner') AS c6 \gset
SELECT is(pg_temp.finish(:c6, 'reserve'), 'completed', 'the middle run''s first step completes');
SELECT pg_temp.child(:c6, 'pay') AS g6 \gset
SELECT is(pg_temp.finish(:g6, 'authorize'), 'completed', 'the grandchild''s first step');
SELECT is(pg_temp.finish(:g6, 'capture'), 'completed', 'the grandchild''s last step');
SELECT is(pg_temp.finish(:c6, 'ship', '"shipped"'), 'completed', 'the middle run''s last step');
SELECT results_eq(format($$ SELECT state, results -> 'inner' -> 'ship' FROM treadle.workflow_runs WHERE id = %s $$, :r6),
                  $$ VALUES ('completed'::text, '"shipped"'::jsonb) $$,
                  'completion climbs through every level');

SELECT lives_ok($$ SELECT treadle.define_workflow('forever', ARRAY['again'], children => '{"again": {"workflow": "forever"}}') $$,
                'a workflow may name itself as a child');
SELECT throws_like($$ SELECT treadle.start_workflow('forever', '{}', queue => 'shop') $$,
                   '%child step "again" would nest workflow runs more than 10 levels deep%',
                   'but its runs stop at 10 levels');
SELECT is((SELECT count(*) FROM treadle.workflow_runs WHERE name = 'forever'), 0::bigint, 'and no run of it is left');
SELECT throws_ok($$ SELECT treadle.start_workflow('lost', steps => ARRAY['x'], children => '{"x": {"workflow": "nowhere"}}') $$,
                 '22023', 'treadle: child step "x" starts workflow nowhere, which has no definition',
                 'a child step of a workflow without a definition is refused when it starts');

--------------------------------------------------------------------------------
-- bad definitions: 22023 naming the step, nothing written
--------------------------------------------------------------------------------
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a'], children => '[]') $$,
                 '22023', 'treadle: children must be a JSON object mapping a step to {"workflow": name}, not array',
                 'children must be an object');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a'], children => '{"b": {"workflow": "charge"}}') $$,
                 '22023', 'treadle: children names step "b", which is not one of the steps', 'an unknown step');
SELECT throws_like($$ SELECT treadle.define_workflow('bad', ARRAY['a'], children => '{"a": "charge"}') $$,
                   '%child step "a" must be {"workflow": name}%', 'a value that is not an object');
SELECT throws_like($$ SELECT treadle.define_workflow('bad', ARRAY['a'], children => '{"a": {"workflow": ""}}') $$,
                   '%child step "a" must be {"workflow": name}%', 'an empty workflow name');
SELECT throws_like($$ SELECT treadle.define_workflow('bad', ARRAY['a'], children => '{"a": {"workflow": "c", "queue": 3}}') $$,
                   '%child step "a" must be {"workflow": name}%', 'a queue that is not a name');
SELECT throws_like($$ SELECT treadle.define_workflow('bad', ARRAY['a'], children => '{"a": {"workflow": "c", "extra": 1}}') $$,
                   '%child step "a" must be {"workflow": name}%', 'an unknown key');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], sleeps => '{"a": "1 hour"}', children => '{"a": {"workflow": "c"}}') $$,
                 '22023', 'treadle: step "a" is a sleep step and cannot start a child workflow', 'a sleep step');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], maps => '{"b": "a"}', children => '{"b": {"workflow": "c"}}') $$,
                 '22023', 'treadle: step "b" is a map step and cannot start a child workflow', 'a map step');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], waits => '{"b": {"signal": "go"}}', children => '{"b": {"workflow": "c"}}') $$,
                 '22023', 'treadle: step "b" is a wait step and cannot start a child workflow', 'a wait step');
SELECT throws_ok($$ SELECT treadle.start_workflow('bad', steps => ARRAY['a', 'b'], waits => '{"a": {"signal": "go"}}', children => '{"a": {"workflow": "c"}}') $$,
                 '22023', 'treadle: step "a" is a wait step and cannot start a child workflow', 'a wait step given to start_workflow');
SELECT throws_ok($$ SELECT treadle.start_workflow('bad', children => '{"a": {"workflow": "c"}}') $$,
                 '22023', 'treadle: after, sleeps, maps, children and compensations need steps', 'children without steps');
SELECT is((SELECT count(*) FROM treadle.workflows WHERE name = 'bad'), 0::bigint, 'nothing was defined');

--------------------------------------------------------------------------------
-- tenants: a tenant's child stays in its prefix
--------------------------------------------------------------------------------
CREATE ROLE ten_a;  SELECT treadle.grant_worker('ten_a');  SELECT treadle.grant_producer('ten_a');
SELECT treadle.set_tenant('ten_a', 'a.');
SELECT is(pg_temp.as_role('ten_a', $$ SELECT treadle.define_workflow('a.flow', ARRAY['x'], children => '{"x": {"workflow": "charge"}}') $$),
          '42501', 'a tenant''s child workflow outside its prefix is refused');
SELECT is(pg_temp.as_role('ten_a', $$ SELECT treadle.define_workflow('a.flow', ARRAY['x'], children => '{"x": {"workflow": "a.kid", "queue": "shop"}}') $$),
          '42501', 'so is a child queue outside its prefix');
SELECT lives_ok($$ SELECT treadle.define_workflow('a.mixed', ARRAY['x'], children => '{"x": {"workflow": "charge"}}') $$,
                'a role that is not a tenant defines a child anywhere');
SELECT is(pg_temp.as_role('ten_a', $$ SELECT treadle.start_workflow('a.mixed', queue => 'a.q') $$),
          '42501', 'a tenant cannot start a definition whose child leaves its prefix');
SELECT is(pg_temp.as_role('ten_a', $$ SELECT treadle.define_workflow('a.flow', ARRAY['x'], children => '{"x": {"workflow": "a.kid", "queue": "a.kids"}}') $$),
          'ok', 'a tenant''s child within its prefix');


-- a child run takes its definition as start_workflow does: its wait steps, and the version
SELECT treadle.define_workflow('waitkid', ARRAY['w', 'x'], waits => '{"w": {"signal": "go"}}');
SELECT treadle.define_workflow('waitkid', ARRAY['w', 'x', 'y'], waits => '{"w": {"signal": "go"}}');
SELECT treadle.start_workflow('waitparent', steps => ARRAY['kid'], after => '{}',
                              children => '{"kid": {"workflow": "waitkid"}}') AS wp \gset
SELECT results_eq(format($$ SELECT version, waits, waiting ? 'w' FROM treadle.workflow_runs WHERE parent_run_id = %s $$, :wp),
                  $$ VALUES (2::bigint, '{"w": {"signal": "go"}}'::jsonb, true) $$,
                  'a child run records its definition''s version and waits at its wait step');
SELECT is(treadle.signal((SELECT id FROM treadle.workflow_runs WHERE parent_run_id = :wp), 'go', '{"ok": true}'), 'delivered',
          'a signal to the child completes its wait step');

SELECT * FROM finish();
ROLLBACK;
