-- pgtap/089_workflow_ops.sql: operating workflow runs. retry_run resumes a failed or
-- cancelled run from its failed steps (completed steps never run again); fork_run
-- starts a new run of the same definition from a step, with the results recorded
-- before it; compensate_run undoes a cancelled run's completed steps. Every refusal has a stable SQLSTATE and writes nothing; only the
-- operator's roles may call them, and a tenant reaches only its queues' runs.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(89);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

SELECT has_function('treadle', 'retry_run', ARRAY['bigint'], 'treadle.retry_run exists');
SELECT has_function('treadle', 'fork_run', ARRAY['bigint', 'text', 'jsonb'], 'treadle.fork_run exists');
SELECT has_function('treadle', 'compensate_run', ARRAY['bigint'], 'treadle.compensate_run exists');
SELECT is((SELECT array_agg(column_name::text ORDER BY ordinal_position DESC) FROM
            (SELECT column_name, ordinal_position FROM information_schema.columns
              WHERE table_schema = 'treadle' AND table_name = 'workflow_runs'
              ORDER BY ordinal_position DESC LIMIT 6) AS c),
          ARRAY['parent_queue', 'root_queue', 'tree_runs', 'root_run_id', 'meta', 'forked_step'],
          'workflow_runs ends with forked_step (then meta, root_run_id, tree_runs, root_queue, parent_queue)');

-- pg_temp.step_job(run, step): the job that runs a step of a run
CREATE FUNCTION pg_temp.step_job(run_id bigint, step_name text) RETURNS treadle.jobs LANGUAGE sql AS $$
    SELECT * FROM treadle.jobs WHERE workflow_run_id = run_id AND step = step_name ORDER BY id DESC LIMIT 1
$$;
-- pg_temp.claim(run, step): claim that step's job; its lease token
CREATE FUNCTION pg_temp.claim(run_id bigint, step_name text) RETURNS uuid LANGUAGE sql AS $$
    SELECT c.lease_token
      FROM treadle.claim('w', ARRAY[(pg_temp.step_job(run_id, step_name)).queue],
                         names => ARRAY[(pg_temp.step_job(run_id, step_name)).name], batch => 1000) AS c
     WHERE c.workflow_run_id = run_id AND c.step = step_name
$$;
-- pg_temp.finish(run, step, result): claim and complete a step (a null result: fail it for good)
CREATE FUNCTION pg_temp.finish(run_id bigint, step_name text, result jsonb) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_token uuid := pg_temp.claim(run_id, step_name);
    v_id    bigint := (pg_temp.step_job(run_id, step_name)).id;
BEGIN
    IF result IS NULL THEN
        RETURN treadle.fail(v_id, v_token, 'boom', retryable => false);
    END IF;
    RETURN treadle.complete(v_id, v_token, result);
END;
$$;
-- pg_temp.picture(): everything a refusal must leave as it was
CREATE FUNCTION pg_temp.picture() RETURNS text LANGUAGE sql AS $$
    SELECT md5(coalesce((SELECT string_agg(r::text, '|' ORDER BY r.id) FROM treadle.workflow_runs AS r), '')
               || coalesce((SELECT string_agg(j::text, '|' ORDER BY j.id) FROM treadle.jobs AS j), ''))
$$;

--------------------------------------------------------------------------------
-- retry_run: a list run that failed goes on from its failed step
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('order', '{"n": 1}', steps => ARRAY['reserve', 'charge', 'ship'], queue => 'ops') AS l1 \gset
SELECT is(pg_temp.finish(:l1, 'reserve', '{"r": 1}'), 'completed', 'the first step completes');
SELECT is(pg_temp.finish(:l1, 'charge', NULL), 'discarded', 'the second fails for good');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :l1), 'failed', 'the run failed');
SELECT (pg_temp.step_job(:l1, 'reserve')).id AS l1_reserve \gset
SELECT is(treadle.retry_run(:l1), 'running', 'retry_run says the run is running again');
SELECT results_eq(format($$ SELECT step, state, attempt FROM treadle.jobs WHERE workflow_run_id = %s ORDER BY id $$, :l1),
                  $$ VALUES ('reserve'::text, 'completed'::text, 1), ('charge', 'available', 0) $$,
                  'its failed step is available again with attempt 0; the completed one is not touched');
