-- pgtap/096_queue_args.sql: the finishes and controls take the job's queue as their
-- last argument (complete, fail, release, snooze, heartbeat, progress, cancel, retry,
-- explain). Given, every
-- statement names it; a job of another queue is as an unknown id (nothing changes);
-- null, or left out, is a call by id alone, as before.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(68);
\ir helpers.psql
SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

SELECT has_function('treadle', 'complete', ARRAY['bigint', 'uuid', 'jsonb', 'text'], 'complete(job_id, lease_token, result, queue)');
SELECT has_function('treadle', 'fail', ARRAY['bigint', 'uuid', 'text', 'interval', 'boolean', 'text'],
                    'fail(job_id, lease_token, error, retry_in, retryable, queue)');
SELECT has_function('treadle', 'release', ARRAY['bigint', 'uuid', 'text'], 'release(job_id, lease_token, queue)');
SELECT has_function('treadle', 'snooze', ARRAY['bigint', 'uuid', 'interval', 'text'], 'snooze(job_id, lease_token, delay, queue)');
SELECT has_function('treadle', 'cancel', ARRAY['bigint', 'text'], 'cancel(job_id, queue)');
SELECT has_function('treadle', 'retry', ARRAY['bigint', 'text'], 'retry(job_id, queue)');
SELECT has_function('treadle', 'explain', ARRAY['bigint', 'text'], 'explain(job_id, queue)');
SELECT has_function('treadle', 'heartbeat', ARRAY['bigint', 'uuid', 'interval', 'text'], 'heartbeat(job_id, lease_token, lease, queue)');
SELECT has_function('treadle', 'progress', ARRAY['bigint', 'uuid', 'double precision', 'text', 'text'],
                    'progress(job_id, lease_token, fraction, message, queue)');
SELECT is((SELECT array_agg(p.proname::text ORDER BY p.proname) FROM pg_proc AS p
            WHERE p.pronamespace = 'treadle'::regnamespace
              AND p.proname = ANY (ARRAY['complete', 'fail', 'release', 'snooze', 'cancel', 'retry', 'explain', 'heartbeat', 'progress'])
              AND p.proargnames[p.pronargs] = 'queue'
              AND pg_get_expr(p.proargdefaults, 0) LIKE '%NULL::text'),
          ARRAY['cancel', 'complete', 'explain', 'fail', 'heartbeat', 'progress', 'release', 'retry', 'snooze'],
          'each takes queue text DEFAULT NULL as its last argument, and has no other signature')
  FROM (SELECT 1) AS x
 WHERE (SELECT count(*) FROM pg_proc AS p WHERE p.pronamespace = 'treadle'::regnamespace
          AND p.proname = ANY (ARRAY['complete', 'fail', 'release', 'snooze', 'cancel', 'retry', 'explain', 'heartbeat',
                                  'progress'])) = 9;

