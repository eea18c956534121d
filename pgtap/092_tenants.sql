-- pgtap/092_tenants.sql: tenants share nothing, and what the dashboard's part may not do
-- to queues, each as the real roles the grant helpers make. A tenant cannot define or
-- start a workflow under another tenant's prefix; it reads no other tenant's workers,
-- tenant row or workflow definitions; refusals name nothing of another tenant's rows; its
-- worker neither registers queues outside its prefix nor touches another's registry
-- entries; the rule follows the role's OID through a rename; job_counts follows an
-- operator's RESTRICTIVE policy. A role without the admin part makes settings rows for at
-- most max_queues queues and sets no retention below the floor. Schedules take exactly
-- the time zones pg_timezone_names lists.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(54);

\ir helpers.psql

-- pg_temp.as_role_error(role, statement): the message and detail of the error one
-- statement raised as role ('' when it raised none).
CREATE FUNCTION pg_temp.as_role_error(role name, statement text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_message text;
    v_detail  text;
BEGIN
    EXECUTE format('SET LOCAL ROLE %I', role);
    BEGIN
        EXECUTE statement;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS v_message = MESSAGE_TEXT, v_detail = PG_EXCEPTION_DETAIL;
        RESET ROLE;
        RETURN v_message || ' ' || coalesce(v_detail, '');
    END;
    RESET ROLE;
    RETURN '';
END;
$$;

CREATE ROLE ten_a;  SELECT treadle.grant_worker('ten_a');  SELECT treadle.set_tenant('ten_a', 'a.');
CREATE ROLE ten_b;  SELECT treadle.grant_worker('ten_b');  SELECT treadle.set_tenant('ten_b', 'b.');
CREATE ROLE ten_reader; SELECT treadle.grant_reader('ten_reader');

--------------------------------------------------------------------------------
-- Workflow definitions belong to a tenant (issue 21, finding 3)
--------------------------------------------------------------------------------
SELECT is(pg_temp.as_role('ten_b', $$ SELECT treadle.define_workflow('b.signup', ARRAY['create', 'approve', 'mail']) $$),
          'ok', 'tenant b defines a workflow under its prefix');
SELECT is(pg_temp.as_role('ten_a', $$ SELECT treadle.define_workflow('b.signup', ARRAY['create', 'mail']) $$),
          '42501', 'tenant a cannot redefine tenant b''s workflow');
SELECT is((SELECT steps FROM treadle.workflows WHERE name = 'b.signup'), ARRAY['create', 'approve', 'mail'],
          'tenant b''s definition keeps its approval step');
SELECT is(pg_temp.as_role('ten_a', $$ SELECT treadle.define_workflow('signup', ARRAY['create']) $$),
          '42501', 'nor define one outside its prefix');
SELECT is(pg_temp.as_role('ten_a', $$ SELECT treadle.start_workflow('b.signup', queue => 'a.flows') $$),
          '42501', 'nor start tenant b''s workflow, even in its own queue');
SELECT is(pg_temp.as_role('ten_a', $$ SELECT treadle.start_workflow('b.signup', steps => ARRAY['x'], queue => 'a.flows') $$),
          '42501', 'nor a run under tenant b''s prefix with steps of its own');
SELECT is(pg_temp.as_role('ten_a', $$ SELECT treadle.define_workflow('a.signup', ARRAY['create']) $$),
          'ok', 'tenant a defines its own');
SELECT is(pg_temp.as_role('ten_a', $$ SELECT treadle.start_workflow('a.signup', queue => 'a.flows') $$),
          'ok', 'and starts it');
SELECT is(pg_temp.as_role('ten_reader', $$ SELECT treadle.define_workflow('signup', ARRAY['one']) $$), '42501',
          'a reader defines nothing');
SELECT lives_ok($$ SELECT treadle.define_workflow('signup', ARRAY['one']) $$, 'a role that is not a tenant defines any name');

--------------------------------------------------------------------------------
-- A tenant learns nothing of another tenant (finding 6)
--------------------------------------------------------------------------------
SELECT is(pg_temp.as_role('ten_b', $$ SELECT treadle.worker_seen('wb', 'host-b', 7, ARRAY['b.mail'], 4) $$), 'ok',
          'tenant b''s worker registers');
SELECT is(pg_temp.as_role('ten_a', $$ SELECT treadle.worker_seen('wa', 'host-a', 8, ARRAY['a.mail'], 4) $$), 'ok',
          'tenant a''s worker registers');
SELECT is(pg_temp.as_role_value('ten_a', $$ SELECT string_agg(id, ',' ORDER BY id) FROM treadle.workers $$), 'wa',
          'tenant a reads only its own worker from the registry');
SELECT is(pg_temp.as_role_value('ten_a', $$ SELECT string_agg(id, ',' ORDER BY id) FROM treadle.live_workers $$), 'wa',
          'and through live_workers');
SELECT is(pg_temp.as_role_value('ten_reader', $$ SELECT string_agg(id, ',' ORDER BY id) FROM treadle.workers $$), 'wa,wb',
          'a reader that is not a tenant reads every worker');
SELECT is(pg_temp.as_role_value('ten_a', $$ SELECT string_agg(tenant_role::text || '=' || queue_prefix, ',') FROM treadle.tenants $$),
          'ten_a=a.', 'tenant a reads only its own tenant row');
SELECT is(pg_temp.as_role_value('ten_reader', $$ SELECT count(*) FROM treadle.tenants $$), '2',
          'a reader that is not a tenant reads every tenant');
SELECT is(pg_temp.as_role_value('ten_a', $$ SELECT string_agg(name, ',' ORDER BY name) FROM treadle.workflows $$), 'a.signup',
          'tenant a reads only its own workflow definitions');
SELECT is(pg_temp.as_role('ten_a', $$ SELECT treadle.worker_seen('wa', 'host-a', 8, ARRAY['a.mail', 'b.mail'], 4) $$), '42501',
          'tenant a''s worker cannot register a queue outside its prefix');
SELECT is(pg_temp.as_role('ten_a', $$ SELECT treadle.worker_seen('wb', 'host-a', 9, ARRAY['a.mail'], 4) $$), '23505',
          'nor overwrite tenant b''s registry entry');
SELECT is(pg_temp.as_role_value('ten_a', $$ SELECT treadle.worker_stopped('wb') $$), 'false',
          'nor delete it: it is unknown to tenant a');
SELECT is((SELECT host || ':' || pid || ':' || array_to_string(queues, ',') FROM treadle.workers WHERE id = 'wb'),
          'host-b:7:b.mail', 'tenant b''s entry is as tenant b wrote it');
SELECT is(pg_temp.as_role_value('ten_b', $$ SELECT treadle.worker_stopped('wb') $$), 'true',
          'tenant b removes its own');

SELECT pg_temp.as_role_value('ten_b', $$ SELECT treadle.enqueue('secret', queue => 'b.payroll') $$) AS b_job \gset
SELECT pg_temp.as_role_value('ten_b', $$ SELECT treadle.start_workflow('b.signup', queue => 'b.payroll') $$) AS b_run \gset
SELECT pg_temp.as_role_value('ten_b',
           $$ SELECT treadle.schedule('b-nightly', '0 3 * * *', 'secret', queue => 'b.payroll') $$) AS b_sched \gset
SELECT unalike(pg_temp.as_role_error('ten_a', format($$ SELECT treadle.cancel(%s) $$, :b_job)), '%b.%',
               'refusing to cancel tenant b''s job names nothing of tenant b');
SELECT unalike(pg_temp.as_role_error('ten_a', format($$ SELECT treadle.retry(%s) $$, :b_job)), '%b.%',
               'nor refusing to retry it');
SELECT unalike(pg_temp.as_role_error('ten_a', format($$ SELECT treadle.cancel_workflow(%s) $$, :b_run)), '%b.%',
               'nor refusing to cancel tenant b''s run');
SELECT unalike(pg_temp.as_role_error('ten_a', $$ SELECT treadle.unschedule('b-nightly') $$), '%b.%',
               'nor refusing to unschedule tenant b''s schedule');
SELECT unalike(pg_temp.as_role_error('ten_a', $$ SELECT treadle.schedule('b-nightly', '0 4 * * *', 'x', queue => 'a.q') $$),
               '%b.%', 'nor refusing to replace it');
SELECT is(pg_temp.as_role('ten_a', format($$ SELECT treadle.cancel(%s) $$, :b_job)), '42501', 'each still refused (42501)');
SELECT is((SELECT queue || ' ' || cron FROM treadle.cron_schedules WHERE name = 'b-nightly'), 'b.payroll 0 3 * * *',
          'tenant b''s schedule is unchanged');

-- the rule is kept by OID: renaming the role keeps it
ALTER ROLE ten_a RENAME TO ten_a_renamed;
SELECT is(pg_temp.as_role('ten_a_renamed', $$ SELECT treadle.enqueue('x', queue => 'b.payroll') $$), '42501',
          'a renamed tenant is still kept to its prefix');
SELECT is(pg_temp.as_role_value('ten_a_renamed', $$ SELECT count(*) FROM treadle.jobs WHERE queue LIKE 'b.%' $$), '0',
          'and still reads none of tenant b''s jobs');
ALTER ROLE ten_a_renamed RENAME TO ten_a;
-- and a role whose name needs quoting is kept as well (its name was stored quoted before)
CREATE ROLE "Ten Mixed"; SELECT treadle.grant_producer('"Ten Mixed"'); SELECT treadle.set_tenant('"Ten Mixed"', 'm.');
SELECT is(pg_temp.as_role('Ten Mixed', $$ SELECT treadle.enqueue('x', queue => 'b.payroll') $$), '42501',
          'a tenant whose name needs quoting is kept to its prefix');
SELECT is(pg_temp.as_role_value('Ten Mixed', $$ SELECT count(*) FROM treadle.jobs WHERE queue NOT LIKE 'm.%' $$), '0',
          'and reads nothing outside it');

-- job_counts follows row-level security: an operator's RESTRICTIVE policy keeps a reader to one queue
CREATE ROLE ten_narrow; SELECT treadle.grant_reader('ten_narrow');
CREATE POLICY narrow_jobs ON treadle.jobs AS RESTRICTIVE FOR SELECT TO ten_narrow USING (queue = 'a.flows');
CREATE POLICY narrow_history ON treadle.job_history AS RESTRICTIVE FOR SELECT TO ten_narrow USING (queue = 'a.flows');
SELECT is(pg_temp.as_role_value('ten_narrow', $$ SELECT string_agg(DISTINCT queue, ',') FROM treadle.job_counts() $$),
          'a.flows', 'job_counts shows a reader kept to one queue only that queue');
SELECT is(pg_temp.as_role_value('ten_narrow', $$ SELECT sum(jobs) FROM treadle.job_counts() WHERE queue IS NULL $$),
          (SELECT count(*)::text FROM treadle.jobs WHERE queue = 'a.flows'), 'and totals over it alone');

--------------------------------------------------------------------------------
-- Roles without the admin part: at most max_queues settings rows, no retention
-- below the floor (findings 5 and 9)
--------------------------------------------------------------------------------
CREATE ROLE lim_dash;  SELECT treadle.grant_dashboard('lim_dash');
CREATE ROLE lim_admin; SELECT treadle.grant_admin('lim_admin');
SELECT is(pg_temp.as_role('lim_dash', $$ SELECT treadle.set_queue('mail', retain_completed => '0') $$), '42501',
          'a dashboard role cannot set a retention of 0 (it would prune the queue)');
SELECT is(pg_temp.as_role('lim_dash', $$ SELECT treadle.set_queue('mail', retain_failed => '1 hour') $$), '42501',
          'nor one below the floor of 1 day');
SELECT is((SELECT count(*) FROM treadle.queues WHERE queue = 'mail'), 0::bigint, 'and nothing was written');
SELECT is(pg_temp.as_role('lim_dash', $$ SELECT treadle.set_queue('mail', retain_completed => '2 days') $$), 'ok',
          'a retention above the floor is its to set');
SELECT is(pg_temp.as_role('lim_admin', $$ SELECT treadle.set_queue('mail', retain_completed => '0') $$), 'ok',
          'an admin sets any retention');
SELECT lives_ok($$ SELECT treadle.configure(max_queues => (SELECT count(*)::integer + 2 FROM treadle.queues),
                                            retention_floor => '1 hour') $$, 'the owner sets max_queues and the floor');
SELECT is(pg_temp.as_role('lim_dash', $$ SELECT treadle.set_queue('mail', retain_failed => '1 hour') $$), 'ok',
          'the floor is the owner''s to move');
SELECT is(pg_temp.as_role('lim_dash', $$ SELECT treadle.pause('flood-1') $$) || pg_temp.as_role('lim_dash', $$ SELECT treadle.pause('flood-2') $$),
          'okok', 'a dashboard role pauses new queues up to max_queues');
SELECT is(pg_temp.as_role('lim_dash', $$ SELECT treadle.pause('flood-3') $$), '54000', 'and no further (54000)');
SELECT is(pg_temp.as_role('lim_dash', $$ SELECT treadle.set_queue('flood-4', concurrency => 1) $$), '54000',
          'nor limits a new one');
SELECT is((SELECT count(*) FROM treadle.queues WHERE queue IN ('flood-3', 'flood-4')), 0::bigint, 'and nothing was written');
SELECT is(pg_temp.as_role('lim_dash', $$ SELECT treadle.resume('flood-1') $$) || pg_temp.as_role('lim_dash', $$ SELECT treadle.set_queue('mail', concurrency => 2) $$),
          'okok', 'queues that have a row stay its to change');
SELECT is(pg_temp.as_role('lim_admin', $$ SELECT treadle.pause('flood-3') $$), 'ok', 'an admin is not held to max_queues');

--------------------------------------------------------------------------------
-- Time zones: exactly the names pg_timezone_names lists (finding 8)
--------------------------------------------------------------------------------
SELECT is(pg_temp.as_role('ten_b', $$ SELECT treadle.schedule('b-posix', '* * * * *', 'x', tz => 'Foo/Bar+5', queue => 'b.q') $$),
          '22023', 'a POSIX rule dressed as a zone name raises 22023');
SELECT is(pg_temp.as_role('ten_b', $$ SELECT treadle.schedule('b-leap', '* * * * *', 'x', tz => 'right/UTC', queue => 'b.q') $$),
          '22023', 'a zone that counts leap seconds raises 22023');
SELECT throws_ok($$ SELECT treadle.cron_next('* * * * *', 'UTC+3') $$, '22023', NULL,
                 'as does a POSIX rule of a known name');
SELECT lives_ok($$ SELECT treadle.cron_next('* * * * *', 'Etc/GMT+5') $$, 'a listed zone with digits in its name is accepted');
SELECT is(pg_temp.as_role('ten_b', $$ SELECT treadle.schedule('b-paris', '0 9 * * *', 'x', tz => 'Europe/Paris', queue => 'b.q'),
                                             treadle.schedule('b-utc', '0 9 * * *', 'x', tz => 'UTC', queue => 'b.q') $$),
          'ok', 'Europe/Paris and UTC are accepted');

SELECT * FROM finish();
ROLLBACK;