SELECT is((SELECT results FROM treadle.workflow_runs WHERE id = :l1), '{"reserve": {"r": 1}}'::jsonb,
          'the completed step''s result is kept');
SELECT is((SELECT finished_at FROM treadle.workflow_runs WHERE id = :l1), NULL, 'the run is not finished');
SELECT is(pg_temp.finish(:l1, 'charge', '{"c": 2}'), 'completed', 'the retried step completes');
SELECT is(pg_temp.finish(:l1, 'ship', '{"s": 3}'), 'completed', 'and the last one');
SELECT results_eq(format($$ SELECT state, results FROM treadle.workflow_runs WHERE id = %s $$, :l1),
                  $$ VALUES ('completed'::text, '{"reserve": {"r": 1}, "charge": {"c": 2}, "ship": {"s": 3}}'::jsonb) $$,
                  'the run completes with every result');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE workflow_run_id = :l1 AND step = 'reserve'), 1::bigint,
          'the completed step ran once');

--------------------------------------------------------------------------------
-- retry_run: a graph run resumes its failed branch, not its completed one
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('fan', steps => ARRAY['a', 'b', 'c', 'join'], queue => 'ops',
                              after => '{"join": ["a", "b", "c"]}') AS g1 \gset
SELECT is(pg_temp.finish(:g1, 'a', '1'), 'completed', 'branch a completes');
SELECT is(pg_temp.finish(:g1, 'b', NULL), 'discarded', 'branch b fails for good');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :g1), 'failed', 'the graph run failed');
SELECT is(pg_temp.finish(:g1, 'c', '3'), 'completed', 'branch c completes while the run is failed');
SELECT is(treadle.retry_run(:g1), 'running', 'retry_run resumes the graph run');
SELECT results_eq(format($$ SELECT step, state, attempt FROM treadle.jobs WHERE workflow_run_id = %s ORDER BY id $$, :g1),
                  $$ VALUES ('a'::text, 'completed'::text, 1), ('b', 'available', 0), ('c', 'completed', 1) $$,
                  'only the failed branch runs again; the join waits for it');
SELECT is(pg_temp.finish(:g1, 'b', '2'), 'completed', 'the retried branch completes');
SELECT is((pg_temp.step_job(:g1, 'join')).state, 'available', 'the join starts once, after every branch');
SELECT is(pg_temp.finish(:g1, 'join', '"done"'), 'completed', 'the join completes');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :g1), 'completed', 'the graph run completes');

--------------------------------------------------------------------------------
-- retry_run: a cancelled run, and a run whose compensation failed
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('stop', steps => ARRAY['x', 'y'], queue => 'ops') AS c1 \gset
SELECT ok(treadle.cancel_workflow(:c1), 'a waiting run is cancelled');
SELECT is(treadle.retry_run(:c1), 'running', 'a cancelled run is retried');
SELECT is((pg_temp.step_job(:c1, 'x')).state, 'available', 'its cancelled step waits to run again');

SELECT treadle.start_workflow('saga', steps => ARRAY['debit', 'credit'], queue => 'ops',
                              compensations => '{"debit": "refund"}', max_attempts => 1) AS s1 \gset
SELECT is(pg_temp.finish(:s1, 'debit', '{"id": 9}'), 'completed', 'the saga''s first step completes');
SELECT is(pg_temp.finish(:s1, 'credit', NULL), 'discarded', 'its second fails for good');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :s1), 'compensating', 'the saga compensates');
SELECT is(pg_temp.finish(:s1, 'refund', NULL), 'discarded', 'its compensation fails for good');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :s1), 'failed', 'the saga failed');
SELECT is(treadle.retry_run(:s1), 'compensating', 'retry_run runs the failed compensation again');
SELECT results_eq(format($$ SELECT step, state FROM treadle.jobs WHERE workflow_run_id = %s ORDER BY id $$, :s1),
                  $$ VALUES ('debit'::text, 'completed'::text), ('credit', 'discarded'), ('refund', 'available') $$,
                  'the compensation is available; no forward step runs again');
