-- pgtap/074_workflow_signals.sql: wait steps (define_workflow's and start_workflow's
-- `waits`) and treadle.signal / treadle.signal_by_key: a signal delivered to a wait
-- under way, kept for a wait not reached yet, ignored, or refused; the timeout;
-- bad input that changes nothing; roles and tenants.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(105);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

-- pg_temp.finish(run, step, result): claim that step's (single) job and complete it
CREATE FUNCTION pg_temp.finish(run_id bigint, step_name text, step_result jsonb DEFAULT '{}') RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_job treadle.jobs;
    v_token uuid := gen_random_uuid();
BEGIN
    SELECT * INTO STRICT v_job FROM treadle.jobs AS j
     WHERE j.workflow_run_id = run_id AND j.step = step_name AND j.state = 'available';
    UPDATE treadle.jobs AS j SET state = 'running', lease_until = treadle.now() + interval '1 hour',
           lease_token = v_token, worker_id = 'w', attempt = 1
     WHERE j.id = v_job.id;
    RETURN treadle.complete(v_job.id, v_token, step_result);
END;
$$;
-- pg_temp.steps(run): the run's step jobs as 'step:state', in id order
CREATE FUNCTION pg_temp.steps(run_id bigint) RETURNS text[] LANGUAGE sql AS $$
    SELECT coalesce(array_agg(j.step || ':' || j.state ORDER BY j.id), '{}')
      FROM treadle.jobs AS j WHERE j.workflow_run_id = run_id
$$;
-- pg_temp.run_text(run): everything a signal may change on a run, as text
CREATE FUNCTION pg_temp.run_text(run_id bigint) RETURNS text LANGUAGE sql AS $$
    SELECT row(r.state, r.results, r.waiting, r.wait_until, pg_temp.steps(r.id),
               (SELECT count(*) FROM treadle.workflow_signals AS g WHERE g.run_id = r.id))::text
      FROM treadle.workflow_runs AS r WHERE r.id = run_id
$$;

--------------------------------------------------------------------------------
-- Definitions: checked, normalised, refused with nothing written
--------------------------------------------------------------------------------
SELECT lives_ok($$ SELECT treadle.define_workflow('orders', ARRAY['order', 'approve', 'ship'],
                        waits => '{"approve": {"signal": "approved", "timeout": "72 hours"}}') $$,
                'a workflow with a wait step is defined');
SELECT is((SELECT waits FROM treadle.workflows WHERE name = 'orders'),
          '{"approve": {"signal": "approved", "timeout": "72:00:00"}}'::jsonb,
          'the wait is stored with its timeout normalised');
SELECT ok((SELECT after IS NOT NULL FROM treadle.workflows WHERE name = 'orders'),
          'a list with a wait step is stored as a graph');
SELECT lives_ok($$ SELECT treadle.define_workflow('orders', ARRAY['order', 'approve', 'ship'],
                        waits => '{"approve": {"signal": "approved"}}') $$,
                'a wait without a timeout is valid');
SELECT is((SELECT waits FROM treadle.workflows WHERE name = 'orders'), '{"approve": {"signal": "approved"}}'::jsonb,
          'and waits for ever');
SELECT lives_ok($$ SELECT treadle.define_workflow('plain', ARRAY['a', 'b'], waits => '{}') $$, 'waits {} is none');
SELECT is((SELECT waits FROM treadle.workflows WHERE name = 'plain'), NULL, 'stored as null');

CREATE TEMP TABLE before_defs AS SELECT * FROM treadle.workflows;
SELECT throws_ok($$ SELECT treadle.define_workflow('orders', ARRAY['a', 'b'], waits => '[]') $$,
                 '22023', NULL, 'waits must be an object');
SELECT throws_like($$ SELECT treadle.define_workflow('orders', ARRAY['a', 'b'], waits => '{"c": {"signal": "go"}}') $$,
                   '%step "c"%not one of the steps%', 'a wait on an unknown step names it');
