-- pgtap/071_workflow_graphs.sql: workflows whose steps run after the steps they
-- depend on (define_workflow's and start_workflow's `after`): checks at define
-- time, parallel first steps, a join that starts once every branch completed,
-- the results a step receives, failure, retry and cancel of a graph run.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(112);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

SELECT has_function('treadle', 'workflow_step_results', ARRAY['bigint', 'text'], 'treadle.workflow_step_results exists');

-- pg_temp.steps(run): the run's step jobs as 'step:state', in id order
CREATE FUNCTION pg_temp.steps(run_id bigint) RETURNS text[] LANGUAGE sql AS $$
    SELECT coalesce(array_agg(j.step || ':' || j.state ORDER BY j.id), '{}')
      FROM treadle.jobs AS j WHERE j.workflow_run_id = run_id
$$;
-- pg_temp.lease_step(run, step): claim that step's job as worker 'w' (the other jobs
-- the claim takes are released again); the job as claimed
CREATE FUNCTION pg_temp.lease_step(run_id bigint, step_name text) RETURNS treadle.jobs
LANGUAGE plpgsql AS $$
DECLARE
    v_job treadle.jobs;
BEGIN
    SELECT * INTO STRICT v_job FROM treadle.jobs AS j WHERE j.workflow_run_id = run_id AND j.step = step_name;
    IF v_job.state = 'running' THEN
        RETURN v_job;
    END IF;
    CREATE TEMP TABLE claimed_now ON COMMIT DROP AS
    SELECT c.id, c.lease_token FROM treadle.claim('w', ARRAY[v_job.queue], names => ARRAY[v_job.name], batch => 1000) AS c;
    PERFORM treadle.release(c.id, c.lease_token) FROM claimed_now AS c WHERE c.id <> v_job.id;
    DROP TABLE claimed_now;
    SELECT * INTO STRICT v_job FROM treadle.jobs AS j WHERE j.id = v_job.id AND j.state = 'running';
    RETURN v_job;
END;
$$;
-- pg_temp.finish_step(run, step, result): lease that step's job and complete it
CREATE FUNCTION pg_temp.finish_step(run_id bigint, step_name text, step_result jsonb DEFAULT '{}') RETURNS text
LANGUAGE sql AS $$
    SELECT treadle.complete(l.id, l.lease_token, step_result) FROM pg_temp.lease_step(run_id, step_name) AS l
$$;
-- pg_temp.fail_step(run, step): lease that step's job and fail it for good
CREATE FUNCTION pg_temp.fail_step(run_id bigint, step_name text) RETURNS text
LANGUAGE sql AS $$
    SELECT treadle.fail(l.id, l.lease_token, 'boom', retryable => false) FROM pg_temp.lease_step(run_id, step_name) AS l
$$;

--------------------------------------------------------------------------------
-- A diamond: extract_a and extract_b in parallel, report after both, mail after report
--------------------------------------------------------------------------------
SELECT lives_ok($$ SELECT treadle.define_workflow('etl', ARRAY['extract_a', 'extract_b', 'report', 'mail'],
                                                  after => '{"report": ["extract_a", "extract_b"], "mail": ["report"]}') $$,
                'define_workflow takes the steps each step runs after');
SELECT is((SELECT after FROM treadle.workflows WHERE name = 'etl'),
          '{"extract_a": [], "extract_b": [], "report": ["extract_a", "extract_b"], "mail": ["report"]}'::jsonb,
          'the definition records every step''s dependencies');
SELECT treadle.start_workflow('etl', '{"day": "2999-01-01"}', queue => 'etl') AS r1 \gset
SELECT is(pg_temp.steps(:r1), ARRAY['extract_a:available', 'extract_b:available'],
          'the run starts with every step that has no dependency, at once');
SELECT is((SELECT after FROM treadle.workflow_runs WHERE id = :r1),
          (SELECT after FROM treadle.workflows WHERE name = 'etl'), 'the run keeps the graph it started with');
SELECT is(pg_temp.finish_step(:r1, 'extract_b', '{"rows": 2}'), 'completed', 'extract_b completes first');
SELECT is(pg_temp.steps(:r1), ARRAY['extract_a:available', 'extract_b:completed'],
          'the join waits while one of its dependencies has not completed');
