-- pgtap/073_workflow_joins.sql: complete_and_claim moves the run of a step that
-- may make a join ready (a step that a step with other dependencies runs after, a
-- map element) after its claim (073_workflow_joins.sql): the join is enqueued once,
-- left to the next claim; a step whose successors wait for it alone is still
-- claimed by the same call; complete_many moves every run at once.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(12);
\ir helpers.psql

-- pg_temp.steps(run): the run's step jobs as 'step:state', in id order
CREATE FUNCTION pg_temp.steps(run_id bigint) RETURNS text[] LANGUAGE sql AS $$
    SELECT coalesce(array_agg(j.step || ':' || j.state ORDER BY j.id), '{}')
      FROM treadle.jobs AS j WHERE j.workflow_run_id = run_id
$$;

--------------------------------------------------------------------------------
-- x, y -> join: the last branch's cycle claims first, then enqueues the join
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('pair', '{}', ARRAY['x', 'y', 'join'], queue => 'jn',
                              after => '{"join": ["x", "y"]}') AS run \gset
SELECT id AS x, lease_token AS x_tok FROM treadle.claim('w', ARRAY['jn'], names => ARRAY['workflow:pair/x']) \gset
SELECT id AS y, lease_token AS y_tok FROM treadle.claim('w', ARRAY['jn'], names => ARRAY['workflow:pair/y']) \gset
CREATE TEMP TABLE first_branch AS
SELECT finished_state, (job).id FROM treadle.complete_and_claim(ARRAY[:x]::bigint[], ARRAY[:'x_tok']::uuid[],
                                                                ARRAY['1']::jsonb[], 'w', ARRAY['jn'], batch => 5);
SELECT results_eq($$ SELECT * FROM first_branch $$, $$ VALUES ('completed'::text, NULL::bigint) $$,
                  'the first branch: nothing to claim');
CREATE TEMP TABLE last_branch AS
SELECT finished_state, (job).step FROM treadle.complete_and_claim(ARRAY[:y]::bigint[], ARRAY[:'y_tok']::uuid[],
                                                                  ARRAY['2']::jsonb[], 'w', ARRAY['jn'], batch => 5);
SELECT results_eq($$ SELECT * FROM last_branch $$, $$ VALUES ('completed'::text, NULL::text) $$,
                  'the last branch''s claim ran before its run moved: the join is not claimed by it');
SELECT is(pg_temp.steps(:run), ARRAY['x:completed', 'y:completed', 'join:available'],
          'the join is enqueued once, waiting for the next claim');
SELECT is(treadle.workflow_step_results(:run, 'join'), '{"x": 1, "y": 2}'::jsonb, 'with both results');
SELECT is(current_setting('treadle.defer_joins', true), '', 'the rest of the transaction moves runs at once');
SELECT is(current_setting('treadle.joins_deferred', true), '', 'and keeps nothing');

--------------------------------------------------------------------------------
-- a -> b: a step whose successor waits for it alone: claimed by the same call
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('chain', '{}', ARRAY['a', 'b', 'c'], queue => 'jn-chain',
                              after => '{"b": ["a"], "c": ["b"]}') AS chain \gset
SELECT id AS a, lease_token AS a_tok FROM treadle.claim('w', ARRAY['jn-chain']) \gset
CREATE TEMP TABLE chained AS
SELECT finished_state, (job).step FROM treadle.complete_and_claim(ARRAY[:a]::bigint[], ARRAY[:'a_tok']::uuid[],
                                                                  NULL, 'w', ARRAY['jn-chain'], batch => 5);
SELECT results_eq($$ SELECT * FROM chained $$, $$ VALUES ('completed'::text, NULL::text), (NULL, 'b') $$,
                  'a graph step with a single dependency is claimed by the same call');

--------------------------------------------------------------------------------
-- complete_many, and complete_and_claim with batch 0: the join at once
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('pair', '{}', ARRAY['x', 'y', 'join'], queue => 'jn-many',
                              after => '{"join": ["x", "y"]}') AS run2 \gset
SELECT id AS x2, lease_token AS x2_tok FROM treadle.claim('w', ARRAY['jn-many'], names => ARRAY['workflow:pair/x']) \gset
SELECT id AS y2, lease_token AS y2_tok FROM treadle.claim('w', ARRAY['jn-many'], names => ARRAY['workflow:pair/y']) \gset
CREATE TEMP TABLE many AS
SELECT state FROM treadle.complete_many(ARRAY[:x2, :y2]::bigint[], ARRAY[:'x2_tok', :'y2_tok']::uuid[]);
SELECT results_eq($$ SELECT * FROM many $$, $$ VALUES ('completed'::text), ('completed') $$,
                  'complete_many finishes both branches');
SELECT is(pg_temp.steps(:run2), ARRAY['x:completed', 'y:completed', 'join:available'],
          'and enqueues the join in the same statement');

SELECT treadle.start_workflow('pair', '{}', ARRAY['x', 'y', 'join'], queue => 'jn-zero',
                              after => '{"join": ["x", "y"]}') AS run3 \gset
SELECT id AS x3, lease_token AS x3_tok FROM treadle.claim('w', ARRAY['jn-zero'], names => ARRAY['workflow:pair/x']) \gset
SELECT id AS y3, lease_token AS y3_tok FROM treadle.claim('w', ARRAY['jn-zero'], names => ARRAY['workflow:pair/y']) \gset
CREATE TEMP TABLE zero AS
SELECT finished_state FROM treadle.complete_and_claim(ARRAY[:x3, :y3]::bigint[], ARRAY[:'x3_tok', :'y3_tok']::uuid[],
                                                      NULL, 'w', ARRAY['jn-zero'], batch => 0);
SELECT results_eq($$ SELECT * FROM zero $$, $$ VALUES ('completed'::text), ('completed') $$,
                  'batch 0 only finishes');
SELECT is(pg_temp.steps(:run3), ARRAY['x:completed', 'y:completed', 'join:available'],
          'and moves the runs at once: the join is there');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE step = 'join'), 3::bigint, 'one join per run, no more');

SELECT * FROM finish();
ROLLBACK;
