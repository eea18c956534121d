-- pgtap/076_workflow_child_ends.sql: a child run's end moves its parent through
-- treadle._child_run_ended, called by every statement that changes a run's state (no
-- trigger on treadle.workflow_runs does it): a chain of ten runs, each the child of the
-- one before and each in a queue of its own, completes, fails, resumes and is
-- cancelled from its leaf up to its root in one call; and each path that ends a child
-- on its own (a sleep, a signal, a wait's timeout, a map over nothing, cancel_workflow,
-- cancel_run, retry_run) moves its parent.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(37);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

-- pg_temp.lease(run, step): lease that step's available job as worker 'w'
CREATE FUNCTION pg_temp.lease(run_id bigint, step_name text) RETURNS treadle.jobs
LANGUAGE plpgsql AS $$
DECLARE
    v_job treadle.jobs;
BEGIN
    UPDATE treadle.jobs AS j SET state = 'running', lease_until = treadle.now() + interval '1 hour',
           lease_token = gen_random_uuid(), worker_id = 'w', attempt = 1
     WHERE j.workflow_run_id = run_id AND j.step = step_name AND j.state = 'available'
    RETURNING j.* INTO STRICT v_job;
    RETURN v_job;
END;
$$;
CREATE FUNCTION pg_temp.finish(run_id bigint, step_name text, step_result jsonb DEFAULT '{}') RETURNS text
LANGUAGE sql AS $$
    SELECT treadle.complete(l.id, l.lease_token, step_result) FROM pg_temp.lease(run_id, step_name) AS l
$$;
CREATE FUNCTION pg_temp.discard(run_id bigint, step_name text) RETURNS text
LANGUAGE sql AS $$
    SELECT treadle.fail(l.id, l.lease_token, 'boom', retryable => false) FROM pg_temp.lease(run_id, step_name) AS l
$$;
-- pg_temp.child(run): the id of a run's child run
CREATE FUNCTION pg_temp.child(run_id bigint) RETURNS bigint LANGUAGE sql AS $$
    SELECT r.id FROM treadle.workflow_runs AS r WHERE r.parent_run_id = run_id
$$;
CREATE FUNCTION pg_temp.state(run_id bigint) RETURNS text LANGUAGE sql AS $$
    SELECT r.state FROM treadle.workflow_runs AS r WHERE r.id = run_id
$$;
-- pg_temp.chain(root): the states of a run tree's runs, root first (one per level)
CREATE FUNCTION pg_temp.chain(root bigint) RETURNS text[] LANGUAGE sql AS $$
    SELECT array_agg(r.state ORDER BY r.id) FROM treadle.workflow_runs AS r
     WHERE r.id = root OR r.root_run_id = root
$$;
-- pg_temp.leaf(root): the run at the bottom of a chain
CREATE FUNCTION pg_temp.leaf(root bigint) RETURNS bigint LANGUAGE sql AS $$
    SELECT max(r.id) FROM treadle.workflow_runs AS r WHERE r.root_run_id = root
$$;

SELECT is((SELECT array_agg(t.tgname::text ORDER BY t.tgname) FROM pg_trigger AS t
            WHERE t.tgrelid = 'treadle.workflow_runs'::regclass AND NOT t.tgisinternal),
          ARRAY['workflow_runs_fail_compensates'],
          'treadle.workflow_runs has one trigger, which changes only its own row (a child''s end is a call)');

-- every statement that changes a run's state (but to compensating, which moves no parent)
-- is followed by the call: in each function, as many calls as such statements
CREATE FUNCTION pg_temp.state_updates(src text) RETURNS bigint LANGUAGE sql AS $$
    SELECT count(*) FROM regexp_split_to_table(src, ';') AS u(s)
     WHERE u.s ~ 'UPDATE\s+treadle\.workflow_runs\s'
       AND substring(u.s from '\mSET\M(.*)\mWHERE\M') ~ '(^|[\s,])state\s*='
       AND substring(u.s from '\mSET\M(.*)\mWHERE\M') !~ '(^|[\s,])state\s*=\s*''compensating'''