SELECT is(pg_temp.finish_step(:r1, 'extract_a', '{"rows": 1}'), 'completed', 'then extract_a');
SELECT is(pg_temp.steps(:r1), ARRAY['extract_a:completed', 'extract_b:completed', 'report:available'],
          'the join becomes a job once every dependency completed, once');
SELECT is(treadle.workflow_step_results(:r1, 'report'), '{"extract_a": {"rows": 1}, "extract_b": {"rows": 2}}'::jsonb,
          'the join receives the results of the steps it runs after');
SELECT is(treadle.workflow_step_results(:r1, 'extract_a'), '{}'::jsonb, 'a first step receives {}');
SELECT is(pg_temp.finish_step(:r1, 'report', '{"sum": 3}'), 'completed', 'report completes');
SELECT is(treadle.workflow_step_results(:r1, 'mail'),
          '{"extract_a": {"rows": 1}, "extract_b": {"rows": 2}, "report": {"sum": 3}}'::jsonb,
          'a step receives the results of the steps it runs after through others too');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :r1), 'running', 'the run goes on while a step is left');
SELECT is(pg_temp.finish_step(:r1, 'mail', '{"sent": true}'), 'completed', 'the last step completes');
SELECT results_eq(format($$ SELECT state, finished_at, results FROM treadle.workflow_runs WHERE id = %s $$, :r1),
                  $$ VALUES ('completed', '2999-01-01 12:00:00+00'::timestamptz,
                             '{"extract_a": {"rows": 1}, "extract_b": {"rows": 2}, "report": {"sum": 3}, "mail": {"sent": true}}'::jsonb) $$,
                  'the run completes once every step has a result, with every result');
SELECT is(cardinality(pg_temp.steps(:r1)), 4, 'each step ran as one job');
SELECT is(treadle.workflow_step_results(-1, 'report'), NULL, 'workflow_step_results is null for an unknown run');
SELECT is(treadle.workflow_step_results(:r1, 'nope'), '{}'::jsonb, 'and {} for a step the run does not have');

-- two independent chains and two steps with no dependency at all, ad hoc
SELECT treadle.start_workflow('adhoc', steps => ARRAY['a1', 'a2', 'b1', 'b2', 'solo'],
                              after => '{"a2": ["a1"], "b2": ["b1"]}', queue => 'etl') AS r2 \gset
SELECT is(pg_temp.steps(:r2), ARRAY['a1:available', 'b1:available', 'solo:available'],
          'start_workflow takes steps and after too; every root starts');
SELECT is(pg_temp.finish_step(:r2, 'a1'), 'completed', 'a1 completes');
SELECT is((SELECT array_agg(step ORDER BY id) FROM treadle.jobs WHERE workflow_run_id = :r2 AND state = 'available'),
          ARRAY['b1', 'solo', 'a2'], 'a completed step starts its successor; the other chain does not move');

-- a linear after is the list itself: stored as null, run as a list
SELECT treadle.start_workflow('chain', steps => ARRAY['x', 'y', 'z'], after => '{"y": ["x"], "z": ["y"]}') AS r3 \gset
SELECT is((SELECT after FROM treadle.workflow_runs WHERE id = :r3), NULL, 'after that spells the list itself is stored as null');
SELECT is(pg_temp.steps(:r3), ARRAY['x:available'], 'and it runs as a list');
SELECT treadle.start_workflow('flat', steps => ARRAY['p', 'q'], after => '{}') AS r4 \gset
SELECT is(pg_temp.steps(:r4), ARRAY['p:available', 'q:available'], 'after {} runs every step at once');
SELECT is(treadle.workflow_step_results(:r3, 'z'), '{}'::jsonb, 'a list''s step receives the earlier results, none yet');
SELECT is(pg_temp.finish_step(:r3, 'x', '[1]'), 'completed', 'a list''s first step completes');
SELECT is(treadle.workflow_step_results(:r3, 'z'), '{"x": [1]}'::jsonb, 'a list''s step receives every earlier result');
-- treadle._step_results, which workflow_step_results and the worker's read of its claimed steps call
SELECT is(treadle._step_results('{x,y,z}', NULL, '{"x": [1], "y": 2}', 'z'), '{"x": [1], "y": 2}'::jsonb,
          '_step_results: a list''s step receives the results before it');
