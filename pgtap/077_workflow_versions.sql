-- pgtap/077_workflow_versions.sql: workflow versions and rolling deploys. A step job is
-- named workflow:<workflow>/<step>, so a claim takes only the steps it names; a run
-- keeps the definition it started with whatever define_workflow does after; the
-- definition counts its versions and a run records its own; claim and worker_seen
-- take step job names (up to 410 characters) and refuse what is not one; explain
-- names the step no live worker runs; step_sleep (ctx.sleep) records a step's wake
-- times once and tells how long is left.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(70);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

-- pg_temp.steps(run): the run's step jobs as 'name:state', in id order
CREATE FUNCTION pg_temp.steps(run_id bigint) RETURNS text[] LANGUAGE sql AS $$
    SELECT coalesce(array_agg(j.name || ':' || j.state ORDER BY j.id), '{}')
      FROM treadle.jobs AS j WHERE j.workflow_run_id = run_id
$$;
-- pg_temp.finish(run, step, result): claim that step's job by its name and complete it
CREATE FUNCTION pg_temp.finish(run_id bigint, step_name text, step_result jsonb DEFAULT '{}') RETURNS text
LANGUAGE sql AS $$
    SELECT treadle.complete(c.id, c.lease_token, step_result)
      FROM treadle.claim('w', ARRAY['ver'], names => ARRAY['workflow:ver/' || step_name], batch => 1) AS c
     WHERE c.workflow_run_id = run_id
$$;

-- Versions
SELECT treadle.define_workflow('ver', ARRAY['a', 'b', 'c']);
SELECT is((SELECT version FROM treadle.workflows WHERE name = 'ver'), 1::bigint, 'a first definition is version 1');
SELECT treadle.define_workflow('ver', ARRAY['a', 'b', 'c']);
SELECT is((SELECT version FROM treadle.workflows WHERE name = 'ver'), 1::bigint,
          'defining the same steps again keeps the version');
SELECT treadle.start_workflow('ver', '{"n": 1}', queue => 'ver') AS r1 \gset
SELECT is((SELECT version FROM treadle.workflow_runs WHERE id = :r1), 1::bigint, 'a run records the version it started with');
SELECT is(pg_temp.steps(:r1), ARRAY['workflow:ver/a:available'], 'its first step job is named workflow:<workflow>/<step>');

-- A claim takes only the steps it names
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['ver'], names => ARRAY['workflow:ver'])), 0::bigint,
          'a claim of the workflow''s name alone takes no step');
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['ver'], names => ARRAY['workflow:ver/b', 'workflow:ver/x'])),
          0::bigint, 'a claim of other steps leaves step a');
SELECT is(pg_temp.finish(:r1, 'a', '{"a": 1}'), 'completed', 'a claim naming step a takes it');
SELECT is(pg_temp.steps(:r1), ARRAY['workflow:ver/a:completed', 'workflow:ver/b:available'], 'step b comes next');

-- Redefine: b removed, x added, c after x, a graph with a sleep step
SELECT treadle.define_workflow('ver', ARRAY['a', 'x', 'c', 'nap'], after => '{"x": [], "c": ["x"], "nap": ["a"]}',
                               sleeps => '{"nap": "1 hour"}');
SELECT is((SELECT version FROM treadle.workflows WHERE name = 'ver'), 2::bigint, 'a changed definition counts version 2');
SELECT results_eq(
    format($$ SELECT steps, after, sleeps, maps, version FROM treadle.workflow_runs WHERE id = %s $$, :r1),
    $$ VALUES (ARRAY['a', 'b', 'c'], NULL::jsonb, NULL::jsonb, NULL::jsonb, 1::bigint) $$,
    'the run in flight keeps its steps, its (list) dependencies and its version');
SELECT is(pg_temp.steps(:r1), ARRAY['workflow:ver/a:completed', 'workflow:ver/b:available'],
          'and its waiting step is still b');
SELECT treadle.start_workflow('ver', '{"n": 2}', queue => 'ver') AS r2 \gset
SELECT results_eq(
    format($$ SELECT steps, version FROM treadle.workflow_runs WHERE id = %s $$, :r2),
    $$ VALUES (ARRAY['a', 'x', 'c', 'nap'], 2::bigint) $$,
    'a run started now takes the new definition and its version');
SELECT is(pg_temp.steps(:r2), ARRAY['workflow:ver/a:available', 'workflow:ver/x:available'],
          'and starts with its first steps, a and x');

