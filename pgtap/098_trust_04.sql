-- pgtap/098_trust_04.sql: the trust boundary over 0.4.0's new surface, as the real roles.
-- The finishes that take the job's queue hold nothing for a wrong queue, nor for a
-- tenant's queue with another tenant's job and token; explain and explain_run answer a
-- tenant the same for another tenant's row as for none; a tenant's operator neither
-- retries, forks, compensates nor cancels another tenant's run, nor prunes its finished
-- work; every new argument refuses what it cannot take with a stable SQLSTATE and
-- writes nothing.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(63);

\ir helpers.psql

CREATE ROLE t4_a;      SELECT treadle.grant_worker('t4_a');    SELECT treadle.set_tenant('t4_a', 'a.');
CREATE ROLE t4_b;      SELECT treadle.grant_worker('t4_b');    SELECT treadle.set_tenant('t4_b', 'b.');
CREATE ROLE t4_a_adm;  SELECT treadle.grant_admin('t4_a_adm'); SELECT treadle.set_tenant('t4_a_adm', 'a.');
CREATE ROLE t4_a_dash; SELECT treadle.grant_dashboard('t4_a_dash'); SELECT treadle.set_tenant('t4_a_dash', 'a.');
CREATE ROLE t4_prod;   SELECT treadle.grant_producer('t4_prod');

-- pg_temp.rows(): every row of the tables a call could write, as one fingerprint
CREATE FUNCTION pg_temp.rows() RETURNS text LANGUAGE sql AS $$
    SELECT md5(concat_ws('|',
        (SELECT string_agg(format('%s %s %s %s %s %s', j.id, j.queue, j.state, j.attempt, j.lease_token, j.result),
                           ',' ORDER BY j.id) FROM treadle.jobs AS j),
        (SELECT string_agg(format('%s %s %s %s', r.id, r.state, r.results, r.waiting), ',' ORDER BY r.id)
           FROM treadle.workflow_runs AS r),
        (SELECT count(*) FROM treadle.workflow_signals),
        (SELECT count(*) FROM treadle.job_history)))
$$;

--------------------------------------------------------------------------------
-- The finishes that take the job's queue: the queue is part of what holds the job
--------------------------------------------------------------------------------
SELECT treadle.enqueue('a-job', queue => 'a.fin', run_at => '2000-01-01') AS a_job \gset
SELECT treadle.enqueue('b-job', queue => 'b.fin', run_at => '2000-01-01') AS b_job \gset
CREATE TEMP TABLE held AS
    SELECT c.id, c.queue, c.lease_token FROM treadle.claim('w-a', ARRAY['a.fin']) AS c
    UNION ALL SELECT c.id, c.queue, c.lease_token FROM treadle.claim('w-b', ARRAY['b.fin']) AS c;
SELECT lease_token AS b_token FROM held WHERE queue = 'b.fin' \gset
SELECT lease_token AS a_token FROM held WHERE queue = 'a.fin' \gset
SELECT pg_temp.rows() AS before \gset

SELECT is(pg_temp.as_role_value('t4_b', format($$ SELECT coalesce(treadle.complete(%s, %L, '{}', 'b.other'), 'not held') $$,
                                                :b_job, :'b_token')),
          'not held', 'complete with the right id and token but a wrong queue holds nothing');
SELECT is(pg_temp.as_role_value('t4_b', format($$ SELECT coalesce(treadle.fail(%s, %L, 'e', queue => 'b.other'), 'not held') $$,
                                                :b_job, :'b_token')),
          'not held', 'nor fail');
SELECT is(pg_temp.as_role_value('t4_b', format($$ SELECT coalesce(treadle.release(%s, %L, 'b.other'), 'not held') $$,
                                                :b_job, :'b_token')),
          'not held', 'nor release');
SELECT is(pg_temp.as_role_value('t4_b', format($$ SELECT coalesce(treadle.snooze(%s, %L, '1 minute', 'b.other'), 'not held') $$,
                                                :b_job, :'b_token')),
          'not held', 'nor snooze');