SELECT is(treadle._step_results('{x,y,z}', NULL, '{"x": 1, "z": 3, "y": 2}', 'y'), '{"x": 1}'::jsonb,
          '_step_results: and not its own or a later step''s, when the run holds them');
SELECT is(treadle._step_results('{x,y}', NULL, '{"x": 1}', 'nope'), '{}'::jsonb,
          '_step_results: {} for a step the list does not have');
SELECT is(treadle._step_results('{a,b,c,d}', '{"b": ["a"], "c": ["b"]}', '{"a": 1, "b": 2, "d": 4}', 'c'),
          '{"a": 1, "b": 2}'::jsonb, '_step_results: a graph''s step receives its dependencies'' results, directly or not');
SELECT is(treadle._step_results(NULL, NULL, NULL, NULL), NULL, '_step_results: null for nulls');
SELECT is(treadle._step_results('{a,b}', '{"a": ["b"], "b": ["a"]}', '{"a": 1, "b": 2}', 'a'), '{"a": 1, "b": 2}'::jsonb,
          '_step_results: ends on a cycle (which define_workflow and start_workflow refuse)');
SELECT throws_ok($$ SELECT treadle._step_results('{a,b}', '{"b": 5}', '{}', 'b') $$, '22023', NULL,
                 '_step_results: a dependency list that is not an array is refused (22023)');

--------------------------------------------------------------------------------
-- Failure, retry and cancel of a graph run
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('etl', '{}', queue => 'etl') AS r5 \gset
SELECT is(pg_temp.fail_step(:r5, 'extract_a'), 'discarded', 'a branch fails for good');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :r5), 'failed', 'the run fails');
SELECT is(pg_temp.finish_step(:r5, 'extract_b', '{"rows": 5}'), 'completed', 'the other branch still completes');
SELECT is(treadle.workflow_results(:r5), '{"extract_b": {"rows": 5}}'::jsonb, 'and its result is kept');
SELECT is(pg_temp.steps(:r5), ARRAY['extract_a:discarded', 'extract_b:completed'], 'no step starts in a failed run');
SELECT ok(treadle.retry((SELECT id FROM treadle.jobs WHERE workflow_run_id = :r5 AND step = 'extract_a')),
          'the failed step is retried');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :r5), 'running', 'the run runs again');
SELECT is(pg_temp.finish_step(:r5, 'extract_a', '{"rows": 4}'), 'completed', 'the retried step completes');
SELECT is(pg_temp.steps(:r5), ARRAY['extract_a:completed', 'extract_b:completed', 'report:available'],
          'the join starts; the completed branch did not run again');

-- cancel: every pending step now, a running one when it finishes
SELECT treadle.start_workflow('etl', '{}', queue => 'etl') AS r6 \gset
SELECT is((pg_temp.lease_step(:r6, 'extract_a')).state, 'running', 'extract_a runs');
SELECT ok(treadle.cancel_workflow(:r6), 'cancel_workflow cancels a graph run');
SELECT is(pg_temp.steps(:r6), ARRAY['extract_a:running', 'extract_b:cancelled'], 'its waiting branch is cancelled at once');
SELECT is((SELECT cancel_requested FROM treadle.jobs WHERE workflow_run_id = :r6 AND step = 'extract_a'), true,
          'its running branch is asked to stop');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :r6), 'cancelled', 'the run is cancelled');
SELECT ok(NOT treadle.cancel_workflow(:r6), 'a second cancel_workflow returns false');
SELECT ok(treadle.retry((SELECT id FROM treadle.jobs WHERE workflow_run_id = :r6 AND step = 'extract_b')),
          'a cancelled step is retried');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :r6), 'running', 'the run runs again');

--------------------------------------------------------------------------------
-- Bad graphs: 22023 naming the step, and nothing written
--------------------------------------------------------------------------------
CREATE TEMP TABLE before AS
SELECT (SELECT count(*) FROM treadle.workflow_runs) AS runs, (SELECT count(*) FROM treadle.jobs) AS jobs,
       (SELECT count(*) FROM treadle.workflows) AS definitions;
SELECT throws_ok($$ SELECT treadle.define_workflow('etl', ARRAY['a', 'b', 'c'], after => '{"a": ["c"], "b": ["a"], "c": ["b"]}') $$,
                 '22023', 'treadle: step "a" is in a dependency cycle: a after c after b after a', 'a cycle is refused, named');
