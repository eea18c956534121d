-- pgtap/055_workflow_lists.sql: a batch's list steps move their runs together
-- (treadle._advance_lists, 051_workflow_lists.sql): one statement for every completed
-- step of a running list run without step options, the same runs, results and next
-- jobs as treadle._advance_run writes one by one; every other step of the batch
-- still takes treadle._advance_run. The calls are counted (track_functions).
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(30);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';
SET LOCAL track_functions = 'all';

-- pg_temp.calls(function): how often this transaction called it so far
CREATE FUNCTION pg_temp.calls(fn regprocedure) RETURNS bigint LANGUAGE sql AS $$
    SELECT coalesce(pg_stat_get_xact_function_calls(fn), 0)
$$;
-- pg_temp.finish_all(queue, extra, extra_token): claim every available job of the queue
-- and complete them all (with `extra` after them, when given) in one complete_many, in id
-- order, the i-th with {"n": i}; the states it returns
CREATE FUNCTION pg_temp.finish_all(q text, extra bigint DEFAULT NULL, extra_token uuid DEFAULT NULL)
RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    v_ids    bigint[];
    v_tokens uuid[];
BEGIN
    SELECT array_agg(c.id ORDER BY c.id), array_agg(c.lease_token ORDER BY c.id) INTO v_ids, v_tokens
      FROM treadle.claim('w', ARRAY[q], batch => 1000) AS c;
    IF extra IS NOT NULL THEN
        v_ids := v_ids || extra;
        v_tokens := v_tokens || extra_token;
    END IF;
    RETURN QUERY
    SELECT m.state
      FROM treadle.complete_many(v_ids, v_tokens,
                                 ARRAY(SELECT jsonb_build_object('n', i) FROM generate_series(1, cardinality(v_ids)) AS i)) AS m;
END;
$$;
-- pg_temp.steps(run): the run's jobs as step:state, in id order
CREATE FUNCTION pg_temp.steps(run_id bigint) RETURNS text[] LANGUAGE sql AS $$
    SELECT array_agg(j.step || ':' || j.state ORDER BY j.id) FROM treadle.jobs AS j WHERE j.workflow_run_id = run_id
$$;

--------------------------------------------------------------------------------
-- four list runs, one batch per step
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('lin', '{}', steps => ARRAY['a', 'b', 'c'], queue => 'lists') AS r1 \gset
SELECT treadle.start_workflow('lin', '{}', steps => ARRAY['a', 'b', 'c'], queue => 'lists', priority => 5) AS r2 \gset
SELECT treadle.start_workflow('lin', '{}', steps => ARRAY['a', 'b', 'c'], queue => 'lists', max_attempts => 3,
                              meta => '{"tag": "x"}') AS r3 \gset
SELECT treadle.start_workflow('lin', '{}', steps => ARRAY['a', 'b', 'c'], queue => 'lists') AS r4 \gset

SELECT pg_temp.calls('treadle._advance_run(treadle.jobs)') AS run0,
       pg_temp.calls('treadle._advance_lists(treadle.jobs[])') AS lists0 \gset
SELECT is((SELECT count(*) FROM pg_temp.finish_all('lists') AS s WHERE s = 'completed'), 4::bigint, 'four first steps complete in one call');
SELECT is(pg_temp.calls('treadle._advance_lists(treadle.jobs[])') - :lists0, 1::bigint,
          'their runs move in one call of _advance_lists');
SELECT is(pg_temp.calls('treadle._advance_run(treadle.jobs)') - :run0, 0::bigint, 'and none of _advance_run');
SELECT results_eq(
    format($$ SELECT id, results FROM treadle.workflow_runs WHERE id IN (%s, %s, %s, %s) ORDER BY id $$, :r1, :r2, :r3, :r4),
    format($$ VALUES (%s::bigint, '{"a": {"n": 1}}'::jsonb), (%s, '{"a": {"n": 2}}'), (%s, '{"a": {"n": 3}}'),
                     (%s, '{"a": {"n": 4}}') $$, :r1, :r2, :r3, :r4),
    'each run holds its own step''s result');
