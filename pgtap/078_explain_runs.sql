-- pgtap/078_explain_runs.sql: treadle.explain_run, why a workflow run is where it
-- is: a summary row, then each step that has not completed with its reason (the
-- dependencies it waits for, a sleep, a signal, a map's element jobs, a child
-- run, and a step job's reasons; a compensating run's step jobs not ended and
-- compensations not started as treadle.explain gives them); a finished run's summary alone;
-- a fork names its origin, a run forked from names its forks;
-- null refused; readers may call it, others not; a tenant sees only its runs.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(58);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

-- pg_temp.why(run): the run's rows as 'step:reason', in order ('-' for the run row)
CREATE FUNCTION pg_temp.why(run_id bigint) RETURNS text[] LANGUAGE sql AS $$
    SELECT coalesce(array_agg(coalesce(e.step, '-') || ':' || e.reason), '{}') FROM treadle.explain_run(run_id) AS e
$$;
-- pg_temp.message(run, step, reason): the message of that row
CREATE FUNCTION pg_temp.message(run_id bigint, step_name text, reason_key text) RETURNS text LANGUAGE sql AS $$
    SELECT e.message FROM treadle.explain_run(run_id) AS e
     WHERE e.step IS NOT DISTINCT FROM step_name AND e.reason = reason_key
$$;
-- pg_temp.claim_step(queue, workflow, step): claim that step's job as worker 'w'
CREATE FUNCTION pg_temp.claim_step(queue_name text, workflow text, step_name text) RETURNS treadle.jobs
LANGUAGE sql AS $$
    SELECT c FROM treadle.claim('w', ARRAY[queue_name], names => ARRAY['workflow:' || workflow || '/' || step_name],
                                batch => 1) AS c
$$;

SELECT has_function('treadle', 'explain_run', ARRAY['bigint'], 'treadle.explain_run(bigint) exists');
SELECT throws_ok($$ SELECT * FROM treadle.explain_run(NULL) $$, '22004', 'treadle: run_id must not be null',
                 'a null run_id raises 22004');
SELECT is_empty($$ SELECT * FROM treadle.explain_run(-1) $$, 'an unknown run has no rows');

-- A graph: b after a, c after a and b
SELECT treadle.start_workflow('ex', steps => ARRAY['a', 'b', 'c'], queue => 'ex',
                              after => '{"b": ["a"], "c": ["a", "b"]}') AS r1 \gset
SELECT is(pg_temp.why(:r1), ARRAY['-:run', 'a:no_worker', 'b:dependencies', 'c:dependencies'],
          'a new run: its summary, its first step''s job (no worker yet), the others waiting for dependencies');
SELECT is(pg_temp.message(:r1, NULL, 'run'), format('run %s of workflow ex on queue ex is running since 2999-01-01 12:00:00+00: 0 of 3 step(s) completed', :r1),
          'the summary names the workflow, queue, state and how many steps completed');
SELECT is(pg_temp.message(:r1, 'c', 'dependencies'), 'step c waits for its dependencies to complete: a, b',
          'a step waiting for its dependencies names them');
SELECT is((SELECT job_id FROM treadle.explain_run(:r1) WHERE step = 'a'),
          (SELECT id FROM treadle.jobs WHERE workflow_run_id = :r1 AND step = 'a'), 'a step job''s row carries its job id');
SELECT is((SELECT message FROM treadle.explain_run(:r1) WHERE step = 'a'),
          (SELECT message FROM treadle.explain((SELECT id FROM treadle.jobs WHERE workflow_run_id = :r1 AND step = 'a'))),
          'and the reason treadle.explain gives the job');

SELECT treadle.worker_seen('w-other', 'h', 1, ARRAY['ex'], 1, 0, ARRAY['workflow:ex/b']);
SELECT is(pg_temp.why(:r1), ARRAY['-:run', 'a:no_worker', 'b:dependencies', 'c:dependencies'],
          'a live worker without a handler for step a: still no_worker');
SELECT matches(pg_temp.message(:r1, 'a', 'no_worker'), '^no live worker runs step a of workflow ex',
               'naming the step no worker runs');
SELECT treadle.worker_seen('w', 'h', 1, ARRAY['ex'], 1, 0, ARRAY['workflow:ex/a', 'workflow:ex/b', 'workflow:ex/c']);
SELECT is(pg_temp.why(:r1), ARRAY['-:run', 'a:ready', 'b:dependencies', 'c:dependencies'],
          'with a worker that runs it, step a is ready');
