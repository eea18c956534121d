-- pgtap/099_trust_05.sql: the trust boundary, second round, as the real roles.
-- A lease token leaked to another tenant holds nothing for it: every call that takes
-- a token answers it as a stale one (null, lost, false, no row) and writes nothing,
-- while the rightful tenant's token still holds the job. on_conflict 'replace' that
-- moves a keyed job's run_at hands the key's slot to the job due longest, whether or
-- not the call names the key. What 0.4.0 added (cancel_run, enqueue_arrays,
-- claim_checked, run trees, step names, parent_queue, run_queue) refuses every role
-- and tenant it is not for, and every bad argument, with a stable SQLSTATE and no write.
\set ON_ERROR_STOP true
BEGIN;
SELECT * FROM no_plan();

\ir helpers.psql

CREATE ROLE t5_a;      SELECT treadle.grant_worker('t5_a');    SELECT treadle.set_tenant('t5_a', 'a.');
CREATE ROLE t5_b;      SELECT treadle.grant_worker('t5_b');    SELECT treadle.set_tenant('t5_b', 'b.');
CREATE ROLE t5_a_adm;  SELECT treadle.grant_admin('t5_a_adm'); SELECT treadle.set_tenant('t5_a_adm', 'a.');
CREATE ROLE t5_a_prod; SELECT treadle.grant_producer('t5_a_prod'); SELECT treadle.set_tenant('t5_a_prod', 'a.');
CREATE ROLE t5_a_read; SELECT treadle.grant_reader('t5_a_read'); SELECT treadle.set_tenant('t5_a_read', 'a.');
CREATE ROLE t5_prod;   SELECT treadle.grant_producer('t5_prod');
CREATE ROLE t5_read;   SELECT treadle.grant_reader('t5_read');
CREATE ROLE t5_worker; SELECT treadle.grant_worker('t5_worker');
CREATE ROLE t5_admin;  SELECT treadle.grant_admin('t5_admin');
CREATE ROLE t5_nobody;

-- pg_temp.rows(): every row of the tables a call could write, as one fingerprint
CREATE FUNCTION pg_temp.rows() RETURNS text LANGUAGE sql AS $$
    SELECT md5(concat_ws('|',
        (SELECT string_agg(format('%s %s %s %s %s %s %s %s %s %s %s', j.id, j.queue, j.state, j.attempt, j.lease_token,
                                  j.lease_until, j.result, j.run_at, j.progress, j.key_slot, j.args),
                           ',' ORDER BY j.id) FROM treadle.jobs AS j),
        (SELECT string_agg(format('%s %s %s %s %s', r.id, r.state, r.results, r.waiting, r.step_sleeps), ',' ORDER BY r.id)
           FROM treadle.workflow_runs AS r),
        (SELECT string_agg(format('%s %s %s', k.queue, k.key, k.held), ',' ORDER BY k.queue, k.key) FROM treadle.key_slots AS k),
        (SELECT count(*) FROM treadle.workflow_signals),
        (SELECT count(*) FROM treadle.workflows),
        (SELECT count(*) FROM treadle.queues),
        (SELECT count(*) FROM treadle.job_history)))
$$;

