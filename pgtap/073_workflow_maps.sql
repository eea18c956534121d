-- pgtap/073_workflow_maps.sql: map steps (define_workflow's and start_workflow's
-- `maps`): a step that becomes one job per element of the array a step it runs
-- after returned (or its run's input holds), completes once every element job
-- completed, and hands the results on in element order; checks at define time and
-- at the fan-out.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(65);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

-- pg_temp.steps(run): the run's step jobs as 'step:state', in id order
CREATE FUNCTION pg_temp.steps(run_id bigint) RETURNS text[] LANGUAGE sql AS $$
    SELECT coalesce(array_agg(j.step || ':' || j.state ORDER BY j.id), '{}')
      FROM treadle.jobs AS j WHERE j.workflow_run_id = run_id
$$;
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
-- pg_temp.finish_elements(run, step, last): claim the step's available element jobs, in
-- reverse element order, and complete each with {"doubled": 2 * element}; stop after
-- `last` of them (null: all). Returns how many completed.
CREATE FUNCTION pg_temp.finish_elements(run_id bigint, step_name text, how_many integer DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_job treadle.jobs;
    v_n   integer := 0;
    v_token uuid := gen_random_uuid();
BEGIN
    FOR v_job IN SELECT * FROM treadle.jobs AS j
                  WHERE j.workflow_run_id = run_id AND j.step = step_name AND j.state = 'available'
                  ORDER BY (j.args ->> 'index')::integer DESC LIMIT how_many LOOP
        UPDATE treadle.jobs AS j SET state = 'running', lease_until = treadle.now() + interval '1 hour',
               lease_token = v_token, worker_id = 'w', attempt = 1
         WHERE j.id = v_job.id;
        PERFORM treadle.complete(v_job.id, v_token,
                                 jsonb_build_object('doubled', 2 * (v_job.args ->> 'element')::integer));
        v_n := v_n + 1;
    END LOOP;
    RETURN v_n;
END;
$$;

--------------------------------------------------------------------------------
-- load returns [1, 2, 3]; resize maps over it; report after resize
--------------------------------------------------------------------------------
SELECT lives_ok($$ SELECT treadle.define_workflow('thumbs', ARRAY['load', 'resize', 'report'],
                                                  maps => '{"resize": "load"}') $$,
                'define_workflow takes the map steps of a list');
SELECT results_eq($$ SELECT after, maps FROM treadle.workflows WHERE name = 'thumbs' $$,
                  $$ VALUES ('{"load": [], "resize": ["load"], "report": ["resize"]}'::jsonb, '{"resize": "load"}'::jsonb) $$,
                  'the definition records the map and spells out the list as a graph');
SELECT treadle.start_workflow('thumbs', '{}', queue => 'maps') AS r1 \gset
SELECT is(pg_temp.steps(:r1), ARRAY['load:available'], 'the run starts with load');
SELECT is(pg_temp.finish(:r1, 'load', '[1, 2, 3]'), 'completed', 'load completes with an array');
SELECT is(pg_temp.steps(:r1), ARRAY['load:completed', 'resize:available', 'resize:available', 'resize:available'],
          'resize becomes one job per element');
SELECT results_eq(format($$ SELECT args FROM treadle.jobs WHERE workflow_run_id = %s AND step = 'resize' ORDER BY id $$, :r1),
                  $$ VALUES ('{"element": 1, "index": 0}'::jsonb), ('{"element": 2, "index": 1}'), ('{"element": 3, "index": 2}') $$,
                  'each element job receives its element and its position');
SELECT results_eq(format($$ SELECT map_left, results ? 'resize' FROM treadle.workflow_runs WHERE id = %s $$, :r1),
                  $$ VALUES ('{"resize": 3}'::jsonb, false) $$, 'the run counts the element jobs left');
SELECT is(pg_temp.finish_elements(:r1, 'resize', 2), 2, 'two element jobs complete (the last elements first)');
SELECT results_eq(format($$ SELECT map_left, results ? 'resize' FROM treadle.workflow_runs WHERE id = %s $$, :r1),
                  $$ VALUES ('{"resize": 1}'::jsonb, false) $$, 'the step is not complete with one element left');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE workflow_run_id = :r1 AND step = 'report'), 0::bigint,
          'report has not started');
