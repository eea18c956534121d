-- pgtap/093_queue_keys.sql: keys that include the queue (sql/src/010_tables.sql), so
-- that Citus can distribute the tables by queue. Primary keys are (id, queue), id
-- first; every unique index names the queue; a run's steps have no foreign key and
-- go with their run all the same (prune, apply_retention), in any queue.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(22);
\ir helpers.psql

SELECT col_is_pk('treadle', 'jobs', ARRAY['id', 'queue'], 'jobs: primary key (id, queue)');
SELECT col_is_pk('treadle', 'workflow_runs', ARRAY['id', 'queue'], 'workflow_runs: primary key (id, queue)');
SELECT col_is_pk('treadle', 'workflow_signals', ARRAY['id', 'queue'], 'workflow_signals: primary key (id, queue)');
SELECT fk_ok('treadle', 'workflow_signals', ARRAY['run_id', 'queue'], 'treadle', 'workflow_runs', ARRAY['id', 'queue'],
             'a signal references its run by (id, queue)');
SELECT is((SELECT confdeltype FROM pg_constraint WHERE conname = 'workflow_signals_run_id_fkey'), 'c'::"char",
          'and goes with it (ON DELETE CASCADE)');
SELECT is((SELECT count(*) FROM pg_constraint WHERE conrelid = 'treadle.jobs'::regclass AND contype = 'f'), 0::bigint,
          'jobs has no foreign key (a step may run in another queue than its run)');
SELECT is_empty($$
    SELECT i.indexrelid::regclass::text
      FROM pg_index AS i
     WHERE i.indrelid = ANY (ARRAY['treadle.jobs', 'treadle.workflow_runs', 'treadle.workflow_signals',
                                   'treadle.job_history']::regclass[])
       AND i.indisunique
       AND NOT EXISTS (SELECT FROM pg_attribute AS a
                        WHERE a.attrelid = i.indrelid AND a.attname = 'queue' AND a.attnum = ANY (i.indkey))
$$, 'every unique index of jobs, workflow_runs, workflow_signals and job_history includes the queue');

