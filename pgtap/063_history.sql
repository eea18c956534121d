-- pgtap/063_history.sql: treadle.archive moves finished jobs to treadle.job_history;
-- apply_retention empties its partitions whole; readers, retry, cancel and a repeated
-- finish still find the jobs there.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(52);
\ir helpers.psql

SELECT has_function('treadle', 'archive', ARRAY['integer'], 'treadle.archive(integer) exists');
SELECT is(
    (SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_attribute AS a
      WHERE a.attrelid = 'treadle.job_history'::regclass AND a.attnum > 0 AND NOT a.attisdropped),
    ARRAY['purge_at', 'slot']
    || (SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_attribute AS a
         WHERE a.attrelid = 'treadle.jobs'::regclass AND a.attnum > 0 AND NOT a.attisdropped),
    'job_history has purge_at and slot, then the columns of jobs in their order');
SELECT is((SELECT count(*)::integer FROM pg_inherits WHERE inhparent = 'treadle.job_history'::regclass), 41,
          'job_history has 41 partitions, made at install');

-- bad batches, each refused with nothing changed
SELECT throws_ok($$ SELECT treadle.archive(NULL) $$, '22004', 'treadle: batch must not be null',
                 'archive(null) is refused');
SELECT throws_ok($$ SELECT treadle.archive(0) $$, '22023', 'treadle: batch must be between 1 and 100000, got 0',
                 'archive(0) is refused');
SELECT throws_ok($$ SELECT treadle.archive(100001) $$, '22023', NULL, 'archive(100001) is refused');

-- pg_temp.finished(queue, state, key): a job of queue that ends now in state; its id.
CREATE FUNCTION pg_temp.finished(queue text, state text, key text DEFAULT NULL) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_job treadle.jobs;
BEGIN
    IF state = 'cancelled' THEN
        v_job.id := treadle.enqueue('h', queue => finished.queue, idempotency_key => finished.key);
        PERFORM treadle.cancel(v_job.id);
        RETURN v_job.id;
    END IF;
    PERFORM treadle.enqueue('h', queue => finished.queue, max_attempts => 1, idempotency_key => finished.key,
                            run_at => '2000-01-01 00:00:00+00');
    SELECT * INTO STRICT v_job FROM treadle.claim('w', ARRAY[finished.queue]);
    IF state = 'completed' THEN
        PERFORM treadle.complete(v_job.id, v_job.lease_token, '{"ok": 1}');
    ELSE
        PERFORM treadle.fail(v_job.id, v_job.lease_token, 'boom');
    END IF;
    RETURN v_job.id;