SELECT is(pg_temp.finish(:s1, 'refund', '"refunded"'), 'completed', 'the compensation completes');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :s1), 'compensated', 'the saga ends compensated');

--------------------------------------------------------------------------------
-- retry_run refuses, writing nothing
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('busy', steps => ARRAY['p'], queue => 'ops') AS b1 \gset
SELECT pg_temp.picture() AS before \gset
SELECT throws_ok('SELECT treadle.retry_run(NULL)', '22004', NULL, 'a null run id is refused with 22004');
SELECT throws_ok('SELECT treadle.retry_run(-1)', 'P0002', 'treadle: no workflow run has id -1', 'an unknown run: P0002');
SELECT throws_ok(format('SELECT treadle.retry_run(%s)', :b1), '55000', NULL, 'a running run: 55000');
SELECT throws_ok(format('SELECT treadle.retry_run(%s)', :l1), '55000', NULL, 'a completed run: 55000');
SELECT throws_ok(format('SELECT treadle.retry_run(%s)', :s1), '55000',
                 format('treadle: workflow run %s is compensated: its completed steps were undone', :s1),
                 'a compensated run: 55000 (its steps were undone)');
SELECT is(pg_temp.picture(), :'before', 'the refusals wrote nothing');

--------------------------------------------------------------------------------
-- fork_run: a list run forked from its middle step
--------------------------------------------------------------------------------
SELECT treadle.fork_run(:l1, 'charge') AS f1 \gset
SELECT results_eq(
    format($$ SELECT name, input, state, steps, results, queue, forked_from, forked_step
                FROM treadle.workflow_runs WHERE id = %s $$, :f1),
    format($$ VALUES ('order'::text, '{"n": 1}'::jsonb, 'running'::text, ARRAY['reserve', 'charge', 'ship'],
                      '{"reserve": {"r": 1}}'::jsonb, 'ops'::text, %s::bigint, 'charge'::text) $$, :l1),
    'the fork is a new run of the same steps and input with the results before the step, linked to its source');
SELECT results_eq(format($$ SELECT step, state FROM treadle.jobs WHERE workflow_run_id = %s $$, :f1),
                  $$ VALUES ('charge'::text, 'available'::text) $$, 'it starts at the step it was forked from');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :l1), 'completed', 'the source run is unchanged');
SELECT is(pg_temp.finish(:f1, 'charge', '{"c": 20}'), 'completed', 'the forked step runs again');
SELECT is(pg_temp.finish(:f1, 'ship', '{"s": 30}'), 'completed', 'so does the step after it');
SELECT is((SELECT results FROM treadle.workflow_runs WHERE id = :f1),
          '{"reserve": {"r": 1}, "charge": {"c": 20}, "ship": {"s": 30}}'::jsonb, 'the fork completes with new results');

-- a source that had not reached the step: the earlier step without a result runs first
SELECT treadle.start_workflow('order', '{"n": 2}', steps => ARRAY['reserve', 'charge', 'ship'], queue => 'ops') AS l2 \gset
SELECT treadle.fork_run(:l2, 'ship', input => '{"n": 3}') AS f2 \gset
SELECT results_eq(format($$ SELECT r.input, r.results, j.step FROM treadle.workflow_runs AS r
                             JOIN treadle.jobs AS j ON j.workflow_run_id = r.id WHERE r.id = %s $$, :f2),
                  $$ VALUES ('{"n": 3}'::jsonb, '{}'::jsonb, 'reserve'::text) $$,
                  'a fork takes a new input, and starts with the first step that has no result');

