-- pgtap/072_schedules.sql: cron schedules. The parser's fields and refusals,
-- cron_next's rules (Vixie day rule, clock changes), schedule's idempotent create
-- and replace, the next occurrence written by the finish of the previous one,
-- missed times (once, or every one with catch_up), unschedule, bad inputs that
-- write nothing, tenants.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(105);
\ir helpers.psql

SET LOCAL timezone = 'UTC';

--------------------------------------------------------------------------------
-- The parser
--------------------------------------------------------------------------------
SELECT is(treadle._cron_field('*/15', 1), ARRAY[0, 15, 30, 45], 'minutes */15');
SELECT is(treadle._cron_field('1-5,20-22/2', 2), ARRAY[1, 2, 3, 4, 5, 20, 22], 'hours: a list of ranges, one with a step');
SELECT is(treadle._cron_field('1/10', 3), ARRAY[1, 11, 21, 31], 'days: a/n runs from a to the end');
SELECT is(treadle._cron_field('JAN,jul-Sep', 4), ARRAY[1, 7, 8, 9], 'months by name, any case');
SELECT is(treadle._cron_field('fri-sun', 5), ARRAY[0, 5, 6], 'a weekday range may end on Sunday');
SELECT is(treadle._cron_field('7', 5), ARRAY[0], '7 is Sunday');
SELECT is(treadle._cron_field('*', 5), ARRAY[0, 1, 2, 3, 4, 5, 6], 'every weekday once');
SELECT results_eq($$ SELECT minutes, hours, days, months, weekdays, day_or, real_time FROM treadle._cron_parse('@weekly') $$,
                  $$ VALUES (ARRAY[0], ARRAY[0], ARRAY(SELECT generate_series(1, 31)), ARRAY(SELECT generate_series(1, 12)),
                             ARRAY[0], false, false) $$,
                  '@weekly is 0 0 * * 0');
SELECT is((treadle._cron_parse('0 0 13 * fri')).day_or, true, 'both day fields restricted: either matches');
SELECT is((treadle._cron_parse('0 0 */2 * fri')).day_or, false, 'a day field starting with * is not restricted');
SELECT is((treadle._cron_parse('*/5 * * * *')).real_time, true, 'an hour field of * follows real time');
SELECT is((treadle._cron_parse('0 */2 * * *')).real_time, false, 'any other hour field keeps to the wall clock');