SELECT throws_ok($$ SELECT treadle.define_workflow('etl', ARRAY['a', 'b', 'c', 'd'], after => '{"d": ["a"], "b": ["c"], "c": ["b"]}') $$,
                 '22023', 'treadle: step "b" is in a dependency cycle: b after c after b', 'a cycle beside a fine branch too');
SELECT throws_ok($$ SELECT treadle.define_workflow('etl', ARRAY['a', 'b'], after => '{"a": ["a"]}') $$,
                 '22023', 'treadle: step "a" runs after itself (a dependency cycle)', 'a step after itself is refused');
SELECT throws_ok($$ SELECT treadle.define_workflow('etl', ARRAY['a', 'b'], after => '{"b": ["zz"]}') $$,
                 '22023', 'treadle: step "b" runs after "zz", which is not one of the steps', 'an unknown dependency is refused');
SELECT throws_ok($$ SELECT treadle.define_workflow('etl', ARRAY['a', 'b'], after => '{"zz": ["a"]}') $$,
                 '22023', 'treadle: after names step "zz", which is not one of the steps', 'an unknown step is refused');
SELECT throws_ok($$ SELECT treadle.define_workflow('etl', ARRAY['a', 'b'], after => '{"b": ["a", "a"]}') $$,
                 '22023', 'treadle: step "b" names "a" twice in after', 'a repeated dependency is refused');
SELECT throws_ok($$ SELECT treadle.define_workflow('etl', ARRAY['a', 'b'], after => '{"b": "a"}') $$,
                 '22023', NULL, 'a dependency list that is not a list is refused');
SELECT throws_ok($$ SELECT treadle.start_workflow('etl', steps => ARRAY['a', 'b'], after => '{"b": [1]}') $$,
                 '22023', NULL, 'start_workflow refuses a list of non-names');
SELECT throws_ok($$ SELECT treadle.start_workflow('etl', steps => ARRAY['a', 'b'], after => '["a"]') $$,
                 '22023', NULL, 'after that is not an object is refused');
SELECT throws_ok($$ SELECT treadle.start_workflow('etl', after => '{}') $$,
                 '22023', 'treadle: after, sleeps, maps, children and compensations need steps', 'after without steps is refused');
SELECT throws_ok($$ SELECT treadle.define_workflow('etl', ARRAY['a', 'a'], after => '{}') $$,
                 '22023', 'treadle: steps must not repeat a name: step "a" is listed more than once',
                 'a repeated step name is refused with after too, named');
SELECT throws_ok($$ SELECT treadle.start_workflow('etl', steps => ARRAY['x', 'b', 'c', 'b', 'x']) $$,
                 '22023', 'treadle: steps must not repeat a name: step "x" is listed more than once',
                 'the first name repeated is the one named');
SELECT throws_ok(format($$ SELECT treadle.define_workflow('big', %L, after => %L) $$,
                        (SELECT array_agg('s' || i) FROM generate_series(1, 1000) AS i),
                        (SELECT jsonb_object_agg('s' || i, (SELECT jsonb_agg('s' || k) FROM generate_series(1, i - 1) AS k))
                           FROM generate_series(150, 1000) AS i)),
                 '22023', NULL, 'over 10,000 dependencies are refused');
SELECT throws_ok(format($$ SELECT treadle.define_workflow('big', %L, after => '{}') $$,
                        (SELECT array_agg('s' || i) FROM generate_series(1, 1001) AS i)),
                 '22023', 'treadle: steps must be a list of 1 to 1000 names', 'a graph over 1,000 steps is refused');
SELECT throws_ok(format($$ SELECT treadle.start_workflow('big', steps => %L, after => '{}') $$,
                        (SELECT array_agg('s' || i) FROM generate_series(1, 1001) AS i)),
                 '22023', 'treadle: steps must be a list of 1 to 1000 names', 'so is a run of over 1,000 steps');
SELECT treadle.configure(max_payload_bytes => 4096);
SELECT throws_ok(format($$ SELECT treadle.define_workflow('big', %L, after => %L) $$,
                        (SELECT array_agg('s' || i) FROM generate_series(1, 300) AS i),
                        (SELECT jsonb_object_agg('s' || i, jsonb_build_array('s' || (i - 1))) FROM generate_series(2, 300) AS i)),
                 '22023', NULL, 'after over the payload size limit is refused');
