-- pgtap/094_policy_prefix.sql: the row-level security policies read the reader's tenant
-- prefix through treadle._reader_prefix, with no subquery (Citus distributes no table
-- whose policy has one), once per plan. A cached plan never keeps a prefix that no
-- longer holds: a change of role or of the tenants plans it again.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(16);
\ir helpers.psql

SELECT is_empty($$
    SELECT p.polrelid::regclass || ' ' || p.polname FROM pg_policy AS p
     WHERE p.polrelid::regclass::text LIKE 'treadle.%'
       AND pg_get_expr(p.polqual, p.polrelid) ~* '\mselect\M'
$$, 'no policy of treadle''s tables has a subquery');
SELECT is((SELECT count(*) FROM pg_policy AS p
            WHERE pg_get_expr(p.polqual, p.polrelid) LIKE '%treadle._reader_prefix()%'), 9::bigint,
          'the nine policies read treadle._reader_prefix()');
SELECT volatility_is('treadle', '_reader_prefix', ARRAY[]::text[], 'immutable',
                     'treadle._reader_prefix is computed once per plan');
SELECT is(treadle._all_start_with(ARRAY['a.1', 'a.2'], 'a.'), true, '_all_start_with: every name has the prefix');
SELECT is(treadle._all_start_with(ARRAY['a.1', 'b.2'], 'a.'), false, '_all_start_with: one has not');
SELECT is(treadle._all_start_with(ARRAY[]::text[], 'a.'), true, '_all_start_with: no names');

CREATE ROLE pp_reader;
SELECT treadle.grant_reader('pp_reader');
SELECT treadle.enqueue('x', queue => 'a.one');
SELECT treadle.enqueue('x', queue => 'a.two');
SELECT treadle.enqueue('x', queue => 'b.one');

-- the reader's plan is generic (made once, then reused) and cached
SET plan_cache_mode = force_generic_plan;
SET ROLE pp_reader;
PREPARE visible AS SELECT array_agg(queue ORDER BY queue) FROM treadle.jobs WHERE state = $1;
RESET ROLE;

CREATE FUNCTION pg_temp.visible() RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE
    v text[];
BEGIN
    SET LOCAL ROLE pp_reader;
    EXECUTE 'EXECUTE visible(''available'')' INTO v;
    RESET ROLE;
    RETURN v;
END;
$$;
SELECT is(pg_temp.visible(), ARRAY['a.one', 'a.two', 'b.one'], 'a role that is not a tenant sees every queue');
SELECT is(pg_temp.visible(), ARRAY['a.one', 'a.two', 'b.one'], 'so does the same plan again');

SELECT treadle.set_tenant('pp_reader', 'a.');
SELECT is(pg_temp.visible(), ARRAY['a.one', 'a.two'], 'made a tenant, its cached plan shows only its queues');
SELECT treadle.set_tenant('pp_reader', 'b.');
SELECT is(pg_temp.visible(), ARRAY['b.one'], 'a new prefix holds at once');
UPDATE treadle.tenants SET queue_prefix = 'a.t' WHERE tenant_role = 'pp_reader'::regrole;
SELECT is(pg_temp.visible(), ARRAY['a.two'], 'so does a row the owner changed by hand');
SELECT treadle.set_tenant('pp_reader', NULL);
SELECT is(pg_temp.visible(), ARRAY['a.one', 'a.two', 'b.one'], 'the rule lifted, it sees every queue again');
TRUNCATE treadle.tenants;
SELECT is(pg_temp.visible(), ARRAY['a.one', 'a.two', 'b.one'], 'TRUNCATE of the tenants keeps that');

-- a role change plans again too: another tenant reading through the same session
CREATE ROLE pp_other;
SELECT treadle.grant_reader('pp_other');
SELECT treadle.set_tenant('pp_other', 'b.');
SELECT is(pg_temp.visible(), ARRAY['a.one', 'a.two', 'b.one'], 'the reader still sees every queue');
SET ROLE pp_other;
SELECT is((SELECT array_agg(queue ORDER BY queue) FROM treadle.jobs), ARRAY['b.one'], 'the other tenant sees its own');
RESET ROLE;

-- bad input: set_tenant refuses
SELECT throws_ok($$ SELECT treadle.set_tenant(NULL, 'a.') $$, '22004', NULL, 'set_tenant(null role) raises 22004');

SELECT * FROM finish();
ROLLBACK;