SELECT throws_like($$ SELECT treadle.define_workflow('orders', ARRAY['a', 'b'], sleeps => '{"b": "1 hour"}',
                                                     waits => '{"b": {"signal": "go"}}') $$,
                   '%step "b" is a sleep step%', 'a sleep step cannot wait');
SELECT throws_like($$ SELECT treadle.define_workflow('orders', ARRAY['a', 'b'], maps => '{"b": "a"}',
                                                     waits => '{"b": {"signal": "go"}}') $$,
                   '%step "b" is a map step%', 'a map step cannot wait');
SELECT throws_like($$ SELECT treadle.define_workflow('orders', ARRAY['a', 'b'], waits => '{"b": "go"}') $$,
                   '%wait step "b" must be {"signal": name}%', 'a wait is an object');
SELECT throws_like($$ SELECT treadle.define_workflow('orders', ARRAY['a', 'b'], waits => '{"b": {}}') $$,
                   '%wait step "b" must be%', 'a wait names its signal');
SELECT throws_like($$ SELECT treadle.define_workflow('orders', ARRAY['a', 'b'], waits => '{"b": {"signal": ""}}') $$,
                   '%wait step "b" must be%', 'a signal name is a valid name');
SELECT throws_like($$ SELECT treadle.define_workflow('orders', ARRAY['a', 'b'], waits => '{"b": {"signal": 7}}') $$,
                   '%wait step "b" must be%', 'a signal name is a string');
SELECT throws_like($$ SELECT treadle.define_workflow('orders', ARRAY['a', 'b'],
                                                     waits => '{"b": {"signal": "go", "branch": "x"}}') $$,
                   '%wait step "b" must be%', 'a wait has no other keys');
SELECT throws_like($$ SELECT treadle.define_workflow('orders', ARRAY['a', 'b'],
                                                     waits => '{"b": {"signal": "go", "timeout": "soon"}}') $$,
                   '%wait step "b" must time out after an interval%', 'a timeout is an interval');
SELECT throws_like($$ SELECT treadle.define_workflow('orders', ARRAY['a', 'b'],
                                                     waits => '{"b": {"signal": "go", "timeout": 60}}') $$,
                   '%wait step "b" must time out after an interval%', 'a timeout is an interval as text');
SELECT throws_like($$ SELECT treadle.define_workflow('orders', ARRAY['a', 'b'],
                                                     waits => '{"b": {"signal": "go", "timeout": "0 seconds"}}') $$,
                   '%wait step "b" must time out after more than 0%', 'a timeout is positive');
SELECT throws_like($$ SELECT treadle.define_workflow('orders', ARRAY['a', 'b'],
                                                     waits => '{"b": {"signal": "go", "timeout": "367 days"}}') $$,
                   '%wait step "b" must time out after more than 0 and at most 366 days%', 'a timeout is bounded');
SELECT throws_like($$ SELECT treadle.define_workflow('orders', ARRAY['a', 'b'],
                                                     waits => '{"b": {"signal": "go", "timeout": "1 hour", "on_timeout": "skip"}}') $$,
                   '%wait step "b" takes "on_timeout": "fail" or "continue", with a timeout%', 'on_timeout is fail or continue');
SELECT throws_like($$ SELECT treadle.define_workflow('orders', ARRAY['a', 'b'],
                                                     waits => '{"b": {"signal": "go", "on_timeout": "continue"}}') $$,
                   '%wait step "b" takes "on_timeout"%with a timeout%', 'on_timeout needs a timeout');
SELECT throws_ok($$ SELECT treadle.start_workflow('orders', waits => '{"b": {"signal": "go"}}') $$,
                 '22023', 'treadle: waits need steps', 'waits without steps');
SELECT throws_like($$ SELECT treadle.start_workflow('adhoc', steps => ARRAY['a', 'b'], waits => '{"z": {"signal": "go"}}') $$,
                   '%step "z"%', 'start_workflow checks waits as define_workflow does');
