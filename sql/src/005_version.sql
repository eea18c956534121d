--------------------------------------------------------------------------------
-- treadle.version() -> text
--
-- The version of the installed SQL API; clients check it when they connect.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.version()
RETURNS text
LANGUAGE sql
IMMUTABLE
BEGIN ATOMIC
    SELECT '@EXTVERSION@'::text;
END;
COMMENT ON FUNCTION treadle.version() IS 'The version of the installed treadle SQL API.';

