-- pgtap/074_workflow_sleep_until.sql: sleep steps until a time (define_workflow's
-- and start_workflow's sleeps => {"step": {"until": ...}}): a time in the
-- definition, or a key of the run's input holding it; never early, on treadle's
-- clock; a time already past ends the sleep at once; bad times refused (22023
-- naming the step) with nothing written.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(41);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';
SET LOCAL TimeZone = 'UTC';

-- pg_temp.steps(run): the run's step jobs as 'step:state', in id order
CREATE FUNCTION pg_temp.steps(run_id bigint) RETURNS text[] LANGUAGE sql AS $$
    SELECT coalesce(array_agg(j.step || ':' || j.state ORDER BY j.id), '{}')
      FROM treadle.jobs AS j WHERE j.workflow_run_id = run_id
$$;
-- pg_temp.finish_step(run, step, result): claim that step's (available) job and complete it
CREATE FUNCTION pg_temp.finish_step(run_id bigint, step_name text, step_result jsonb DEFAULT '{}') RETURNS text
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

--------------------------------------------------------------------------------
-- until a time in the definition
--------------------------------------------------------------------------------
SELECT lives_ok($$ SELECT treadle.define_workflow('launch', ARRAY['prepare', 'wait', 'announce'],
                                                  sleeps => '{"wait": {"until": "2999-01-03 09:00+01"}}') $$,
                'define_workflow takes a sleep until a time');
SELECT is((SELECT sleeps FROM treadle.workflows WHERE name = 'launch'),
          '{"wait": {"until": "2999-01-03T08:00:00.000000Z"}}'::jsonb,
          'the time is recorded in UTC');
SELECT treadle.start_workflow('launch', '{}', queue => 'sleepy') AS r1 \gset
SELECT is(pg_temp.finish_step(:r1, 'prepare'), 'completed', 'the step before the sleep completes');
SELECT is((SELECT wake_at FROM treadle.workflow_runs WHERE id = :r1), '2999-01-03 08:00:00+00'::timestamptz,
          'the run wakes at that time');
SET LOCAL treadle.now = '2999-01-03 07:59:59.999999+00';
SELECT lives_ok('SELECT treadle.rescue()', 'rescue a microsecond before the time');
SELECT is(pg_temp.steps(:r1), ARRAY['prepare:completed'], 'a sleep until a time never ends early');
SET LOCAL treadle.now = '2999-01-03 08:00:00+00';
SELECT lives_ok('SELECT treadle.rescue()', 'rescue at the time');
SELECT is(pg_temp.steps(:r1), ARRAY['prepare:completed', 'announce:available'], 'the sleep ends and the next step starts');
SELECT is((SELECT results -> 'wait' FROM treadle.workflow_runs WHERE id = :r1),
          to_jsonb('2999-01-03 08:00:00+00'::timestamptz), 'its result is when it ended');

-- a time already past when the step becomes ready: the sleep ends at once
SET LOCAL treadle.now = '2999-01-05 12:00:00+00';
SELECT treadle.start_workflow('launch', '{}', queue => 'sleepy') AS r2 \gset
SELECT is(pg_temp.finish_step(:r2, 'prepare'), 'completed', 'the step before the sleep completes after the time');
SELECT is(pg_temp.steps(:r2), ARRAY['prepare:completed', 'announce:available'],
          'a sleep until a time already past ends at once: the next step is available without a rescue');
SELECT results_eq(format($$ SELECT results -> 'wait', wakes, wake_at FROM treadle.workflow_runs WHERE id = %s $$, :r2),
                  $$ VALUES (to_jsonb('2999-01-05 12:00:00+00'::timestamptz), NULL::jsonb, NULL::timestamptz) $$,
                  'its result is the time it ended, and nothing is under way');

-- a run that starts with a sleep until a time past, and nothing else: completes at once
SELECT treadle.start_workflow('gone', steps => ARRAY['zz'], sleeps => '{"zz": {"until": "2999-01-01 00:00+00"}}',
                              queue => 'sleepy') AS r3 \gset
SELECT results_eq(format($$ SELECT state, finished_at, results FROM treadle.workflow_runs WHERE id = %s $$, :r3),
                  $$ VALUES ('completed', '2999-01-05 12:00:00+00'::timestamptz,
                             jsonb_build_object('zz', to_jsonb('2999-01-05 12:00:00+00'::timestamptz))) $$,
                  'a run of one sleep until a time past completes when it starts');

--------------------------------------------------------------------------------
-- until a time the run's input holds: each run its own
--------------------------------------------------------------------------------
SELECT lives_ok($$ SELECT treadle.define_workflow('trial', ARRAY['signup', 'remind', 'mail'],
                                                  sleeps => '{"remind": {"until": {"input": "remind_at"}}}') $$,
                'define_workflow takes a sleep until a key of the input');
SELECT treadle.start_workflow('trial', '{"remind_at": "2999-01-06 12:00+00"}', queue => 'sleepy') AS r4 \gset
SELECT treadle.start_workflow('trial', '{"remind_at": "2999-01-08 00:00+00"}', queue => 'sleepy') AS r5 \gset
SELECT is(pg_temp.finish_step(:r4, 'signup'), 'completed', 'run 4''s first step completes');
SELECT is(pg_temp.finish_step(:r5, 'signup'), 'completed', 'run 5''s first step completes');
SELECT results_eq(format($$ SELECT wake_at FROM treadle.workflow_runs WHERE id IN (%s, %s) ORDER BY id $$, :r4, :r5),
                  $$ VALUES ('2999-01-06 12:00:00+00'::timestamptz), ('2999-01-08 00:00:00+00'::timestamptz) $$,
                  'each run sleeps until the time its input holds');
SET LOCAL treadle.now = '2999-01-06 12:00:00+00';
SELECT lives_ok('SELECT treadle.rescue()', 'rescue at run 4''s time');
SELECT results_eq(format($$ VALUES (pg_temp.steps(%s)), (pg_temp.steps(%s)) $$, :r4, :r5),
                  $$ VALUES (ARRAY['signup:completed', 'mail:available']), (ARRAY['signup:completed']) $$,
                  'run 4 goes on, run 5 still sleeps');

-- the input's time bad when the sleep becomes ready: 22023 naming the step, the step before stays running
SELECT treadle.start_workflow('trial', '{"remind_at": "someday"}', queue => 'sleepy') AS r6 \gset
SELECT throws_ok(format($$ SELECT pg_temp.finish_step(%s, 'signup') $$, :r6), '22023',
                 'treadle: sleep step "remind" sleeps until the input''s "remind_at", which must be a time such as "2027-01-04 09:00+00", not "someday"',
                 'an input time that is no time');
SELECT treadle.start_workflow('trial', '{"other": 1}', queue => 'sleepy') AS r7 \gset
SELECT throws_ok(format($$ SELECT pg_temp.finish_step(%s, 'signup') $$, :r7), '22023',
                 'treadle: sleep step "remind" sleeps until the input''s "remind_at", which must be a time such as "2027-01-04 09:00+00", not missing',
                 'an input without the key');
SELECT treadle.start_workflow('trial', '{"remind_at": "3000-01-08 00:00+00"}', queue => 'sleepy') AS r8 \gset
SELECT throws_ok(format($$ SELECT pg_temp.finish_step(%s, 'signup') $$, :r8), '22023', NULL,
                 'an input time over 366 days away');
SELECT results_eq(format($$ SELECT pg_temp.steps(id), results, wakes FROM treadle.workflow_runs WHERE id IN (%s, %s, %s) ORDER BY id $$, :r6, :r7, :r8),
                  $$ VALUES (ARRAY['signup:available'], '{}'::jsonb, NULL::jsonb),
                            (ARRAY['signup:available'], '{}'::jsonb, NULL::jsonb),
                            (ARRAY['signup:available'], '{}'::jsonb, NULL::jsonb) $$,
                  'none of them changed its run');
-- a run that starts with such a sleep does not start
SELECT throws_ok($$ SELECT treadle.start_workflow('first', '{"at": "infinity"}', steps => ARRAY['zz', 'b'],
                                                  sleeps => '{"zz": {"until": {"input": "at"}}}', queue => 'sleepy') $$,
                 '22023', 'treadle: sleep step "zz" sleeps until the input''s "at", which must be a time such as "2027-01-04 09:00+00", not "infinity"',
                 'a run whose first sleep has no finite time does not start');
SELECT is((SELECT count(*) FROM treadle.workflow_runs WHERE name = 'first'), 0::bigint, 'no run was written');

--------------------------------------------------------------------------------
-- bad definitions: 22023 naming the step, nothing written
--------------------------------------------------------------------------------
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], sleeps => '{"b": {"until": "next tuesday"}}') $$,
                 '22023', 'treadle: sleep step "b" sleeps until a time, which must be a time such as "2027-01-04 09:00+00", not "next tuesday"',
                 'a time that is no timestamptz');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], sleeps => '{"b": {"until": 1700000000}}') $$,
                 '22023', NULL, 'a time that is a number');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], sleeps => '{"b": {"until": "infinity"}}') $$,
                 '22023', NULL, 'infinity');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], sleeps => '{"b": {"until": "3001-01-01 00:00+00"}}') $$,
                 '22023', 'treadle: sleep step "b" sleeps until at most 366 days after 2999-01-06 12:00:00+00, got 3001-01-01 00:00:00+00',
                 'a time over 366 days after treadle''s clock');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], sleeps => '{"b": {"until": "2999-01-07 00:00+00", "for": "1 hour"}}') $$,
                 '22023', 'treadle: sleep step "b" waits an interval such as "1 hour" or {"until": time}, not {"for": "1 hour", "until": "2999-01-07 00:00+00"}',
                 'an interval and a time both');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], sleeps => '{"b": {"at": "2999-01-07 00:00+00"}}') $$,
                 '22023', NULL, 'an object without until');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], sleeps => '{"b": {"until": {"input": ""}}}') $$,
                 '22023', 'treadle: sleep step "b" sleeps until a time or {"input": key}, not {"input": ""}', 'an empty input key');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], sleeps => '{"b": {"until": {"input": "k", "x": 1}}}') $$,
                 '22023', NULL, 'an input reference with another key');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], sleeps => '{"b": {"until": {"step": "a"}}}') $$,
                 '22023', NULL, 'a reference that is not to the input');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], sleeps => '{"b": {"until": null}}') $$,
                 '22023', NULL, 'a null time');
