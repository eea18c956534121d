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
SELECT plan(116);

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

--------------------------------------------------------------------------------
-- 3. What 0.4.0 added, as every role and as tenant a against tenant b
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('b.saga', steps => ARRAY['one', 'two'], queue => 'b.run',
                              compensations => '{"one": "undo_one"}') AS b_saga \gset
SELECT treadle.enqueue('b-wait', queue => 'b.run', run_at => '2000-01-01') AS b_wait \gset
SELECT treadle.enqueue('a-wait', queue => 'a.run', run_at => '2000-01-01') AS a_wait \gset
SELECT pg_temp.rows() AS before3 \gset

-- cancel_run: only the owner, the admin and the dashboard parts; a tenant's only on its runs
SELECT is(pg_temp.as_role(r, format('SELECT treadle.cancel_run(%s, %L)', :b_saga, c)), '42501',
          format('cancel_run(compensate => %s) as %s: 42501', c, r))
  FROM unnest(ARRAY['t5_a', 't5_a_prod', 't5_a_read', 't5_a_adm', 't5_prod', 't5_read', 't5_worker', 't5_nobody']) AS r,
       unnest(ARRAY[false, true]) AS c;
SELECT is(pg_temp.as_role('t5_a_adm', format('SELECT treadle.cancel_run(%s, NULL)', :b_saga)), '22004',
          'cancel_run: a null compensate, 22004 (checked before the run is looked up)');
SELECT is(pg_temp.as_role('t5_a_adm', 'SELECT treadle.cancel_run(NULL)'), '22004', 'cancel_run: a null run id, 22004');
SELECT is(pg_temp.as_role('t5_a_adm', 'SELECT treadle.cancel_run(9223372036854775807, true)'), 'P0002',
          'cancel_run: the largest id, P0002');
SELECT is(pg_temp.as_role('t5_a_adm', 'SELECT treadle.cancel_run(-1)'), 'P0002', 'cancel_run: a negative id, P0002');
SELECT is(pg_temp.as_role('t5_admin', format('SELECT treadle.cancel_run(%s, true)', :a_wait)), 'P0002',
          'cancel_run: a job''s id is no run''s (or names nothing)');

-- enqueue_arrays: a tenant's batch with any element outside its queues writes nothing
SELECT is(pg_temp.as_role('t5_a_prod', $$ SELECT treadle.enqueue_arrays(ARRAY['x', 'y'], queue => ARRAY['a.q', 'b.q']) $$),
          '42501', 'enqueue_arrays: one element in tenant b''s queue, 42501');
SELECT is(pg_temp.as_role('t5_a_prod', $$ SELECT treadle.enqueue_arrays(ARRAY['x', 'y'], queue => ARRAY['a.q', NULL]) $$),
          '42501', 'a null queue element is the default queue, not the tenant''s: 42501');
SELECT is(pg_temp.as_role('t5_a_prod', $$ SELECT treadle.enqueue_arrays(ARRAY['x']) $$),
          '42501', 'no queue array at all: the default queue, 42501');
SELECT is(pg_temp.as_role(r, $$ SELECT treadle.enqueue_arrays(ARRAY['x'], queue => ARRAY['q']) $$), '42501',
          format('enqueue_arrays as %s: 42501', r))
  FROM unnest(ARRAY['t5_read', 't5_a_read', 't5_nobody']) AS r;