SELECT treadle.pause('ex');
SELECT is(pg_temp.why(:r1), ARRAY['-:run', 'a:paused', 'b:dependencies', 'c:dependencies'], 'a paused queue holds it');
SELECT treadle.resume('ex');
SELECT treadle.set_queue('ex', concurrency => 1);
SELECT treadle.enqueue('other', queue => 'ex', run_at => '2000-01-01 00:00:00+00');
SELECT lives_ok($$ SELECT treadle.claim('w', ARRAY['ex'], names => ARRAY['other']) $$, 'another job of the queue runs');
SELECT is(pg_temp.why(:r1), ARRAY['-:run', 'a:concurrency_limit', 'b:dependencies', 'c:dependencies'],
          'a queue at its concurrency limit holds it');
SELECT treadle.set_queue('ex', concurrency => NULL);

SELECT pg_temp.claim_step('ex', 'ex', 'a') AS a \gset
SELECT is(pg_temp.why(:r1), ARRAY['-:run', 'a:running', 'a:worker', 'b:dependencies', 'c:dependencies'],
          'a running step: running and its worker, as explain says');
SELECT is(treadle.fail((:'a'::treadle.jobs).id, (:'a'::treadle.jobs).lease_token, 'boom', interval '5 minutes'), 'retryable',
          'step a fails and will retry');
SELECT is(pg_temp.why(:r1), ARRAY['-:run', 'a:retrying', 'b:dependencies', 'c:dependencies'],
          'a step that retries: retrying');
SELECT matches(pg_temp.message(:r1, 'a', 'retrying'), 'boom', 'with its last error');
SELECT is((SELECT at FROM treadle.explain_run(:r1) WHERE step = 'a'), '2999-01-01 12:05:00+00'::timestamptz,
          'and the time it retries at');
SET LOCAL treadle.now = '2999-01-01 12:10:00+00';
SELECT treadle.worker_seen('w', 'h', 1, ARRAY['ex'], 1, 0, ARRAY['workflow:ex/a', 'workflow:ex/b', 'workflow:ex/c']);
SELECT pg_temp.claim_step('ex', 'ex', 'a') AS a \gset
SELECT treadle.complete((:'a'::treadle.jobs).id, (:'a'::treadle.jobs).lease_token, '{}');
SELECT is(pg_temp.why(:r1), ARRAY['-:run', 'b:ready', 'c:dependencies'], 'a completed step is left out');
SELECT matches(pg_temp.message(:r1, NULL, 'run'), '1 of 3 step\(s\) completed \(a\)$', 'and summed up in the run row');
SELECT is(pg_temp.message(:r1, 'c', 'dependencies'), 'step c waits for its dependencies to complete: b',
          'a dependency that completed is no longer named');

-- A run of a defined workflow names its version
SELECT treadle.define_workflow('exv', ARRAY['one']);
SELECT treadle.start_workflow('exv', queue => 'exv') AS rv \gset
SELECT is(pg_temp.message(:rv, NULL, 'run'),
          format('run %s of workflow exv (version 1) on queue exv is running since 2999-01-01 12:10:00+00: 0 of 1 step(s) completed', :rv),
          'the summary of a run of a defined workflow names the version it started with');

-- A finished run: its summary alone
SELECT ok(treadle.cancel_workflow(:r1), 'the run is cancelled');
SELECT is(pg_temp.why(:r1), ARRAY['-:run'], 'a finished run has its summary row alone');
SELECT matches(pg_temp.message(:r1, NULL, 'run'), ' is cancelled since ', 'saying how it ended');

-- A sleep step, a wait step with and without a timeout
SELECT treadle.start_workflow('exs', steps => ARRAY['nap', 'gate', 'open'], queue => 'exs',
                              after => '{"gate": [], "open": []}', sleeps => '{"nap": "1 hour"}',
                              waits => '{"gate": {"signal": "go", "timeout": "2 hours"}, "open": {"signal": "open"}}') AS r2 \gset
SELECT is(pg_temp.why(:r2), ARRAY['-:run', 'nap:sleeping', 'gate:signal', 'open:signal'],
          'a sleep step sleeps, wait steps wait for their signals');
SELECT results_eq(format($$ SELECT message, at FROM treadle.explain_run(%s) WHERE step IS NOT NULL $$, :r2),
    $$ VALUES ('sleep step nap sleeps until 2999-01-01 13:10:00+00', '2999-01-01 13:10:00+00'::timestamptz),
              ('wait step gate waits for signal go until 2999-01-01 14:10:00+00, when it times out and the run fails',
               '2999-01-01 14:10:00+00'::timestamptz),
              ('wait step open waits for signal open (no timeout)', NULL::timestamptz) $$,
    'each says until when, and what a timeout does');