--------------------------------------------------------------------------------
-- fork_run: a graph keeps the results of the steps the forked step does not lead to
--------------------------------------------------------------------------------
-- a -> b -> d, a -> c -> d, c -> e
SELECT treadle.start_workflow('dag', steps => ARRAY['a', 'b', 'c', 'd', 'e'], queue => 'ops',
                              after => '{"b": ["a"], "c": ["a"], "d": ["b", "c"], "e": ["c"]}') AS g2 \gset
SELECT is(pg_temp.finish(:g2, 'a', '"A"'), 'completed', 'a completes');
SELECT is(pg_temp.finish(:g2, 'b', '"B"') || pg_temp.finish(:g2, 'c', '"C"'), 'completedcompleted', 'b and c complete');
SELECT is(pg_temp.finish(:g2, 'd', '"D"') || pg_temp.finish(:g2, 'e', '"E"'), 'completedcompleted', 'd and e complete');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :g2), 'completed', 'the graph run completed');
SELECT treadle.fork_run(:g2, 'b') AS f3 \gset
SELECT is((SELECT results FROM treadle.workflow_runs WHERE id = :f3), '{"a": "A", "c": "C", "e": "E"}'::jsonb,
          'forked from b: a, c and e (which b does not lead to) keep their results');
SELECT results_eq(format($$ SELECT step FROM treadle.jobs WHERE workflow_run_id = %s $$, :f3),
                  $$ VALUES ('b'::text) $$, 'only b starts; d waits for it');
SELECT is(pg_temp.finish(:f3, 'b', '"B2"'), 'completed', 'b runs again');
SELECT is(pg_temp.finish(:f3, 'd', '"D2"'), 'completed', 'then d, which runs after it');
SELECT results_eq(format($$ SELECT state, results FROM treadle.workflow_runs WHERE id = %s $$, :f3),
                  $$ VALUES ('completed'::text, '{"a": "A", "b": "B2", "c": "C", "d": "D2", "e": "E"}'::jsonb) $$,
                  'the fork completes; a, c and e never ran in it');
SELECT is(treadle._steps_from(r, 'c'), ARRAY['c', 'd', 'e'], 'forked from c: c, d and e run again')
  FROM treadle.workflow_runs AS r WHERE r.id = :g2;

--------------------------------------------------------------------------------
-- fork_run refuses, writing nothing
--------------------------------------------------------------------------------
SELECT pg_temp.picture() AS before \gset
SELECT throws_ok(format('SELECT treadle.fork_run(%s, NULL)', :g2), '22004', NULL, 'a null step: 22004');
SELECT throws_ok('SELECT treadle.fork_run(NULL, ''a'')', '22004', NULL, 'a null run id: 22004');
SELECT throws_ok('SELECT treadle.fork_run(-1, ''a'')', 'P0002', NULL, 'an unknown run: P0002');
SELECT throws_ok(format('SELECT treadle.fork_run(%s, ''zz'')', :g2), '22023',
                 format('treadle: workflow run %s has no step "zz"', :g2), 'a step the run does not have: 22023');
SELECT throws_ok(format($$ SELECT treadle.fork_run(%s, 'a', input => '"text"') $$, :g2), '22023', NULL,
                 'an input that is not an object or array: 22023');
SELECT is(pg_temp.picture(), :'before', 'the refusals wrote nothing');

--------------------------------------------------------------------------------
-- compensate_run: a cancelled run undoes its completed steps when asked
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('saga', steps => ARRAY['debit', 'credit'], queue => 'ops',
                              compensations => '{"debit": "refund"}') AS k1 \gset
SELECT is(pg_temp.finish(:k1, 'debit', '{"id": 1}'), 'completed', 'the first step completes');
SELECT ok(treadle.cancel_workflow(:k1), 'the run is cancelled while its second step waits');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :k1), 'cancelled', 'it is cancelled, not compensated');
SELECT is(treadle.compensate_run(:k1), 'compensating', 'compensate_run starts its compensations');
SELECT results_eq(format($$ SELECT step, state, args FROM treadle.jobs WHERE workflow_run_id = %s AND step = 'refund' $$, :k1),
                  $$ VALUES ('refund'::text, 'available'::text, '{"compensates": "debit", "result": {"id": 1}}'::jsonb) $$,
                  'the compensation of the completed step is a job with its result');