-- A third definition: steps renamed, dependencies changed again
SELECT treadle.define_workflow('ver', ARRAY['a2', 'b', 'c'], after => '{"c": ["a2"], "b": ["a2"]}');
SELECT is((SELECT version FROM treadle.workflows WHERE name = 'ver'), 3::bigint, 'version 3');
SELECT is(pg_temp.finish(:r1, 'b', '{"b": 1}'), 'completed', 'the old run''s b completes');
SELECT is(pg_temp.steps(:r1), ARRAY['workflow:ver/a:completed', 'workflow:ver/b:completed', 'workflow:ver/c:available'],
          'and its c follows b, as its own definition says');
SELECT is(pg_temp.finish(:r1, 'c'), 'completed', 'c completes');
SELECT results_eq(
    format($$ SELECT state, results FROM treadle.workflow_runs WHERE id = %s $$, :r1),
    $$ VALUES ('completed'::text, '{"a": {"a": 1}, "b": {"b": 1}, "c": {}}'::jsonb) $$,
    'the old run completes with the steps of version 1');
SELECT is(pg_temp.finish(:r2, 'x'), 'completed', 'the version 2 run''s x completes');
SELECT is(pg_temp.steps(:r2), ARRAY['workflow:ver/a:available', 'workflow:ver/x:completed', 'workflow:ver/c:available'],
          'and its c follows x, as version 2 says (not a2: version 3 changed nothing of it)');
SELECT is(pg_temp.finish(:r2, 'a'), 'completed', 'its a completes');
SELECT ok((SELECT wakes ? 'nap' FROM treadle.workflow_runs WHERE id = :r2), 'and its sleep step of version 2 sleeps');
SELECT results_eq(
    format($$ SELECT steps, after ->> 'c', version FROM treadle.workflow_runs WHERE id = %s $$, :r2),
    $$ VALUES (ARRAY['a', 'x', 'c', 'nap'], '["x"]'::text, 2::bigint) $$,
    'the version 2 run still holds its own definition');

-- A run given its steps records no version
SELECT treadle.start_workflow('ver', steps => ARRAY['z'], queue => 'ver') AS r3 \gset
SELECT is((SELECT version FROM treadle.workflow_runs WHERE id = :r3), NULL::bigint,
          'a run started with its own steps records no version');
SELECT is(pg_temp.steps(:r3), ARRAY['workflow:ver/z:available'], 'its step job is named the same way');
SELECT throws_ok($$ UPDATE treadle.workflows SET version = 0 WHERE name = 'ver' $$, '23514', NULL,
                 'a version below 1 breaks a check constraint');

-- Step job names are longer than other names: claim and worker_seen take them
SELECT treadle.start_workflow(repeat('w', 200), steps => ARRAY[repeat('s', 200)], queue => 'long') AS r4 \gset
SELECT is((SELECT length(name) FROM treadle.jobs WHERE workflow_run_id = :r4), 410,
          'the longest step job name is 410 characters');
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['long'],
                                              names => ARRAY['workflow:' || repeat('w', 200) || '/' || repeat('s', 200)])),
          1::bigint, 'a claim takes it by that name');
SELECT throws_ok(format($$ SELECT * FROM treadle.claim('w', names => ARRAY[%L]) $$, repeat('n', 411)), '22023', NULL,
                 'claim: a name over 410 characters raises 22023');
SELECT throws_ok($$ SELECT * FROM treadle.claim('w', names => ARRAY[' ']) $$, '22023', NULL,
                 'claim: a blank name raises 22023');
SELECT throws_ok($$ SELECT * FROM treadle.claim('w', names => ARRAY[E'workflow:a/\n']) $$, '22023', NULL,
                 'claim: a name with a control character raises 22023');
SELECT throws_ok($$ SELECT * FROM treadle.claim('w', names => ARRAY['a', NULL]) $$, '22023', NULL,
                 'claim: a null name raises 22023');
SELECT throws_ok($$ SELECT * FROM treadle.claim('w', names => ARRAY[]::text[]) $$, '22023', NULL,
                 'claim: no names raise 22023');
SELECT throws_ok($$ SELECT * FROM treadle.claim('w', names => ARRAY[ARRAY['a'], ARRAY['b']]) $$, '22023', NULL,
                 'claim: a nested list of names raises 22023');
SELECT throws_ok($$ SELECT * FROM treadle.claim('w', names => ARRAY(SELECT 'n' || g FROM generate_series(1, 1001) AS g)) $$,
                 '22023', NULL, 'claim: over 1000 names raise 22023');
