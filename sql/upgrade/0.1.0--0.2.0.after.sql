--------------------------------------------------------------------------------
-- Migration 0.1.0 -> 0.2.0, after the definitions.
--------------------------------------------------------------------------------

-- Helpers 0.2.0 no longer has (the views and defaults that used them are replaced).
DROP FUNCTION treadle._now();
DROP FUNCTION treadle._check_positive(interval, text);
DROP FUNCTION treadle._estimated_jobs(text, text);

-- The roles 0.1.0 set up get the same part again, with 0.2.0's rights.
SELECT CASE u.kind
           WHEN 'worker' THEN treadle.grant_worker(u.role_name::regrole)
           WHEN 'producer' THEN treadle.grant_producer(u.role_name::regrole)
           WHEN 'dashboard' THEN treadle.grant_dashboard(u.role_name::regrole)
           ELSE treadle.grant_dashboard(u.role_name::regrole, read_only => true) END
  FROM treadle_upgrade_roles AS u;
DROP TABLE treadle_upgrade_roles;