SELECT set_eq($$ SELECT * FROM treadle.workflows $$, $$ SELECT * FROM before_defs $$,
              'no refused definition wrote anything');
SELECT is((SELECT count(*) FROM treadle.workflow_runs WHERE name = 'adhoc'), 0::bigint, 'no refused run started');

--------------------------------------------------------------------------------
-- Delivered: the run waits, the signal completes the wait step with its payload
--------------------------------------------------------------------------------
SELECT treadle.define_workflow('orders', ARRAY['order', 'approve', 'ship'],
                               waits => '{"approve": {"signal": "approved", "timeout": "3 days"}}');
SELECT treadle.start_workflow('orders', '{"n": 1}', queue => 'sig') AS run1 \gset
SELECT is(pg_temp.finish(:run1, 'order', '{"total": 10}'), 'completed', 'the first step completes');
SELECT is(pg_temp.steps(:run1), ARRAY['order:completed'], 'a wait step has no job');
SELECT is((SELECT waiting FROM treadle.workflow_runs WHERE id = :run1),
          '{"approve": {"signal": "approved", "until": "2999-01-04T12:00:00+00:00"}}'::jsonb,
          'the wait is under way until its timeout');
SELECT is((SELECT wait_until FROM treadle.workflow_runs WHERE id = :run1), '2999-01-04 12:00:00+00'::timestamptz,
          'wait_until is the earliest timeout');
SELECT is((SELECT state || ' ' || waits_for FROM treadle.workflow_run_steps WHERE run_id = :run1 AND step = 'approve'),
          'waiting approved', 'the steps view shows the wait and its signal');

SELECT pg_temp.run_text(:run1) AS run1_text \gset
SELECT is(treadle.signal(:run1, 'rejected', '{}'), 'ignored', 'a signal the run does not wait for is ignored');
SELECT is(pg_temp.run_text(:run1), :'run1_text', 'and writes nothing');

SAVEPOINT before_signal;
SELECT is(treadle.signal(:run1, 'approved', '{"by": "ann"}'), 'delivered', 'the signal is delivered');
ROLLBACK TO SAVEPOINT before_signal;
SELECT is(pg_temp.run_text(:run1), :'run1_text', 'a signal rolled back was never delivered');

SELECT is(treadle.signal(:run1, 'approved', '{"by": "ann"}'), 'delivered', 'the signal is delivered again');
SELECT is((SELECT results -> 'approve' FROM treadle.workflow_runs WHERE id = :run1), '{"by": "ann"}'::jsonb,
          'the wait step completes with the payload as its result');
SELECT is(pg_temp.steps(:run1), ARRAY['order:completed', 'ship:available'], 'the step after it is enqueued');
SELECT is((SELECT row(waiting, wait_until)::text FROM treadle.workflow_runs WHERE id = :run1), '(,)',
          'no wait is under way any more');
SELECT is(treadle.workflow_step_results(:run1, 'ship'), '{"order": {"total": 10}, "approve": {"by": "ann"}}'::jsonb,
          'the next step receives the payload');
SELECT is(treadle.signal(:run1, 'approved', '{"by": "bob"}'), 'ignored', 'a second signal of the name is ignored');
SELECT is((SELECT count(*) FROM treadle.workflow_signals WHERE run_id = :run1), 0::bigint, 'and not kept');
SELECT is(pg_temp.finish(:run1, 'ship'), 'completed', 'the last step completes');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :run1), 'completed', 'the run completes');
SELECT is(treadle.signal(:run1, 'approved', '{}'), 'finished', 'a signal to a finished run: finished');
SELECT is((SELECT count(*) FROM treadle.workflow_signals WHERE run_id = :run1), 0::bigint, 'and nothing written');
SELECT is(treadle.signal(-1, 'approved', '{}'), 'unknown', 'a signal to an unknown run: unknown');
SELECT is((SELECT count(*) FROM treadle.workflow_signals), 0::bigint, 'and nothing written');

