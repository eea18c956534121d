--------------------------------------------------------------------------------
-- Migration 0.1.0 -> 0.2.0: what CREATE OR REPLACE cannot do. The function and
-- view definitions that follow this file come from sql/src, as in a fresh install.
--------------------------------------------------------------------------------

-- Views are created again from sql/src.
DROP VIEW treadle.queue_stats, treadle.throughput, treadle.recent_failures,
          treadle.workflow_run_overview, treadle.job_details, treadle.workflow_run_steps,
          treadle.live_workers;
