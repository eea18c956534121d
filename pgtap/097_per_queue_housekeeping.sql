-- pgtap/097_per_queue_housekeeping.sql: apply_retention and archive work queue by queue
-- (each statement names one queue) and still take the oldest jobs across all queues
-- first: a batch of n takes the same n jobs as one read across queues would. Finished
-- workflow runs go the same way, each with its steps (in its queue and in a step's own
-- queue) and its signals.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(12);
\ir helpers.psql

-- pg_temp.done_in(queue, at): a job of `queue` completed at `at`; returns its id
CREATE FUNCTION pg_temp.done_in(queue text, at timestamptz) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_job treadle.jobs;
BEGIN
    PERFORM set_config('treadle.now', at::text, true);
    PERFORM treadle.enqueue('h', queue => done_in.queue, run_at => '2000-01-01 00:00:00+00');
    SELECT * INTO STRICT v_job FROM treadle.claim('w', ARRAY[done_in.queue]);
    PERFORM treadle.complete(v_job.id, v_job.lease_token, queue => done_in.queue);
    RETURN v_job.id;
END;
$$;

-- retention: completed jobs kept 7 days; five old ones, alternating between two queues
DELETE FROM treadle.settings;
CREATE TEMP TABLE old_jobs AS
SELECT n, pg_temp.done_in(CASE WHEN n % 2 = 1 THEN 'hk-a' ELSE 'hk-b' END,
                          timestamptz '2998-12-01 00:00:00+00' + n * interval '1 hour') AS id
  FROM generate_series(1, 5) AS n;
SET LOCAL treadle.now = '2999-01-01 00:00:00+00';
SELECT is(treadle.apply_retention(3), 3::bigint, 'apply_retention(3) deletes three jobs');
SELECT set_eq($$ SELECT n FROM old_jobs WHERE id NOT IN (SELECT id FROM treadle.jobs) $$, ARRAY[1, 2, 3],
              'the three oldest, from both queues');
SELECT is(treadle.apply_retention(3), 2::bigint, 'then the other two');

-- archive: jobs finished two minutes ago and more, alternating between two queues
CREATE TEMP TABLE recent_jobs AS
SELECT n, pg_temp.done_in(CASE WHEN n % 2 = 1 THEN 'hk-c' ELSE 'hk-d' END,
                          timestamptz '2999-01-01 00:00:00+00' + n * interval '1 second') AS id
  FROM generate_series(1, 5) AS n;
SET LOCAL treadle.now = '2999-01-01 00:10:00+00';
SELECT is(treadle.archive(3), 3::bigint, 'archive(3) moves three jobs');
SELECT set_eq($$ SELECT n FROM recent_jobs WHERE id IN (SELECT id FROM treadle.job_history) $$, ARRAY[1, 2, 3],
              'the three oldest, from both queues');
SELECT is(treadle.archive(3), 2::bigint, 'then the other two');

-- workflow runs: completed 30, 20 and 10 days ago in two queues; the oldest has a step
-- in a queue of its own (step_options) and a signal
CREATE FUNCTION pg_temp.run_done_in(queue text, at timestamptz, options jsonb) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_run bigint;
    v_job treadle.jobs;
BEGIN
    PERFORM set_config('treadle.now', at::text, true);
    v_run := treadle.start_workflow('hk-flow', '{}', steps => ARRAY['one', 'two'], queue => run_done_in.queue,
                                    step_options => run_done_in.options);
    INSERT INTO treadle.workflow_signals (run_id, queue, name, payload, sent_at)
    VALUES (v_run, run_done_in.queue, 'ping', '{}', at);
    FOR i IN 1..2 LOOP
        SELECT * INTO STRICT v_job FROM treadle.claim('w', ARRAY[run_done_in.queue, 'hk-side']);
        PERFORM treadle.complete(v_job.id, v_job.lease_token, queue => v_job.queue);
    END LOOP;
    RETURN v_run;
END;
$$;
SELECT pg_temp.run_done_in('hk-ra', '2998-12-01 00:00:00+00', '{"two": {"queue": "hk-side"}}') AS run_a \gset
SELECT pg_temp.run_done_in('hk-rb', '2998-12-10 00:00:00+00', NULL) AS run_b \gset
SELECT pg_temp.run_done_in('hk-ra', '2998-12-20 00:00:00+00', NULL) AS run_c \gset
-- (read apart from is(): on Citus a statement that names one queue goes whole to its shard's node)
SELECT count(*) AS side_steps FROM treadle.jobs WHERE workflow_run_id = :run_a AND queue = 'hk-side' \gset
SELECT is(:side_steps::bigint, 1::bigint, 'the first run''s second step ran in its own queue');
SET LOCAL treadle.now = '2999-01-01 00:00:00+00';
SELECT is(treadle.apply_retention(4), 4::bigint, 'apply_retention(4): the two oldest runs, two steps each');
SELECT results_eq('SELECT id FROM treadle.workflow_runs ORDER BY id', ARRAY[:run_c]::bigint[],
                  'the two oldest runs went, from both queues');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE workflow_run_id IN (:run_a, :run_b)), 0::bigint,
          'with their steps, the one in a queue of its own too');
SELECT results_eq('SELECT run_id FROM treadle.workflow_signals', ARRAY[:run_c]::bigint[], 'and their signals');
SELECT is(treadle.apply_retention(4), 2::bigint, 'then the last run and its steps');

SELECT * FROM finish();
ROLLBACK;