END;
$$;
-- (PL/pgSQL: Citus plans no SQL function's read of a distributed table by a parameter)
CREATE FUNCTION pg_temp.where_is(job_id bigint) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    RETURN CASE WHEN EXISTS (SELECT 1 FROM treadle.jobs AS j WHERE j.id = where_is.job_id) THEN 'jobs'
                WHEN EXISTS (SELECT 1 FROM treadle.job_history AS h WHERE h.id = where_is.job_id) THEN 'history'
                ELSE 'gone' END;
END;
$$;

DELETE FROM treadle.settings;
SET LOCAL treadle.now = '2999-01-01 12:00:00+00';
SELECT pg_temp.finished('h', 'completed') AS completed \gset
SELECT id AS completed_token_job, lease_token AS completed_token FROM treadle.jobs WHERE id = :completed \gset
SELECT pg_temp.finished('h', 'discarded') AS discarded \gset
SELECT pg_temp.finished('h', 'cancelled') AS cancelled \gset
SELECT pg_temp.finished('h', 'completed', 'key-1') AS keyed \gset
SELECT pg_temp.finished('forever', 'completed') AS forever \gset
SELECT treadle.start_workflow('f', steps => ARRAY['a'], queue => 'h') AS run \gset
SELECT treadle.complete(id, lease_token) AS step_done FROM treadle.claim('w', ARRAY['h']) \gset
SELECT id AS step FROM treadle.jobs WHERE workflow_run_id = :run \gset
SELECT treadle.enqueue('waiting', queue => 'h') AS waiting \gset
SELECT id AS running FROM pg_temp.leased() \gset
SELECT treadle.set_queue('forever', retain_completed => '100 years');

SELECT is(treadle.archive(), 0::bigint, 'archive moves nothing that finished less than a minute ago');

SET LOCAL treadle.now = '2999-01-01 12:02:00+00';
SELECT is(treadle.archive(2), 2::bigint, 'archive moves at most batch jobs');
SELECT is(treadle.archive(), 2::bigint, 'and the rest in the next call');
SELECT is(treadle.archive(), 0::bigint, 'then nothing: it caught up');
SELECT results_eq(
    format($$ SELECT pg_temp.where_is(id) FROM unnest(ARRAY[%s, %s, %s, %s]::bigint[]) AS id $$,
           :completed, :discarded, :cancelled, :forever),
    $$ VALUES ('history'), ('history'), ('history'), ('history') $$,
    'completed, discarded and cancelled jobs moved to the history');
SELECT is(pg_temp.where_is(:keyed), 'jobs', 'a job that holds an idempotency key stays in treadle.jobs');
SELECT is(pg_temp.where_is(:step), 'jobs', 'a workflow step stays with its run');
SELECT is(pg_temp.where_is(:waiting) || pg_temp.where_is(:running), 'jobsjobs', 'waiting and running jobs stay');
SELECT is(treadle.enqueue('h', queue => 'h', idempotency_key => 'key-1'), :keyed::bigint,
          'the key still returns its job');

SELECT results_eq(
    $$ SELECT h.id, h.purge_at FROM treadle.job_history AS h ORDER BY h.id $$,
    format($$ SELECT j.id, j.finished_at + r.retain FROM treadle.job_details AS j
                JOIN (VALUES (%s, interval '7 days'), (%s, interval '30 days'),
                             (%s, interval '30 days'), (%s, interval '100 years')) AS r(id, retain)
                  ON r.id = j.id
               ORDER BY j.id $$, :completed, :discarded, :cancelled, :forever),
    'each moved job carries its purge time: finished_at plus its retention (the queue''s, or the global one)');
SELECT is((SELECT slot FROM treadle.job_history WHERE id = :forever), 0::smallint,
          'a purge time beyond the 40 days of partitions goes to partition 0');
SELECT is((SELECT count(*)::integer FROM treadle.history_slots), 2,
          'the completed job''s day and the failures'' day each took a partition');
SELECT is((SELECT ends - starts FROM treadle.history_slots AS s
            JOIN treadle.job_history AS h ON h.slot = s.slot WHERE h.id = :completed), interval '1 day',
          'a partition holds one day of purge times');

-- the readers find them
SELECT results_eq(
    format($$ SELECT id, state, result FROM treadle.job_details WHERE id IN (%s, %s) ORDER BY id $$,
           :completed, :discarded),
    format($$ VALUES (%s::bigint, 'completed', '{"ok": 1}'::jsonb), (%s::bigint, 'discarded', NULL) $$,
           :completed, :discarded),
    'job_details shows moved jobs with their columns');
SELECT ok(EXISTS (SELECT 1 FROM treadle.recent_failures WHERE id = :discarded), 'recent_failures shows a moved failure');
SELECT is((SELECT sum(completed)::integer FROM treadle.throughput), 4,
          'throughput counts moved completions (the keyed job, the step and the forever job too)');
SELECT results_eq(
    $$ SELECT state, jobs FROM treadle.queue_stats WHERE queue = 'h' ORDER BY state $$,
    $$ VALUES ('available', 1::bigint), ('cancelled', 1), ('completed', 3), ('discarded', 1) $$,
    'queue_stats counts jobs in both tables');
SELECT is((SELECT jobs FROM treadle.job_counts() WHERE queue IS NULL AND state = 'completed'), 4::bigint,
          'job_counts counts moved jobs (and the keyed job and the step)');
SELECT is((SELECT reason FROM treadle.explain(:discarded)), 'discarded', 'explain finds a moved job');

-- a finish repeated after its answer was lost is still told what it did
SELECT is(treadle.complete(:completed, :'completed_token'), 'completed',
          'a repeated complete of a moved job returns the state it left');
SELECT is(treadle.cancel(:completed), false, 'cancel of a moved job changes nothing');

-- retry brings a job back to treadle.jobs, as it was but for what retry resets
SELECT is(treadle.retry(:completed), false, 'a completed job in the history is not retried');
CREATE TEMP TABLE moved_discarded AS SELECT * FROM treadle.job_history WHERE id = :discarded;
SELECT is(treadle.retry(:discarded), true, 'a discarded job in the history is retried');
SELECT is(
    (SELECT to_jsonb(j) - ARRAY['state', 'run_at', 'attempt', 'finished_at', 'cancel_requested', 'lease_token',
                                'ready_txid']
       FROM treadle.jobs AS j WHERE j.id = :discarded),
    (SELECT to_jsonb(m) - ARRAY['state', 'run_at', 'attempt', 'finished_at', 'cancel_requested', 'lease_token',
                                'ready_txid', 'purge_at', 'slot']
       FROM moved_discarded AS m),
    'every column comes back as it was in the history, but those retry resets');
SELECT is(pg_temp.where_is(:discarded), 'jobs', 'it is back in treadle.jobs');
SELECT results_eq(
    format($$ SELECT state, attempt, last_error, finished_at FROM treadle.jobs WHERE id = %s $$, :discarded),
    $$ VALUES ('available', 0, 'boom', NULL::timestamptz) $$,
    'available, attempt 0, its last error kept');
SELECT ok(:discarded IN (SELECT id FROM treadle.claim('w', ARRAY['h'], batch => 2)), 'and claimable');

-- retention: the whole partition goes once its day has passed
SET LOCAL treadle.now = '2999-01-08 11:00:00+00';
SELECT is(pg_temp.where_is(:completed), 'history', 'a day before its purge time the job is kept');
SET LOCAL treadle.now = '2999-01-09 00:30:00+00';
SELECT is(treadle.apply_retention(), 3::bigint,
          'apply_retention counts the jobs of the partition it empties, and the keyed job and the run''s step');
SELECT is(pg_temp.where_is(:completed), 'gone', 'the completed job went with its partition');
SELECT is(pg_temp.where_is(:keyed), 'gone', 'the keyed job went from treadle.jobs by its retention');
SELECT is((SELECT count(*)::integer FROM treadle.history_slots), 1, 'the emptied partition is free again');
SELECT is(pg_temp.where_is(:cancelled), 'history', 'the cancelled job (30 days) is kept');

SET LOCAL treadle.now = '2999-02-02 00:00:00+00';
SELECT is(treadle.apply_retention(), 1::bigint, 'after 30 days the failures'' partition goes');
SELECT is(pg_temp.where_is(:cancelled), 'gone', 'with the cancelled job');
SELECT is(pg_temp.where_is(:forever), 'history', 'partition 0 keeps what is not due');
SET LOCAL treadle.now = '3099-02-02 00:00:00+00';
SELECT is(treadle.apply_retention(), 1::bigint, 'partition 0 loses its rows one by one once due');
SELECT is(pg_temp.where_is(:forever), 'gone', 'the job kept 100 years went');

-- prune deletes from the history too
SET LOCAL treadle.now = '3099-02-02 00:00:00+00';
SELECT pg_temp.finished('p', 'completed') AS pruned \gset
SET LOCAL treadle.now = '3099-02-02 00:05:00+00';
SELECT is(treadle.archive(), 1::bigint, 'a job moved');
SELECT is(treadle.prune('1 minute'), 1::bigint, 'prune counts the job it deleted from the history');
SELECT is(pg_temp.where_is(:pruned), 'gone', 'it went');

-- one call empties partitions until its batch is full, so a transaction holds few of them
SET LOCAL treadle.now = '3100-01-01 12:00:00+00';
SELECT pg_temp.finished('b', 'completed') AS b1 \gset
SET LOCAL treadle.now = '3100-01-02 12:00:00+00';
SELECT pg_temp.finished('b', 'completed') AS b2 \gset
SET LOCAL treadle.now = '3100-01-02 12:05:00+00';
SELECT is(treadle.archive(), 2::bigint, 'two jobs moved, to the partitions of two days');
SET LOCAL treadle.now = '3100-01-10 00:30:00+00';
SELECT is(treadle.apply_retention(1), 1::bigint, 'with a batch of 1, one partition is emptied');
SELECT is((SELECT count(*)::integer FROM treadle.history_slots), 1, 'the other waits');
SELECT is(treadle.apply_retention(1), 1::bigint, 'the next call empties it');
SELECT is(pg_temp.where_is(:b1) || pg_temp.where_is(:b2), 'gonegone', 'both jobs went');

SELECT * FROM finish();
ROLLBACK;
