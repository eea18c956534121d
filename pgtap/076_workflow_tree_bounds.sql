-- pgtap/076_workflow_tree_bounds.sql: the bounds that keep a workflow run tree
-- (a root run and the runs its child steps start, directly or not) from growing
-- without end: each child names its root and the root counts its tree, and a child
-- past 10,000 runs is refused (54000) with nothing written; and step names that
-- hold '/' (which would make two workflows' step job names the same) are refused.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(40);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

-- pg_temp.finish(run, step): lease that step's available job and complete it
CREATE FUNCTION pg_temp.finish(run_id bigint, step_name text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_job treadle.jobs;
BEGIN
    UPDATE treadle.jobs AS j SET state = 'running', lease_until = treadle.now() + interval '1 hour',
           lease_token = gen_random_uuid(), worker_id = 'w', attempt = 1
     WHERE j.workflow_run_id = run_id AND j.step = step_name AND j.state = 'available'
    RETURNING j.* INTO STRICT v_job;
    RETURN treadle.complete(v_job.id, v_job.lease_token, '{}');
END;
$$;
-- pg_temp.child(run, step): the id of the child run a step started
CREATE FUNCTION pg_temp.child(run_id bigint, step_name text) RETURNS bigint LANGUAGE sql AS $$
    SELECT r.id FROM treadle.workflow_runs AS r WHERE r.parent_run_id = run_id AND r.parent_step = step_name
$$;
-- pg_temp.tree(run): a run's root_run_id and tree_runs as text
CREATE FUNCTION pg_temp.tree(run_id bigint) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(r.root_run_id::text, 'root') || ':' || coalesce(r.tree_runs, 1) FROM treadle.workflow_runs AS r WHERE r.id = run_id
$$;

--------------------------------------------------------------------------------
-- the count: a root counts each run of its tree, a descendant names its root
--------------------------------------------------------------------------------
SELECT is(treadle._max_tree_runs(), 10000, 'a run tree holds at most 10,000 runs');
SELECT lives_ok($$ SELECT treadle.define_workflow('leaf', ARRAY['x']) $$, 'a leaf workflow');
SELECT lives_ok($$ SELECT treadle.define_workflow('mid', ARRAY['m1', 'm2'], after => '{"m1": [], "m2": []}',
                                                  children => '{"m1": {"workflow": "leaf"}, "m2": {"workflow": "leaf"}}') $$,
                'a workflow of two child steps side by side');
SELECT lives_ok($$ SELECT treadle.define_workflow('top', ARRAY['a', 'k1', 'b', 'k2'],
                                                  children => '{"k1": {"workflow": "mid", "queue": "bounds-mid"}, "k2": {"workflow": "leaf"}}') $$,
                'a workflow with a child step (in a queue of its own), a step, another child step');
SELECT treadle.start_workflow('top', '{}', queue => 'bounds') AS r1 \gset
SELECT is(pg_temp.tree(:r1), 'root:1', 'a run that start_workflow started is a root of one run');
SELECT is(pg_temp.finish(:r1, 'a'), 'completed', 'the root''s first step completes');
SELECT is(pg_temp.tree(:r1), 'root:4', 'its child and the child''s two children count on the root');
SELECT is(pg_temp.tree(pg_temp.child(:r1, 'k1')), :'r1' || ':1', 'the child names the root and counts nothing itself');
SELECT is(pg_temp.tree(pg_temp.child(pg_temp.child(:r1, 'k1'), 'm2')), :'r1' || ':1',
          'a grandchild names the root, not its parent');
SELECT is((SELECT queue || ' ' || root_queue FROM treadle.workflow_runs WHERE id = pg_temp.child(pg_temp.child(:r1, 'k1'), 'm2')),
          'bounds-mid bounds', 'and the root''s queue, not its own or its parent''s');
SELECT is((SELECT root_queue FROM treadle.workflow_runs WHERE id = :r1), NULL, 'a root names no root queue');

--------------------------------------------------------------------------------
-- at the cap, and one past it
--------------------------------------------------------------------------------
SELECT pg_temp.finish(pg_temp.child(pg_temp.child(:r1, 'k1'), 'm1'), 'x') AS ignored \gset
SELECT pg_temp.finish(pg_temp.child(pg_temp.child(:r1, 'k1'), 'm2'), 'x') AS ignored \gset
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = pg_temp.child(:r1, 'k1')), 'completed',
          'the child completes with its children');