-- refusals: 22023 with a message naming the field
SELECT throws_ok($$ SELECT treadle.cron_next('0 0 * *') $$, '22023', NULL, 'four fields raise 22023');
SELECT throws_ok($$ SELECT treadle.cron_next('0 0 0 * * *') $$, '22023', NULL, 'six fields (seconds) raise 22023');
SELECT throws_ok($$ SELECT treadle.cron_next('60 * * * *') $$, '22023', NULL, 'minute 60 raises 22023');
SELECT throws_ok($$ SELECT treadle.cron_next('* 24 * * *') $$, '22023', NULL, 'hour 24 raises 22023');
SELECT throws_ok($$ SELECT treadle.cron_next('* * 0 * *') $$, '22023', NULL, 'day 0 raises 22023');
SELECT throws_ok($$ SELECT treadle.cron_next('* * 32 * *') $$, '22023', NULL, 'day 32 raises 22023');
SELECT throws_ok($$ SELECT treadle.cron_next('* * * 13 *') $$, '22023', NULL, 'month 13 raises 22023');
SELECT throws_ok($$ SELECT treadle.cron_next('* * * * 8') $$, '22023', NULL, 'weekday 8 raises 22023');
SELECT throws_ok($$ SELECT treadle.cron_next('*/0 * * * *') $$, '22023', NULL, 'a step of 0 raises 22023');
SELECT throws_ok($$ SELECT treadle.cron_next('30-10 * * * *') $$, '22023', NULL, 'a reversed range raises 22023');
SELECT throws_ok($$ SELECT treadle.cron_next('0 0 L * *') $$, '22023', NULL, 'L (Quartz) raises 22023');
SELECT throws_ok($$ SELECT treadle.cron_next('0 0 ? * *') $$, '22023', NULL, '? (Quartz) raises 22023');
SELECT throws_ok($$ SELECT treadle.cron_next('0 0 * * mon#1') $$, '22023', NULL, '# (Quartz) raises 22023');
SELECT throws_ok($$ SELECT treadle.cron_next('0 0 * jan-foo *') $$, '22023', NULL, 'an unknown name raises 22023');
SELECT throws_ok($$ SELECT treadle.cron_next('0 0 * * jan') $$, '22023', NULL, 'a month name among weekdays raises 22023');
SELECT throws_ok($$ SELECT treadle.cron_next('@reboot') $$, '22023', NULL, '@reboot raises 22023');
SELECT throws_ok($$ SELECT treadle.cron_next('1,,2 * * * *') $$, '22023', NULL, 'an empty list item raises 22023');
SELECT throws_ok($$ SELECT treadle.cron_next(E'0\t0 * * *') $$, '22023', NULL, 'a tab (a control character) raises 22023');
SELECT throws_ok($$ SELECT treadle.cron_next(repeat('1,', 100) || '1 * * * *') $$, '22023', NULL, 'over 200 characters raises 22023');
SELECT throws_ok($$ SELECT treadle.cron_next(NULL) $$, '22004', NULL, 'a null cron raises 22004');
SELECT throws_ok($$ SELECT treadle.cron_next('* * * * *', NULL) $$, '22004', NULL, 'a null tz raises 22004');
SELECT throws_ok($$ SELECT treadle.cron_next('* * * * *', 'UTC', NULL) $$, '22004', NULL, 'a null after raises 22004');
SELECT throws_ok($$ SELECT treadle.cron_next('* * * * *', 'Mars/Olympus_Mons') $$, '22023', NULL, 'an unknown zone raises 22023');
SELECT throws_ok($$ SELECT treadle.cron_next('* * * * *', 'CET') $$, '22023', NULL,
                 'a zone name PostgreSQL reads as a fixed abbreviation raises 22023');
SELECT throws_ok($$ SELECT treadle.cron_next('* * * * *', 'UTC+3') $$, '22023', NULL, 'a POSIX rule raises 22023');
SELECT throws_ok($$ SELECT treadle.cron_next('* * * * *', 'UTC', 'infinity') $$, '22023', NULL, 'an infinite after raises 22023');

--------------------------------------------------------------------------------
-- cron_next: the day rule and the clock changes
--------------------------------------------------------------------------------
SELECT is(treadle.cron_next('0 0 13 * fri', 'UTC', '2024-01-01 00:00+00'), '2024-01-05 00:00+00'::timestamptz,
          'the 13th or a Friday: the first Friday comes first (Vixie)');
SELECT is(treadle.cron_next('0 0 */2 * mon', 'UTC', '2024-01-01 00:00+00'), '2024-01-15 00:00+00'::timestamptz,
          'odd days that are Mondays when the day field starts with *');
SELECT is(treadle.cron_next('0 0 29 2 *', 'UTC', '2097-01-01 00:00+00'), '2104-02-29 00:00+00'::timestamptz,
          'the 29th of February, across 2100 (not a leap year)');
SELECT is(treadle.cron_next('0 0 30 2 *', 'UTC', '2024-01-01 00:00+00'), NULL, 'the 30th of February never comes: null');
SELECT is(treadle.cron_next('30 2 * * *', 'America/New_York', '2024-03-09 12:00+00'), '2024-03-10 07:00+00'::timestamptz,
          'spring forward: 02:30 is skipped, the job runs once when the clocks jump (03:00 EDT)');
SELECT is(treadle.cron_next('30 1 * * *', 'America/New_York', '2024-11-03 05:30+00'), '2024-11-04 06:30+00'::timestamptz,
          'fall back: after 01:30 EDT, 01:30 EST does not run again');
SELECT is(treadle.cron_next('0 * * * *', 'America/New_York', '2024-11-03 05:00+00'), '2024-11-03 06:00+00'::timestamptz,
          'fall back: an hourly job runs in the repeated hour too');
SELECT is(treadle.cron_next('0 9 * * *', 'Asia/Tokyo', '2024-06-01 00:00+00'), '2024-06-02 00:00+00'::timestamptz,
          '09:00 in Tokyo is midnight UTC');