SELECT lives_ok($$ SELECT * FROM treadle.claim('w', names => ARRAY(SELECT 'n' || g FROM generate_series(1, 1000) AS g)) $$,
                'claim: 1000 names are accepted');
SELECT throws_ok(format($$ SELECT * FROM treadle.complete_and_claim('{}', '{}', '{}', 'w', ARRAY['default'], ARRAY[%L], 0) $$,
                        repeat('n', 411)),
                 '22023', NULL, 'complete_and_claim: a name over 410 characters raises 22023');
SELECT throws_ok(format($$ SELECT treadle.worker_seen('w-long', 'h', 1, ARRAY['ver'], 1, 0, ARRAY[%L]) $$, repeat('n', 411)),
                 '22023', NULL, 'worker_seen: a name over 410 characters raises 22023');
SELECT is((SELECT count(*) FROM treadle.workers WHERE id = 'w-long'), 0::bigint, 'and records no worker');
SELECT lives_ok(format($$ SELECT treadle.worker_seen('w-long', 'h', 1, ARRAY['ver'], 1, 0, ARRAY[%L]) $$,
                       'workflow:' || repeat('w', 200) || '/' || repeat('s', 200)),
                'worker_seen: a 410-character step job name is accepted');

-- explain: a step that the live workers of its queue do not run
SELECT treadle.worker_seen('w-old', 'h', 1, ARRAY['ver'], 1, 0, ARRAY['workflow:ver/a', 'workflow:ver/x']);
SELECT treadle.start_workflow('ver', steps => ARRAY['b'], queue => 'ver') AS r5 \gset
SELECT id AS b5 FROM treadle.jobs WHERE workflow_run_id = :r5 \gset
SELECT is((SELECT count(*) FROM treadle.explain(:b5) WHERE reason = 'no_worker'
                                                       AND message LIKE 'no live worker runs step b of workflow ver (run '
                                                                        || :r5 || ', definition version not recorded)%'),
          1::bigint, 'explain: no live worker runs the step, naming it, the workflow, the run and its version');
SELECT is((SELECT count(*) FROM treadle.explain(:b5) WHERE reason = 'no_worker' AND message LIKE '%waits for a worker%'),
          1::bigint, 'explain: and says the step waits');
SELECT treadle.worker_seen('w-new', 'h', 2, ARRAY['ver'], 1, 0, ARRAY['workflow:ver/b']);
SELECT is((SELECT count(*) FROM treadle.explain(:b5) WHERE reason = 'no_worker'), 0::bigint,
          'explain: no no_worker once a live worker runs that step');
SELECT treadle.define_workflow('ver2', ARRAY['q']);
SELECT treadle.start_workflow('ver2', queue => 'ver') AS r6 \gset
SELECT id AS q6 FROM treadle.jobs WHERE workflow_run_id = :r6 \gset
SELECT is((SELECT count(*) FROM treadle.explain(:q6) WHERE reason = 'no_worker' AND message LIKE '%definition version 1)%'),
          1::bigint, 'explain: a run started from a definition names its version');

-- step_sleep: ctx.sleep's wake times, recorded once per (step job, seq)
SELECT treadle.start_workflow('napper', steps => ARRAY['nap'], queue => 'naps') AS r7 \gset
SELECT id AS nap, lease_token AS nap_tok FROM treadle.claim('w', ARRAY['naps'], names => ARRAY['workflow:napper/nap']) \gset
SELECT is(treadle.step_sleep(:nap, :'nap_tok', 0, delay => '1 hour'), interval '1 hour',
          'step_sleep: the first sleep is recorded, an hour left');
SELECT is((SELECT step_sleeps FROM treadle.workflow_runs WHERE id = :r7),
          jsonb_build_object(:'nap', jsonb_build_array('2999-01-01 13:00:00+00'::timestamptz)),
          'its wake time is on the run, under the step job''s id, on treadle''s clock');
SELECT is(treadle.step_sleep(:nap, :'nap_tok', 0, delay => '5 hours'), interval '1 hour',
          'asked again, the recorded wake time holds');
SELECT is(treadle.step_sleep(:nap, gen_random_uuid(), 1, delay => '1 hour'), NULL,
          'a token that does not hold the job gets null');
SELECT throws_ok(format($$ SELECT treadle.step_sleep(%s, %L, 2, delay => '1 hour') $$, :nap, :'nap_tok'), '22023', NULL,
                 'step_sleep: a seq that skips a sleep raises 22023');