SELECT is(pg_temp.as_role_value('t4_b', format($$ SELECT treadle.heartbeat(%s, %L, queue => 'b.other') $$,
                                                :b_job, :'b_token')),
          'lost', 'a heartbeat naming a wrong queue is told the lease is lost');
SELECT is(pg_temp.as_role_value('t4_b', format($$ SELECT treadle.progress(%s, %L, 0.5, 'half', 'b.other') $$,
                                                :b_job, :'b_token')),
          'false', 'and progress is not recorded');
SELECT is(pg_temp.as_role_value('t4_b', format($$ SELECT c.state FROM treadle.complete_many(ARRAY[%s], ARRAY[%L]::uuid[], NULL,
                                                                                ARRAY['b.other']) AS c $$,
                                                :b_job, :'b_token')),
          NULL, 'complete_many naming a wrong queue holds nothing');
SELECT is(pg_temp.as_role_value('t4_b', format($$ SELECT h.answer FROM treadle.heartbeat_many(ARRAY[%s], ARRAY[%L]::uuid[], '30 seconds',
                                                                                 ARRAY['b.other']) AS h $$,
                                                :b_job, :'b_token')),
          'lost', 'heartbeat_many naming a wrong queue is told lost');
SELECT is(pg_temp.as_role_value('t4_b', format($$ SELECT string_agg(coalesce(c.finished_state, 'null') || ' ' || (c.job IS NULL), ',')
                                                  FROM treadle.complete_and_claim(ARRAY[%s], ARRAY[%L]::uuid[],
                                                  NULL, 'w-b', ARRAY['b.fin'], job_queues => ARRAY['b.other']) AS c $$,
                                                :b_job, :'b_token')),
          'null true', 'complete_and_claim naming a wrong queue finishes nothing (and claims nothing: the queue is empty)');
SELECT is(pg_temp.as_role_value('t4_a', format($$ SELECT coalesce(treadle.complete(%s, %L, '{"forged": true}', 'a.fin'), 'not held') $$,
                                                :b_job, :'b_token')),
          'not held', 'tenant a, naming its own queue, does not finish tenant b''s job even with its token');
SELECT is(pg_temp.as_role_value('t4_a', format($$ SELECT coalesce(treadle.complete(%s, %L, '{"forged": true}', 'a.fin'), 'not held') $$,
                                                :b_job, :'a_token')),
          'not held', 'nor with its own token');
SELECT is(pg_temp.as_role_value('t4_a', format($$ SELECT coalesce(treadle.fail(%s, %L, 'forged', queue => 'a.fin'), 'not held') $$,
                                                :b_job, :'a_token')),
          'not held', 'nor fails it');
SELECT is(pg_temp.rows(), :'before', 'none of these calls changed a row');
SELECT is((SELECT state || ' ' || lease_token::text FROM treadle.jobs WHERE id = :b_job), 'running ' || :'b_token',
          'tenant b''s job still runs under its own lease');
SELECT is(pg_temp.as_role_value('t4_b', format($$ SELECT treadle.complete(%s, %L, '{}', 'b.fin') $$, :b_job, :'b_token')),
          'completed', 'and its holder, naming the right queue, completes it');

--------------------------------------------------------------------------------
-- explain and explain_run: another tenant's row reads as no row
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('b.flow', steps => ARRAY['one', 'two'], queue => 'b.runs') AS b_run \gset
SELECT max(id) AS b_step FROM treadle.jobs WHERE queue = 'b.runs' \gset
SELECT is(pg_temp.as_role_value('t4_a', format('SELECT treadle.explain(%s)::text', :b_step)),
          pg_temp.as_role_value('t4_a', 'SELECT treadle.explain(999999999)::text'),
          'explain answers a tenant the same for another tenant''s job as for none');
SELECT is(pg_temp.as_role_value('t4_a', format($$ SELECT treadle.explain(%s, 'b.runs')::text $$, :b_step)),
          pg_temp.as_role_value('t4_a', $$ SELECT treadle.explain(999999999, 'b.runs')::text $$),
          'and so when it names the other tenant''s queue');
SELECT is(pg_temp.as_role_value('t4_a', format($$ SELECT treadle.explain(%s, 'a.fin')::text $$, :b_step)),
          pg_temp.as_role_value('t4_a', $$ SELECT treadle.explain(999999999, 'a.fin')::text $$),
          'and when it names its own');
