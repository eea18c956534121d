--------------------------------------------------------------------------------
-- Migration 0.3.0 -> 0.4.0, before the definitions: what CREATE OR REPLACE
-- cannot do. The functions and views that follow come from sql/src, as in a fresh
-- install; sql/upgrade/0.3.0--0.4.0.after.sql finishes after them.
--------------------------------------------------------------------------------

-- The parts each role was given by 0.3.0's grant helpers, read from the ACL of one
-- function of each part (the role's own entry, not what it reaches by membership).
-- The after-script gives each the same parts again: the views are created anew, and
-- a part may hold functions 0.3.0 did not have.
CREATE TEMPORARY TABLE treadle_upgrade_parts ON COMMIT DROP AS
SELECT r.rolname AS role_name, array_agg(p.part ORDER BY p.part) AS parts
  FROM (VALUES ('read',    'treadle.job_counts(bigint)'),
               ('produce', 'treadle.enqueue_many(jsonb)'),
               ('control', 'treadle.cancel(bigint)'),
               ('work',    'treadle.claimed(uuid)'),
               ('queues',  'treadle.pause(text)'),
               ('recover', 'treadle.rescue()'),
               ('prune',   'treadle.prune(interval)')) AS p(part, signature)
  JOIN pg_catalog.pg_proc AS f ON f.oid = p.signature::regprocedure
 CROSS JOIN pg_catalog.aclexplode(f.proacl) AS a
  JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee
 WHERE a.privilege_type = 'EXECUTE'
   AND r.oid <> (SELECT n.nspowner FROM pg_catalog.pg_namespace AS n WHERE n.nspname = 'treadle')
 GROUP BY r.rolname;

-- Views are created again from sql/src.
DROP VIEW treadle.queue_settings, treadle.schedules, treadle.live_workers, treadle.queue_stats,
          treadle.throughput, treadle.recent_failures, treadle.workflow_run_overview,
          treadle.job_details, treadle.workflow_run_steps;

-- Claim and rescue cursors are composite types now (sql/src/010_tables.sql has the same definitions).
-- A claim cursor (treadle.claim, sql/src/040_claim.sql), kept as this type's text in
-- a session setting. Times are microseconds since 1970 (treadle._us); a lane is the
-- same subscript of the six lane_ arrays.
CREATE TYPE treadle._claim_cursor AS (
    version       integer,   -- of this layout: 1
    taken_at      bigint,    -- when the claim that wrote it ran (a clock that went back voids it)
    swept_at      bigint,    -- when its lanes were last read from the front of the claim index
    plain         boolean,   -- too many lanes: claims are plain until the next sweep (no more fields)
    xmax          bigint,    -- the snapshot the claim read with: it did not see the ids >= xmax,
    xip           bigint[],  -- nor these (its own among them)
    lane_queue    bigint[],  -- the lane's queue: its number among the claim's queues, sorted
    lane_name     bigint[],  -- its name's number among the claim's names, sorted (0: without names)
    lane_priority bigint[],  -- its priority
    lane_run_at   bigint[],  -- the key (run_at, id) below which the lane has nothing left to take
    lane_id       bigint[]
);
COMMENT ON TYPE treadle._claim_cursor IS
    'A session''s claim cursor: its snapshot and, per (queue, name, priority) lane, where claims resume.';

-- A rescue cursor (treadle.rescue, sql/src/050_finish.sql), kept as this type's text
-- in the session setting treadle.rescue_cursor, as a claim cursor is. Times are
-- microseconds since 1970 (treadle._us).
CREATE TYPE treadle._rescue_cursor AS (
    version     integer,  -- of this layout: 1
    taken_at    bigint,   -- the previous rescue's now (a clock that went back voids the cursor)
    floor       bigint,   -- rescues read the leases that ran out at or above it (null: all)
    next_floor  bigint,   -- where the floor moves once the transactions below have ended
    newest_xid  bigint,   -- the newest transaction id running when next_floor was set (null: none)
    swept_at    bigint    -- when a rescue last read from the floor
);
COMMENT ON TYPE treadle._rescue_cursor IS
    'A session''s rescue cursor: the floor of the expired leases its rescues read, and where it moves next.';
