-- pgtap/020_bounds.sql: every input bounded in SQL, so every client gets the same
-- answer: names, payload sizes and depth, error text, intervals. Each refusal is
-- 22023 (22004 for a null) and writes nothing.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(30);

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';
CREATE FUNCTION pg_temp.leased(queue text DEFAULT 'bounds') RETURNS treadle.jobs LANGUAGE sql AS $$
    SELECT treadle.enqueue('b', queue => queue);
    SELECT * FROM treadle.claim('w', ARRAY[queue]);
$$;
SELECT id AS j, lease_token AS j_tok FROM pg_temp.leased() \gset
CREATE TEMP TABLE before AS SELECT * FROM treadle.jobs;
CREATE TEMP TABLE runs_before AS SELECT * FROM treadle.workflow_runs;

-- enqueue_many: the same rules as enqueue, element by element
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "queue": "q\u0007"}]') $$, '22023', NULL,
                 'enqueue_many: a control character in a queue raises 22023');
SELECT throws_ok(format($$ SELECT treadle.enqueue_many('[{"name": %s}]') $$, to_jsonb(repeat('n', 201))), '22023', NULL,
                 'enqueue_many: a name over 200 characters raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many(jsonb_build_array(jsonb_build_object('name', 'x', 'args',
                        (repeat('[', 1500) || repeat(']', 1500))::jsonb))) $$, '22023',
                 'treadle: jobs element 0 has "args" nested more than 100 levels deep',
                 'enqueue_many: args nested 1,500 deep raise 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "idempotency_key": ""}]') $$, '22023', NULL,
                 'enqueue_many: an empty key raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "run_at": "2999-01-01", "run_in": "1 hour"}]') $$, '22023',
                 'treadle: jobs element 0 has both "run_at" and "run_in"', 'enqueue_many: run_at and run_in together raise 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "every": "300000 years"}]') $$, '22023', NULL,
                 'enqueue_many: an every over 10 years raises 22023');
SELECT treadle.enqueue_many('[{"name": "whole", "queue": "bounds-ok", "priority": 1.0, "max_attempts": 3.0}]') AS whole \gset
SELECT results_eq(format($$ SELECT priority, max_attempts FROM treadle.jobs WHERE id = %s $$, :whole),
                  $$ VALUES (1, 3) $$, 'enqueue_many: a whole number written 1.0 is an integer');
SELECT treadle.enqueue_many('[{"name": "later", "queue": "bounds-ok", "run_in": "1 hour"}]') AS later \gset
SELECT results_eq(format($$ SELECT run_at FROM treadle.jobs WHERE id = %s $$, :later),
                  $$ VALUES ('2999-01-01 13:00:00+00'::timestamptz) $$, 'enqueue_many: run_in counts from treadle''s clock');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "priority": 1.5}]') $$, '22023',
                 'treadle: jobs element 0 has a "priority" that is not an integer', 'enqueue_many: priority 1.5 raises 22023');

-- workflows
SELECT throws_ok($$ SELECT treadle.define_workflow('w2d', ARRAY[['a', 'b'], ['c', 'd']]) $$, '22023', NULL,
                 'define_workflow: a two-dimensional steps array raises 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('w2d', steps => ARRAY[['a'], ['b']]) $$, '22023', NULL,
                 'start_workflow: a two-dimensional steps array raises 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('w', (repeat('{"a":', 150) || '1' || repeat('}', 150))::jsonb,
                                                  steps => ARRAY['a']) $$, '22023', NULL,
                 'start_workflow: input nested 150 deep raises 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow(repeat('w', 201), steps => ARRAY['a']) $$, '22023', NULL,
                 'start_workflow: a name over 200 characters raises 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('w', steps => ARRAY[E'a\nb']) $$, '22023', NULL,
                 'start_workflow: a step name with a newline raises 22023');
