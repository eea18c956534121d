--------------------------------------------------------------------------------
-- Migration 0.2.0 -> 0.3.0, after the definitions.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- Retention: the roles that may rescue (grant_worker, grant_admin) may also apply
-- retention, as those helpers now grant.
--------------------------------------------------------------------------------
DO $$
DECLARE
    v_role name;
BEGIN
    FOR v_role IN
        SELECT r.rolname
          FROM pg_catalog.pg_proc AS p
         CROSS JOIN aclexplode(p.proacl) AS a
          JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee
         WHERE p.oid = 'treadle.rescue()'::regprocedure AND a.privilege_type = 'EXECUTE'
           AND r.oid <> (SELECT n.nspowner FROM pg_catalog.pg_namespace AS n WHERE n.nspname = 'treadle')
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION treadle.apply_retention(integer) TO %I', v_role);
    END LOOP;
END;
$$;
