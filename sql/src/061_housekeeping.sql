--------------------------------------------------------------------------------
-- What treadle.archive, treadle.apply_retention and treadle.prune share: which
-- finished jobs may go, and the per-queue read that starts archive's and
-- apply_retention's work. Both work queue by queue (on Citus each statement names
-- one queue, so it runs on that queue's shard) and still take the oldest jobs
-- across all queues first.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._may_go(key_slot) -> boolean
--
-- Whether a finished job may leave treadle.jobs (moved to history or deleted) as
-- far as its concurrency key goes: a failed head that blocks its ordered lane holds
-- its slot (jobs.key_slot) and stays (034_key_lanes.sql). Inlined by the planner.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._may_go(key_slot boolean)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
RETURN _may_go.key_slot IS NOT TRUE;
COMMENT ON FUNCTION treadle._may_go(boolean) IS
    'A finished job may leave treadle.jobs unless it holds a slot of its key (a failed lane head).';

--------------------------------------------------------------------------------
-- treadle._oldest_by_queue(before, batch, expired, retain_completed, retain_failed, now)
--   -> table(queue, jobs, keep_completed, keep_failed)
--
-- The queues of the `batch` oldest finished jobs outside workflow runs that may go
-- (treadle._may_go) and finished before `before`, read without a lock, with how
-- many of them each queue has and its retention of completed and of discarded or
-- cancelled jobs (the queue's, else retain_completed and retain_failed). expired:
-- only jobs whose retention has passed at `now` (apply_retention); else only jobs
-- without an idempotency key (archive: the key stays unique in treadle.jobs).
-- The caller then locks, per queue, as many of that queue's oldest candidates.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._oldest_by_queue(before timestamptz, batch bigint, expired boolean,
                                                    retain_completed interval, retain_failed interval,
                                                    now timestamptz)
RETURNS TABLE (queue text, jobs bigint, keep_completed interval, keep_failed interval)
LANGUAGE plpgsql  -- (not SQL: Citus plans no SQL function's parameterized read of a distributed table)
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT c.queue, count(*), coalesce(q.retain_completed, _oldest_by_queue.retain_completed),
           coalesce(q.retain_failed, _oldest_by_queue.retain_failed)
      FROM (SELECT e.queue
              FROM treadle.jobs AS e
              LEFT JOIN treadle.queues AS s ON s.queue = e.queue
             WHERE e.finished_at < _oldest_by_queue.before
               AND e.workflow_run_id IS NULL
               AND treadle._may_go(e.key_slot)
               AND CASE WHEN _oldest_by_queue.expired
                        THEN e.finished_at < _oldest_by_queue.now
                                             - CASE WHEN e.state = 'completed'
                                                    THEN coalesce(s.retain_completed, _oldest_by_queue.retain_completed)
                                                    ELSE coalesce(s.retain_failed, _oldest_by_queue.retain_failed) END
                        ELSE e.idempotency_key IS NULL END
             ORDER BY e.finished_at
             LIMIT _oldest_by_queue.batch) AS c
      LEFT JOIN treadle.queues AS q ON q.queue = c.queue
     GROUP BY c.queue, q.retain_completed, q.retain_failed;
END;
$$;
COMMENT ON FUNCTION treadle._oldest_by_queue(timestamptz, bigint, boolean, interval, interval, timestamptz) IS
    'The queues of the oldest finished jobs that archive or apply_retention may take, with each queue''s count and retention.';