UPDATE treadle.workflow_runs SET tree_runs = 9999 WHERE id = :r1;  -- as if 9,995 more runs had started
SELECT lives_ok(format($$ SELECT pg_temp.finish(%s, 'b') $$, :r1), 'at 9,999 runs the root''s next step completes');
SELECT is(pg_temp.tree(:r1), 'root:10000', 'and the child it starts is the 10,000th run');
SELECT ok(pg_temp.child(:r1, 'k2') IS NOT NULL, 'which starts');
-- the same tree, one run past: a fresh root counted up to the cap
SELECT treadle.start_workflow('top', '{}', queue => 'bounds') AS r2 \gset
UPDATE treadle.workflow_runs SET tree_runs = 10000 WHERE id = :r2;
SELECT throws_ok(format($$ SELECT pg_temp.finish(%s, 'a') $$, :r2), '54000',
                 format('treadle: child step "k1" would grow the run tree of workflow run %s past 10000 runs', :r2),
                 'a child step past 10,000 runs is refused (54000), naming the step and the root');
SELECT is(pg_temp.tree(:r2), 'root:10000', 'the count is as it was');
SELECT is((SELECT count(*) FROM treadle.workflow_runs WHERE parent_run_id = :r2), 0::bigint, 'no child run is written');
SELECT is((SELECT state FROM treadle.jobs WHERE workflow_run_id = :r2 AND step = 'a'), 'available',
          'and the step that led to it stays where it was');
-- a descendant deep in a full tree is refused the same way
UPDATE treadle.workflow_runs SET tree_runs = 1 WHERE id = :r2;
SELECT is(pg_temp.finish(:r2, 'a'), 'completed', 'below the cap the step completes');
UPDATE treadle.workflow_runs SET tree_runs = 10000 WHERE id = :r2;
SELECT is(pg_temp.finish(pg_temp.child(pg_temp.child(:r2, 'k1'), 'm1'), 'x'), 'completed',
          'a grandchild''s step completes (it starts no run)');
SELECT is(pg_temp.tree(:r2), 'root:10000', 'the root''s count stays');

--------------------------------------------------------------------------------
-- a child step that fans out at every level: up to the cap, and one run past it
--------------------------------------------------------------------------------
-- fan1 starts ten fan2 runs, each ten fan3 runs, each ten leaf runs: 1 + 10 + 100 +
-- 1,000 runs, 3 levels below it, all started when fan1 starts
CREATE FUNCTION pg_temp.fan(name text, child text) RETURNS void LANGUAGE sql AS $$
    SELECT treadle.define_workflow(name, array_agg('c' || i ORDER BY i),
                                   after => jsonb_object_agg('c' || i, '[]'::jsonb),
                                   children => jsonb_object_agg('c' || i, jsonb_build_object('workflow', child)))
      FROM generate_series(1, 10) AS i
$$;
SELECT lives_ok($$ SELECT pg_temp.fan('fan1', 'fan2'), pg_temp.fan('fan2', 'fan3'), pg_temp.fan('fan3', 'leaf'),
                          treadle.define_workflow('fanned', ARRAY['a', 'k'], children => '{"k": {"workflow": "fan1"}}') $$,
                'workflows of ten child steps side by side, each level starting the next');