-- a lookup by id alone reads the primary key (id leads it)
CREATE FUNCTION pg_temp.plan(query text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_line text;
    v_plan text := '';
BEGIN
    FOR v_line IN EXECUTE 'EXPLAIN ' || query LOOP
        v_plan := v_plan || v_line || E'\n';
    END LOOP;
    RETURN v_plan;
END;
$$;
SET LOCAL enable_seqscan = off;
SET LOCAL enable_bitmapscan = off;
SELECT matches(pg_temp.plan('SELECT * FROM treadle.jobs WHERE id = 1'),
               'jobs_pkey', 'a job read by id alone uses the primary key');
SELECT matches(pg_temp.plan('SELECT * FROM treadle.workflow_runs WHERE id = 1'),
               'workflow_runs_pkey', 'a run read by id alone uses the primary key');
RESET enable_seqscan;
RESET enable_bitmapscan;

-- pg_temp.finish_run(run): claims and completes the run's steps, queue by queue, until
-- none is left to claim; returns the run's state.
CREATE FUNCTION pg_temp.finish_run(run_id bigint) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_job treadle.jobs;
    v_queue text;
BEGIN
    LOOP
        SELECT j.queue INTO v_queue FROM treadle.jobs AS j
         WHERE j.workflow_run_id = finish_run.run_id AND j.state = 'available' LIMIT 1;
        EXIT WHEN NOT FOUND;
        SELECT * INTO STRICT v_job FROM treadle.claim('w', ARRAY[v_queue]);
        PERFORM treadle.complete(v_job.id, v_job.lease_token);
    END LOOP;
    RETURN (SELECT r.state FROM treadle.workflow_runs AS r WHERE r.id = finish_run.run_id);
END;
$$;
-- pg_temp.left_of(run): how many rows of the run are left: the run, its steps, its signals
CREATE FUNCTION pg_temp.left_of(run_id bigint) RETURNS bigint[] LANGUAGE sql AS $$
    SELECT ARRAY[(SELECT count(*) FROM treadle.workflow_runs AS r WHERE r.id = run_id),
                 (SELECT count(*) FROM treadle.jobs AS j WHERE j.workflow_run_id = run_id),
                 (SELECT count(*) FROM treadle.workflow_signals AS s WHERE s.run_id = left_of.run_id)]
$$;

-- Ten days ago: three runs, each with a step in another queue and a signal kept
SET LOCAL treadle.now = '2998-12-22 12:00:00+00';
SELECT treadle.start_workflow('away', steps => ARRAY['a', 'b'], queue => 'home1',
                              step_options => '{"b": {"queue": "away1"}}') AS retained_run \gset
SELECT treadle.start_workflow('away', steps => ARRAY['a', 'b'], queue => 'home2',
                              step_options => '{"b": {"queue": "away2"}}') AS pruned_run \gset
SELECT treadle.start_workflow('away', steps => ARRAY['a', 'b'], queue => 'home3',
                              step_options => '{"b": {"queue": "away3"}}') AS running_run \gset
INSERT INTO treadle.workflow_signals (run_id, queue, name, payload, sent_at)
SELECT r.id, r.queue, 'never', '{}', treadle.now() FROM treadle.workflow_runs AS r
 WHERE r.id IN (:retained_run, :pruned_run, :running_run);
SELECT throws_ok(format($$ INSERT INTO treadle.workflow_signals (run_id, queue, name, payload, sent_at)
                           VALUES (%s, 'elsewhere', 'x', '{}', now()) $$, :pruned_run),
                 '23503', NULL, 'a signal in another queue than its run''s is refused');
SELECT is(pg_temp.finish_run(:retained_run), 'completed', 'a run with a step in another queue completes');
SELECT is(pg_temp.finish_run(:pruned_run), 'completed', 'so does the second');
SELECT is((SELECT array_agg(DISTINCT j.queue ORDER BY j.queue) FROM treadle.jobs AS j WHERE j.workflow_run_id = :pruned_run),
          ARRAY['away2', 'home2'], 'its steps ran in two queues');
SELECT is(pg_temp.left_of(:pruned_run), ARRAY[1, 2, 1]::bigint[], 'the run, two steps and a signal are there');

-- Now: retention (7 days for completed work), one run per batch of two jobs
SET LOCAL treadle.now = '2999-01-01 12:00:00+00';
SELECT is(treadle.apply_retention(2), 2::bigint, 'apply_retention(2) deletes the oldest run''s two steps');
SELECT is(pg_temp.left_of(:retained_run), ARRAY[0, 0, 0]::bigint[],
          'the run goes with both its steps (one in another queue) and its signal');
SELECT is(pg_temp.left_of(:pruned_run), ARRAY[1, 2, 1]::bigint[], 'the next run waits for the next batch');

SELECT is(treadle.prune('11 days'), 0::bigint, 'prune with a longer cutoff deletes nothing');
SELECT is(treadle.prune('7 days'), 2::bigint, 'prune deletes the finished run''s two steps');
SELECT is(pg_temp.left_of(:pruned_run), ARRAY[0, 0, 0]::bigint[],
          'the run goes with both its steps (one in another queue) and its signal');
SELECT is(pg_temp.left_of(:running_run), ARRAY[1, 1, 1]::bigint[], 'a running run stays whole');

-- a child step starts one run: the parent's row fixes the child's queue, so the
-- unique index over (parent_run_id, parent_step, queue) lets no second run in
SELECT r.queue AS running_queue FROM treadle.workflow_runs AS r WHERE r.id = :running_run \gset
INSERT INTO treadle.workflow_runs (name, steps, queue, priority, max_attempts, created_at, parent_run_id, parent_step,
                                   parent_queue)
VALUES ('child', ARRAY['x'], 'kids', 0, 1, treadle.now(), :running_run, 'spawn', :'running_queue');
SELECT throws_ok(format($$ INSERT INTO treadle.workflow_runs
                               (name, steps, queue, priority, max_attempts, created_at, parent_run_id, parent_step,
                                parent_queue)
                           VALUES ('child', ARRAY['x'], 'kids', 0, 1, now(), %s, 'spawn', %L) $$,
                        :running_run, :'running_queue'),
                 '23505', NULL, 'a second child run of the same step is refused');

SELECT * FROM finish();
ROLLBACK;
