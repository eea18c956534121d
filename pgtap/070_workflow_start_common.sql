-- pgtap/070_workflow_start_common.sql: start_workflow's common call (a list of steps given,
-- or a definition that is one, and no other option) writes the run and its first step
-- job that the whole way writes; every other call, and every bad list, goes the whole
-- way (its errors, nothing written).
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(17);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

-- pg_temp.run_shape(id) / pg_temp.first_job(id): what both ways must write alike
CREATE FUNCTION pg_temp.run_shape(run_id bigint) RETURNS jsonb LANGUAGE sql AS $$
    SELECT to_jsonb(r) - ARRAY['id', 'idempotency_key'] FROM treadle.workflow_runs AS r WHERE r.id = run_id
$$;
CREATE FUNCTION pg_temp.first_job(run_id bigint) RETURNS jsonb LANGUAGE sql AS $$
    SELECT to_jsonb(j) - ARRAY['id', 'workflow_run_id', 'ready_txid'] FROM treadle.jobs AS j
     WHERE j.workflow_run_id = run_id
$$;

-- a list given: the common call (no key) against the whole way (a key sends it there)
SELECT treadle.start_workflow('sc', '{"n": 1}', steps => ARRAY['a', 'b', 'c'], queue => 'sc', priority => 3,
                              max_attempts => 4) AS common \gset
SELECT treadle.start_workflow('sc', '{"n": 1}', steps => ARRAY['a', 'b', 'c'], queue => 'sc', priority => 3,
                              max_attempts => 4, idempotency_key => 'whole') AS whole \gset
SELECT is(pg_temp.run_shape(:common), pg_temp.run_shape(:whole), 'a list given: the run as the whole way writes it');
SELECT is(pg_temp.first_job(:common), pg_temp.first_job(:whole), 'a list given: its first step job as well');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE workflow_run_id = :common), 1::bigint, 'one job: the first step''s');
SELECT is(pg_temp.first_job(:common) ->> 'name', 'workflow:sc/a', 'named for its workflow and step');

-- a definition that is a list: its steps and version, as the whole way copies them
SELECT treadle.define_workflow('sd', ARRAY['x', 'y']);
SELECT treadle.define_workflow('sd', ARRAY['x', 'y', 'z']);  -- version 2
SELECT treadle.start_workflow('sd', queue => 'sd') AS d_common \gset
SELECT treadle.start_workflow('sd', queue => 'sd', idempotency_key => 'whole') AS d_whole \gset
SELECT is(pg_temp.run_shape(:d_common), pg_temp.run_shape(:d_whole), 'a list defined: the run as the whole way writes it');
SELECT is((SELECT steps || version::text FROM treadle.workflow_runs WHERE id = :d_common), ARRAY['x', 'y', 'z', '2'],
          'the definition''s steps and its version');
SELECT is(pg_temp.first_job(:d_common), pg_temp.first_job(:d_whole), 'a list defined: its first step job as well');

-- a definition that is a graph: the common call does not take it; the whole way does
SELECT treadle.define_workflow('sg', ARRAY['p', 'q', 'r'], after => '{"r": ["p", "q"]}');
SELECT treadle.start_workflow('sg', queue => 'sg') AS g_run \gset
SELECT is((SELECT after FROM treadle.workflow_runs WHERE id = :g_run), '{"p": [], "q": [], "r": ["p", "q"]}'::jsonb,
          'a graph defined: its dependencies recorded');
SELECT is((SELECT array_agg(step ORDER BY step) FROM treadle.jobs WHERE workflow_run_id = :g_run), ARRAY['p', 'q'],
          'a graph defined: every step without dependencies enqueued');

-- bad lists in the common shape: the whole way's errors, nothing written
SELECT count(*) AS runs FROM treadle.workflow_runs \gset
SELECT throws_ok($$ SELECT treadle.start_workflow('sc', steps => ARRAY['a', 'b', 'a'], queue => 'sc') $$, '22023',
                 'treadle: steps must not repeat a name: step "a" is listed more than once', 'a repeated step, 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('sc', steps => ARRAY['a', 'b/c'], queue => 'sc') $$, '22023',
                 'treadle: step "b/c" must not hold ''/''', 'a step holding /, 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('sc', steps => ARRAY[]::text[], queue => 'sc') $$, '22023',
                 NULL, 'no steps, 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('sc', steps => ARRAY['a', NULL], queue => 'sc') $$, '22023',
                 NULL, 'a null step, 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('sc', steps => ARRAY['a', E'b\tc'], queue => 'sc') $$, '22023',
                 NULL, 'a step holding a control character, 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('nope', queue => 'sc') $$, '22023',
                 'treadle: unknown workflow nope', 'no steps and no definition, 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow(repeat('w', 201), steps => ARRAY['a'], queue => 'sc') $$, '22023',
                 NULL, 'a name over 200 characters, 22023');
SELECT is((SELECT count(*) FROM treadle.workflow_runs), :runs::bigint, 'the refusals wrote no run');

SELECT * FROM finish();
ROLLBACK;
