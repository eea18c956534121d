--------------------------------------------------------------------------------
-- Migration 0.3.0 -> 0.4.0, after the definitions.
--------------------------------------------------------------------------------

-- The roles 0.3.0 set up get their parts again, with 0.4.0's functions and views.
SELECT treadle.grant_reader(u.role_name::regrole) FROM treadle_upgrade_parts AS u WHERE 'read' = ANY (u.parts);
SELECT treadle._grant_parts(u.role_name::regrole, u.parts) FROM treadle_upgrade_parts AS u;

-- run operations: the admin part and a dashboard that may act (those that hold the
-- queues part) gain retry_run and fork_run (the runs part).
SELECT treadle._grant_parts(u.role_name::regrole, ARRAY['runs']) FROM treadle_upgrade_parts AS u
 WHERE 'queues' = ANY (u.parts);

-- explain_run names a run's forks
CREATE INDEX workflow_runs_forked_from_idx ON treadle.workflow_runs (forked_from) WHERE forked_from IS NOT NULL;

DROP TABLE treadle_upgrade_parts;