SELECT throws_ok(format($$ SELECT treadle.define_workflow('big', ARRAY['a'], sleeps => %L) $$,
                        jsonb_build_object('a', repeat('1 second ', 1000))),
                 '22023', NULL, 'sleeps over the payload size limit are refused');
SELECT treadle.configure(max_payload_bytes => 1048576);
SELECT results_eq(
    $$ SELECT (SELECT count(*) FROM treadle.workflow_runs), (SELECT count(*) FROM treadle.jobs),
              (SELECT count(*) FROM treadle.workflows) $$,
    $$ SELECT runs, jobs, definitions FROM before $$,
    'no bad graph wrote a run, a job or a definition');
SELECT is((SELECT after FROM treadle.workflows WHERE name = 'etl'),
          '{"extract_a": [], "extract_b": [], "report": ["extract_a", "extract_b"], "mail": ["report"]}'::jsonb,
          'a refused define_workflow left the definition alone');

-- 1,000 steps in a chain listed backwards: checked in good time
SELECT lives_ok(format($$ SELECT treadle.define_workflow('long', %L, after => %L) $$,
                       (SELECT array_agg('s' || i ORDER BY i DESC) FROM generate_series(1, 1000) AS i),
                       (SELECT jsonb_object_agg('s' || i, jsonb_build_array('s' || (i - 1))) FROM generate_series(2, 1000) AS i)),
                '1,000 steps in a chain, listed backwards, are a graph');

--------------------------------------------------------------------------------
-- Sleep steps: no job, no worker; rescue ends them on treadle's clock
--------------------------------------------------------------------------------
SELECT lives_ok($$ SELECT treadle.define_workflow('signup', ARRAY['create', 'wait', 'remind'], sleeps => '{"wait": "1 day"}') $$,
                'define_workflow takes sleep steps');
SELECT results_eq($$ SELECT after, sleeps FROM treadle.workflows WHERE name = 'signup' $$,
                  $$ VALUES ('{"create": [], "wait": ["create"], "remind": ["wait"]}'::jsonb, '{"wait": "1 day"}'::jsonb) $$,
                  'a list with a sleep is recorded as the graph it spells');
SELECT treadle.start_workflow('signup', '{"user": 1}', queue => 'mail') AS r7 \gset
SELECT is(pg_temp.finish_step(:r7, 'create', '{"id": 1}'), 'completed', 'the step before the sleep completes');
SELECT is(pg_temp.steps(:r7), ARRAY['create:completed'], 'a sleep step is no job');
SELECT is((SELECT wake_at FROM treadle.workflow_runs WHERE id = :r7), '2999-01-02 12:00:00+00'::timestamptz,
          'the run records when the sleep ends, on treadle''s clock');
SET LOCAL treadle.now = '2999-01-02 11:59:59+00';
SELECT lives_ok('SELECT treadle.rescue()', 'rescue a second before the sleep ends');
SELECT is(pg_temp.steps(:r7), ARRAY['create:completed'], 'a sleep never ends early');
SET LOCAL treadle.now = '2999-01-02 12:00:00+00';
SELECT lives_ok('SELECT treadle.rescue()', 'rescue when it is due');
SELECT is(pg_temp.steps(:r7), ARRAY['create:completed', 'remind:available'], 'the sleep ends and the next step starts');
SELECT results_eq(format($$ SELECT results -> 'wait', wakes, wake_at FROM treadle.workflow_runs WHERE id = %s $$, :r7),
                  $$ VALUES (to_jsonb('2999-01-02 12:00:00+00'::timestamptz), NULL::jsonb, NULL::timestamptz) $$,
                  'the sleep''s result is when it ended, and nothing is under way');
SELECT is(treadle.workflow_step_results(:r7, 'remind') ? 'wait', true, 'the next step receives it');
SELECT lives_ok('SELECT treadle.rescue()', 'rescue again');
SELECT is(pg_temp.steps(:r7), ARRAY['create:completed', 'remind:available'], 'a sleep ends once');
SELECT is(pg_temp.finish_step(:r7, 'remind'), 'completed', 'the last step completes');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :r7), 'completed', 'the run completes');

