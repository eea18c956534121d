--------------------------------------------------------------------------------
-- Migration 0.2.0 -> 0.3.0, after the definitions.
--------------------------------------------------------------------------------

-- The roles 0.2.0 set up get their parts again, with 0.3.0's functions and views.
SELECT treadle.grant_reader(u.role_name::regrole) FROM treadle_upgrade_parts AS u WHERE 'read' = ANY (u.parts);
SELECT treadle._grant_parts(u.role_name::regrole, u.parts) FROM treadle_upgrade_parts AS u;

--------------------------------------------------------------------------------
-- queues: the admin part and a dashboard that may act (control without produce)
-- gained set_queue, pause and resume.
--------------------------------------------------------------------------------
SELECT treadle._grant_parts(u.role_name::regrole, ARRAY['queues']) FROM treadle_upgrade_parts AS u
 WHERE 'prune' = ANY (u.parts) OR ('control' = ANY (u.parts) AND NOT 'produce' = ANY (u.parts));

DROP TABLE treadle_upgrade_parts;