SELECT is(pg_temp.finish_elements(:r1, 'resize'), 1, 'the last element job completes');
SELECT results_eq(format($$ SELECT map_left, results -> 'resize' FROM treadle.workflow_runs WHERE id = %s $$, :r1),
                  $$ VALUES (NULL::jsonb, '[{"doubled": 2}, {"doubled": 4}, {"doubled": 6}]'::jsonb) $$,
                  'the step''s result is the element results in element order');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE workflow_run_id = :r1 AND step = 'report' AND state = 'available'),
          1::bigint, 'report starts once');
SELECT is(treadle.workflow_step_results(:r1, 'report') -> 'resize', '[{"doubled": 2}, {"doubled": 4}, {"doubled": 6}]'::jsonb,
          'report receives the results in element order');
SELECT is(pg_temp.finish(:r1, 'report'), 'completed', 'report completes');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :r1), 'completed', 'the run completes');

--------------------------------------------------------------------------------
-- an empty array: the map step completes at once with []; a map step last
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('thumbs', '{}', queue => 'maps') AS r2 \gset
SELECT is(pg_temp.finish(:r2, 'load', '[]'), 'completed', 'load completes with an empty array');
SELECT results_eq(format($$ SELECT results -> 'resize', map_left FROM treadle.workflow_runs WHERE id = %s $$, :r2),
                  $$ VALUES ('[]'::jsonb, NULL::jsonb) $$, 'the map step completes at once with []');
SELECT is(pg_temp.steps(:r2), ARRAY['load:completed', 'report:available'], 'and what runs after it starts');
SELECT treadle.start_workflow('last', '{}', steps => ARRAY['load', 'each'], maps => '{"each": "load"}', queue => 'maps') AS r3 \gset
SELECT is(pg_temp.finish(:r3, 'load', '[5, 6]'), 'completed', 'a run whose last step maps');
SELECT is(pg_temp.finish_elements(:r3, 'each'), 2, 'its element jobs complete');
SELECT results_eq(format($$ SELECT state, results -> 'each' FROM treadle.workflow_runs WHERE id = %s $$, :r3),
                  $$ VALUES ('completed', '[{"doubled": 10}, {"doubled": 12}]'::jsonb) $$, 'the run completes with the map''s results');

--------------------------------------------------------------------------------
-- an element job that fails for good fails the run; a retry resumes it
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('thumbs', '{}', queue => 'maps') AS r6 \gset
SELECT is(pg_temp.finish(:r6, 'load', '[1, 2, 3]'), 'completed', 'load completes');
SELECT is(pg_temp.finish_elements(:r6, 'resize', 1), 1, 'the last element completes');
SELECT is(treadle.fail(j.id, j.lease_token, 'boom', retryable => false), 'discarded', 'the middle element fails for good')
  FROM (SELECT id, lease_token FROM treadle.claim('w', ARRAY['maps'], batch => 10)) AS j
  JOIN treadle.jobs AS k ON k.id = j.id AND k.workflow_run_id = :r6 AND k.args ->> 'index' = '1';
SELECT is(pg_temp.finish_elements(:r6, 'resize'), 0, 'the first element is claimed (running), none available');
SELECT is(treadle.complete(k.id, k.lease_token, '{"doubled": 2}'), 'completed', 'the first element completes in the failed run')
  FROM treadle.jobs AS k WHERE k.workflow_run_id = :r6 AND k.step = 'resize' AND k.args ->> 'index' = '0';
SELECT results_eq(format($$ SELECT state, map_left, results ? 'resize' FROM treadle.workflow_runs WHERE id = %s $$, :r6),
                  $$ VALUES ('failed', '{"resize": 1}'::jsonb, false) $$, 'the run failed, one element left');
SELECT ok(treadle.retry((SELECT id FROM treadle.jobs WHERE workflow_run_id = :r6 AND step = 'resize' AND state = 'discarded')),
          'a retry of the failed element resumes the run');