-- a run cancelled while it sleeps stays cancelled when the sleep falls due
SELECT treadle.start_workflow('nap', steps => ARRAY['zz', 'after_zz'], sleeps => '{"zz": "1 hour"}', queue => 'mail') AS r8 \gset
SELECT is(pg_temp.steps(:r8), ARRAY[]::text[], 'a run can start with a sleep');
SELECT ok(treadle.cancel_workflow(:r8), 'a sleeping run is cancelled');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :r8), 'cancelled', 'at once');
SET LOCAL treadle.now = '2999-01-03 12:00:00+00';
SELECT lives_ok('SELECT treadle.rescue()', 'rescue after its sleep would have ended');
SELECT is(pg_temp.steps(:r8), ARRAY[]::text[], 'a cancelled run starts nothing');

-- a cancel while one branch runs and the other sleeps: the sleep starts nothing after
-- it; a retry of the cancelled branch wakes the sleep again
SET LOCAL treadle.now = '2999-01-04 12:00:00+00';
SELECT treadle.start_workflow('both', steps => ARRAY['work', 'nap', 'done'], after => '{"done": ["work", "nap"]}',
                              sleeps => '{"nap": "1 hour"}', queue => 'mail') AS r9 \gset
SELECT is((pg_temp.lease_step(:r9, 'work')).state, 'running', 'one branch runs, the other sleeps');
SELECT ok(treadle.cancel_workflow(:r9), 'the run is cancelled');
SELECT is((SELECT wake_at FROM treadle.workflow_runs WHERE id = :r9), NULL, 'its sleep no longer wakes it');
SET LOCAL treadle.now = '2999-01-04 14:00:00+00';
SELECT lives_ok('SELECT treadle.rescue()', 'rescue after the sleep would have ended');
SELECT is((SELECT state FROM treadle.jobs WHERE workflow_run_id = :r9 AND step = 'work'), 'cancelled',
          'the running branch ends cancelled (its lease ran out by then)');
SELECT results_eq(format($$ SELECT state, results ? 'nap' FROM treadle.workflow_runs WHERE id = %s $$, :r9),
                  $$ VALUES ('cancelled', false) $$, 'the run is cancelled and its sleep did not end');
SELECT ok(treadle.retry((SELECT id FROM treadle.jobs WHERE workflow_run_id = :r9 AND step = 'work')), 'a retry resumes it');
SELECT is((SELECT wake_at FROM treadle.workflow_runs WHERE id = :r9), '2999-01-04 13:00:00+00'::timestamptz,
          'its sleep wakes it again');
SELECT lives_ok('SELECT treadle.rescue()', 'rescue');
SELECT is((SELECT results ? 'nap' FROM treadle.workflow_runs WHERE id = :r9), true, 'the sleep ends');
SELECT is(pg_temp.finish_step(:r9, 'work'), 'completed', 'the retried branch completes');
SELECT is(pg_temp.steps(:r9), ARRAY['work:completed', 'done:available'], 'the join starts once');

-- bad sleeps: 22023 naming the step, nothing written
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], sleeps => '{"b": "soon"}') $$,
                 '22023', 'treadle: sleep step "b" must wait an interval such as "1 hour", not "soon"', 'not an interval');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], sleeps => '{"b": 60}') $$,
                 '22023', NULL, 'a number is not an interval');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], sleeps => '{"b": "0 seconds"}') $$,
                 '22023', 'treadle: sleep step "b" must wait more than 0 and at most 366 days, got 00:00:00', 'a zero sleep');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], sleeps => '{"b": "367 days"}') $$,
                 '22023', NULL, 'a sleep over 366 days');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], sleeps => '{"c": "1 hour"}') $$,
                 '22023', 'treadle: sleeps names step "c", which is not one of the steps', 'an unknown sleep step');
SELECT throws_ok($$ SELECT treadle.start_workflow('bad', steps => ARRAY['a'], sleeps => '["a"]') $$,
                 '22023', NULL, 'sleeps that is not an object');
SELECT throws_ok($$ SELECT treadle.start_workflow('signup', sleeps => '{"wait": "1 hour"}') $$,
                 '22023', 'treadle: after, sleeps, maps, children and compensations need steps', 'sleeps without steps');
SELECT is((SELECT count(*) FROM treadle.workflows WHERE name = 'bad'), 0::bigint, 'no bad sleep wrote a definition');

SELECT * FROM finish();
ROLLBACK;