$$;
SELECT is(ARRAY(SELECT p.proname::text FROM pg_proc AS p
                 WHERE p.pronamespace = 'treadle'::regnamespace
                   AND pg_temp.state_updates(p.prosrc)
                       > (SELECT count(*) FROM regexp_matches(p.prosrc, '_child_run_ended\(', 'g'))
                 ORDER BY 1),
          '{}'::text[], 'every function that changes a run''s state calls treadle._child_run_ended after each such statement');
SELECT cmp_ok((SELECT sum(pg_temp.state_updates(p.prosrc)) FROM pg_proc AS p
                WHERE p.pronamespace = 'treadle'::regnamespace),
              '>=', 20::numeric, 'of which there are over twenty, in a dozen functions');

--------------------------------------------------------------------------------
-- a chain ten runs deep: level n's only step starts level n + 1 in queue qn+1; level 10's
-- only step is a plain job
--------------------------------------------------------------------------------
SELECT treadle.define_workflow('level10', ARRAY['leaf']);
SELECT treadle.define_workflow(format('level%s', n), ARRAY['kid'],
                               children => jsonb_build_object('kid', jsonb_build_object(
                                   'workflow', format('level%s', n + 1), 'queue', format('q%s', n + 1))))
  FROM generate_series(1, 9) AS n;

SELECT treadle.start_workflow('level1', '{}', queue => 'q1') AS a \gset
SELECT is(cardinality(pg_temp.chain(:a)), 10, 'the chain starts ten runs, one per level');
SELECT results_eq(format($$ SELECT queue, parent_queue FROM treadle.workflow_runs WHERE id = %s $$, pg_temp.leaf(:a)),
                  $$ VALUES ('q10'::text, 'q9'::text) $$, 'its leaf is in its own queue and names its parent''s');
