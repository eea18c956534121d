-- pgtap/079_step_options.sql: per-step options (define_workflow's and
-- start_workflow's `step_options`): a step's own queue, priority, max_attempts,
-- timeout and backoff reach its jobs (plain steps, graph steps, map elements,
-- compensations, a child run's steps), the run's otherwise; bad options are refused
-- with 22023 naming the step and nothing written; a tenant's step queue stays in
-- its prefix; a changed option counts a new version.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(51);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

-- pg_temp.opts(run): the run's step jobs as 'step queue priority max_attempts timeout backoff', in id order
CREATE FUNCTION pg_temp.opts(run_id bigint) RETURNS text[] LANGUAGE sql AS $$
    SELECT coalesce(array_agg(concat_ws(' ', j.step, j.queue, j.priority, j.max_attempts,
                                        coalesce(j.timeout::text, '-'), coalesce(j.backoff::text, '-'))
                              ORDER BY j.id), '{}')
      FROM treadle.jobs AS j WHERE j.workflow_run_id = run_id
$$;
-- pg_temp.finish(run, step, result): claim that step's (single) available job and complete it
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

--------------------------------------------------------------------------------
-- a list: each step's own options, the run's for the rest
--------------------------------------------------------------------------------
SELECT lives_ok($$ SELECT treadle.define_workflow('render', ARRAY['fetch', 'gpu', 'store'], step_options =>
    '{"gpu": {"queue": "gpu", "priority": 5, "max_attempts": 3, "timeout": "10 minutes",
              "backoff": ["1 second", "1 minute"]},
      "store": {"priority": -2}}') $$, 'a definition with step options');
SELECT is((SELECT step_options FROM treadle.workflows WHERE name = 'render'),
          '{"gpu": {"queue": "gpu", "priority": 5, "max_attempts": 3, "timeout": "00:10:00",
                    "backoff": ["00:00:01", "00:01:00"]},
            "store": {"priority": -2}}'::jsonb, 'the options are stored with intervals normalised');
SELECT treadle.start_workflow('render', queue => 'cpu', priority => 1, max_attempts => 7) AS r1 \gset
SELECT is((SELECT step_options FROM treadle.workflow_runs WHERE id = :r1),
          (SELECT step_options FROM treadle.workflows WHERE name = 'render'), 'the run pins the definition''s options');
SELECT is(pg_temp.opts(:r1), ARRAY['fetch cpu 1 7 - -'], 'a step without options takes the run''s');
SELECT is(pg_temp.finish(:r1, 'fetch'), 'completed', 'fetch completes');
SELECT is(pg_temp.opts(:r1), ARRAY['fetch cpu 1 7 - -', 'gpu gpu 5 3 00:10:00 {00:00:01,00:01:00}'],
          'the gpu step runs in its queue with its priority, attempts, timeout and backoff');
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['cpu'])), 0::bigint, 'a worker of the run''s queue does not claim it');
SELECT is((SELECT step FROM treadle.claim('w', ARRAY['gpu'])), 'gpu', 'a worker of the gpu queue claims it');
SELECT is((SELECT treadle.fail(j.id, j.lease_token, 'once') FROM treadle.jobs AS j
            WHERE j.workflow_run_id = :r1 AND j.step = 'gpu'), 'retryable', 'its first failure retries');
SELECT ok((SELECT run_at BETWEEN treadle.now() + interval '0.5 second' AND treadle.now() + interval '1 second'
             FROM treadle.jobs WHERE workflow_run_id = :r1 AND step = 'gpu'),
          'after its own first backoff delay (jittered)');
UPDATE treadle.jobs SET run_at = treadle.now() WHERE workflow_run_id = :r1 AND step = 'gpu';
SELECT is((SELECT treadle.fail(j.id, j.lease_token, 'twice') FROM treadle.claim('w', ARRAY['gpu']) AS j), 'retryable',
          'its second failure retries');
UPDATE treadle.jobs SET run_at = treadle.now() WHERE workflow_run_id = :r1 AND step = 'gpu';
SELECT is((SELECT treadle.fail(j.id, j.lease_token, 'thrice') FROM treadle.claim('w', ARRAY['gpu']) AS j), 'discarded',
          'its third failure is its last: max_attempts 3, not the run''s 7');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :r1), 'failed', 'and the run fails');