SELECT isnt(pg_temp.as_role_value('t4_b', format('SELECT treadle.explain(%s)::text', :b_step)), NULL,
            '(tenant b is told why its job waits)');
SELECT is(pg_temp.as_role_value('t4_a', format('SELECT count(*) FROM treadle.explain_run(%s)', :b_run)),
          pg_temp.as_role_value('t4_a', 'SELECT count(*) FROM treadle.explain_run(999999999)'),
          'explain_run answers a tenant the same for another tenant''s run as for none');
SELECT isnt(pg_temp.as_role_value('t4_b', format('SELECT count(*) FROM treadle.explain_run(%s)', :b_run)), '0',
            '(tenant b is told why its run waits)');

--------------------------------------------------------------------------------
-- A tenant's operator and dashboard: only its own queues' runs
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('b.gone', steps => ARRAY['one'], queue => 'b.runs', max_attempts => 1,
                              compensations => '{"one": "undo"}') AS b_failed \gset
SELECT c.id AS b_failed_job, c.lease_token AS b_failed_token
  FROM treadle.claim('w-b', ARRAY['b.runs'], names => ARRAY['workflow:b.gone/one']) AS c \gset
SELECT is(treadle.fail(:b_failed_job, :'b_failed_token', 'boom', retryable => false), 'discarded',
          '(tenant b''s run fails)');
SELECT pg_temp.rows() AS before \gset
SELECT is(pg_temp.as_role('t4_a_adm', format('SELECT treadle.retry_run(%s)', :b_failed)), '42501',
          'tenant a''s operator may not retry tenant b''s run');
SELECT is(pg_temp.as_role('t4_a_adm', format($$ SELECT treadle.fork_run(%s, 'one') $$, :b_failed)), '42501',
          'nor fork it');
SELECT is(pg_temp.as_role('t4_a_adm', format('SELECT treadle.compensate_run(%s)', :b_failed)), '42501',
          'nor compensate it');
SELECT is(pg_temp.as_role('t4_a_adm', format('SELECT treadle.cancel_workflow(%s)', :b_run)), '42501',
          'nor cancel a running one');
SELECT is(pg_temp.as_role('t4_a_dash', format('SELECT treadle.retry_run(%s)', :b_failed)), '42501',
          'nor may tenant a''s dashboard retry it');
SELECT is(pg_temp.as_role('t4_a_dash', format($$ SELECT treadle.fork_run(%s, 'one') $$, :b_failed)), '42501',
          'or fork it');
SELECT is(pg_temp.as_role('t4_prod', format('SELECT treadle.retry_run(%s)', :b_failed)), '42501',
          'a producer that is no tenant may not retry a run');
SELECT is(pg_temp.as_role('t4_a', format('SELECT treadle.compensate_run(%s)', :b_failed)), '42501',
          'nor a worker compensate one');
SELECT is(pg_temp.as_role('t4_a', format($$ SELECT treadle.signal(%s, 'go') $$, :b_run)), '42501',
          'tenant a''s worker may not signal tenant b''s run');
SELECT is(pg_temp.rows(), :'before', 'none of these calls changed a row');

--------------------------------------------------------------------------------
-- prune by a tenant's operator: its own queues' finished work only
--------------------------------------------------------------------------------
SET LOCAL treadle.now = '2000-01-01 00:00:00+00';
SELECT treadle.enqueue('old', queue => q) FROM unnest(ARRAY['a.old', 'b.old']) AS q;
SELECT treadle.start_workflow('old-flow', steps => ARRAY['only'], queue => q) FROM unnest(ARRAY['a.old', 'b.old']) AS q;
SELECT count(*) FROM (SELECT treadle.complete(c.id, c.lease_token) FROM treadle.claim('w-old', ARRAY['a.old', 'b.old'], batch => 10) AS c) AS d;
RESET treadle.now;
SELECT is((SELECT string_agg(queue || ' ' || state, ', ' ORDER BY queue, id) FROM treadle.jobs WHERE queue LIKE '_.old'),
          'a.old completed, a.old completed, b.old completed, b.old completed', '(each tenant has a job and a run finished in 2000)');