SELECT is((SELECT count(*) FROM treadle.workflows WHERE name = 'bad'), 0::bigint, 'no bad sleep wrote a definition');

-- a time given without an offset is the session's time zone's
SET LOCAL TimeZone = 'Europe/Paris';
SELECT lives_ok($$ SELECT treadle.define_workflow('paris', ARRAY['a', 'zz'], sleeps => '{"zz": {"until": "2999-07-01 09:00"}}') $$,
                'a time without an offset');
SELECT is((SELECT sleeps FROM treadle.workflows WHERE name = 'paris'), '{"zz": {"until": "2999-07-01T07:00:00.000000Z"}}'::jsonb,
          'is read in the session''s time zone and recorded in UTC');
SELECT is((SELECT version FROM treadle.workflows WHERE name = 'paris'), 1::bigint, 'defined once');
SET LOCAL TimeZone = 'UTC';
SELECT lives_ok($$ SELECT treadle.define_workflow('paris', ARRAY['a', 'zz'], sleeps => '{"zz": {"until": "2999-07-01 07:00+00"}}') $$,
                'the same time written in UTC');
SELECT is((SELECT version FROM treadle.workflows WHERE name = 'paris'), 1::bigint, 'is the same definition: no new version');

SELECT * FROM finish();
ROLLBACK;