--------------------------------------------------------------------------------
-- Kept: a signal sent before the run reaches the wait is consumed there, once
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('orders', queue => 'sig') AS run2 \gset
SELECT is(treadle.signal(:run2, 'approved', '{"early": true}'), 'kept', 'a signal before the wait is kept');
SELECT is(treadle.signal(:run2, 'approved', '{"early": 2}'), 'ignored', 'one signal is kept per wait step');
SELECT is((SELECT array_agg(payload::text) FROM treadle.workflow_signals WHERE run_id = :run2), ARRAY['{"early": true}'],
          'the first one is kept');
SELECT is(pg_temp.finish(:run2, 'order'), 'completed', 'the step before the wait completes');
SELECT is((SELECT results -> 'approve' FROM treadle.workflow_runs WHERE id = :run2), '{"early": true}'::jsonb,
          'the wait step completes at once with the kept payload');
SELECT is(pg_temp.steps(:run2), ARRAY['order:completed', 'ship:available'], 'and the run moves on');
SELECT is((SELECT count(*) FROM treadle.workflow_signals WHERE run_id = :run2), 0::bigint, 'the kept signal is consumed');
SELECT is((SELECT waiting FROM treadle.workflow_runs WHERE id = :run2), NULL, 'no wait was left under way');

-- a wait that starts the run, and ends it
SELECT treadle.start_workflow('gate', steps => ARRAY['open'], waits => '{"open": {"signal": "go"}}', queue => 'sig')
    AS run3 \gset
SELECT is((SELECT waiting ->> 'open' FROM treadle.workflow_runs WHERE id = :run3), '{"until": null, "signal": "go"}',
          'a wait the run starts with is under way at once, without a timeout');
SELECT is((SELECT wait_until FROM treadle.workflow_runs WHERE id = :run3), NULL, 'and nothing times it out');
SELECT is(treadle.signal(:run3, 'go', '[1, 2]'), 'delivered', 'its signal is delivered');
SELECT is((SELECT row(state, results)::text FROM treadle.workflow_runs WHERE id = :run3),
          '(completed,"{""open"": [1, 2]}")', 'and the run completes with the payload');

-- two waits for one name take one signal each, in step order
SELECT treadle.start_workflow('twice', steps => ARRAY['x', 'y'], after => '{"x": [], "y": []}',
                              waits => '{"x": {"signal": "go"}, "y": {"signal": "go"}}', queue => 'sig') AS run4 \gset
SELECT is(treadle.signal(:run4, 'go', '{"n": 1}'), 'delivered', 'the first signal is delivered');
SELECT is((SELECT row(results, waiting ? 'y')::text FROM treadle.workflow_runs WHERE id = :run4),
          '("{""x"": {""n"": 1}}",t)', 'to the first wait in step order only');
SELECT is(treadle.signal(:run4, 'go', '{"n": 2}'), 'delivered', 'the second to the other');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :run4), 'completed', 'and the run completes');

--------------------------------------------------------------------------------
-- By key
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('orders', queue => 'sig', idempotency_key => 'order-7') AS run5 \gset
SELECT is(treadle.signal_by_key('sig', 'order-7', 'approved', '{"k": 1}'), 'kept', 'a signal by key reaches the run');
SELECT is((SELECT run_id FROM treadle.workflow_signals WHERE payload = '{"k": 1}'), :run5::bigint, 'kept for that run');
SELECT is(treadle.signal_by_key('sig', 'order-8', 'approved'), 'unknown', 'a key no run holds: unknown');
SELECT is(treadle.signal_by_key('other', 'order-7', 'approved'), 'unknown', 'keys are per queue');
SELECT throws_ok($$ SELECT treadle.signal_by_key(NULL, 'order-7', 'approved') $$, '22004', NULL, 'null queue');
SELECT throws_ok($$ SELECT treadle.signal_by_key('sig', NULL, 'approved') $$, '22004', NULL, 'null key');
SELECT throws_ok($$ SELECT treadle.signal_by_key('sig', 'order-7', NULL) $$, '22004', NULL, 'null name');
SELECT throws_ok($$ SELECT treadle.signal_by_key('sig', 'order-7', 'approved', '"x"') $$, '22023', NULL,
                 'a scalar payload by key');

