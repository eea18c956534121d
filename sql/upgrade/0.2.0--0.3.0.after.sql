--------------------------------------------------------------------------------
-- Migration 0.2.0 -> 0.3.0, after the definitions.
--------------------------------------------------------------------------------

-- The rights held on the views and functions that were dropped and created again
-- (treadle_upgrade_rights, from 0.2.0--0.3.0.sql), given back: a role that could
-- enqueue or fail still can (and may now snooze, as fail's holders are workers).
DO $$
DECLARE
    v_right record;
BEGIN
    FOR v_right IN
        SELECT DISTINCT t.privilege_type, t.grantee, o.target
          FROM treadle_upgrade_rights AS t
         CROSS JOIN LATERAL unnest(CASE t.object
                   WHEN 'enqueue' THEN ARRAY['FUNCTION treadle.enqueue(text, jsonb, text, integer, timestamptz, integer, '
                                             'text, interval, interval, interval[])']
                   WHEN 'fail' THEN ARRAY['FUNCTION treadle.fail(bigint, uuid, text, interval, boolean)',
                                          'FUNCTION treadle.snooze(bigint, uuid, interval)']
                   ELSE ARRAY['TABLE ' || t.object] END) AS o(target)
    LOOP
        EXECUTE format('GRANT %s ON %s TO %s', v_right.privilege_type, v_right.target,
                       CASE WHEN v_right.grantee = 0 THEN 'PUBLIC'
                            ELSE v_right.grantee::regrole::text END);  -- regrole quotes as needed
    END LOOP;
END;
$$;
DROP TABLE treadle_upgrade_rights;

-- A role that reads the jobs' columns (treadle.grant_reader: all but lease_token) reads
-- the new ones too.
DO $$
DECLARE
    v_grantee oid;
BEGIN
    FOR v_grantee IN
        SELECT DISTINCT a.grantee
          FROM pg_catalog.pg_attribute AS c
         CROSS JOIN LATERAL pg_catalog.aclexplode(c.attacl) AS a
         WHERE c.attrelid = 'treadle.jobs'::regclass AND c.attname = 'id' AND a.privilege_type = 'SELECT'
    LOOP
        EXECUTE format('GRANT SELECT (timeout, backoff) ON treadle.jobs TO %s',
                       CASE WHEN v_grantee = 0 THEN 'PUBLIC' ELSE v_grantee::regrole::text END);
    END LOOP;
END;
$$;