SELECT is(pg_temp.finish_elements(:r6, 'resize'), 1, 'the retried element completes');
SELECT results_eq(format($$ SELECT state, results -> 'resize' FROM treadle.workflow_runs WHERE id = %s $$, :r6),
                  $$ VALUES ('running', '[{"doubled": 2}, {"doubled": 4}, {"doubled": 6}]'::jsonb) $$,
                  'the map step completes with every element''s result in order');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE workflow_run_id = :r6 AND step = 'report'), 1::bigint, 'report starts once');

--------------------------------------------------------------------------------
-- a map over the run's input: {"input": key}
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('fromin', '{"images": [7, 8]}', steps => ARRAY['each', 'done'],
                              maps => '{"each": {"input": "images"}}', queue => 'maps') AS r5 \gset
SELECT results_eq(format($$ SELECT step, args FROM treadle.jobs WHERE workflow_run_id = %s ORDER BY id $$, :r5),
                  $$ VALUES ('each', '{"element": 7, "index": 0}'::jsonb), ('each', '{"element": 8, "index": 1}') $$,
                  'a map over the input starts with the run, a job per element');
SELECT is(pg_temp.finish_elements(:r5, 'each'), 2, 'its element jobs complete');
SELECT results_eq(format($$ SELECT results -> 'each', pg_temp.steps(%s) FROM treadle.workflow_runs WHERE id = %s $$, :r5, :r5),
                  $$ VALUES ('[{"doubled": 14}, {"doubled": 16}]'::jsonb, ARRAY['each:completed', 'each:completed', 'done:available']) $$,
                  'the map step completes in element order and the next step starts');
SELECT throws_ok($$ SELECT treadle.start_workflow('fromin', '{"images": "x"}', steps => ARRAY['each'],
                                                  maps => '{"each": {"input": "images"}}', queue => 'maps') $$,
                 '22023', 'treadle: map step "each" maps over the input''s "images", which must be a JSON array, not string',
                 'an input whose key is not an array');
SELECT throws_ok($$ SELECT treadle.start_workflow('fromin', '{}', steps => ARRAY['each'],
                                                  maps => '{"each": {"input": "images"}}', queue => 'maps') $$,
                 '22023', 'treadle: map step "each" maps over the input''s "images", which must be a JSON array, not missing',
                 'an input without the key');
SELECT is((SELECT count(*) FROM treadle.workflow_runs WHERE name = 'fromin'), 1::bigint, 'neither started a run');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a'], maps => '{"a": {"input": 5}}') $$,
                 '22023', 'treadle: map step "a" maps over a step name or {"input": key}, not {"input": 5}', 'an input key that is not text');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a'], maps => '{"a": {"input": "k", "x": 1}}') $$,
                 '22023', NULL, 'an input map with another key');

--------------------------------------------------------------------------------
-- bad input: 22023 naming the step, nothing written
--------------------------------------------------------------------------------
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b', 'c'], after => '{"c": ["b"]}', maps => '{"c": "a"}') $$,
                 '22023', 'treadle: map step "c" maps over step "a", which it does not run after', 'maps over a step it does not depend on');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], maps => '{"x": "a"}') $$,
                 '22023', 'treadle: maps names step "x", which is not one of the steps', 'an unknown map step');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], maps => '{"b": ["a"]}') $$,
                 '22023', NULL, 'a map that does not name one step');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'b'], sleeps => '{"b": "1 hour"}', maps => '{"b": "a"}') $$,
                 '22023', 'treadle: step "b" is a sleep step and cannot map', 'a sleep step that maps');
SELECT throws_ok($$ SELECT treadle.start_workflow('thumbs', maps => '{"resize": "load"}') $$,
                 '22023', 'treadle: after, sleeps, maps, children and compensations need steps', 'maps without steps');
SELECT is((SELECT count(*) FROM treadle.workflows WHERE name = 'bad'), 0::bigint, 'no bad map wrote a definition');