-- pg_temp.tried(role, query): the text of a one-value query run as role, followed by
-- ' (wrote)' when it changed a row; whatever it did is undone, so that each call is
-- tried against the same rows
CREATE FUNCTION pg_temp.tried(role name, query text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_before text := pg_temp.rows();
    v        text;
BEGIN
    BEGIN
        EXECUTE format('SET LOCAL ROLE %I', role);
        EXECUTE query INTO v;
        RESET ROLE;
        v := coalesce(v, 'null') || CASE WHEN pg_temp.rows() <> v_before THEN ' (wrote)' ELSE '' END;
        RAISE EXCEPTION USING ERRCODE = 'T5UND', MESSAGE = v;
    EXCEPTION WHEN SQLSTATE 'T5UND' THEN
        GET STACKED DIAGNOSTICS v = MESSAGE_TEXT;
    END;
    RETURN v;
END;
$$;

--------------------------------------------------------------------------------
-- 1. Another tenant's leaked lease token holds nothing
--------------------------------------------------------------------------------
SELECT treadle.enqueue('b-job', queue => 'b.fin', run_at => '2000-01-01') AS b_job \gset
SELECT treadle.enqueue('b-two', queue => 'b.fin', run_at => '2000-01-01') AS b_two \gset
SELECT treadle.start_workflow('b.flow', steps => ARRAY['s'], queue => 'b.fin') AS b_run \gset
CREATE TEMP TABLE held AS SELECT c.id, c.name, c.lease_token FROM treadle.claim('w-b', ARRAY['b.fin'], batch => 10) AS c;
SELECT lease_token AS b_token FROM held WHERE id = :b_job \gset
SELECT lease_token AS b_two_token FROM held WHERE id = :b_two \gset
SELECT id AS b_step, lease_token AS b_step_token FROM held WHERE id NOT IN (:b_job, :b_two) \gset
SELECT pg_temp.rows() AS before \gset

SELECT is(pg_temp.tried('t5_a', format($$ SELECT coalesce(treadle.complete(%s, %L, '{"forged": 1}'), 'stale') $$,
                                                :b_job, :'b_token')),
          'stale', 'complete: tenant a with tenant b''s token and no queue finishes nothing (as a stale token)');
SELECT is(pg_temp.tried('t5_a', format($$ SELECT coalesce(treadle.complete(%s, %L, '{"forged": 1}', 'b.fin'), 'stale') $$,
                                                :b_job, :'b_token')),
          'stale', 'complete naming tenant b''s queue: the same');
SELECT is(pg_temp.tried('t5_a', format($$ SELECT coalesce(treadle.fail(%s, %L, 'forged'), 'stale') $$,
                                                :b_job, :'b_token')),
          'stale', 'fail: the same');
SELECT is(pg_temp.tried('t5_a', format($$ SELECT coalesce(treadle.fail(%s, %L, 'forged', queue => 'b.fin'), 'stale') $$,
                                                :b_job, :'b_token')),
          'stale', 'fail naming the queue: the same');
SELECT is(pg_temp.tried('t5_a', format($$ SELECT coalesce(treadle.release(%s, %L), 'stale') $$, :b_job, :'b_token')),
          'stale', 'release: the same');
SELECT is(pg_temp.tried('t5_a', format($$ SELECT coalesce(treadle.snooze(%s, %L, '1 hour', 'b.fin'), 'stale') $$,
                                                :b_job, :'b_token')),
          'stale', 'snooze: the same');
SELECT is(pg_temp.tried('t5_a', format($$ SELECT treadle.heartbeat(%s, %L) $$, :b_job, :'b_token')),
          'lost', 'heartbeat: lost');
SELECT is(pg_temp.tried('t5_a', format($$ SELECT treadle.heartbeat(%s, %L, queue => 'b.fin') $$, :b_job, :'b_token')),
          'lost', 'heartbeat naming the queue: lost');
SELECT is(pg_temp.tried('t5_a', format($$ SELECT treadle.progress(%s, %L, 0.5, 'forged') $$, :b_job, :'b_token')),
          'false', 'progress: not recorded');
SELECT is(pg_temp.tried('t5_a', format($$ SELECT string_agg(coalesce(c.state, 'stale'), ',')
                                                  FROM treadle.complete_many(ARRAY[%s, %s], ARRAY[%L, %L]::uuid[]) AS c $$,
                                                :b_job, :b_two, :'b_token', :'b_two_token')),
          'stale,stale', 'complete_many by id alone: nothing held');
SELECT is(pg_temp.tried('t5_a', format($$ SELECT string_agg(coalesce(c.state, 'stale'), ',')
                                                  FROM treadle.complete_many(ARRAY[%s, %s], ARRAY[%L, %L]::uuid[], NULL,
                                                                             ARRAY['b.fin', 'b.fin']) AS c $$,
                                                :b_job, :b_two, :'b_token', :'b_two_token')),
          'stale,stale', 'complete_many naming the queues: nothing held');
SELECT is(pg_temp.tried('t5_a', format($$ SELECT string_agg(h.answer, ',')
                                                  FROM treadle.heartbeat_many(ARRAY[%s, %s], ARRAY[%L, %L]::uuid[]) AS h $$,
                                                :b_job, :b_two, :'b_token', :'b_two_token')),
          'lost,lost', 'heartbeat_many by id alone: lost');
SELECT is(pg_temp.tried('t5_a', format($$ SELECT string_agg(h.answer, ',')
                                                  FROM treadle.heartbeat_many(ARRAY[%s], ARRAY[%L]::uuid[], '1 minute',
                                                                              ARRAY['b.fin']) AS h $$,
                                                :b_job, :'b_token')),
          'lost', 'heartbeat_many naming the queue: lost');
SELECT is(pg_temp.tried('t5_a', format($$ SELECT string_agg(coalesce(c.finished_state, 'stale'), ',')
                                                  FROM treadle.complete_and_claim(ARRAY[%s], ARRAY[%L]::uuid[], NULL,
                                                                                  'w-a', ARRAY['a.fin']) AS c $$,
                                                :b_job, :'b_token')),
          'stale', 'complete_and_claim: nothing finished');
SELECT is(pg_temp.tried('t5_a', format($$ SELECT count(*) FROM treadle.claimed(%L) $$, :'b_token')),
          '0', 'claimed: tenant a finds no job (nor its args) by tenant b''s token');
SELECT is(pg_temp.tried('t5_a', format($$ SELECT coalesce(treadle.step_sleep(%s, %L, 0, '1 hour')::text, 'stale') $$,
                                                :b_step, :'b_step_token')),
          'stale', 'step_sleep: no sleep recorded for tenant b''s step');
SELECT is(pg_temp.as_role_value('t5_a', format($$ SELECT concat(treadle.complete(%s, %L), treadle.fail(%s, %L, 'x'),
                                                                treadle.release(%s, %L), treadle.step_sleep(%s, %L, 0, '1 hour'),
                                                                (SELECT string_agg(c.state, ',') FROM treadle.complete_many(ARRAY[%s], ARRAY[%L]::uuid[]) AS c)) $$,
                                                :b_job, :'b_token', :b_job, :'b_token', :b_two, :'b_two_token',
                                                :b_step, :'b_step_token', :b_two, :'b_two_token')),
          '', 'the same calls, kept: every answer null');
SELECT is(pg_temp.rows(), :'before', 'none of tenant a''s calls with tenant b''s tokens wrote a row');

-- tenant b's own token still holds its jobs, and a repeat by tenant a learns nothing of it
SELECT is(pg_temp.as_role_value('t5_b', format($$ SELECT treadle.heartbeat(%s, %L) $$, :b_job, :'b_token')),
          'held', 'tenant b''s heartbeat with its token still holds');
SELECT is(pg_temp.as_role_value('t5_b', format($$ SELECT count(*) FROM treadle.claimed(%L) $$, :'b_token')),
          '1', 'tenant b finds its claim by its token');
SELECT is(pg_temp.as_role_value('t5_b', format($$ SELECT treadle.complete(%s, %L, '{"ok": 1}') $$, :b_job, :'b_token')),
          'completed', 'tenant b completes its job');
SELECT is(pg_temp.as_role_value('t5_a', format($$ SELECT coalesce(treadle.complete(%s, %L), 'stale') $$, :b_job, :'b_token')),
          'stale', 'tenant a repeating that finish with the token is not told it completed');
SELECT is(pg_temp.as_role_value('t5_a', format($$ SELECT string_agg(coalesce(c.state, 'stale'), ',')
                                                  FROM treadle.complete_many(ARRAY[%s], ARRAY[%L]::uuid[]) AS c $$,
                                                :b_job, :'b_token')),
          'stale', 'nor by complete_many');
SELECT is(pg_temp.as_role_value('t5_b', format($$ SELECT treadle.complete(%s, %L) $$, :b_job, :'b_token')),
          'completed', 'tenant b''s repeat is told, as before');
SELECT is((SELECT result FROM treadle.jobs WHERE id = :b_job), '{"ok": 1}'::jsonb, 'the result is tenant b''s');
-- a role that is not a tenant (a shared worker) still finishes any job with its token
SELECT is(pg_temp.as_role_value('t5_worker', format($$ SELECT treadle.complete(%s, %L) $$, :b_two, :'b_two_token')),
          'completed', 'an untenanted worker finishes a tenant''s job with its token');

--------------------------------------------------------------------------------
-- 2. on_conflict 'replace' that moves a keyed job's run_at re-checks the key's slot
--------------------------------------------------------------------------------
-- a holder due longest is moved an hour ahead: the blocked job now due takes the slot
SELECT treadle.enqueue('h', queue => 'kq', concurrency_key => 'k', idempotency_key => 'h',
                       run_at => treadle.now() - interval '1 hour') AS k_holder \gset
SELECT treadle.enqueue('w', queue => 'kq', concurrency_key => 'k', run_at => treadle.now() - interval '30 minutes') AS k_waiter \gset
SELECT is((SELECT string_agg(state, ',' ORDER BY id) FROM treadle.jobs WHERE id IN (:k_holder, :k_waiter)),
          'available,blocked', 'the key''s slot is the holder''s, due longest');
SELECT is(treadle.enqueue('h', queue => 'kq', idempotency_key => 'h', on_conflict => 'replace',
                          run_at => treadle.now() + interval '1 hour'), :k_holder::bigint,
          'replace, naming no key, merges into the holder and moves its run_at an hour ahead');
SELECT is((SELECT string_agg(state || ' ' || key_slot, ',' ORDER BY id) FROM treadle.jobs WHERE id IN (:k_holder, :k_waiter)),
          'blocked false,available true', 'the job now due longest holds the slot; the moved one waits');
SELECT is((SELECT held FROM treadle.key_slots WHERE queue = 'kq' AND key = 'k'), 1, 'one slot held');
-- a blocked job moved earlier than a holder that has not started takes its slot
SELECT treadle.enqueue('x', queue => 'kq2', concurrency_key => 'k', run_at => treadle.now() + interval '1 hour') AS k2_holder \gset
SELECT treadle.enqueue('y', queue => 'kq2', concurrency_key => 'k', idempotency_key => 'y',
                       run_at => treadle.now() + interval '2 hours') AS k2_waiter \gset
SELECT is(treadle.enqueue('y', queue => 'kq2', idempotency_key => 'y', on_conflict => 'replace',
                          run_at => treadle.now() - interval '1 minute'), :k2_waiter::bigint,
          'replace moves a blocked job''s run_at before the holder''s');
SELECT is((SELECT string_agg(state || ' ' || key_slot, ',' ORDER BY id) FROM treadle.jobs WHERE id IN (:k2_holder, :k2_waiter)),
          'blocked false,available true', 'the job now due takes the slot from the holder not started yet');
-- naming the key, as before
SELECT treadle.enqueue('x', queue => 'kq3', concurrency_key => 'k', idempotency_key => 'x',
                       run_at => treadle.now() - interval '1 hour') AS k3_holder \gset
SELECT treadle.enqueue('z', queue => 'kq3', concurrency_key => 'k', run_at => treadle.now() - interval '30 minutes') AS k3_waiter \gset
SELECT is(treadle.enqueue('x', queue => 'kq3', concurrency_key => 'k', idempotency_key => 'x', on_conflict => 'replace',
                          run_at => treadle.now() + interval '1 hour'), :k3_holder::bigint, 'replace naming the key');
SELECT is((SELECT string_agg(state || ' ' || key_slot, ',' ORDER BY id) FROM treadle.jobs WHERE id IN (:k3_holder, :k3_waiter)),
          'blocked false,available true', 'hands the slot over the same way');
-- a replace that names another key changes no key of the holder, and still re-checks its own
SELECT treadle.enqueue('x', queue => 'kq4', concurrency_key => 'k', idempotency_key => 'x',
                       run_at => treadle.now() - interval '1 hour') AS k4_holder \gset
SELECT treadle.enqueue('z', queue => 'kq4', concurrency_key => 'k', run_at => treadle.now() - interval '30 minutes') AS k4_waiter \gset
SELECT is(treadle.enqueue('x', queue => 'kq4', concurrency_key => 'other', idempotency_key => 'x', on_conflict => 'replace',
                          run_at => treadle.now() + interval '1 hour'), :k4_holder::bigint, 'replace naming another key');
SELECT is((SELECT string_agg(concurrency_key || ' ' || state || ' ' || key_slot, ',' ORDER BY id) FROM treadle.jobs
            WHERE id IN (:k4_holder, :k4_waiter)),
          'k blocked false,k available true', 'the holder keeps its key, and the slot goes to the job due longest');
SELECT is((SELECT count(*) FROM treadle.key_slots WHERE queue = 'kq4' AND key = 'other'), 0::bigint,
          'no slot row is left for the key the call named');

SELECT * FROM finish();
ROLLBACK;