--------------------------------------------------------------------------------
-- Bad input changes nothing
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('orders', queue => 'sig') AS run6 \gset
SELECT pg_temp.finish(:run6, 'order');
SELECT pg_temp.run_text(:run6) AS run6_text \gset
SELECT throws_ok($$ SELECT treadle.signal(NULL, 'approved') $$, '22004', NULL, 'a null run id');
SELECT throws_ok(format($$ SELECT treadle.signal(%s, NULL) $$, :run6), '22004', NULL, 'a null name');
SELECT throws_ok(format($$ SELECT treadle.signal(%s, '') $$, :run6), '22023', NULL, 'an empty name');
SELECT throws_ok(format($$ SELECT treadle.signal(%s, repeat('x', 201)) $$, :run6), '22023', NULL, 'a long name');
SELECT throws_ok(format($$ SELECT treadle.signal(%s, 'approved', '3') $$, :run6), '22023', NULL, 'a scalar payload');
SELECT throws_ok(format($$ SELECT treadle.signal(%s, 'approved', jsonb_build_object('x', repeat('x', 1100000))) $$, :run6),
                 '22023', NULL, 'a payload over max_payload_bytes');
SELECT throws_ok(format($$ SELECT treadle.signal(%s, 'approved', (repeat('[', 101) || repeat(']', 101))::jsonb) $$, :run6),
                 '22023', NULL, 'a payload nested too deep');
SELECT is(pg_temp.run_text(:run6), :'run6_text', 'none of them changed the run');
SELECT is(treadle.signal(:run6, 'approved', NULL), 'delivered', 'a null payload is {}');
SELECT is((SELECT results -> 'approve' FROM treadle.workflow_runs WHERE id = :run6), '{}'::jsonb, 'delivered as {}');

--------------------------------------------------------------------------------
-- Timeout: treadle's clock, at a rescue; never early
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('orders', queue => 'sig') AS run7 \gset
SELECT pg_temp.finish(:run7, 'order');
SET LOCAL treadle.now = '2999-01-04 11:59:59+00';
SELECT treadle.rescue();
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :run7), 'running', 'a wait never times out early');
SET LOCAL treadle.now = '2999-01-04 12:00:00+00';
SELECT treadle.rescue();
SELECT is((SELECT row(state, finished_at, wait_until)::text FROM treadle.workflow_runs WHERE id = :run7),
          '(failed,"2999-01-04 12:00:00+00",)', 'at its timeout the run fails');
SELECT is((SELECT waiting -> 'approve' ->> 'timed_out' FROM treadle.workflow_runs WHERE id = :run7), 'true',
          'the wait is marked timed out');
SELECT is((SELECT state FROM treadle.workflow_run_steps WHERE run_id = :run7 AND step = 'approve'), 'timed_out',
          'the steps view says so');
SELECT is(treadle.signal(:run7, 'approved'), 'finished', 'a signal after the timeout finds the run finished');
SELECT is(pg_temp.steps(:run7), ARRAY['order:completed'], 'and starts nothing');
SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

-- "on_timeout": "continue": the wait completes as timed out and the run moves on
SELECT lives_ok($$ SELECT treadle.define_workflow('soft', ARRAY['approve', 'ship'],
                        waits => '{"approve": {"signal": "go", "timeout": "1 hour", "on_timeout": "continue"}}') $$,
                'a wait that continues on timeout is defined');
SELECT lives_ok($$ SELECT treadle.define_workflow('hard', ARRAY['approve', 'ship'],
                        waits => '{"approve": {"signal": "go", "timeout": "1 hour", "on_timeout": "fail"}}') $$,
                'on_timeout fail is the default, said out loud');
