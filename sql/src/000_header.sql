-- treadle: a job queue and step-workflow engine inside PostgreSQL.
--
-- Every state transition is a function in schema treadle; docs/concepts.md draws
-- the state machine. Every write after a claim names the job and the lease token
-- that claim returned, so a worker that lost its lease can never overwrite what a
-- rescuer or another worker did. Bad arguments raise 22004 (null_value_not_allowed)
-- or 22023 (invalid_parameter_value) and change nothing.

-- Install only into a schema the installing role owns and that holds nothing yet: a
-- schema made beforehand by another role would let that role plant objects (an
-- overload, an operator) that the functions below would then run as their owner.
DO $$
DECLARE
    v_owner name;
BEGIN
    SELECT pg_catalog.pg_get_userbyid(n.nspowner) INTO v_owner
      FROM pg_catalog.pg_namespace AS n WHERE n.nspname = 'treadle';
    IF v_owner IS DISTINCT FROM current_user THEN
        RAISE EXCEPTION 'treadle: schema treadle belongs to role %, not to %', v_owner, current_user
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Drop that schema first, or install as the role that owns it.';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_class AS c WHERE c.relnamespace = 'treadle'::regnamespace)
       OR EXISTS (SELECT 1 FROM pg_catalog.pg_proc AS p WHERE p.pronamespace = 'treadle'::regnamespace)
       OR EXISTS (SELECT 1 FROM pg_catalog.pg_type AS t WHERE t.typnamespace = 'treadle'::regnamespace)
       OR EXISTS (SELECT 1 FROM pg_catalog.pg_operator AS o WHERE o.oprnamespace = 'treadle'::regnamespace) THEN
        RAISE EXCEPTION 'treadle: schema treadle already holds objects'
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'treadle installs into a new or empty schema treadle.';
    END IF;
END;
$$;

-- Nobody but the owner creates objects in the schema; roles get USAGE from the grant helpers.
REVOKE ALL ON SCHEMA treadle FROM PUBLIC;