SELECT is(pg_temp.as_role('t5_prod', q), st, 'enqueue_arrays: ' || what)
  FROM (VALUES ($$ SELECT treadle.enqueue_arrays(NULL) $$, '22004', 'a null name array'),
               ($$ SELECT treadle.enqueue_arrays(ARRAY[['a', 'b'], ['c', 'd']]) $$, '22023', 'a 2-D name array'),
               ($$ SELECT treadle.enqueue_arrays(ARRAY['a', NULL]) $$, '22023', 'a null name element'),
               ($$ SELECT treadle.enqueue_arrays(ARRAY[E'a\u0001']) $$, '22023', 'a control character in a name'),
               ($$ SELECT treadle.enqueue_arrays(ARRAY['a'], queue => ARRAY[E'q\t']) $$, '22023', 'a tab in a queue'),
               ($$ SELECT treadle.enqueue_arrays(ARRAY['a'], queue => ARRAY[repeat('q', 201)]) $$, '22023', 'a queue of 201 characters'),
               ($$ SELECT treadle.enqueue_arrays(ARRAY['a'], priority => ARRAY[NULL, 1]) $$, '22023', 'a longer priority array'),
               ($$ SELECT treadle.enqueue_arrays(ARRAY['a'], run_at => ARRAY['-infinity']::timestamptz[]) $$, '22023', 'run_at -infinity'),
               ($$ SELECT treadle.enqueue_arrays(ARRAY['a'], max_attempts => ARRAY[-2147483648]) $$, '22023', 'max_attempts at the integer floor'),
               ($$ SELECT treadle.enqueue_arrays(ARRAY['a'], concurrency_key => ARRAY[E'k\n']) $$, '22023', 'a newline in a concurrency key'),
               ($$ SELECT treadle.enqueue_arrays(ARRAY['a'], idempotency_key => ARRAY[repeat('k', 1000)]) $$, '22023', 'an idempotency key of 1,000 characters')
       ) AS t(q, st, what);

-- a batch floods no queue past its max_depth, alone or among other queues
SELECT treadle.set_queue('a.deep', max_depth => 5) IS NOT NULL AS deep_set \gset
SELECT pg_temp.rows() AS before3 \gset
SELECT is(pg_temp.as_role('t5_a_prod', $$ SELECT treadle.enqueue_arrays(array_fill('x'::text, ARRAY[6]),
                                                                      queue => array_fill('a.deep'::text, ARRAY[6])) $$),
          'TQ001', 'enqueue_arrays: six jobs into a queue of max_depth 5, TQ001');
SELECT is(pg_temp.as_role('t5_a_prod', $$ SELECT treadle.enqueue_arrays(array_fill('x'::text, ARRAY[7]),
                                                                      queue => ARRAY['a.q'] || array_fill('a.deep'::text, ARRAY[6])) $$),
          'TQ001', 'and among jobs of another queue, TQ001: none of them is written');

-- claim's kept check (treadle.claim_checked): a setting forged by hand widens nothing
SELECT is(pg_temp.as_role('t5_a', $$ SELECT count(*) FROM (SELECT set_config('treadle.claim_checked',
                                       to_hex(hash_array_extended(ARRAY['b.run'], 0)), false)) AS f,
                                       treadle.claim('w-a', ARRAY['b.run']) AS c $$),
          '42501', 'claim: a forged claim_checked for tenant b''s queue is still refused, 42501');
SELECT is(pg_temp.as_role_value('t5_a', $$ SELECT count(*) FROM (SELECT set_config('treadle.claim_checked',
                                       to_hex(hash_array_extended(ARRAY[E'a.run\n'], 0)), false)) AS f,
                                       treadle.claim('w-a', ARRAY[E'a.run\n']) AS c $$),
          '0', 'a forged claim_checked for a name with a newline claims nothing');
SELECT is(pg_temp.as_role_value('t5_worker', $$ SELECT count(*) FROM (SELECT set_config('treadle.claim_checked',
                                       to_hex(hash_array_extended(ARRAY[repeat('q', 300)], 0)), false)) AS f,
                                       treadle.claim('w', ARRAY[repeat('q', 300)]) AS c $$),
          '0', 'nor for a name too long, as an untenanted worker');
