-- pgtap/079_workflow_run_queue.sql: a step job names its run's queue (run_queue)
-- when a step option put it in another queue, and null when it is in the run's own;
-- every statement that moves a run names that queue (so on Citus each is one
-- shard's): a step, a map element or a compensation in another queue moves its
-- run on; a step row naming a queue that is not its run's moves nothing; the
-- column holds nothing else (23514).
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(23);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

-- pg_temp.rq(run): the run's step jobs as 'step queue run_queue', in id order
CREATE FUNCTION pg_temp.rq(run_id bigint) RETURNS text[] LANGUAGE sql AS $$
    SELECT coalesce(array_agg(concat_ws(' ', j.step, j.queue, coalesce(j.run_queue, '-')) ORDER BY j.id), '{}')
      FROM treadle.jobs AS j WHERE j.workflow_run_id = run_id
$$;
-- pg_temp.finish(run, step, result): claim one available job of that step and complete it
CREATE FUNCTION pg_temp.finish(run_id bigint, step_name text, step_result jsonb DEFAULT '{}') RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_job treadle.jobs;
    v_token uuid := gen_random_uuid();
BEGIN
    SELECT * INTO v_job FROM treadle.jobs AS j
     WHERE j.workflow_run_id = run_id AND j.step = step_name AND j.state = 'available'
     ORDER BY j.id LIMIT 1;
    UPDATE treadle.jobs AS j SET state = 'running', lease_until = treadle.now() + interval '1 hour',
           lease_token = v_token, worker_id = 'w', attempt = 1
     WHERE j.id = v_job.id;
    RETURN treadle.complete(v_job.id, v_token, step_result);
END;
$$;
-- pg_temp.fail(run, step): claim that step's available job and fail it for good
CREATE FUNCTION pg_temp.fail(run_id bigint, step_name text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_job treadle.jobs;
    v_token uuid := gen_random_uuid();
BEGIN
    SELECT * INTO STRICT v_job FROM treadle.jobs AS j
     WHERE j.workflow_run_id = run_id AND j.step = step_name AND j.state = 'available';
    UPDATE treadle.jobs AS j SET state = 'running', lease_until = treadle.now() + interval '1 hour',
           lease_token = v_token, worker_id = 'w', attempt = j.max_attempts
     WHERE j.id = v_job.id;
    RETURN treadle.fail(v_job.id, v_token, 'boom');
END;
$$;
CREATE FUNCTION pg_temp.state(run_id bigint) RETURNS text LANGUAGE sql AS $$
    SELECT r.state FROM treadle.workflow_runs AS r WHERE r.id = run_id
$$;

--------------------------------------------------------------------------------
-- a list whose middle step runs in another queue
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('rq_list', steps => ARRAY['a', 'b', 'c'], queue => 'rq_main',
                              step_options => '{"b": {"queue": "rq_gpu"}}') AS r1 \gset
SELECT is(pg_temp.rq(:r1), ARRAY['a rq_main -'], 'a step in its run''s queue names no other');
SELECT is(pg_temp.finish(:r1, 'a'), 'completed', 'a completes');
SELECT is(pg_temp.rq(:r1), ARRAY['a rq_main -', 'b rq_gpu rq_main'], 'a step in another queue names its run''s');
SELECT is(pg_temp.finish(:r1, 'b', '{"b": 1}'), 'completed', 'b completes in its own queue');
SELECT is(pg_temp.rq(:r1), ARRAY['a rq_main -', 'b rq_gpu rq_main', 'c rq_main -'], 'and its run goes on to c');
SELECT is((SELECT results -> 'b' FROM treadle.workflow_runs WHERE id = :r1), '{"b": 1}'::jsonb, 'with b''s result');
SELECT is(pg_temp.finish(:r1, 'c'), 'completed', 'c completes');
SELECT is(pg_temp.state(:r1), 'completed', 'the run completes');

--------------------------------------------------------------------------------
-- a graph: two branches, one in another queue, and a join; then a failure there
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('rq_graph', steps => ARRAY['left', 'right', 'join'], queue => 'rq_main',
                              after => '{"join": ["left", "right"]}',
                              step_options => '{"right": {"queue": "rq_gpu"}}') AS r2 \gset
SELECT is(pg_temp.finish(:r2, 'right'), 'completed', 'the branch in another queue completes first');
SELECT is(pg_temp.finish(:r2, 'left'), 'completed', 'then the other');
SELECT is(pg_temp.rq(:r2), ARRAY['left rq_main -', 'right rq_gpu rq_main', 'join rq_main -'], 'the join starts once');
SELECT treadle.start_workflow('rq_graph', steps => ARRAY['left', 'right', 'join'], queue => 'rq_main',
                              after => '{"join": ["left", "right"]}',
                              step_options => '{"right": {"queue": "rq_gpu"}}') AS r3 \gset
SELECT is(pg_temp.fail(:r3, 'right'), 'discarded', 'a step in another queue fails for good');
SELECT is(pg_temp.state(:r3), 'failed', 'and its run fails');

--------------------------------------------------------------------------------
-- a map step's elements and a compensation in other queues
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('rq_map', steps => ARRAY['load', 'each'], queue => 'rq_main',
                              maps => '{"each": "load"}', step_options => '{"each": {"queue": "rq_img"}}') AS r4 \gset
SELECT is(pg_temp.finish(:r4, 'load', '[1, 2]'), 'completed', 'load returns two elements');
SELECT is(pg_temp.rq(:r4), ARRAY['load rq_main -', 'each rq_img rq_main', 'each rq_img rq_main'],
          'each element job names its run''s queue');
SELECT is(pg_temp.finish(:r4, 'each', '"x"') || pg_temp.finish(:r4, 'each', '"y"'), 'completedcompleted', 'both complete');
SELECT is(pg_temp.state(:r4), 'completed', 'the map step completes and so does its run');

SELECT treadle.start_workflow('rq_comp', steps => ARRAY['debit', 'credit'], queue => 'rq_bank',
                              compensations => '{"debit": "refund"}',
                              step_options => '{"refund": {"queue": "rq_refunds"}}') AS r5 \gset
SELECT is(pg_temp.finish(:r5, 'debit') || pg_temp.fail(:r5, 'credit'), 'completeddiscarded', 'debit completes, credit fails');
SELECT is((pg_temp.rq(:r5))[3], 'refund rq_refunds rq_bank', 'the compensation names its run''s queue');
SELECT is(pg_temp.finish(:r5, 'refund'), 'completed', 'the compensation completes in its own queue');
SELECT is(pg_temp.state(:r5), 'compensated', 'and its run ends compensated');

--------------------------------------------------------------------------------
-- the run is found by its queue: a step naming another moves nothing; the column
-- holds only a step's run's queue that differs from its own
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('rq_list', steps => ARRAY['a', 'b'], queue => 'rq_main') AS r6 \gset
UPDATE treadle.jobs SET run_queue = 'rq_elsewhere' WHERE workflow_run_id = :r6;
SELECT is(pg_temp.finish(:r6, 'a') || ' ' || pg_temp.state(:r6) || ' ' || cardinality(pg_temp.rq(:r6)),
          'completed running 1', 'a step whose run_queue is not its run''s queue moves no run');
SELECT throws_ok($$ UPDATE treadle.jobs SET run_queue = queue WHERE workflow_run_id = $$ || :r1,
                 '23514', NULL, 'run_queue is never the job''s own queue');
SELECT * FROM finish();
ROLLBACK;
