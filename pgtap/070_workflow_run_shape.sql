-- pgtap/070_workflow_run_shape.sql: treadle.workflow_runs keeps few CHECK constraints
-- (each costs every statement that writes a run row, 010_tables.sql): the state with
-- finished_at, and the columns that go in pairs, refuse a bad row with 23514; the shape
-- of a run's definition is the functions' to guard: start_workflow refuses each bad
-- value that a dropped constraint refused (22023, no run written), and every run that
-- start_workflow, a child step and fork_run write holds what those constraints said.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(19);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

SELECT is(ARRAY(SELECT conname::text FROM pg_constraint
                 WHERE conrelid = 'treadle.workflow_runs'::regclass AND contype = 'c' ORDER BY conname),
          ARRAY['workflow_runs_forked_check', 'workflow_runs_parent_check', 'workflow_runs_parent_queue_check',
                'workflow_runs_root_check', 'workflow_runs_state_check'],
          'workflow_runs has the CHECK constraints 010_tables.sql keeps, and no other');

--------------------------------------------------------------------------------
-- the kept constraint on the state: one of six, finished_at exactly when finished
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('shape', steps => ARRAY['a', 'b'], queue => 'shape') AS r1 \gset
SELECT throws_ok(format($$ UPDATE treadle.workflow_runs SET state = 'done', finished_at = now() WHERE id = %s $$, :r1),
                 '23514', NULL, 'a state that is none of the six is refused');
SELECT throws_ok(format($$ UPDATE treadle.workflow_runs SET state = 'completed' WHERE id = %s $$, :r1),
                 '23514', NULL, 'a finished state without finished_at is refused');
SELECT throws_ok(format($$ UPDATE treadle.workflow_runs SET finished_at = now() WHERE id = %s $$, :r1),
                 '23514', NULL, 'a running run with finished_at is refused');
SELECT throws_ok(format($$ UPDATE treadle.workflow_runs SET state = 'compensating', finished_at = now() WHERE id = %s $$,
                        :r1),
                 '23514', NULL, 'so is a compensating one');
SELECT lives_ok(format($$ UPDATE treadle.workflow_runs SET state = 'cancelled', finished_at = now() WHERE id = %s $$, :r1),
                'a finished state with finished_at is let in');

--------------------------------------------------------------------------------
-- start_workflow refuses what the dropped constraints refused, and writes nothing
--------------------------------------------------------------------------------
SELECT count(*) AS runs FROM treadle.workflow_runs \gset
SELECT throws_ok($$ SELECT treadle.start_workflow('shape', steps => ARRAY[]::text[]) $$, '22023', NULL,
                 'no steps (workflow_runs_steps_check): 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('shape', steps => ARRAY['a'], after => '[]') $$, '22023', NULL,
                 'after not an object (workflow_runs_after_check): 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('shape', steps => ARRAY['a'], sleeps => '[]') $$, '22023', NULL,
                 'sleeps not an object (workflow_runs_sleeps_check): 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('shape', steps => ARRAY['a', 'b'], maps => '[]') $$, '22023', NULL,
                 'maps not an object (workflow_runs_maps_check): 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('shape', steps => ARRAY['a'], waits => '[]') $$, '22023', NULL,
                 'waits not an object (workflow_runs_waits_check): 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('shape', steps => ARRAY['a'], children => '[]') $$, '22023', NULL,
                 'children not an object (workflow_runs_children_check): 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('shape', steps => ARRAY['a'], compensations => '[]') $$, '22023', NULL,
                 'compensations not an object (workflow_runs_compensations_check): 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('shape', steps => ARRAY['a'], step_options => '[]') $$, '22023', NULL,
                 'step_options not an object (workflow_runs_step_options_check): 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('shape', steps => ARRAY['a'], meta => '[]') $$, '22023', NULL,
                 'meta not an object (workflow_runs_meta_check): 22023');
SELECT is((SELECT count(*) FROM treadle.workflow_runs), :runs::bigint, 'the refusals wrote no run');

--------------------------------------------------------------------------------
-- every run the three INSERTs write holds what the dropped constraints said
--------------------------------------------------------------------------------
SELECT treadle.define_workflow('shape_child', ARRAY['c1', 'c2'], sleeps => '{"c2": "1 hour"}');
SELECT treadle.define_workflow('shape_parent', ARRAY['p1', 'p2'], children => '{"p1": {"workflow": "shape_child"}}',
                               compensations => '{"p2": "undo_p2"}', step_options => '{"p2": {"priority": 3}}');
SELECT treadle.start_workflow('shape_parent', '{"n": 1}', queue => 'shape', meta => '{"trace": "t1"}') AS r2 \gset
SELECT treadle.start_workflow('shape', steps => ARRAY['a', 'b'], sleeps => '{"b": "1 hour"}', queue => 'shape') AS r3 \gset
SELECT treadle.fork_run(:r3, 'b') AS r4 \gset
SELECT is((SELECT count(*) FROM treadle.workflow_runs WHERE parent_run_id = :r2), 1::bigint,
          'the parent''s child step started its child run');
SELECT is((SELECT count(*) FROM treadle.workflow_runs AS r
            WHERE r.id IN (:r2, :r3, :r4) OR r.parent_run_id = :r2),
          4::bigint, 'a started run, its child, a run given its steps and its fork');
SELECT is((SELECT count(*) FROM treadle.workflow_runs AS r
            WHERE NOT (cardinality(r.steps) > 0
                       AND coalesce(jsonb_typeof(r.after), 'object') = 'object'
                       AND (r.sleeps IS NULL OR (jsonb_typeof(r.sleeps) = 'object' AND r.after IS NOT NULL))
                       AND (r.maps IS NULL OR (jsonb_typeof(r.maps) = 'object' AND r.after IS NOT NULL))
                       AND (r.waits IS NULL OR (jsonb_typeof(r.waits) = 'object' AND r.after IS NOT NULL))
                       AND (r.children IS NULL OR (jsonb_typeof(r.children) = 'object' AND r.after IS NOT NULL))
                       AND coalesce(jsonb_typeof(r.compensations), 'object') = 'object'
                       AND coalesce(jsonb_typeof(r.step_options), 'object') = 'object'
                       AND coalesce(jsonb_typeof(r.meta), 'object') = 'object'
                       AND coalesce(r.tree_runs, 2) >= 2)),
          0::bigint, 'and each holds the shape the dropped constraints stated (sleeps and children come with after)');

SELECT * FROM finish();
ROLLBACK;
