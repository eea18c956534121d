--------------------------------------------------------------------------------
-- Views: the read interface for dashboards and monitoring. Finished jobs are in
-- treadle.jobs and, once archived, in treadle.job_history: the views read both.
--------------------------------------------------------------------------------

-- One row per queue and state present, with the age of the queue's oldest
-- claimable job (null when it has none): a growing age is the first sign of trouble.
-- The clock is read once, in a materialized CTE: on Citus that CTE runs on the
-- coordinator (where the session's settings, treadle.now among them, apply) and the
-- worker nodes compare against its value instead of reading their own clock.
CREATE VIEW treadle.queue_stats WITH (security_invoker = true) AS
WITH clock AS MATERIALIZED (
    SELECT treadle.now() AS now
), counts AS (
    SELECT j.queue, j.state, count(*) AS jobs
      FROM (SELECT j.queue, j.state FROM treadle.jobs AS j
            UNION ALL
            SELECT h.queue, h.state FROM treadle.job_history AS h) AS j
     GROUP BY j.queue, j.state
), ages AS (
    SELECT j.queue, c.now - min(j.run_at) AS oldest_available_age
      FROM treadle.jobs AS j
      JOIN clock AS c ON j.run_at <= c.now
     WHERE j.state = ANY (ARRAY['available', 'retryable'])
     GROUP BY j.queue, c.now
)
SELECT c.queue, c.state, c.jobs, a.oldest_available_age
  FROM counts AS c
  LEFT JOIN ages AS a ON a.queue = c.queue
 ORDER BY c.queue, c.state;
COMMENT ON VIEW treadle.queue_stats IS
    'Jobs per queue and state, with the age of each queue''s oldest claimable job.';

-- Jobs finished per minute over the last hour, every minute present.
CREATE VIEW treadle.throughput WITH (security_invoker = true) AS
SELECT m.minute,
       count(*) FILTER (WHERE j.state = 'completed') AS completed,
       count(*) FILTER (WHERE j.state = 'discarded') AS discarded
  FROM generate_series(date_trunc('minute', treadle.now()) - interval '59 minutes',
                       date_trunc('minute', treadle.now()),
                       interval '1 minute') AS m(minute)
  LEFT JOIN (SELECT j.state, j.finished_at FROM treadle.jobs AS j
              WHERE j.finished_at >= date_trunc('minute', treadle.now()) - interval '59 minutes'
             UNION ALL
             SELECT h.state, h.finished_at FROM treadle.job_history AS h
              WHERE h.finished_at >= date_trunc('minute', treadle.now()) - interval '59 minutes') AS j
    ON j.finished_at >= m.minute
   AND j.finished_at < m.minute + interval '1 minute'
   AND j.state = ANY (ARRAY['completed', 'discarded'])
 GROUP BY m.minute
 ORDER BY m.minute;
COMMENT ON VIEW treadle.throughput IS
    'Completed and discarded jobs per minute over the last hour.';

-- Jobs that failed and will retry, or were discarded, newest failure first.
CREATE VIEW treadle.recent_failures WITH (security_invoker = true) AS
SELECT j.id, j.queue, j.name, j.state, j.attempt, j.max_attempts, j.last_error, j.failed_at,
       j.workflow_run_id, j.step
  FROM treadle.jobs AS j
 WHERE j.state = ANY (ARRAY['retryable', 'discarded'])
   AND j.last_error IS NOT NULL
UNION ALL
SELECT h.id, h.queue, h.name, h.state, h.attempt, h.max_attempts, h.last_error, h.failed_at,
       h.workflow_run_id, h.step
  FROM treadle.job_history AS h
 WHERE h.state = 'discarded'
   AND h.last_error IS NOT NULL
 ORDER BY failed_at DESC, id DESC;
COMMENT ON VIEW treadle.recent_failures IS
    'Retryable and discarded jobs with an error, newest failure first.';

-- Workflow runs with their current step and how far they have come; a child run
-- names its parent run and the parent's step that started it. The current step is
-- the newest step job in the run's own queue: the join names the queue, so that on
-- Citus it stays within the run's shard (a step whose step_options give it another
-- queue is not the current step while it runs).
CREATE VIEW treadle.workflow_run_overview WITH (security_invoker = true) AS
SELECT r.id, r.name, r.state,
       cur.step AS current_step,
       (SELECT count(*) FROM jsonb_object_keys(r.results))::integer AS steps_done,
       cardinality(r.steps) AS steps_total,
       r.created_at, r.finished_at,
       r.steps, r.input,
       r.parent_run_id, r.parent_step
  FROM treadle.workflow_runs AS r
  LEFT JOIN LATERAL (
        SELECT j.step FROM treadle.jobs AS j
         WHERE j.workflow_run_id = r.id AND j.queue = r.queue
         ORDER BY j.id DESC
         LIMIT 1) AS cur ON true
 ORDER BY r.id DESC;
COMMENT ON VIEW treadle.workflow_run_overview IS
    'Workflow runs: state, current step, steps done of total.';