SELECT throws_ok(format($$ SELECT treadle.step_sleep(%s, %L, 100, delay => '1 hour') $$, :nap, :'nap_tok'), '22023', NULL,
                 'step_sleep: seq 100 raises 22023');
SELECT throws_ok(format($$ SELECT treadle.step_sleep(%s, %L, -1, delay => '1 hour') $$, :nap, :'nap_tok'), '22023', NULL,
                 'step_sleep: a negative seq raises 22023');
SELECT throws_ok(format($$ SELECT treadle.step_sleep(%s, %L, NULL, delay => '1 hour') $$, :nap, :'nap_tok'), '22004', NULL,
                 'step_sleep: a null seq raises 22004');
SELECT throws_ok(format($$ SELECT treadle.step_sleep(%s, NULL, 1, delay => '1 hour') $$, :nap), '22004', NULL,
                 'step_sleep: a null token raises 22004');
SELECT throws_ok(format($$ SELECT treadle.step_sleep(%s, %L, 1) $$, :nap, :'nap_tok'), '22004', NULL,
                 'step_sleep: neither delay nor until raises 22004');
SELECT throws_ok(format($$ SELECT treadle.step_sleep(%s, %L, 1, delay => '1 hour', until => '2999-01-02') $$, :nap, :'nap_tok'),
                 '22023', NULL, 'step_sleep: both delay and until raise 22023');
SELECT throws_ok(format($$ SELECT treadle.step_sleep(%s, %L, 1, delay => '-1 second') $$, :nap, :'nap_tok'), '22023', NULL,
                 'step_sleep: a negative delay raises 22023');
SELECT throws_ok(format($$ SELECT treadle.step_sleep(%s, %L, 1, delay => '367 days') $$, :nap, :'nap_tok'), '22023', NULL,
                 'step_sleep: a delay over 366 days raises 22023');
SELECT throws_ok(format($$ SELECT treadle.step_sleep(%s, %L, 1, until => '3000-06-01') $$, :nap, :'nap_tok'), '22023', NULL,
                 'step_sleep: until over 366 days ahead raises 22023');
SELECT throws_ok(format($$ SELECT treadle.step_sleep(%s, %L, 1, until => 'infinity') $$, :nap, :'nap_tok'), '22023', NULL,
                 'step_sleep: an infinite until raises 22023');
SELECT id AS plain, lease_token AS plain_tok FROM pg_temp.leased('plain') \gset
SELECT throws_ok(format($$ SELECT treadle.step_sleep(%s, %L, 0, delay => '1 hour') $$, :plain, :'plain_tok'), '22023', NULL,
                 'step_sleep: a job that is not a workflow step raises 22023');
SELECT is((SELECT step_sleeps FROM treadle.workflow_runs WHERE id = :r7),
          jsonb_build_object(:'nap', jsonb_build_array('2999-01-01 13:00:00+00'::timestamptz)),
          'none of those changed what the run records');
SELECT is(treadle.snooze(:nap, :'nap_tok', interval '1 hour'), 'available', 'the worker snoozes the step for what is left');
SELECT results_eq(format($$ SELECT state, attempt, run_at FROM treadle.jobs WHERE id = %s $$, :nap),
                  $$ VALUES ('available'::text, 0, '2999-01-01 13:00:00+00'::timestamptz) $$,
                  'it waits until its wake time, its attempt given back');
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['naps'], names => ARRAY['workflow:napper/nap'])), 0::bigint,
          'no claim takes it before then');
SET LOCAL treadle.now = '2999-01-01 13:00:00+00';
SELECT id AS nap2, lease_token AS nap2_tok FROM treadle.claim('w', ARRAY['naps'], names => ARRAY['workflow:napper/nap']) \gset
SELECT is(:nap2, :nap, 'at its wake time a claim takes it');
SELECT is(treadle.step_sleep(:nap, :'nap2_tok', 0, delay => '1 hour'), interval '0',
          'the step runs again: its first sleep has ended');
SELECT is(treadle.step_sleep(:nap, :'nap2_tok', 1, until => '2999-01-01 12:30:00+00'), interval '0',
          'a second sleep until a time passed is recorded and has ended');
SELECT is(jsonb_array_length((SELECT step_sleeps -> :'nap' FROM treadle.workflow_runs WHERE id = :r7)), 2,
          'the run holds both wake times');
SELECT is(treadle.complete(:nap, :'nap2_tok'), 'completed', 'the step completes');
SELECT is((SELECT attempt FROM treadle.jobs WHERE id = :nap), 1, 'with one attempt spent');

SELECT * FROM finish();
ROLLBACK;
