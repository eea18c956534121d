-- pgtap/095_no_volatile_writes.sql: no write to the tables Citus distributes (jobs,
-- workflow_runs, job_history, workflow_signals) or to the queues holds a volatile call
-- (the clock, a token, jitter, an id from a sequence) or a CASE or COALESCE around the
-- clock: Citus refuses both in a distributed UPDATE. The functions compute them into
-- variables first. A check of every statement of every function's text.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(4);

-- pg_temp.volatile_write(statement): whether one statement writes one of those
-- tables with a volatile value, or the clock under a CASE or COALESCE
CREATE FUNCTION pg_temp.volatile_write(stmt text) RETURNS boolean LANGUAGE sql AS $$
    SELECT stmt ~* '^\s*(UPDATE|INSERT|WITH|DELETE)\M'
       AND stmt ~* '\m(UPDATE|INSERT INTO)\s+treadle\.(jobs|workflow_runs|job_history|queues|workflow_signals)\M'
       AND (stmt ~* '(CASE|coalesce)[^;]*\m(v_now|at|_at)\s*[-+]'
            OR stmt ~* '(treadle\.now\(\)|nextval\(|\mrandom\(|gen_random_uuid\(|_retry_delay\(|_jitter\(|_backoff\(|clock_timestamp\()')
$$;
SELECT ok(pg_temp.volatile_write('UPDATE treadle.jobs AS j SET finished_at = treadle.now() WHERE j.id = 1'),
          'the check sees the clock inside an UPDATE');
SELECT ok(pg_temp.volatile_write(E'\n    UPDATE treadle.jobs AS j\n SET run_at = CASE WHEN j.x THEN v_now + d END'),
          'and the clock under a CASE');
SELECT ok(NOT pg_temp.volatile_write('UPDATE treadle.jobs AS j SET finished_at = v_now WHERE j.id = 1'),
          'and not a value computed before');

-- None is left (enqueue_many's rows draw their ids before the INSERT: 031_enqueue_rows.sql).
SELECT is_empty($$
    SELECT DISTINCT p.proname::text
      FROM pg_proc AS p
     CROSS JOIN LATERAL regexp_split_to_table(regexp_replace(p.prosrc, '--[^\n]*', '', 'g'), ';') AS s(stmt)
     WHERE p.pronamespace = 'treadle'::regnamespace AND pg_temp.volatile_write(s.stmt) $$,
    'no other function writes a volatile value, or the clock under a CASE, inside a statement');

SELECT * FROM finish();
ROLLBACK;