SELECT results_eq(
    $$ SELECT workflow_run_id, queue, name, args, priority, max_attempts, meta, run_at, created_at, state, attempt,
              run_queue, step_options_free
         FROM (SELECT j.*, j.timeout IS NULL AND j.backoff IS NULL AND j.concurrency_key IS NULL AS step_options_free
                 FROM treadle.jobs AS j WHERE j.step = 'b' AND j.queue = 'lists') AS j ORDER BY id $$,
    format($$ VALUES (%s::bigint, 'lists'::text, 'workflow:lin/b'::text, '{}'::jsonb, 0, 25, NULL::jsonb,
                      '2999-01-01 12:00:00+00'::timestamptz, '2999-01-01 12:00:00+00'::timestamptz, 'available'::text,
                      0, NULL::text, true),
                     (%s, 'lists', 'workflow:lin/b', '{}', 5, 25, NULL, '2999-01-01 12:00:00+00',
                      '2999-01-01 12:00:00+00', 'available', 0, NULL, true),
                     (%s, 'lists', 'workflow:lin/b', '{}', 0, 3, '{"tag": "x"}', '2999-01-01 12:00:00+00',
                      '2999-01-01 12:00:00+00', 'available', 0, NULL, true),
                     (%s, 'lists', 'workflow:lin/b', '{}', 0, 25, NULL, '2999-01-01 12:00:00+00',
                      '2999-01-01 12:00:00+00', 'available', 0, NULL, true) $$, :r1, :r2, :r3, :r4),
    'each next step is a job as _advance_run writes it (priority, max_attempts, meta from the run), in the order of the steps that finished');
SELECT is((SELECT count(*) FROM pg_temp.finish_all('lists') AS s WHERE s = 'completed'), 4::bigint, 'the four second steps complete in one call');
SELECT is((SELECT count(*) FROM pg_temp.finish_all('lists') AS s WHERE s = 'completed'), 4::bigint, 'and the four last steps');
SELECT is(pg_temp.calls('treadle._advance_run(treadle.jobs)') - :run0, 0::bigint, 'still no call of _advance_run');
SELECT results_eq(
    format($$ SELECT state, finished_at, results FROM treadle.workflow_runs WHERE id IN (%s, %s, %s, %s) ORDER BY id $$,
           :r1, :r2, :r3, :r4),
    $$ VALUES ('completed'::text, '2999-01-01 12:00:00+00'::timestamptz, '{"a": {"n": 1}, "b": {"n": 1}, "c": {"n": 1}}'::jsonb),
              ('completed', '2999-01-01 12:00:00+00', '{"a": {"n": 2}, "b": {"n": 2}, "c": {"n": 2}}'),
              ('completed', '2999-01-01 12:00:00+00', '{"a": {"n": 3}, "b": {"n": 3}, "c": {"n": 3}}'),
              ('completed', '2999-01-01 12:00:00+00', '{"a": {"n": 4}, "b": {"n": 4}, "c": {"n": 4}}') $$,
    'the last steps complete their runs, finished now, every result kept');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE queue = 'lists'), 12::bigint, 'three jobs per run, no more');

--------------------------------------------------------------------------------
-- one batch, every kind of row: the others take _advance_run
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('lin', '{}', steps => ARRAY['a', 'b'], queue => 'mix') AS l \gset
SELECT treadle.start_workflow('graph', '{}', steps => ARRAY['a', 'b', 'c'], after => '{"c": ["a", "b"]}',
                              queue => 'mix') AS g \gset
SELECT treadle.start_workflow('opts', '{}', steps => ARRAY['a', 'b'], queue => 'mix',
                              step_options => '{"b": {"queue": "elsewhere"}}') AS o \gset
SELECT treadle.start_workflow('gone', '{}', steps => ARRAY['a', 'b'], queue => 'mix') AS x \gset
SELECT treadle.enqueue('plain', queue => 'mix') AS p \gset
SELECT treadle.enqueue('tick', queue => 'mix', every => '1 hour') AS t \gset
SELECT id AS xa, lease_token AS xa_tok FROM treadle.claim('w', ARRAY['mix'], names => ARRAY['workflow:gone/a']) \gset
SELECT is(treadle.cancel_workflow(:x), true, 'a run is cancelled while its step runs');
-- the cancelled run's step, claimed first, goes with the rest
SELECT results_eq(
    format($$ SELECT * FROM pg_temp.finish_all('mix', %s, %L) $$, :xa, :'xa_tok'),
    $$ VALUES ('completed'::text), ('completed'), ('completed'), ('completed'), ('completed'), ('completed'),
              ('cancelled') $$,
    'a batch of a list step, a graph''s two branches, a step with step options, a plain job, a periodic job and a cancelled step');