SELECT treadle.start_workflow('thumbs', '{}', queue => 'maps') AS r4 \gset
SELECT throws_ok(format($$ SELECT pg_temp.finish(%s, 'load', '{"not": "an array"}') $$, :r4),
                 '22023', 'treadle: map step "resize" maps over the result of step "load", which must be a JSON array, not object',
                 'a result that is not an array');
SELECT throws_ok(format($$ SELECT pg_temp.finish(%s, 'load', (SELECT jsonb_agg(NULL::integer) FROM generate_series(1, 100001))) $$, :r4),
                 '22023', 'treadle: map step "resize" maps over at most 100000 elements, the result of step "load" holds 100001',
                 'a result over 100,000 elements');
SELECT results_eq(format($$ SELECT pg_temp.steps(%s), results FROM treadle.workflow_runs WHERE id = %s $$, :r4, :r4),
                  $$ VALUES (ARRAY['load:available'], '{}'::jsonb) $$, 'neither changed the run');

--------------------------------------------------------------------------------
-- the fan-out limit is the owner's (treadle.configure(max_map_elements))
--------------------------------------------------------------------------------
SELECT is(treadle._max_map_elements(), 100000, 'the fan-out limit is 100,000 until configured');
SELECT throws_ok($$ SELECT treadle.configure(max_map_elements => 0) $$, '22023',
                 'treadle: max_map_elements must be between 1 and 1000000, got 0', 'a limit under 1');
SELECT throws_ok($$ SELECT treadle.configure(max_map_elements => 1000001) $$, '22023', NULL, 'a limit over 1,000,000');
SELECT throws_ok($$ SELECT treadle.configure(max_payload_bytes => NULL, max_map_elements => NULL) $$, '22004',
                 'treadle: max_payload_bytes and max_map_elements must not both be null', 'no limit given');
SELECT is((SELECT count(*) FROM treadle.settings), 0::bigint, 'no refused limit wrote the settings');
SELECT lives_ok($$ SELECT treadle.configure(max_map_elements => 3) $$, 'the owner sets the fan-out limit');
SELECT results_eq($$ SELECT max_payload_bytes, max_map_elements FROM treadle.settings $$,
                  $$ VALUES (1048576, 3) $$, 'the payload limit keeps its value');
SELECT lives_ok($$ SELECT treadle.configure(max_payload_bytes => 4096) $$, 'then the payload limit alone');
SELECT results_eq($$ SELECT max_payload_bytes, max_map_elements FROM treadle.settings $$,
                  $$ VALUES (4096, 3) $$, 'which keeps the fan-out limit');
SELECT throws_ok(format($$ SELECT pg_temp.finish(%s, 'load', '[1, 2, 3, 4]') $$, :r4),
                 '22023', 'treadle: map step "resize" maps over at most 3 elements, the result of step "load" holds 4',
                 'a result over the configured limit');
SELECT results_eq(format($$ SELECT pg_temp.steps(%s), results FROM treadle.workflow_runs WHERE id = %s $$, :r4, :r4),
                  $$ VALUES (ARRAY['load:available'], '{}'::jsonb) $$, 'the refusal enqueued nothing');
SELECT throws_ok($$ SELECT treadle.start_workflow('adhoc', '{"photos": [1, 2, 3, 4]}', steps => ARRAY['resize'],
                                                  maps => '{"resize": {"input": "photos"}}', queue => 'maps') $$,
                 '22023', 'treadle: map step "resize" maps over at most 3 elements, the input''s "photos" holds 4',
                 'an input over the configured limit: the run does not start');
SELECT is(pg_temp.finish(:r4, 'load', '[1, 2, 3]'), 'completed', 'a result at the limit');
SELECT is(pg_temp.steps(:r4), ARRAY['load:completed', 'resize:available', 'resize:available', 'resize:available'],
          'fans out');
SELECT lives_ok($$ SELECT treadle.configure(max_map_elements => 1000000, max_payload_bytes => 1048576) $$,
                'both limits at once, the fan-out at its maximum');
SELECT results_eq($$ SELECT max_payload_bytes, max_map_elements FROM treadle.settings $$,
                  $$ VALUES (1048576, 1000000) $$, 'both set');

SELECT * FROM finish();
ROLLBACK;