SELECT treadle.start_workflow('render', queue => 'cpu') AS r2 \gset
SELECT is(pg_temp.finish(:r2, 'fetch'), 'completed', 'fetch completes');
SELECT is(pg_temp.finish(:r2, 'gpu'), 'completed', 'gpu completes');
SELECT is((pg_temp.opts(:r2))[3], 'store cpu -2 25 - -', 'store has its own priority, the run''s queue and attempts');

--------------------------------------------------------------------------------
-- a graph with a map step, given to start_workflow
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('thumbs', steps => ARRAY['load', 'resize', 'report'], queue => 'main',
                              maps => '{"resize": "load"}',
                              step_options => '{"resize": {"queue": "img", "max_attempts": 2, "timeout": "30 seconds"},
                                                "load": {"priority": 9}}') AS r3 \gset
SELECT is(pg_temp.opts(:r3), ARRAY['load main 9 25 - -'], 'the first step has its own priority');
SELECT is(pg_temp.finish(:r3, 'load', '[1, 2]'), 'completed', 'load returns two elements');
SELECT is(pg_temp.opts(:r3), ARRAY['load main 9 25 - -', 'resize img 0 2 00:00:30 -', 'resize img 0 2 00:00:30 -'],
          'each element job has the map step''s options');

--------------------------------------------------------------------------------
-- compensations: a compensating step's options
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('transfer', steps => ARRAY['debit', 'credit'], queue => 'bank',
                              compensations => '{"debit": "refund"}',
                              step_options => '{"refund": {"queue": "refunds", "max_attempts": 50}}') AS r4 \gset
SELECT is(pg_temp.finish(:r4, 'debit'), 'completed', 'debit completes');
SELECT is(pg_temp.fail(:r4, 'credit'), 'discarded', 'credit fails for good');
SELECT is((pg_temp.opts(:r4))[3], 'refund refunds 0 50 - -', 'the compensation runs with its own options');

--------------------------------------------------------------------------------
-- a child run takes its definition's options
--------------------------------------------------------------------------------
SELECT treadle.define_workflow('kid', ARRAY['k'], step_options => '{"k": {"queue": "kids", "priority": 3}}');
SELECT treadle.start_workflow('parent', steps => ARRAY['spawn'], queue => 'main', children => '{"spawn": {"workflow": "kid"}}') AS r5 \gset
SELECT is(pg_temp.opts((SELECT id FROM treadle.workflow_runs WHERE parent_run_id = :r5)), ARRAY['k kids 3 25 - -'],
          'the child run''s step has its definition''s options');

--------------------------------------------------------------------------------
-- versions: a changed option is a new version, the same options are not
--------------------------------------------------------------------------------
SELECT treadle.define_workflow('versioned', ARRAY['a'], step_options => '{"a": {"priority": 1}}');
SELECT treadle.define_workflow('versioned', ARRAY['a'], step_options => '{"a": {"priority": 1}}');
SELECT is((SELECT version FROM treadle.workflows WHERE name = 'versioned'), 1::bigint, 'the same options again: same version');
SELECT treadle.define_workflow('versioned', ARRAY['a'], step_options => '{"a": {"priority": 2}}');
SELECT is((SELECT version FROM treadle.workflows WHERE name = 'versioned'), 2::bigint, 'a changed option: a new version');
SELECT treadle.define_workflow('versioned', ARRAY['a'], step_options => '{}');
SELECT is((SELECT step_options FROM treadle.workflows WHERE name = 'versioned'), NULL, '{} is no options');
SELECT treadle.define_workflow('versioned', ARRAY['a'], step_options => '{"a": {}}');
SELECT is((SELECT version FROM treadle.workflows WHERE name = 'versioned'), 3::bigint, 'an empty option object is none');