SELECT is((SELECT waits FROM treadle.workflows WHERE name = 'hard'),
          '{"approve": {"signal": "go", "timeout": "01:00:00"}}'::jsonb, 'and stored as the default');
SELECT treadle.start_workflow('soft', queue => 'sig') AS run9 \gset
SET LOCAL treadle.now = '2999-01-01 13:00:00+00';
SELECT treadle.rescue();
SELECT is((SELECT row(state, results, waiting, wait_until)::text FROM treadle.workflow_runs WHERE id = :run9),
          '(running,"{""approve"": {""timed_out"": true}}",,)', 'at its timeout the wait completes as timed out');
SELECT is(pg_temp.steps(:run9), ARRAY['ship:available'], 'and the step after it starts, to take the timeout path');
SELECT is(treadle.signal(:run9, 'go'), 'ignored', 'a signal after that is ignored');
SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

--------------------------------------------------------------------------------
-- Cancel: a run that only waits is cancelled at once
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('gate', steps => ARRAY['open'], waits => '{"open": {"signal": "go"}}', queue => 'sig')
    AS run8 \gset
SELECT ok(treadle.cancel_workflow(:run8), 'a waiting run is cancelled');
SELECT is(treadle.signal(:run8, 'go'), 'finished', 'a signal to it finds it finished');

--------------------------------------------------------------------------------
-- Roles and tenants
--------------------------------------------------------------------------------
CREATE ROLE sig_producer; SELECT treadle.grant_producer('sig_producer');
CREATE ROLE sig_reader;   SELECT treadle.grant_reader('sig_reader');
CREATE ROLE sig_a; SELECT treadle.grant_producer('sig_a'); SELECT treadle.set_tenant('sig_a', 'a.');
SELECT treadle.start_workflow('gate', steps => ARRAY['open'], waits => '{"open": {"signal": "go"}}', queue => 'b.q')
    AS b_run \gset
SELECT treadle.start_workflow('gate', steps => ARRAY['open', 'close'], waits => '{"close": {"signal": "go"}}',
                              queue => 'a.q', idempotency_key => 'k') AS a_run \gset
SELECT is(treadle.signal(:a_run, 'go', '{"mine": true}'), 'kept', 'a signal is kept for tenant a''s run');
SELECT is(treadle.signal(:b_run, 'nope'), 'ignored', '(b''s run waits for go)');
SELECT is(pg_temp.as_role('sig_producer', format($$ SELECT treadle.signal(%s, 'go') $$, :b_run)), 'ok',
          'a producer may signal');
SELECT is(pg_temp.as_role('sig_reader', format($$ SELECT treadle.signal(%s, 'go') $$, :b_run)), '42501',
          'a reader may not');
SELECT treadle.start_workflow('gate', steps => ARRAY['open'], waits => '{"open": {"signal": "go"}}', queue => 'b.q',
                              idempotency_key => 'k') AS b_run2 \gset
SELECT pg_temp.run_text(:b_run2) AS b_text \gset
SELECT is(pg_temp.as_role('sig_a', format($$ SELECT treadle.signal(%s, 'go') $$, :b_run2)), '42501',
          'a tenant may not signal another tenant''s run');
SELECT is(pg_temp.as_role('sig_a', $$ SELECT treadle.signal_by_key('b.q', 'k', 'go') $$), '42501',
          'nor by its key');
SELECT is(pg_temp.run_text(:b_run2), :'b_text', 'the other tenant''s run is unchanged');
SELECT is(pg_temp.as_role_value('sig_a', $$ SELECT treadle.signal_by_key('a.q', 'k', 'go') $$), 'ignored',
          'a tenant signals its own run by key');
SELECT is(pg_temp.as_role_value('sig_a', $$ SELECT string_agg(queue, ',') FROM treadle.workflow_signals $$), 'a.q',
          'a tenant sees only its own runs'' kept signals');

SELECT * FROM finish();
ROLLBACK;
