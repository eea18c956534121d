-- pgtap/054_notify_waiters.sql: the sessions that wait for finishes (treadle.listen_done).
-- What a transaction can show: bad queues and tenants are refused and change nothing,
-- and who may call what. What a finish
-- sends once committed is in tests/sql/test_sql_notify.py.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(12);

\ir helpers.psql

CREATE ROLE waiter_reader;  SELECT treadle.grant_reader('waiter_reader');
CREATE ROLE waiter_tenant;  SELECT treadle.grant_reader('waiter_tenant');  SELECT treadle.set_tenant('waiter_tenant', 'a.');
CREATE ROLE waiter_nobody;

SELECT is((SELECT relpersistence::text FROM pg_class WHERE oid = 'treadle.done_waiters'::regclass), 'u',
          'the waiters table is unlogged: sessions do not outlive a crash');

SELECT throws_ok($$ SELECT treadle.listen_done('') $$, '22023', NULL, 'an empty queue is refused');
SELECT throws_ok($$ SELECT treadle.listen_done('   ') $$, '22023', NULL, 'a blank queue is refused');
SELECT throws_ok($$ SELECT treadle.listen_done(repeat('q', 201)) $$, '22023', NULL, 'a queue over 200 characters is refused');
SELECT throws_ok($$ SELECT treadle.listen_done(E'q\n') $$, '22023', NULL, 'a queue with a control character is refused');
SELECT is(pg_temp.as_role('waiter_tenant', $$ SELECT treadle.listen_done('b.mail') $$), '42501',
          'a tenant may not wait on a queue outside its prefix');
SELECT is((SELECT count(*) FROM treadle.done_waiters), 0::bigint, 'and none of those registered anything');
SELECT lives_ok($$ SELECT treadle.unlisten_done() $$, 'unlisten_done with nothing registered does nothing');

SELECT is(pg_temp.as_role('waiter_reader', $$ SELECT treadle.unlisten_done() $$), 'ok',
          'a reader may wait (and stop waiting)');
SELECT is(pg_temp.as_role('waiter_nobody', $$ SELECT treadle.unlisten_done() $$), '42501',
          'a role without a treadle part may not');
SELECT is(pg_temp.as_role('waiter_reader', $$ SELECT count(*) FROM treadle.done_waiters $$), '42501',
          'no reader reads the waiters table: pids are the owner''s to see');
SELECT is(pg_temp.as_role('waiter_reader', $$ SELECT treadle._notify_done(ARRAY['mail']) $$), '42501',
          'the finish side is the owner''s alone');

SELECT * FROM finish();
ROLLBACK;
