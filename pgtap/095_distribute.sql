-- pgtap/095_distribute.sql: treadle.distribute on a server without Citus (the normal
-- suite's) refuses with 55000 and changes nothing; bad shard counts raise 22023 first;
-- only the owner may call it. On Citus it is tested by make test-citus (tests/citus).
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(12);

\ir helpers.psql

-- what distribute could change: the tables' kinds, keys and triggers, and Citus's catalog
CREATE TEMP TABLE before AS
SELECT c.oid::regclass::text AS relation, c.relkind, c.relpersistence,
       (SELECT count(*) FROM pg_constraint AS k WHERE k.conrelid = c.oid) AS constraints,
       (SELECT count(*) FROM pg_trigger AS t WHERE t.tgrelid = c.oid) AS triggers
  FROM pg_class AS c
 WHERE c.relnamespace = 'treadle'::regnamespace;

SELECT ok(NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus'), 'this server has no Citus');
SELECT throws_ok($$ SELECT treadle.distribute() $$, '55000',
                 'treadle: distribute needs Citus, and this database has no citus extension',
                 'without Citus, distribute refuses with 55000');
SELECT throws_ok($$ SELECT treadle.distribute(shard_count => 32) $$, '55000', NULL,
                 'with a shard count too');
SELECT throws_ok($$ SELECT treadle.distribute(shard_count => 0) $$, '22023',
                 'treadle: shard_count must be between 1 and 1024, got 0', 'shard_count 0 raises 22023');
SELECT throws_ok($$ SELECT treadle.distribute(shard_count => 1025) $$, '22023', NULL,
                 'shard_count over 1024 raises 22023');
SELECT throws_ok($$ SELECT treadle.distribute(shard_count => -1) $$, '22023', NULL,
                 'a negative shard_count raises 22023');
SELECT set_eq(
    $$ SELECT c.oid::regclass::text, c.relkind, c.relpersistence,
              (SELECT count(*) FROM pg_constraint AS k WHERE k.conrelid = c.oid) AS constraints,
              (SELECT count(*) FROM pg_trigger AS t WHERE t.tgrelid = c.oid) AS triggers
         FROM pg_class AS c WHERE c.relnamespace = 'treadle'::regnamespace $$,
    $$ SELECT * FROM before $$,
    'the refused calls changed none of treadle''s relations');

CREATE ROLE distribute_admin;
SELECT treadle.grant_admin('distribute_admin');
SELECT is(pg_temp.as_role('distribute_admin', $$ SELECT treadle.distribute() $$), '42501',
          'an admin may not call it: owner only');
SELECT is(pg_temp.as_role('distribute_admin', $$ SELECT treadle.distribute(shard_count => 0) $$), '42501',
          'nor learn anything from a bad argument');

-- treadle._on_citus: the one guard of what differs on Citus, inlined where it is called
SELECT is(treadle._on_citus(), false, 'without Citus, treadle._on_citus() is false');
CREATE FUNCTION pg_temp.plan_of(statement text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_line text;
    v_plan text := '';
BEGIN
    FOR v_line IN EXECUTE 'EXPLAIN (VERBOSE, COSTS OFF) ' || statement LOOP
        v_plan := v_plan || v_line || E'\n';
    END LOOP;
    RETURN v_plan;
END;
$$;
SELECT ok(pg_temp.plan_of('SELECT treadle._on_citus()') LIKE '%current_setting(''citus.version''::text, true) IS NOT NULL%'
          AND pg_temp.plan_of('SELECT treadle._on_citus()') NOT LIKE '%_on_citus%',
          'treadle._on_citus() is inlined: a call costs what its expression costs');
SELECT set_eq(
    $$ SELECT p.proname::text FROM pg_proc AS p
        WHERE p.pronamespace = 'treadle'::regnamespace AND p.prosrc LIKE '%citus.version%' $$,
    ARRAY['_distributed', 'enqueue'],
    'the functions that differ on Citus ask treadle._on_citus(), but for _distributed and enqueue''s stricter test');

SELECT * FROM finish();
ROLLBACK;