SELECT treadle.signal(:r2, 'go', '{}');
SELECT is(pg_temp.why(:r2), ARRAY['-:run', 'nap:sleeping', 'open:signal'], 'a signalled step is completed and left out');

-- A map step: its element jobs not completed, the oldest explained
SELECT treadle.start_workflow('exm', steps => ARRAY['list', 'each'], queue => 'exm', maps => '{"each": "list"}') AS r3 \gset
SELECT is(pg_temp.why(:r3), ARRAY['-:run', 'list:no_worker', 'each:dependencies'], 'the map step waits for its list');
SELECT pg_temp.claim_step('exm', 'exm', 'list') AS l \gset
SELECT treadle.complete((:'l'::treadle.jobs).id, (:'l'::treadle.jobs).lease_token, '[1, 2, 3]');
SELECT is(pg_temp.why(:r3), ARRAY['-:run', 'each:map', 'each:no_worker'], 'a map under way, and its oldest element job');
SELECT is(pg_temp.message(:r3, 'each', 'map'), 'map step each: 3 of its 3 element job(s) not completed',
          'counting its element jobs not completed');
SELECT pg_temp.claim_step('exm', 'exm', 'each') AS e \gset
SELECT treadle.complete((:'e'::treadle.jobs).id, (:'e'::treadle.jobs).lease_token, '{}');
SELECT is(pg_temp.message(:r3, 'each', 'map'), 'map step each: 2 of its 3 element job(s) not completed',
          'one fewer after one completes');
SELECT is((SELECT job_id FROM treadle.explain_run(:r3) WHERE reason = 'no_worker'),
          (SELECT min(id) FROM treadle.jobs WHERE workflow_run_id = :r3 AND step = 'each' AND state <> 'completed'),
          'the element job explained is the oldest not completed');

-- A child step: the child run it waits for, not a step that has not started
SELECT treadle.define_workflow('exk', ARRAY['k1']);
SELECT treadle.start_workflow('exp', steps => ARRAY['pre', 'kid', 'post'], queue => 'exp',
                              children => '{"kid": {"workflow": "exk", "queue": "exk"}}') AS r4 \gset
SELECT is(pg_temp.why(:r4), ARRAY['-:run', 'pre:no_worker', 'kid:dependencies', 'post:dependencies'],
          'a child step before its child starts waits for its dependencies');
SELECT pg_temp.claim_step('exp', 'exp', 'pre') AS p \gset
SELECT treadle.complete((:'p'::treadle.jobs).id, (:'p'::treadle.jobs).lease_token, '{}');
SELECT id AS kid FROM treadle.workflow_runs WHERE parent_run_id = :r4 \gset
SELECT is(pg_temp.why(:r4), ARRAY['-:run', 'kid:child', 'post:dependencies'], 'a child step under way waits for its child');
SELECT is(pg_temp.message(:r4, 'kid', 'child'),
          format('child step kid waits for run %s of workflow exk on queue exk, which is running', :kid),
          'naming the child run, its workflow, queue and state');
SELECT is((SELECT at FROM treadle.explain_run(:r4) WHERE reason = 'child'),
          (SELECT created_at FROM treadle.workflow_runs WHERE id = :kid), 'at the child''s creation');

-- A compensating run: what it waits for, the running step, then each compensation
SELECT treadle.start_workflow('exc', steps => ARRAY['a', 'b', 'c'], queue => 'exc', max_attempts => 1,
                              after => '{"c": []}', compensations => '{"a": "undo_a", "b": "undo_b"}') AS r5 \gset
SELECT pg_temp.claim_step('exc', 'exc', 'a') AS ca \gset
SELECT treadle.complete((:'ca'::treadle.jobs).id, (:'ca'::treadle.jobs).lease_token, '{}');
SELECT pg_temp.claim_step('exc', 'exc', 'b') AS cb \gset
SELECT pg_temp.claim_step('exc', 'exc', 'c') AS cc \gset
SELECT treadle.fail((:'cc'::treadle.jobs).id, (:'cc'::treadle.jobs).lease_token, 'no', retryable => false);
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :r5), 'compensating', 'a run that failed compensates');
SELECT is(pg_temp.why(:r5), ARRAY['-:run', 'b:running', 'b:worker', 'undo_a:compensation'],
          'it waits for its running step, and a completed step''s compensation waits its turn');