SELECT throws_ok($$ SELECT treadle.start_workflow('w', steps => ARRAY['a'], idempotency_key => repeat('k', 201)) $$, '22023', NULL,
                 'start_workflow: a key over 200 characters raises 22023');

-- a running job's writes
SELECT throws_ok(format($$ SELECT treadle.complete(%s, %L, (repeat('[', 1500) || repeat(']', 1500))::jsonb) $$, :j, :'j_tok'),
                 '22023', NULL, 'complete: a result nested 1,500 deep raises 22023');
SELECT throws_ok(format($$ SELECT * FROM treadle.complete_many(ARRAY[%s]::bigint[], ARRAY[%L]::uuid[],
                                ARRAY[jsonb_build_object('blob', repeat('b', 1100000))]) $$, :j, :'j_tok'),
                 '22023', NULL, 'complete_many: a result over 1 MiB raises 22023');
SELECT throws_ok(format($$ SELECT treadle.progress(%s, %L, 0.5, repeat('m', 1100000)) $$, :j, :'j_tok'),
                 '22023', NULL, 'progress: a message over 1 MiB raises 22023');
SELECT throws_ok(format($$ SELECT treadle.heartbeat(%s, %L, '2 days') $$, :j, :'j_tok'),
                 '22023', 'treadle: lease must be positive and at most 1 day, got 2 days', 'heartbeat: a lease over a day raises 22023');
SELECT throws_ok(format($$ SELECT treadle.heartbeat(%s, %L, '300000 years') $$, :j, :'j_tok'),
                 '22023', NULL, 'heartbeat: a lease of 300,000 years raises 22023, not 22008');
SELECT set_eq($$ SELECT * FROM treadle.jobs WHERE queue <> 'bounds-ok' $$, $$ SELECT * FROM before $$,
              'no refused call changed a job');
SELECT set_eq($$ SELECT * FROM treadle.workflow_runs $$, $$ SELECT * FROM runs_before $$, 'nor a workflow run');

-- error text is trimmed to its head and its tail
SELECT is(treadle.fail(:j, :'j_tok', repeat('h', 9000) || repeat('m', 90000000) || 'ValueError: the last line'),
          'retryable', 'fail takes an error of 90 MB');
SELECT results_eq(format($$ SELECT length(last_error) <= 16384, left(last_error, 3), right(last_error, 25),
                                   last_error LIKE '%%characters cut%%', length(errors -> 0 ->> 'error') <= 16384
                              FROM treadle.jobs WHERE id = %s $$, :j),
                  $$ VALUES (true, 'hhh', 'ValueError: the last line', true, true) $$,
                  'the stored error keeps its head and its last line, and says what was cut');

-- intervals of the operator's controls
SELECT throws_ok($$ SELECT treadle.prune('300000 years') $$, '22023', NULL, 'prune: older_than of 300,000 years raises 22023');
SELECT throws_ok($$ SELECT treadle.prune(NULL) $$, '22004', NULL, 'prune: a null older_than raises 22004');

-- the worker registry
SELECT throws_ok($$ SELECT treadle.worker_seen('w', repeat('h', 201), 1, ARRAY['q'], 1) $$, '22023', NULL,
                 'worker_seen: a host over 200 characters raises 22023');
SELECT throws_ok($$ SELECT treadle.worker_seen(E'w\t', 'h', 1, ARRAY['q'], 1) $$, '22023', NULL,
                 'worker_seen: a worker id with a tab raises 22023');

-- notifications stay within NOTIFY's limit for the longest queue accepted
SELECT lives_ok(format($$ SELECT treadle.cancel(treadle.enqueue('n', queue => %L)) $$, repeat('q', 200)),
                'the longest queue name notifies on enqueue and cancel');
SELECT lives_ok(format($$ SELECT treadle.enqueue('n', queue => %L) $$, repeat('€', 200)),
                'so does a queue of 200 multi-byte characters');

SELECT * FROM finish();
ROLLBACK;