SELECT is(pg_temp.finish(pg_temp.leaf(:a), 'leaf', '{"v": 1}'), 'completed', 'the leaf''s step completes');
SELECT is(pg_temp.chain(:a), array_fill('completed'::text, ARRAY[10]), 'and every run up to the root completes');
SELECT is((SELECT results #> '{kid,kid,kid,kid,kid,kid,kid,kid,kid,leaf}' FROM treadle.workflow_runs WHERE id = :a),
          '{"v": 1}'::jsonb, 'the root''s results hold the leaf''s, nine child steps down');

SELECT treadle.start_workflow('level1', '{}', queue => 'q1') AS b \gset
SELECT is(pg_temp.discard(pg_temp.leaf(:b), 'leaf'), 'discarded', 'another chain''s leaf step fails for good');
SELECT is(pg_temp.chain(:b), array_fill('failed'::text, ARRAY[10]), 'every run up to the root fails');
SELECT is(treadle.retry(j.id), true, 'a retry of the leaf''s step')
  FROM treadle.jobs AS j WHERE j.workflow_run_id = pg_temp.leaf(:b);
SELECT is(pg_temp.chain(:b), array_fill('running'::text, ARRAY[10]), 'resumes every run up to the root');
SELECT is((SELECT count(*) FROM treadle.workflow_runs WHERE root_run_id = :b), 9::bigint,
          'and starts no second child anywhere');
SELECT is(pg_temp.finish(pg_temp.leaf(:b), 'leaf'), 'completed', 'the retried step completes');
SELECT is(pg_temp.chain(:b), array_fill('completed'::text, ARRAY[10]), 'and the chain completes');

SELECT treadle.start_workflow('level1', '{}', queue => 'q1') AS c \gset
SELECT is(treadle.cancel_workflow(pg_temp.leaf(:c)), true, 'a third chain''s leaf run is cancelled');
SELECT is(pg_temp.chain(:c), array_fill('cancelled'::text, ARRAY[10]), 'and so is every run up to the root');
SELECT is((SELECT count(*) FROM treadle.workflow_runs WHERE (id = :c OR root_run_id = :c) AND finished_at IS NULL),
          0::bigint, 'each with finished_at');

--------------------------------------------------------------------------------
-- each way a child ends on its own moves its parent (whose only step is the child)
--------------------------------------------------------------------------------
-- a sleep that ends (treadle.rescue)
SELECT treadle.define_workflow('napkid', ARRAY['nap'], sleeps => '{"nap": "1 minute"}');
SELECT treadle.start_workflow('napper', steps => ARRAY['kid'], children => '{"kid": {"workflow": "napkid"}}',
                              queue => 'p') AS s \gset
SELECT is(pg_temp.state(pg_temp.child(:s)), 'running', 'a child run sleeps');
SET LOCAL treadle.now = '2999-01-01 12:02:00+00';
SELECT lives_ok('SELECT treadle.rescue()', 'rescue after its sleep ends');
SELECT is(pg_temp.chain(:s), ARRAY['completed', 'completed'], 'the child completes, and its parent with it');

-- a signal that completes a wait
SELECT treadle.define_workflow('waitkid', ARRAY['w'], waits => '{"w": {"signal": "go"}}');
SELECT treadle.start_workflow('waiter', steps => ARRAY['kid'], children => '{"kid": {"workflow": "waitkid"}}',
                              queue => 'p') AS g \gset
SELECT is(treadle.signal(pg_temp.child(:g), 'go', '{"ok": true}'), 'delivered', 'a signal completes the child''s wait');
SELECT is(pg_temp.chain(:g), ARRAY['completed', 'completed'], 'the child completes, and its parent with it');
SELECT is((SELECT results FROM treadle.workflow_runs WHERE id = :g), '{"kid": {"w": {"ok": true}}}'::jsonb,
          'the parent holds the child''s results');

-- a wait that times out
SELECT treadle.define_workflow('latekid', ARRAY['w'], waits => '{"w": {"signal": "go", "timeout": "1 minute"}}');
SELECT treadle.start_workflow('late', steps => ARRAY['kid'], children => '{"kid": {"workflow": "latekid"}}',
                              queue => 'p') AS t \gset
SET LOCAL treadle.now = '2999-01-01 12:04:00+00';
SELECT lives_ok('SELECT treadle.rescue()', 'rescue after the child''s wait times out');
SELECT is(pg_temp.chain(:t), ARRAY['failed', 'failed'], 'the child fails, and its parent with it');

-- a map over nothing that ends the child
SELECT treadle.define_workflow('mapkid', ARRAY['load', 'each'], maps => '{"each": "load"}');
SELECT treadle.start_workflow('mapper', steps => ARRAY['kid'], children => '{"kid": {"workflow": "mapkid"}}',
                              queue => 'p') AS m \gset
SELECT is(pg_temp.finish(pg_temp.child(:m), 'load', '[]'), 'completed', 'the child''s map gets no elements');
SELECT is(pg_temp.chain(:m), ARRAY['completed', 'completed'], 'the child completes, and its parent with it');

-- cancel_workflow of a child with no step job under way (a sleep), then retry_run of it
SELECT treadle.define_workflow('longnap', ARRAY['nap'], sleeps => '{"nap": "1 day"}');
SELECT treadle.start_workflow('sleeper', steps => ARRAY['kid'], children => '{"kid": {"workflow": "longnap"}}',
                              queue => 'p') AS z \gset
SELECT is(treadle.cancel_workflow(pg_temp.child(:z)), true, 'a sleeping child is cancelled at once');
SELECT is(pg_temp.chain(:z), ARRAY['cancelled', 'cancelled'], 'and its parent with it');
SELECT is(treadle.retry_run(pg_temp.child(:z)), 'running', 'retry_run resumes the child');
SELECT is(pg_temp.chain(:z), ARRAY['running', 'running'], 'and its parent with it');

-- cancel_run with compensate of a child with compensations
SELECT treadle.define_workflow('sagakid', ARRAY['a', 'b'], compensations => '{"a": "undo_a"}');
SELECT treadle.start_workflow('saga', steps => ARRAY['kid'], children => '{"kid": {"workflow": "sagakid"}}',
                              queue => 'p') AS k \gset
SELECT is(pg_temp.finish(pg_temp.child(:k), 'a'), 'completed', 'the child''s first step completes');
SELECT is(treadle.cancel_run(pg_temp.child(:k), compensate => true), 'compensating',
          'cancel_run with compensate cancels the child and starts its compensation');
SELECT is(pg_temp.chain(:k), ARRAY['cancelled', 'compensating'], 'its parent is cancelled with it');
SELECT is(pg_temp.finish(pg_temp.child(:k), 'undo_a'), 'completed', 'the compensation completes');
SELECT is(pg_temp.chain(:k), ARRAY['cancelled', 'compensated'], 'the child is compensated; its parent stays cancelled');

SELECT * FROM finish();
ROLLBACK;