SELECT is(pg_temp.as_role('t5_worker', q), st, 'claim: ' || what)
  FROM (VALUES ($$ SELECT treadle.claim('w', ARRAY[['a.run'], ['b.run']]) $$, '22023', 'a 2-D queue array'),
               ($$ SELECT treadle.claim('w', ARRAY['a.run', NULL]) $$, '22023', 'a null queue element'),
               ($$ SELECT treadle.claim('w', '[0:0]={a.run}'::text[]) $$, 'ok', 'a queue array counted from 0 (one dimension)'),
               ($$ SELECT treadle.claim('w', ARRAY[]::text[]) $$, '22023', 'an empty queue array'),
               ($$ SELECT treadle.claim(E'w\u0001', ARRAY['q']) $$, '22023', 'a control character in the worker id')
       ) AS t(q, st, what);
RESET treadle.claim_checked;

-- step names with '/', and run trees: as a tenant, nothing of another's
SELECT is(pg_temp.as_role('t5_a', q), st, 'workflows: ' || what)
  FROM (VALUES ($$ SELECT treadle.start_workflow('a.w', steps => ARRAY['x/y'], queue => 'a.q') $$, '22023', 'a step name with /'),
               ($$ SELECT treadle.define_workflow('a.w', steps => ARRAY['x', 'b.w/y']) $$, '22023', 'a defined step name with /'),
               ($$ SELECT treadle.start_workflow('a.w', steps => ARRAY[E'x\u0001'], queue => 'a.q') $$, '22023', 'a control character in a step name'),
               ($$ SELECT treadle.start_workflow('a.w', steps => ARRAY[NULL]::text[], queue => 'a.q') $$, '22023', 'a null step'),
               ($$ SELECT treadle.start_workflow('a.w', steps => ARRAY[['x'], ['y']], queue => 'a.q') $$, '22023', 'a 2-D step list'),
               ($$ SELECT treadle.start_workflow('b.w', steps => ARRAY['x'], queue => 'a.q') $$, '42501', 'another tenant''s workflow name'),
               ($$ SELECT treadle.start_workflow('a.w', steps => ARRAY['x'], queue => 'b.q') $$, '42501', 'another tenant''s queue')
       ) AS t(q, st, what);

-- the columns the tree and the queues keep (root_run_id, tree_runs, parent_queue, run_queue)
-- are written by the functions alone
SELECT is(pg_temp.as_role(r, q), '42501', format('%s: %s', r, what))
  FROM unnest(ARRAY['t5_a', 't5_a_adm', 't5_worker', 't5_admin', 't5_read']) AS r,
       (VALUES (format('UPDATE treadle.workflow_runs SET parent_queue = %L, parent_run_id = %s WHERE id = %s', 'a.run', :b_saga, :b_saga),
                'no UPDATE of parent_queue'),
               (format('UPDATE treadle.workflow_runs SET tree_runs = 10000 WHERE id = %s', :b_saga), 'no UPDATE of tree_runs'),
               (format('UPDATE treadle.jobs SET run_queue = %L WHERE id = %s', 'a.run', :b_wait), 'no UPDATE of run_queue'),
               (format('DELETE FROM treadle.jobs WHERE id = %s', :b_wait), 'no DELETE of a job')) AS t(q, what);
SELECT is(pg_temp.as_role_value('t5_a_read', format($$ SELECT count(*) FROM treadle.workflow_runs WHERE id = %s OR root_run_id = %s
                                                      OR parent_queue LIKE 'b.%%' $$, :b_saga, :b_saga)),
          '0', 'a tenant reader sees no run of tenant b, by id, tree or parent');
SELECT is(pg_temp.as_role_value('t5_a_read', $$ SELECT count(*) FROM treadle.jobs WHERE run_queue LIKE 'b.%' OR queue LIKE 'b.%' $$),
          '0', 'nor a job of tenant b by its run''s queue');
SELECT is(pg_temp.rows(), :'before3', 'no refused call of this section wrote a row');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :b_saga), 'running', 'tenant b''s saga still runs');

SELECT * FROM finish();
ROLLBACK;
