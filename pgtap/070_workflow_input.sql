-- pgtap/070_workflow_input.sql: start_workflow's input is checked as every payload is
-- (null and JSON null are {}; a scalar, an input over the size limit or nested over 100
-- levels is refused with 22023 and writes nothing), the limit being read only for an
-- input over 1 KiB (it is never under).
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(10);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

-- pg_temp.input_of(value): the input of a run started with it
CREATE FUNCTION pg_temp.input_of(value jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint := treadle.start_workflow('wi', value, steps => ARRAY['a'], queue => 'wi');
BEGIN
    RETURN (SELECT r.input FROM treadle.workflow_runs AS r WHERE r.id = v_id);
END;
$$;
SELECT is(pg_temp.input_of(NULL), '{}'::jsonb, 'a null input is {}');
SELECT is(pg_temp.input_of('null'), '{}'::jsonb, 'a JSON null input is {}');
SELECT is(pg_temp.input_of('[1, 2]'), '[1, 2]'::jsonb, 'an array is kept');
SELECT is(pg_temp.input_of('{"k": "v"}'), '{"k": "v"}'::jsonb, 'an object is kept');

SELECT treadle.configure(max_payload_bytes => 2048);
SELECT count(*) AS runs FROM treadle.workflow_runs \gset
SELECT throws_ok($$ SELECT treadle.start_workflow('wi', '"text"', steps => ARRAY['a']) $$, '22023',
                 'treadle: input must be a JSON object or array, not string', 'a scalar input, 22023');
SELECT throws_ok(format($$ SELECT treadle.start_workflow('wi', %L, steps => ARRAY['a']) $$,
                        jsonb_build_object('k', repeat('x', 3000))),
                 '22023', NULL, 'an input over the limit, 22023');
SELECT throws_ok(format($$ SELECT treadle.start_workflow('wi', %L, steps => ARRAY['a']) $$,
                        repeat('[', 120) || repeat(']', 120)),
                 '22023', 'treadle: input is nested more than 100 levels deep', 'a small input nested 120 deep, 22023');
SELECT is(pg_temp.input_of(jsonb_build_object('k', repeat('x', 1500))) ->> 'k', repeat('x', 1500),
          'an input over 1 KiB under the limit is kept');
SELECT is((SELECT count(*) FROM treadle.workflow_runs), :runs::bigint + 1, 'the refusals wrote no run');
SELECT treadle.configure(max_payload_bytes => 1048576);
SELECT is(pg_temp.input_of(jsonb_build_object('k', repeat('x', 3000))) ->> 'k', repeat('x', 3000),
          'the same input under a larger limit is kept');

SELECT * FROM finish();
ROLLBACK;