--------------------------------------------------------------------------------
-- bad options: 22023 naming the step, nothing written
--------------------------------------------------------------------------------
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a'], step_options => '[1]') $$,
                 '22023', 'treadle: step_options must be a JSON object mapping a step to its options, not array', 'not an object');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a'], step_options => '{"b": {}}') $$,
                 '22023', 'treadle: step_options names step "b", which is not one of the steps', 'an unknown step');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a', 'nap'], sleeps => '{"nap": "1 hour"}',
                                                   step_options => '{"nap": {"priority": 1}}') $$,
                 '22023', 'treadle: step "nap" is a sleep, wait or child step: it runs no job to set options for',
                 'a sleep step has no job');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a'], step_options => '{"a": 5}') $$,
                 '22023', 'treadle: the options of step "a" must be a JSON object, not number', 'options not an object');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a'], step_options => '{"a": {"queeu": "x"}}') $$,
                 '22023', 'treadle: step "a" has an unknown option "queeu" (queue, priority, max_attempts, timeout, backoff, concurrency_key)',
                 'an unknown option');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a'], step_options => '{"a": {"queue": ""}}') $$,
                 '22023', NULL, 'an empty queue');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a'], step_options => '{"a": {"priority": 1.5}}') $$,
                 '22023', 'treadle: step "a" has a "priority" that is not an integer: 1.5', 'a fractional priority');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a'], step_options => '{"a": {"priority": 2147483648}}') $$,
                 '22023', NULL, 'a priority past int4');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a'], step_options => '{"a": {"max_attempts": 0}}') $$,
                 '22023', 'treadle: step "a" has a "max_attempts" that is not an integer of at least 1: 0', 'max_attempts 0');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a'], step_options => '{"a": {"max_attempts": "3"}}') $$,
                 '22023', NULL, 'max_attempts as a string');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a'], step_options => '{"a": {"timeout": "8 days"}}') $$,
                 '22023', 'treadle: step "a" has a "timeout" that is not an interval over 0 and at most 7 days: "8 days"',
                 'a timeout over 7 days');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a'], step_options => '{"a": {"timeout": "soon"}}') $$,
                 '22023', NULL, 'a timeout that is not an interval');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a'], step_options => '{"a": {"backoff": []}}') $$,
                 '22023', NULL, 'an empty backoff');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a'], step_options => '{"a": {"backoff": ["-1 second"]}}') $$,
                 '22023', NULL, 'a negative backoff delay');
SELECT throws_ok(format($$ SELECT treadle.define_workflow('bad', ARRAY['a'], step_options => '{"a": {"backoff": %s}}') $$,
                        (SELECT jsonb_agg('1 second'::text) FROM generate_series(1, 101))),
                 '22023', NULL, 'a backoff over 100 delays');
SELECT throws_ok($$ SELECT treadle.start_workflow('bad', steps => ARRAY['a'], step_options => '{"a": {"priority": "x"}}') $$,
                 '22023', 'treadle: step "a" has a "priority" that is not an integer: "x"', 'start_workflow checks them too');
SELECT throws_ok($$ SELECT treadle.start_workflow('render', step_options => '{"gpu": {"priority": 1}}') $$,
                 '22023', 'treadle: step_options need steps', 'step options without steps');
SELECT is((SELECT count(*) FROM treadle.workflows WHERE name = 'bad'), 0::bigint, 'nothing was defined');
SELECT is((SELECT count(*) FROM treadle.workflow_runs WHERE name IN ('bad', 'render')), 2::bigint, 'nothing was started');

--------------------------------------------------------------------------------
-- tenants: a step queue stays in the tenant's prefix
--------------------------------------------------------------------------------
CREATE ROLE so_ten;  SELECT treadle.grant_worker('so_ten');  SELECT treadle.grant_producer('so_ten');
SELECT treadle.set_tenant('so_ten', 'a.');
SELECT is(pg_temp.as_role('so_ten', $$ SELECT treadle.define_workflow('a.flow', ARRAY['x'], step_options => '{"x": {"queue": "gpu"}}') $$),
          '42501', 'a tenant''s step queue outside its prefix is refused');
SELECT is(pg_temp.as_role('so_ten', $$ SELECT treadle.start_workflow('a.flow', steps => ARRAY['x'], queue => 'a.q', step_options => '{"x": {"queue": "gpu"}}') $$),
          '42501', 'at start too');
SELECT is(pg_temp.as_role('so_ten', $$ SELECT treadle.start_workflow('a.render', queue => 'a.q') $$), '22023',
          'a tenant''s unknown workflow');
SELECT treadle.define_workflow('a.render', ARRAY['x'], step_options => '{"x": {"queue": "gpu"}}');
SELECT is(pg_temp.as_role('so_ten', $$ SELECT treadle.start_workflow('a.render', queue => 'a.q') $$), '42501',
          'a tenant cannot start a definition whose step queue leaves its prefix');
SELECT is(pg_temp.as_role('so_ten', $$ SELECT treadle.define_workflow('a.flow', ARRAY['x'], step_options => '{"x": {"queue": "a.gpu"}}') $$),
          'ok', 'a tenant''s step queue within its prefix');

SELECT * FROM finish();
ROLLBACK;