SELECT is(pg_temp.as_role_value('t4_a_adm', $$ SELECT treadle.prune('1 day') $$), '2',
          'tenant a''s operator prunes two jobs (its job and its run''s step)');
SELECT is((SELECT string_agg(queue, ', ' ORDER BY queue) FROM treadle.jobs WHERE queue LIKE '_.old'), 'b.old, b.old',
          'tenant b''s finished jobs stay');
SELECT is((SELECT string_agg(queue, ', ' ORDER BY queue) FROM treadle.workflow_runs WHERE queue LIKE '_.old'), 'b.old',
          'and so does its finished run');

--------------------------------------------------------------------------------
-- Every table and view with a queue column that a tenant may read: none shows it a row
-- of another tenant's queue (a new view that forgets the rule fails here)
--------------------------------------------------------------------------------
SELECT treadle.set_queue('b.old', retain_completed => '100 years', retain_failed => '100 years');
SELECT is(treadle.archive(), 1::bigint, '(tenant b''s job finished in 2000 goes to the history)');
SELECT treadle.start_workflow('b.gate', steps => ARRAY['one', 'two'], waits => '{"two": {"signal": "go"}}',
                              queue => 'b.gates') AS b_gate \gset
SELECT is(treadle.signal(:b_gate, 'go'), 'kept', '(a signal is kept for tenant b''s run)');
SELECT treadle.schedule('t4-b-nightly', '0 3 * * *', 'nightly', queue => 'b.cron');
SELECT treadle.set_queue('b.set', concurrency => 2);
CREATE TEMP TABLE queue_relations AS
    SELECT c.oid::regclass AS rel FROM pg_class AS c
      JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attname = 'queue' AND NOT a.attisdropped
     WHERE c.relnamespace = 'treadle'::regnamespace AND c.relkind IN ('r', 'v', 'p')
       AND has_column_privilege('t4_a', c.oid, a.attnum, 'SELECT');
SELECT cmp_ok((SELECT count(*) FROM queue_relations), '>=', 11::bigint,
              '(tenants read eleven relations or more with a queue column)');
SELECT is_empty($$ SELECT rel FROM queue_relations
                    WHERE pg_temp.as_role_value('t4_b', format('SELECT count(*) FROM %s WHERE starts_with(queue, ''b.'')', rel))::bigint = 0 $$,
                '(tenant b sees rows of its own in each of them)');
SELECT is_empty($$ SELECT rel FROM queue_relations
                    WHERE pg_temp.as_role_value('t4_a', format('SELECT count(*) FROM %s WHERE NOT starts_with(queue, ''a.'')', rel))::bigint > 0 $$,
                'tenant a sees no row of another queue in any of them');
SELECT is(pg_temp.as_role_value('t4_a', $$ SELECT count(*) FROM treadle.workflows WHERE NOT starts_with(name, 'a.') $$), '0',
          'nor another tenant''s workflow definition');

--------------------------------------------------------------------------------
-- The new arguments: each refused with a stable SQLSTATE, nothing written
--------------------------------------------------------------------------------
SELECT pg_temp.rows() AS before \gset
SELECT is(pg_temp.as_role('t4_prod', $$ SELECT treadle.enqueue('x', queue => 'p', idempotency_key => 'k', on_conflict => NULL) $$),
          '22004', 'on_conflict null');
SELECT is(pg_temp.as_role('t4_prod', $$ SELECT treadle.enqueue('x', queue => 'p', idempotency_key => 'k', on_conflict => E'keep\n') $$),
          '22023', 'on_conflict with a control character');
SELECT is(pg_temp.as_role('t4_prod', $$ SELECT treadle.enqueue('x', queue => 'p', on_conflict => 'replace') $$),
          '22023', 'on_conflict without an idempotency key');
SELECT is(pg_temp.as_role('t4_prod', $$ SELECT treadle.enqueue('x', queue => 'p', idempotency_key => 'k', unique_while => '') $$),
          '22023', 'unique_while empty');
SELECT is(pg_temp.as_role('t4_prod', $$ SELECT treadle.enqueue('x', queue => 'p', idempotency_key => 'k', unique_period => '0') $$),
          '22023', 'unique_period zero');