--------------------------------------------------------------------------------
-- schedule: created once, replaced by name
--------------------------------------------------------------------------------
SET LOCAL treadle.now = '2999-01-01 12:00:00+00';
SELECT treadle.schedule('hourly-report', '0 * * * *', 'report', '{"kind": "sales"}', queue => 'cron-t') AS h1 \gset
SELECT results_eq(format($$ SELECT name, args, queue, state, run_at, schedule, every FROM treadle.jobs WHERE id = %s $$, :h1),
                  $$ VALUES ('report'::text, '{"kind": "sales"}'::jsonb, 'cron-t'::text, 'available'::text,
                             '2999-01-01 13:00+00'::timestamptz, 'hourly-report'::text, NULL::interval) $$,
                  'a new schedule inserts its first occurrence, due at the next time it names');
CREATE TEMP TABLE snap_jobs AS SELECT * FROM treadle.jobs;
CREATE TEMP TABLE snap_schedules AS SELECT * FROM treadle.cron_schedules;
SELECT is(treadle.schedule('hourly-report', '0 * * * *', 'report', '{"kind": "sales"}', queue => 'cron-t'), :h1::bigint,
          'the same call again returns the same occurrence');
SELECT ok((SELECT count(*) FROM treadle.jobs) = (SELECT count(*) FROM snap_jobs)
          AND NOT EXISTS (SELECT * FROM treadle.cron_schedules EXCEPT SELECT * FROM snap_schedules),
          'and writes nothing');
SELECT results_eq($$ SELECT name, cron, tz, job, queue, next_run_at, next_run_local, job_state FROM treadle.schedules $$,
                  $$ VALUES ('hourly-report'::text, '0 * * * *'::text, 'UTC'::text, 'report'::text, 'cron-t'::text,
                             '2999-01-01 13:00+00'::timestamptz, '2999-01-01 13:00'::timestamp, 'available'::text) $$,
                  'the schedules view lists it with its next run');
SELECT is(treadle.schedule('hourly-report', '0 * * * *', 'report', '{"kind": "refunds"}', queue => 'cron-t'), :h1::bigint,
          'new args replace the schedule''s');
SELECT results_eq(format($$ SELECT args, run_at FROM treadle.jobs WHERE id = %s $$, :h1),
                  $$ VALUES ('{"kind": "refunds"}'::jsonb, '2999-01-01 13:00+00'::timestamptz) $$,
                  'the waiting occurrence takes them, and keeps its time');
SELECT treadle.schedule('hourly-report', '30 9 * * *', 'report', '{"kind": "refunds"}', 'Europe/Paris', 'cron-t');
SELECT results_eq(format($$ SELECT run_at FROM treadle.jobs WHERE id = %s $$, :h1),
                  $$ VALUES ('2999-01-02 08:30+00'::timestamptz) $$,
                  'a new cron and zone move the waiting occurrence to its next time (09:30 in Paris)');
SELECT is((SELECT next_run_local FROM treadle.schedules WHERE name = 'hourly-report'), '2999-01-02 09:30'::timestamp,
          'the view shows the next run on the zone''s clock');

--------------------------------------------------------------------------------
-- The next occurrence is written by the finish of the previous one
--------------------------------------------------------------------------------
SELECT treadle.schedule('tick', '*/10 * * * *', 'tick', queue => 'cron-tick', max_attempts => 2) AS t1 \gset
SET LOCAL treadle.now = '2999-01-01 12:10:05+00';
SELECT lease_token AS t1_tok FROM treadle.claim('w', ARRAY['cron-tick']) \gset
SELECT is(treadle.complete(:t1, :'t1_tok'), 'completed', 'the first occurrence completes');
SELECT (pg_temp.job(:t1)).next_id AS t2 \gset
SELECT results_eq(format($$ SELECT name, queue, state, run_at, schedule, max_attempts FROM treadle.jobs WHERE id = %s $$, :t2),
                  $$ VALUES ('tick'::text, 'cron-tick'::text, 'available'::text, '2999-01-01 12:20+00'::timestamptz,
                             'tick'::text, 2) $$,
                  'its finish inserted the next occurrence at the next time named');
SELECT is((SELECT job_id FROM treadle.cron_schedules WHERE name = 'tick'), :t2::bigint, 'the schedule points at it');