SELECT is(pg_temp.finish(:k1, 'refund', '"refunded"'), 'completed', 'the compensation completes');
SELECT results_eq(format($$ SELECT state, finished_at IS NOT NULL FROM treadle.workflow_runs WHERE id = %s $$, :k1),
                  $$ VALUES ('compensated'::text, true) $$, 'the run ends compensated');

SELECT treadle.start_workflow('saga', steps => ARRAY['debit', 'credit'], queue => 'ops',
                              compensations => '{"debit": "refund"}') AS k2 \gset
SELECT ok(treadle.cancel_workflow(:k2), 'a run cancelled before any step completed');
SELECT is(treadle.compensate_run(:k2), 'compensated', 'has nothing to undo: compensated at once');

SELECT treadle.start_workflow('saga', steps => ARRAY['debit', 'credit'], queue => 'ops',
                              compensations => '{"debit": "refund"}') AS k3 \gset
SELECT pg_temp.picture() AS before \gset
SELECT throws_ok('SELECT treadle.compensate_run(NULL)', '22004', NULL, 'compensate_run: a null id, 22004');
SELECT throws_ok('SELECT treadle.compensate_run(-1)', 'P0002', NULL, 'an unknown run, P0002');
SELECT throws_ok(format('SELECT treadle.compensate_run(%s)', :k3), '55000',
                 format('treadle: workflow run %s is running: only a cancelled run is compensated on request', :k3),
                 'a running run, 55000');
SELECT throws_ok(format('SELECT treadle.compensate_run(%s)', :k1), '55000', NULL, 'a compensated run, 55000');
SELECT throws_ok(format('SELECT treadle.compensate_run(%s)', :c1), '55000',
                 format('treadle: workflow run %s has no compensations', :c1), 'a run without compensations, 55000');
SELECT is(pg_temp.picture(), :'before', 'the refusals wrote nothing');

--------------------------------------------------------------------------------
-- Who may: the operator's roles; a tenant only its queues' runs
--------------------------------------------------------------------------------
CREATE ROLE ops_producer; SELECT treadle.grant_producer('ops_producer');
CREATE ROLE ops_admin;    SELECT treadle.grant_admin('ops_admin');
CREATE ROLE ops_tenant;   SELECT treadle.grant_admin('ops_tenant'); SELECT treadle.set_tenant('ops_tenant', 't.');
SELECT treadle.start_workflow('t.flow', steps => ARRAY['only'], queue => 't.q', max_attempts => 1) AS t1 \gset
SELECT is(pg_temp.finish(:t1, 'only', NULL), 'discarded', 'the tenant''s run fails');
SELECT is(pg_temp.as_role('ops_producer', format('SELECT treadle.fork_run(%s, ''a'')', :g2)), '42501',
          'a producer may not fork a run');
SELECT is(pg_temp.as_role('ops_producer', format('SELECT treadle.retry_run(%s)', :t1)), '42501',
          'nor retry one');
SELECT is(pg_temp.as_role('ops_tenant', format('SELECT treadle.fork_run(%s, ''a'')', :g2)), '42501',
          'a tenant may not fork another queue''s run');
SELECT is(pg_temp.as_role('ops_tenant', format('SELECT treadle.retry_run(%s)', :t1)), 'ok',
          'a tenant retries its own queue''s run');
SELECT is(pg_temp.as_role('ops_admin', format('SELECT treadle.fork_run(%s, ''a'')', :g2)), 'ok',
          'an admin forks a run');
SELECT is(pg_temp.as_role('ops_producer', format('SELECT treadle.compensate_run(%s)', :k2)), '42501',
          'a producer may not compensate a run');
SELECT is(pg_temp.as_role('ops_tenant', format('SELECT treadle.compensate_run(%s)', :k2)), '42501',
          'nor a tenant another queue''s run');

SELECT * FROM finish();
ROLLBACK;