SELECT is(pg_temp.as_role('t4_prod', $$ SELECT treadle.enqueue('x', queue => 'p', idempotency_key => 'k',
                                                                unique_period => '178000000 years') $$),
          '22023', 'unique_period at the interval type''s edge');
SELECT is(pg_temp.as_role('t4_prod', $$ SELECT treadle.enqueue('x', queue => 'p', meta => '"text"') $$),
          '22023', 'meta that is not an object');
SELECT is(pg_temp.as_role('t4_prod', $$ SELECT treadle.enqueue('x', queue => 'p',
                                                                meta => (repeat('{"a":', 101) || '1' || repeat('}', 101))::jsonb) $$),
          '22023', 'meta nested over 100 levels');
SELECT is(pg_temp.as_role('t4_prod', $$ SELECT treadle.enqueue('x', queue => 'p', meta => jsonb_build_object('a', repeat('x', 1100000))) $$),
          '22023', 'meta over the payload limit');
SELECT is(pg_temp.as_role('t4_prod', $$ SELECT treadle.enqueue('x', queue => 'p', concurrency_key => repeat('k', 201)) $$),
          '22023', 'concurrency_key over 200 characters');
SELECT is(pg_temp.as_role('t4_prod', $$ SELECT treadle.enqueue('x', queue => 'p', concurrency_key => '   ') $$),
          '22023', 'concurrency_key of only spaces');
SELECT is(pg_temp.as_role('t4_prod', $$ SELECT treadle.enqueue_many('[{"name": "x", "queue": "p", "concurrency_key": {"k": 1}}]') $$),
          '22023', 'enqueue_many: a concurrency_key that is an object');
SELECT is(pg_temp.as_role('t4_prod', $$ SELECT treadle.enqueue_many('[{"name": "x", "queue": "p"},
                                                                      {"name": "x", "queue": "p", "idempotency_key": "k",
                                                                       "unique_period": "-1 day"}]') $$),
          '22023', 'enqueue_many: a negative unique_period in the second element (the first is not written either)');
SELECT is(pg_temp.as_role('t4_a', $$ SELECT treadle.enqueue_many('[{"name": "x", "queue": "a.p"}, {"name": "x", "queue": "b.p"}]') $$),
          '42501', 'enqueue_many: a tenant''s batch with one element in another tenant''s queue');
SELECT is(pg_temp.as_role('t4_prod', $$ SELECT treadle.start_workflow('w', steps => ARRAY['a'], queue => 'p', meta => '[]') $$),
          '22023', 'start_workflow: meta that is not an object');
SELECT is(pg_temp.as_role('t4_a', $$ SELECT treadle.start_workflow('a.w', steps => ARRAY['a'], queue => 'a.p',
                                                                   step_options => '{"a": {"queue": "b.p"}}') $$),
          '42501', 'start_workflow: a tenant''s step in another tenant''s queue');
SELECT is(pg_temp.as_role('t4_a', $$ SELECT treadle.start_workflow('a.w', steps => ARRAY['a'], queue => 'a.p',
                                                                   children => '{"a": {"workflow": "a.c", "queue": "b.p"}}') $$),
          '42501', 'start_workflow: a tenant''s child run in another tenant''s queue');
SELECT is(pg_temp.as_role('t4_a_adm', format($$ SELECT treadle.fork_run(%s, 'one', '7') $$, :b_run)), '42501',
          'fork_run: another tenant''s run is refused before its input is looked at');
SELECT is(pg_temp.as_role('t4_a', $$ SELECT treadle.signal_by_key('a.p', 'k', 'go', (repeat('[', 101) || repeat(']', 101))::jsonb) $$),
          '22023', 'signal_by_key: a payload nested over 100 levels');
SELECT is(pg_temp.as_role('t4_a', $$ SELECT treadle.signal_by_key('a.p', E'k\r', 'go') $$),
          '22023', 'signal_by_key: a key with a control character');
SELECT is(pg_temp.rows(), :'before', 'none of these calls wrote a row');

SELECT * FROM finish();
ROLLBACK;