-- a failure with attempts left is the same occurrence; a discarded one is followed
SET LOCAL treadle.now = '2999-01-01 12:20:00+00';
SELECT lease_token AS t2_tok FROM treadle.claim('w', ARRAY['cron-tick']) \gset
SELECT is(treadle.fail(:t2, :'t2_tok', 'flaky', '0 seconds'), 'retryable', 'a failure with an attempt left is retried');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE schedule = 'tick' AND state <> 'completed'), 1::bigint,
          'and starts no new occurrence');
SELECT lease_token AS t2_tok FROM treadle.claim('w', ARRAY['cron-tick']) \gset
SELECT is(treadle.fail(:t2, :'t2_tok', 'down'), 'discarded', 'its last attempt fails');
SELECT (pg_temp.job(:t2)).next_id AS t3 \gset
SELECT is((pg_temp.job(:t3)).run_at, '2999-01-01 12:30+00'::timestamptz, 'a discarded occurrence is followed too');

-- cancelling a waiting occurrence skips it; the schedule goes on
SELECT ok(treadle.cancel(:t3), 'the waiting occurrence is cancelled');
SELECT (pg_temp.job(:t3)).next_id AS t4 \gset
SELECT results_eq(format($$ SELECT state, run_at FROM treadle.jobs WHERE id = %s $$, :t4),
                  $$ VALUES ('available'::text, '2999-01-01 12:40+00'::timestamptz) $$,
                  'a cancelled occurrence is skipped: the schedule goes on at the next time');
SELECT ok(treadle.retry(:t3), 'the skipped occurrence is retried');
SELECT lease_token AS t3_tok FROM treadle.claim('w', ARRAY['cron-tick'], names => ARRAY['tick']) \gset
SELECT is(treadle.complete(:t3, :'t3_tok'), 'completed', 'and completes');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE schedule = 'tick' AND state = 'available'), 1::bigint,
          'a retried occurrence starts nothing: still one waiting');

--------------------------------------------------------------------------------
-- Missed times: once by default, every one with catch_up
--------------------------------------------------------------------------------
SET LOCAL treadle.now = '2999-01-02 12:34:00+00';  -- no worker for a day
SELECT lease_token AS t4_tok FROM treadle.claim('w', ARRAY['cron-tick']) \gset
SELECT is(treadle.complete(:t4, :'t4_tok'), 'completed', 'the occurrence due a day ago runs once, late');
SELECT results_eq($$ SELECT run_at FROM treadle.jobs WHERE schedule = 'tick' AND state = 'available' $$,
                  $$ VALUES ('2999-01-02 12:40+00'::timestamptz) $$,
                  'the next is the first time after it finished: the 143 missed times do not run');

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';
SELECT treadle.schedule('ledger', '0 * * * *', 'close_hour', queue => 'cron-ledger', catch_up => true) AS l1 \gset
SET LOCAL treadle.now = '2999-01-01 15:30:00+00';
SELECT lease_token AS l1_tok FROM treadle.claim('w', ARRAY['cron-ledger']) \gset
SELECT is(treadle.complete(:l1, :'l1_tok'), 'completed', 'with catch_up, the 13:00 occurrence runs late');
SELECT results_eq($$ SELECT run_at FROM treadle.jobs WHERE schedule = 'ledger' AND state = 'available' $$,
                  $$ VALUES ('2999-01-01 14:00+00'::timestamptz) $$,
                  'and the 14:00 one follows, due at once');
SELECT lease_token AS l2_tok, id AS l2 FROM treadle.claim('w', ARRAY['cron-ledger']) \gset
SELECT treadle.complete(:l2, :'l2_tok');
SELECT lease_token AS l3_tok, id AS l3 FROM treadle.claim('w', ARRAY['cron-ledger']) \gset
SELECT treadle.complete(:l3, :'l3_tok');
SELECT results_eq($$ SELECT run_at FROM treadle.jobs WHERE schedule = 'ledger' ORDER BY id $$,
                  $$ VALUES ('2999-01-01 13:00+00'::timestamptz), ('2999-01-01 14:00+00'), ('2999-01-01 15:00+00'),
                            ('2999-01-01 16:00+00') $$,
                  'every missed hour ran once, in order, and the schedule is back on time');