-- pg_temp.state(id): a job's state and attempt, in treadle.jobs
-- (PL/pgSQL: Citus plans no SQL function's read of a distributed table by a parameter)
CREATE FUNCTION pg_temp.state(job_id bigint) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    RETURN (SELECT j.state || '/' || j.attempt FROM treadle.jobs AS j WHERE j.id = state.job_id);
END;
$$;
CREATE TEMP TABLE huge AS SELECT repeat('q', 100000) AS queue;

-- complete
SELECT id AS job, lease_token AS tok, queue AS q FROM pg_temp.leased() \gset
SELECT is(treadle.complete(:job, :'tok', '{"r": 1}', 'elsewhere'), NULL, 'complete in another queue: null');
SELECT is(treadle.complete(:job, :'tok', NULL, (SELECT queue FROM huge)), NULL, 'in a huge queue name: null');
SELECT is(pg_temp.state(:job), 'running/1', 'and the job still runs');
SELECT is(treadle.complete(:job, :'tok', '{"r": 1}', :'q'), 'completed', 'complete in its queue');
SELECT is(treadle.complete(:job, :'tok', '{"r": 1}', :'q'), 'completed', 'repeated in its queue: what it did');
SELECT is(treadle.complete(:job, :'tok', '{"r": 1}', 'elsewhere'), NULL, 'repeated in another queue: null');
SELECT is(treadle.complete(:job, :'tok', '{"r": 1}', NULL), 'completed', 'repeated by id alone (queue null)');
SELECT is(treadle.complete(:job, :'tok'), 'completed', 'repeated by id alone (queue left out)');
SELECT is(treadle.complete(-1, :'tok', NULL, :'q'), NULL, 'an unknown id in the queue: null');

-- fail
SELECT id AS job, lease_token AS tok, queue AS q FROM pg_temp.leased() \gset
SELECT is(treadle.fail(:job, :'tok', 'boom', queue => 'elsewhere'), NULL, 'fail in another queue: null');
SELECT is(pg_temp.state(:job), 'running/1', 'and the job still runs');
SELECT is(treadle.fail(:job, :'tok', 'boom', '1 hour', queue => :'q'), 'retryable', 'fail in its queue');
SELECT is((SELECT run_at FROM treadle.jobs WHERE id = :job), treadle.now() + interval '1 hour', 'retry_in holds');
SELECT is(treadle.fail(:job, :'tok', 'boom', queue => 'elsewhere'), NULL, 'repeated in another queue: null');
SELECT is(treadle.fail(:job, :'tok', 'boom', queue => :'q'), 'retryable', 'repeated in its queue: what it did');
-- the jittered default backoff, computed before the write
SELECT id AS job, lease_token AS tok, queue AS q FROM pg_temp.leased() \gset
SELECT is(treadle.fail(:job, :'tok', 'boom'), 'retryable', 'fail by id alone, with the default backoff');
SELECT ok((SELECT run_at BETWEEN treadle.now() + interval '1 second' AND treadle.now() + interval '2 seconds'
             FROM treadle.jobs WHERE id = :job), 'after attempt 1: between 1 and 2 seconds (2 s, jittered)');

-- release and snooze
SELECT id AS job, lease_token AS tok, queue AS q FROM pg_temp.leased() \gset
SELECT is(treadle.release(:job, :'tok', 'elsewhere'), NULL, 'release in another queue: null');
SELECT is(treadle.snooze(:job, :'tok', '1 minute', 'elsewhere'), NULL, 'snooze in another queue: null');
SELECT is(pg_temp.state(:job), 'running/1', 'and the job still runs');
SELECT is(treadle.snooze(:job, :'tok', '1 minute', :'q'), 'available', 'snooze in its queue');
SELECT is(pg_temp.state(:job), 'available/0', 'its attempt given back');
SELECT id AS job, lease_token AS tok, queue AS q FROM pg_temp.leased() \gset
SELECT is(treadle.release(:job, :'tok', :'q'), 'available', 'release in its queue');
SELECT is(treadle.release(:job, :'tok', 'elsewhere'), NULL, 'repeated in another queue: null');

-- cancel and retry
SELECT treadle.enqueue('c', queue => 'ctl') AS job \gset
SELECT is(treadle.cancel(:job, 'elsewhere'), false, 'cancel in another queue: false');
SELECT is(treadle.cancel(:job, (SELECT queue FROM huge)), false, 'in a huge queue name: false');
SELECT is(pg_temp.state(:job), 'available/0', 'and the job still waits');
SELECT is(treadle.cancel(:job, 'ctl'), true, 'cancel in its queue');
SELECT is(treadle.retry(:job, 'elsewhere'), false, 'retry in another queue: false');
SELECT is(pg_temp.state(:job), 'cancelled/0', 'and the job stays cancelled');
SELECT is(treadle.retry(:job, 'ctl'), true, 'retry in its queue');
SELECT is(treadle.cancel(:job), true, 'cancel by id alone');
SELECT is(treadle.retry(:job, NULL), true, 'retry by id alone');
SELECT throws_ok($$ SELECT treadle.cancel(NULL, 'ctl') $$, '22004', NULL, 'cancel(null, queue) raises 22004');
SELECT throws_ok($$ SELECT treadle.retry(NULL, 'ctl') $$, '22004', NULL, 'retry(null, queue) raises 22004');

-- heartbeat and progress
SELECT id AS job, lease_token AS tok, queue AS q FROM pg_temp.leased() \gset
SELECT is(treadle.heartbeat(:job, :'tok', '1 minute', 'elsewhere'), 'lost', 'heartbeat in another queue: lost');
SELECT is((SELECT lease_until FROM treadle.jobs WHERE id = :job), treadle.now() + interval '30 seconds',
          'and the lease stays');
SELECT is(treadle.heartbeat(:job, :'tok', '1 minute', :'q'), 'held', 'heartbeat in its queue: held');
SELECT is((SELECT lease_until FROM treadle.jobs WHERE id = :job), treadle.now() + interval '1 minute', 'the lease moves');
SELECT is(treadle.heartbeat(:job, :'tok', '2 minutes'), 'held', 'heartbeat by id alone');
SELECT is(treadle.progress(:job, :'tok', 0.5, 'half', 'elsewhere'), false, 'progress in another queue: false');
SELECT is((SELECT progress FROM treadle.jobs WHERE id = :job), NULL, 'and nothing is recorded');
SELECT is(treadle.progress(:job, :'tok', 0.5, 'half', :'q'), true, 'progress in its queue');
SELECT is(treadle.progress(:job, :'tok', 0.7, NULL, NULL), true, 'progress by id alone');

-- explain
SELECT is((SELECT count(*) FROM treadle.explain(:job, 'elsewhere')), 0::bigint, 'explain in another queue: no rows');
SELECT ok((SELECT count(*) FROM treadle.explain(:job, :'q')) > 0, 'explain in its queue: its reasons');

-- the batch calls: job_queues, each job's queue, paired by position
SELECT id AS j1, lease_token AS t1, queue AS q1 FROM pg_temp.leased() \gset
SELECT id AS j2, lease_token AS t2, queue AS q2 FROM pg_temp.leased() \gset
SELECT id AS j3, lease_token AS t3, queue AS q3 FROM pg_temp.leased() \gset
SELECT results_eq(
    format($$ SELECT answer FROM treadle.heartbeat_many(ARRAY[%s, %s]::bigint[], ARRAY[%L, %L]::uuid[], '1 minute',
                                                        ARRAY[%L, 'elsewhere']) $$, :j1, :j2, :'t1', :'t2', :'q1'),
    ARRAY['held', 'lost'], 'heartbeat_many: held in its queue, lost in another');
SELECT is((SELECT array_agg(lease_until ORDER BY id) FROM treadle.jobs WHERE id IN (:j1, :j2)),
          ARRAY[treadle.now() + interval '1 minute', treadle.now() + interval '30 seconds'],
          'only the lease in its queue moves');
SELECT results_eq(
    format($$ SELECT answer FROM treadle.heartbeat_many(ARRAY[%s, %s, %s]::bigint[], ARRAY[%L, %L, %L]::uuid[],
                                                        '2 minutes', ARRAY[%L, %L, %L]) $$,
           :j1, :j2, :j3, :'t1', :'t2', :'t3', :'q1', :'q2', :'q3'),
    ARRAY['held', 'held', 'held'], 'heartbeat_many over three queues: each held');
SELECT throws_ok(format($$ SELECT * FROM treadle.heartbeat_many(ARRAY[%s]::bigint[], ARRAY[%L]::uuid[], '1 minute',
                                                                ARRAY[%L, %L]) $$, :j1, :'t1', :'q1', :'q1'),
                 '22023', NULL, 'heartbeat_many: job_queues of another length raises 22023');
SELECT throws_ok(format($$ SELECT * FROM treadle.heartbeat_many(ARRAY[%s]::bigint[], ARRAY[%L]::uuid[], '1 minute',
                                                                ARRAY[NULL]::text[]) $$, :j1, :'t1'),
                 '22004', NULL, 'heartbeat_many: a null in job_queues raises 22004');
SELECT throws_ok(format($$ SELECT * FROM treadle.complete_many(ARRAY[%s]::bigint[], ARRAY[%L]::uuid[], NULL,
                                                               ARRAY[%L, %L]) $$, :j1, :'t1', :'q1', :'q1'),
                 '22023', NULL, 'complete_many: job_queues of another length raises 22023');
SELECT throws_ok(format($$ SELECT * FROM treadle.complete_many(ARRAY[%s]::bigint[], ARRAY[%L]::uuid[], NULL,
                                                               ARRAY[NULL]::text[]) $$, :j1, :'t1'),
                 '22004', NULL, 'complete_many: a null in job_queues raises 22004');
SELECT results_eq(
    format($$ SELECT job_id, state FROM treadle.complete_many(ARRAY[%s, %s, %s]::bigint[], ARRAY[%L, %L, %L]::uuid[],
                                                              ARRAY['{"a": 1}', '{"b": 2}', '{"c": 3}']::jsonb[],
                                                              ARRAY[%L, 'elsewhere', %L]) $$,
           :j1, :j2, :j3, :'t1', :'t2', :'t3', :'q1', :'q3'),
    format($$ VALUES (%s::bigint, 'completed'::text), (%s, NULL), (%s, 'completed') $$, :j1, :j2, :j3),
    'complete_many: each job finished in its own queue, none in another');
SELECT results_eq(
    format($$ SELECT state, result FROM treadle.jobs WHERE id IN (%s, %s, %s) ORDER BY id $$, :j1, :j2, :j3),
    $$ VALUES ('completed'::text, '{"a": 1}'::jsonb), ('running', NULL), ('completed', '{"c": 3}') $$,
    'each result with its job; the job named with another queue still runs');
SELECT results_eq(
    format($$ SELECT job_id, state FROM treadle.complete_many(ARRAY[%s, %s]::bigint[], ARRAY[%L, %L]::uuid[], NULL,
                                                              ARRAY[%L, %L]) $$, :j1, :j2, :'t1', :'t2', :'q1', :'q2'),
    format($$ VALUES (%s::bigint, 'completed'::text), (%s, 'completed') $$, :j1, :j2),
    'complete_many repeated with job_queues: the finish before, and the one left');
SELECT id AS j4, lease_token AS t4, queue AS q4 FROM pg_temp.leased() \gset
SELECT enqueue AS j5 FROM treadle.enqueue('job', queue => :'q4', run_at => '2000-01-01 00:00:00+00') \gset
SELECT results_eq(
    format($$ SELECT finished_id, finished_state, (job).id FROM treadle.complete_and_claim(
                  ARRAY[%s]::bigint[], ARRAY[%L]::uuid[], NULL, 'w', ARRAY[%L], job_queues => ARRAY[%L]) $$,
           :j4, :'t4', :'q4', :'q4'),
    format($$ VALUES (%s::bigint, 'completed'::text, NULL::bigint), (NULL, NULL, %s) $$, :j4, :j5),
    'complete_and_claim passes job_queues to the finish, then claims');
SELECT is(treadle._distributed(), false, 'treadle is not distributed on a server without Citus');

SELECT * FROM finish();
ROLLBACK;
