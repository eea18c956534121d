--------------------------------------------------------------------------------
-- treadle._on_citus() -> boolean
--
-- Whether treadle is distributed by Citus here: Citus is loaded (the setting
-- citus.version exists) and treadle._distributed() says so. The guard of the
-- statements that differ on Citus (claim, rescue, a finish's follow-up, the
-- workflow steps' notices). Where Citus is not loaded it is one setting's read:
-- a SQL-standard body, no SET clause, so the planner inlines it into the calling
-- expression, which then costs what the expression written out does (VOLATILE, as
-- treadle._distributed is: a volatile call inside a STABLE body would not be
-- inlined). Raises nothing.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._on_citus()
RETURNS boolean
LANGUAGE sql
VOLATILE
RETURN current_setting('citus.version', true) IS NOT NULL AND treadle._distributed();
COMMENT ON FUNCTION treadle._on_citus() IS
    'Whether treadle is distributed by Citus here (Citus loaded and treadle._distributed()).';
REVOKE ALL ON FUNCTION treadle._on_citus() FROM PUBLIC;