--------------------------------------------------------------------------------
-- Clock changes through the finish path: 02:30 in New York
--------------------------------------------------------------------------------
SET LOCAL treadle.now = '2024-03-09 12:00:00+00';
SELECT treadle.schedule('backup', '30 2 * * *', 'backup', tz => 'America/New_York', queue => 'cron-dst') AS b1 \gset
SELECT is((pg_temp.job(:b1)).run_at, '2024-03-10 07:00+00'::timestamptz,
          'on the spring-forward day the 02:30 occurrence is due at 03:00 EDT');
SET LOCAL treadle.now = '2024-03-10 07:00:30+00';
SELECT lease_token AS b1_tok FROM treadle.claim('w', ARRAY['cron-dst']) \gset
SELECT treadle.complete(:b1, :'b1_tok');
SELECT is((pg_temp.job((pg_temp.job(:b1)).next_id)).run_at, '2024-03-11 06:30+00'::timestamptz,
          'it ran once that day; the next is 02:30 EDT the day after');
SET LOCAL treadle.now = '2024-11-02 12:00:00+00';
SELECT treadle.schedule('backup-fall', '30 1 * * *', 'backup', tz => 'America/New_York', queue => 'cron-dst-fall') AS f1 \gset
SELECT is((pg_temp.job(:f1)).run_at, '2024-11-03 05:30+00'::timestamptz,
          'on the fall-back day the 01:30 occurrence is due at its first pass (01:30 EDT)');
SET LOCAL treadle.now = '2024-11-03 05:31:00+00';
SELECT lease_token AS f1_tok FROM treadle.claim('w', ARRAY['cron-dst-fall']) \gset
SELECT treadle.complete(:f1, :'f1_tok');
SELECT is((pg_temp.job((pg_temp.job(:f1)).next_id)).run_at, '2024-11-04 06:30+00'::timestamptz,
          'it does not run again at 01:30 EST: the next is the day after');

--------------------------------------------------------------------------------
-- unschedule
--------------------------------------------------------------------------------
SET LOCAL treadle.now = '2999-01-02 12:35:00+00';
SELECT id AS t5 FROM treadle.jobs WHERE schedule = 'tick' AND state = 'available' \gset
SELECT ok(treadle.unschedule('tick'), 'unschedule removes a schedule');
SELECT is((pg_temp.job(:t5)).state, 'cancelled', 'its waiting occurrence is cancelled');
SELECT is((pg_temp.job(:t5)).next_id, NULL, 'and nothing follows it');
SELECT is_empty($$ SELECT * FROM treadle.schedules WHERE name = 'tick' $$, 'the schedule is gone from the view');
SELECT ok(NOT treadle.unschedule('tick'), 'unscheduling it again returns false');

SELECT id AS l4, lease_token AS l4_tok FROM treadle.claim('w', ARRAY['cron-ledger']) \gset
SELECT ok(treadle.unschedule('ledger'), 'a schedule whose occurrence is running is unscheduled');
SELECT is((pg_temp.job(:l4)).state, 'running', 'the running occurrence goes on');
SELECT is(treadle.complete(:l4, :'l4_tok'), 'completed', 'and completes');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE schedule = 'ledger' AND state = 'available'), 0::bigint,
          'nothing follows it');

SELECT treadle.schedule('tick', '*/10 * * * *', 'tick', queue => 'cron-tick') AS n1 \gset
SELECT ok(:n1 <> :t5, 'a schedule made again under the same name starts a new series');

--------------------------------------------------------------------------------
-- Bad inputs: 22023 / 22004, nothing written
--------------------------------------------------------------------------------
CREATE TEMP TABLE before_jobs AS SELECT * FROM treadle.jobs;
CREATE TEMP TABLE before_schedules AS SELECT * FROM treadle.cron_schedules;
SELECT throws_ok($$ SELECT treadle.schedule(NULL, '* * * * *', 'x') $$, '22004', NULL, 'schedule: a null name raises 22004');
SELECT throws_ok($$ SELECT treadle.schedule('', '* * * * *', 'x') $$, '22023', NULL, 'schedule: an empty name raises 22023');
SELECT throws_ok($$ SELECT treadle.schedule('s', '* * * * *', repeat('j', 201)) $$, '22023', NULL,
                 'schedule: a job name over 200 characters raises 22023');