SELECT is(pg_temp.message(:r5, 'undo_a', 'compensation'),
          'compensation undo_a of step a waits for its turn: one compensation runs at a time, the last completed step''s first',
          'naming the compensation and the step it undoes');
SELECT treadle.complete((:'cb'::treadle.jobs).id, (:'cb'::treadle.jobs).lease_token, '{}');
SELECT is(pg_temp.why(:r5), ARRAY['-:run', 'undo_b:no_worker', 'undo_a:compensation'],
          'the step that completed meanwhile is compensated first, the other waits');
SELECT is((SELECT job_id FROM treadle.explain_run(:r5) WHERE step = 'undo_b'),
          (SELECT id FROM treadle.jobs WHERE workflow_run_id = :r5 AND step = 'undo_b'), 'a compensation job''s row carries its id');
SELECT pg_temp.claim_step('exc', 'exc', 'undo_b') AS ub \gset
SELECT treadle.complete((:'ub'::treadle.jobs).id, (:'ub'::treadle.jobs).lease_token, '{}');
SELECT is(pg_temp.why(:r5), ARRAY['-:run', 'undo_a:no_worker'], 'then the other');
SELECT pg_temp.claim_step('exc', 'exc', 'undo_a') AS ua \gset
SELECT treadle.complete((:'ua'::treadle.jobs).id, (:'ua'::treadle.jobs).lease_token, '{}');
SELECT is(pg_temp.why(:r5), ARRAY['-:run'], 'a compensated run has its summary row alone');

-- Forks: a fork names the run and step it came from, the source names its forks
SELECT treadle.fork_run(:r1, 'b') AS f1 \gset
SELECT treadle.fork_run(:r1, 'c') AS f2 \gset
SELECT is(pg_temp.why(:r1), ARRAY['-:run', '-:forks'], 'a finished run forked from: its summary and its forks');
SELECT is(pg_temp.message(:r1, NULL, 'forks'), format('run %s has 2 fork(s): %s (from c), %s (from b)', :r1, :f2, :f1),
          'the forks named with their step, newest first');
SELECT is((SELECT at FROM treadle.explain_run(:r1) WHERE reason = 'forks'),
          (SELECT created_at FROM treadle.workflow_runs WHERE id = :f2), 'at the newest fork''s creation');
SELECT is((pg_temp.why(:f1))[1:3], ARRAY['-:run', '-:forked_from', 'b:ready'],
          'a running fork: its summary, its origin, then its steps');
SELECT is(pg_temp.message(:f1, NULL, 'forked_from'), format('run %s was forked from run %s at step b', :f1, :r1),
          'naming the run and the step it was forked from');
SELECT is((SELECT job_id FROM treadle.explain_run(:f1) WHERE reason = 'forked_from'), NULL, 'a row of no job');
SELECT treadle.fork_run(:f1, 'c') AS f3 \gset
SELECT ok(treadle.cancel_workflow(:f1), 'the fork is cancelled');
SELECT is(pg_temp.why(:f1), ARRAY['-:run', '-:forked_from', '-:forks'], 'a finished fork of a fork: both rows');
SELECT is(pg_temp.message(:f1, NULL, 'forks'), format('run %s has 1 fork(s): %s (from c)', :f1, :f3),
          'a fork''s own forks, not its siblings');

-- Roles and tenants (a role but the owner reads the real clock, before the year 2999: the jobs are not due)
CREATE ROLE exr_reader;  SELECT treadle.grant_reader('exr_reader');
CREATE ROLE exr_nobody;
CREATE ROLE exr_a;  SELECT treadle.grant_producer('exr_a');  SELECT treadle.set_tenant('exr_a', 'a.');
SELECT treadle.start_workflow('a.flow', steps => ARRAY['one'], queue => 'a.q') AS ra \gset
SELECT is(pg_temp.as_role_value('exr_reader', format($$ SELECT pg_temp.why(%s)::text $$, :r3)), '{-:run,each:map,each:not_due,each:no_worker}',
          'a reader may explain a run');
SELECT is(pg_temp.as_role('exr_nobody', format($$ SELECT * FROM treadle.explain_run(%s) $$, :r3)), '42501',
          'a role without the read part may not');
SELECT is(pg_temp.as_role_value('exr_a', format($$ SELECT pg_temp.why(%s)::text $$, :ra)), '{-:run,one:not_due,one:no_worker}',
          'a tenant explains a run of its queues');
SELECT is(pg_temp.as_role_value('exr_a', format($$ SELECT count(*) FROM treadle.explain_run(%s) $$, :r3)), '0',
          'and learns nothing of another queue''s run');

SELECT * FROM finish();
ROLLBACK;