SELECT is(pg_temp.calls('treadle._advance_lists(treadle.jobs[])') - :lists0, 4::bigint,
          '_advance_lists is called once for the batch');
SELECT is(pg_temp.calls('treadle._advance_run(treadle.jobs)') - :run0, 4::bigint,
          '_advance_run for the graph''s two steps, the step with options and the cancelled step');
SELECT is(pg_temp.steps(:l), ARRAY['a:completed', 'b:available'], 'the list run moves on');
SELECT is(pg_temp.steps(:g), ARRAY['a:completed', 'b:completed', 'c:available'], 'the graph run enqueues its join, once');
SELECT is((SELECT queue FROM treadle.jobs WHERE workflow_run_id = :o AND step = 'b'), 'elsewhere',
          'the run with step options enqueues its next step where they say');
SELECT is(pg_temp.steps(:x), ARRAY['a:cancelled'], 'the cancelled run enqueues nothing');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :x), 'cancelled', 'and stays cancelled');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE queue = 'mix' AND name = 'tick' AND state = 'available'), 1::bigint,
          'the periodic job''s next occurrence is written');
SELECT is((SELECT jsonb_object_keys(results) FROM treadle.workflow_runs WHERE id = :l), 'a', 'the list run holds its result');

--------------------------------------------------------------------------------
-- a child run's last step, in a batch: its parent moves (the step by _advance_run)
--------------------------------------------------------------------------------
SELECT treadle.define_workflow('kid', ARRAY['x']);
SELECT treadle.start_workflow('parent', '{}', steps => ARRAY['k', 'next'], queue => 'fam',
                              children => '{"k": {"workflow": "kid"}}') AS par \gset
SELECT id AS kid FROM treadle.workflow_runs WHERE parent_run_id = :par \gset
SELECT ok((SELECT after IS NULL FROM treadle.workflow_runs WHERE id = :kid), 'the child run is a list');
SELECT treadle.start_workflow('solo', '{}', steps => ARRAY['only'], queue => 'fam') AS solo \gset
SELECT pg_temp.calls('treadle._advance_run(treadle.jobs)') AS run1 \gset
SELECT is((SELECT count(*) FROM pg_temp.finish_all('fam') AS s WHERE s = 'completed'), 2::bigint, 'the child''s step and another run''s only step complete in one call');
SELECT is(pg_temp.calls('treadle._advance_run(treadle.jobs)') - :run1, 1::bigint,
          'the child''s last step by _advance_run (its parent moves in the order of the batch''s rows), the other by _advance_lists');
SELECT results_eq(format($$ SELECT id, state FROM treadle.workflow_runs WHERE id IN (%s, %s, %s) ORDER BY id $$,
                         :par, :kid, :solo),
                  format($$ VALUES (%s::bigint, 'running'::text), (%s, 'completed'), (%s, 'completed') $$,
                         :par, :kid, :solo),
                  'both runs complete; the parent runs on');
SELECT is((SELECT results FROM treadle.workflow_runs WHERE id = :par), '{"k": {"x": {"n": 1}}}'::jsonb,
          'the parent''s child step completes with the child''s results');
SELECT is(pg_temp.steps(:par), ARRAY['next:available'], 'and its next step is a job');

--------------------------------------------------------------------------------
-- one row (treadle.complete): _advance_run, as before
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('lin', '{}', steps => ARRAY['a', 'b'], queue => 'one') AS one \gset
SELECT pg_temp.calls('treadle._advance_lists(treadle.jobs[])') AS lists1 \gset
SELECT is(treadle.complete(c.id, c.lease_token), 'completed', 'a single step completes')
  FROM treadle.claim('w', ARRAY['one']) AS c;
SELECT is(pg_temp.calls('treadle._advance_lists(treadle.jobs[])') - :lists1, 0::bigint, 'without _advance_lists');
SELECT is(pg_temp.steps(:one), ARRAY['a:completed', 'b:available'], 'its run moves on');

SELECT * FROM finish();
ROLLBACK;
