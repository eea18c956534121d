-- pgtap/097_per_queue_housekeeping.sql: apply_retention and archive work queue by queue
-- (each statement names one queue) and still take the oldest jobs across all queues
-- first: a batch of n takes the same n jobs as one read across queues would.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(6);
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

SELECT * FROM finish();
ROLLBACK;
