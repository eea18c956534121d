--------------------------------------------------------------------------------
-- Migration 0.2.0 -> 0.3.0, before the definitions: what CREATE OR REPLACE
-- cannot do. The functions and views that follow come from sql/src, as in a fresh
-- install; sql/upgrade/0.2.0--0.3.0.after.sql finishes after them.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- cycle: treadle.complete_and_claim and treadle.heartbeat_many are new functions
-- (sql/src/045_cycle.sql); no table changes. Their grants: the .after.sql.
--------------------------------------------------------------------------------