SELECT treadle.start_workflow('fanned', '{}', queue => 'bounds') AS r3 \gset
SELECT treadle.start_workflow('fanned', '{}', queue => 'bounds') AS r4 \gset
UPDATE treadle.workflow_runs SET tree_runs = 10000 - 1111 WHERE id = :r3;
UPDATE treadle.workflow_runs SET tree_runs = 10000 - 1111 + 1 WHERE id = :r4;
SELECT count(*) AS runs_before FROM treadle.workflow_runs \gset
SELECT throws_like(format($$ SELECT pg_temp.finish(%s, 'a') $$, :r4),
                   '%would grow the run tree of workflow run ' || :r4 || ' past 10000 runs%',
                   'a tree that 1,111 more runs would take one past 10,000 stops');
SELECT is((SELECT count(*) FROM treadle.workflow_runs), :runs_before::bigint, 'and leaves no run behind');
SELECT is(pg_temp.tree(:r4), 'root:8890', 'nor a count');
SELECT is(pg_temp.finish(:r3, 'a'), 'completed', 'a tree that they take to 10,000 exactly grows');
SELECT is((SELECT count(*) FROM treadle.workflow_runs WHERE root_run_id = :r3), 1111::bigint, 'by 1,111 runs');
SELECT is(pg_temp.tree(:r3), 'root:10000', 'and counts them');

--------------------------------------------------------------------------------
-- step names: no '/' (the step job name workflow:<name>/<step> stays unambiguous)
--------------------------------------------------------------------------------
SELECT throws_ok($$ SELECT treadle.define_workflow('w', ARRAY['a/b']) $$, '22023',
                 'treadle: step "a/b" must not hold ''/''',
                 'define_workflow refuses a step name with a ''/'', naming the step');
SELECT throws_ok($$ SELECT treadle.define_workflow('w', ARRAY['ok', '/']) $$, '22023',
                 'treadle: step "/" must not hold ''/''', 'a step named ''/'' alone too');
SELECT throws_ok(format($$ SELECT treadle.define_workflow('w', ARRAY[%L]) $$, repeat('x', 199) || '/'), '22023',
                 format('treadle: step "%s/" must not hold ''/''', repeat('x', 199)),
                 'a 200-character step name ending in ''/'' too');
SELECT throws_ok($$ SELECT treadle.start_workflow('w', '{}', steps => ARRAY['a/b'], queue => 'bounds') $$, '22023',
                 'treadle: step "a/b" must not hold ''/''', 'start_workflow refuses the same steps');
SELECT is((SELECT count(*) FROM treadle.workflows WHERE name = 'w'), 0::bigint, 'no definition is written');
SELECT throws_ok($$ SELECT treadle.define_workflow('w', NULL) $$, '22004', NULL, 'null steps are still 22004');
SELECT throws_ok($$ SELECT treadle.define_workflow('w', ARRAY['']) $$, '22023', NULL, 'an empty step name is still 22023');
SELECT lives_ok($$ SELECT treadle.define_workflow('w/a', ARRAY['b']) $$, 'a workflow name may hold a ''/''');
SELECT treadle.start_workflow('w/a', '{}', queue => 'bounds') AS r4 \gset
SELECT is((SELECT name FROM treadle.jobs WHERE workflow_run_id = :r4), 'workflow:w/a/b',
          'its step job name ends in the one step name after the last ''/''');
-- a definition stored before 0.4.0 with such a step keeps working; redefining it is refused
INSERT INTO treadle.workflows (name, steps, updated_at) VALUES ('old', ARRAY['a/b'], treadle.now());
SELECT treadle.start_workflow('old', '{}', queue => 'bounds') AS r5 \gset
SELECT is((SELECT name FROM treadle.jobs WHERE workflow_run_id = :r5), 'workflow:old/a/b',
          'a stored definition with a ''/'' in a step name still starts runs');
SELECT throws_ok($$ SELECT treadle.define_workflow('old', ARRAY['a/b']) $$, '22023',
                 'treadle: step "a/b" must not hold ''/''', 'but defining it again is refused');

SELECT * FROM finish();
ROLLBACK;
