--------------------------------------------------------------------------------
-- Workflow versions and rolling deploys. A step job is named
-- 'workflow:<workflow name>/<step>' (050_finish.sql), and a worker claims the
-- step jobs of the steps it has handlers for by those names: such a name holds
-- two names, so job names given to claim and worker_seen may be longer than
-- other names.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._are_job_names(value) -> boolean
--
-- True for a list of job names that claim and worker_seen accept: 1 to 1,000
-- names, one dimension, each as treadle._is_name accepts a name but up to 410
-- characters long ('workflow:', a workflow name, '/' and a step name).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._are_job_names(value text[])
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_name text;
BEGIN
    IF value IS NULL OR cardinality(value) NOT BETWEEN 1 AND 1000 OR array_ndims(value) <> 1 THEN
        RETURN false;
    END IF;
    FOREACH v_name IN ARRAY value LOOP
        IF v_name IS NULL OR btrim(v_name) = '' OR length(v_name) > 410 OR v_name ~ '[[:cntrl:]]' THEN
            RETURN false;
        END IF;
    END LOOP;
    RETURN true;
END;
$$;
COMMENT ON FUNCTION treadle._are_job_names(text[]) IS
    'True for a list of 1 to 1000 job names (step job names included: up to 410 characters each).';

--------------------------------------------------------------------------------
-- treadle._check_job_names(value, argument) -> void
--
-- Raises 22004 when value is null, 22023 when treadle._are_job_names refuses it.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_job_names(value text[], argument text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'treadle: % must not be null', argument
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF cardinality(value) = 0 OR array_ndims(value) <> 1 OR cardinality(value) > 1000 THEN
        RAISE EXCEPTION 'treadle: % must be a list of 1 to 1000 names', argument
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT treadle._are_job_names(value) THEN
        RAISE EXCEPTION 'treadle: % must hold job names of 1 to 410 characters, not only spaces, without control characters',
                        argument
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._check_job_names(text[], text) IS
    'Raise 22004 for a null list of job names, 22023 for an empty, nested or over-long one or a bad name.';