SELECT throws_ok($$ SELECT treadle.schedule('s', '61 * * * *', 'x') $$, '22023', NULL, 'schedule: a bad cron raises 22023');
SELECT throws_ok($$ SELECT treadle.schedule('s', '0 0 31 4 *', 'x') $$, '22023', NULL,
                 'schedule: a cron that names no time (April 31st) raises 22023');
SELECT throws_ok($$ SELECT treadle.schedule('s', '* * * * *', 'x', tz => 'Nowhere/City') $$, '22023', NULL,
                 'schedule: an unknown zone raises 22023');
SELECT throws_ok($$ SELECT treadle.schedule('s', '* * * * *', 'x', '"scalar"') $$, '22023', NULL,
                 'schedule: scalar args raise 22023');
SELECT throws_ok($$ SELECT treadle.schedule('s', '* * * * *', 'x', max_attempts => 0) $$, '22023', NULL,
                 'schedule: max_attempts 0 raises 22023');
SELECT throws_ok($$ SELECT treadle.schedule('s', '* * * * *', 'x', priority => NULL) $$, '22004', NULL,
                 'schedule: a null priority raises 22004');
SELECT throws_ok($$ SELECT treadle.schedule('s', '* * * * *', 'x', catch_up => NULL) $$, '22004', NULL,
                 'schedule: a null catch_up raises 22004');
SELECT throws_ok($$ SELECT treadle.schedule('tick', '* * * * *', 'x', queue => E'q\n') $$, '22023', NULL,
                 'schedule: replacing with a bad queue raises 22023');
SELECT throws_ok($$ SELECT treadle.unschedule(NULL) $$, '22004', NULL, 'unschedule: a null name raises 22004');
SELECT throws_ok($$ SELECT treadle.unschedule(repeat('n', 201)) $$, '22023', NULL, 'unschedule: a long name raises 22023');
SELECT ok(NOT EXISTS (SELECT * FROM treadle.jobs EXCEPT SELECT * FROM before_jobs)
          AND NOT EXISTS (SELECT * FROM treadle.cron_schedules EXCEPT SELECT * FROM before_schedules)
          AND (SELECT count(*) FROM treadle.cron_schedules) = (SELECT count(*) FROM before_schedules),
          'no refused call wrote anything');

--------------------------------------------------------------------------------
-- Tenants: a role kept to a queue prefix schedules only there, and sees only its schedules
--------------------------------------------------------------------------------
CREATE ROLE cron_tenant_a;
SELECT treadle.grant_producer('cron_tenant_a');
SELECT treadle.set_tenant('cron_tenant_a', 'a.');
SELECT is(pg_temp.as_role('cron_tenant_a', $$ SELECT treadle.schedule('a-nightly', '0 3 * * *', 'x', queue => 'b.jobs') $$),
          '42501', 'a tenant cannot schedule into another''s queue');
SELECT is(pg_temp.as_role('cron_tenant_a', $$ SELECT treadle.schedule('tick', '0 3 * * *', 'x', queue => 'a.jobs') $$),
          '42501', 'nor take over a schedule of that name in another''s queue');
SELECT is(pg_temp.as_role('cron_tenant_a', $$ SELECT treadle.unschedule('tick') $$),
          '42501', 'nor unschedule it');
SELECT is(pg_temp.as_role('cron_tenant_a', $$ SELECT treadle.schedule('a-nightly', '0 3 * * *', 'x', queue => 'a.jobs') $$),
          'ok', 'a tenant schedules into its own queue');
SELECT is(pg_temp.as_role_value('cron_tenant_a', $$ SELECT string_agg(name, ',') FROM treadle.schedules $$),
          'a-nightly', 'and sees only its own schedules');
SELECT is(pg_temp.as_role_value('cron_tenant_a', $$ SELECT treadle.cron_next('@daily', 'UTC', '2024-01-01 10:00+00')::text $$),
          '2024-01-02 00:00:00+00', 'anyone may ask cron_next');

SELECT * FROM finish();
ROLLBACK;
