-- pgtap/034_key_lanes.sql: concurrency keys and ordered lanes. Each transition of a
-- keyed job (enqueue, release, claim, finish, fail, retry, cancel, rescue, delete)
-- and the slot count it keeps; set_queue's key settings; bad input refused with
-- nothing written; explain's reasons.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(117);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

-- the jobs of a queue as (state, key_slot) in id order, and a key's slot count
CREATE FUNCTION pg_temp.states(q text) RETURNS text LANGUAGE sql AS $$
    SELECT string_agg(state || CASE WHEN key_slot THEN '*' ELSE '' END, ' ' ORDER BY id)
      FROM treadle.jobs WHERE queue = q $$;
CREATE FUNCTION pg_temp.held(q text, k text) RETURNS integer LANGUAGE sql AS $$
    SELECT held FROM treadle.key_slots WHERE queue = q AND key = k $$;
-- claim one job of a queue; its (id, lease_token)
CREATE FUNCTION pg_temp.take(q text) RETURNS treadle.jobs LANGUAGE sql AS $$
    SELECT * FROM treadle.claim('w', ARRAY[q]) LIMIT 1 $$;

SELECT has_column('treadle', 'jobs', 'concurrency_key', 'treadle.jobs has concurrency_key');
SELECT has_column('treadle', 'job_history', 'concurrency_key', 'the history has concurrency_key');
SELECT has_table('treadle', 'key_slots', 'treadle.key_slots exists');

--------------------------------------------------------------------------------
-- limit 1 (the default): one released, the rest blocked, oldest first
--------------------------------------------------------------------------------
SELECT treadle.enqueue('k', queue => 'kq', concurrency_key => 'c1') AS a1 \gset
SELECT treadle.enqueue('k', queue => 'kq', concurrency_key => 'c1') AS a2 \gset
SELECT treadle.enqueue('k', queue => 'kq', concurrency_key => 'c1') AS a3 \gset
SELECT treadle.enqueue('k', queue => 'kq', concurrency_key => 'c2') AS b1 \gset
SELECT treadle.enqueue('k', queue => 'kq') AS plain \gset
SELECT is(pg_temp.states('kq'), 'available* blocked blocked available* available',
          'the first job of each key is released holding a slot; the others of c1 are blocked; a job without a key is untouched');
SELECT is(pg_temp.held('kq', 'c1'), 1, 'c1 holds one slot');
SELECT is((pg_temp.job(:plain)).key_slot, NULL, 'a job without a key has no key_slot');
SELECT is(pg_temp.states('kq'), 'available* blocked blocked available* available', '(unchanged)');

SELECT id AS t1, lease_token AS t1_tok FROM pg_temp.take('kq') \gset
SELECT is(:t1::bigint, :a1::bigint, 'the claim takes the released job of c1');
SELECT id AS t2 FROM pg_temp.take('kq') \gset
SELECT is(:t2::bigint, :b1::bigint, 'then c2 (the blocked jobs of c1 are never claimed)');
SELECT id AS t3 FROM pg_temp.take('kq') \gset
SELECT is(:t3::bigint, :plain::bigint, 'then the job without a key');
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['kq'])), 0::bigint, 'nothing else is claimable');
SELECT is(pg_temp.states('kq'), 'running* blocked blocked running* running', 'a running job keeps its slot');

SELECT is(treadle.complete(:a1, :'t1_tok'), 'completed', 'the head of c1 completes');
SELECT is(pg_temp.states('kq'), 'completed available* blocked running* running',
          'completing gives its slot back and releases the next job of c1 in the same transaction');
SELECT is(pg_temp.held('kq', 'c1'), 1, 'c1 still holds one slot (the released job''s)');
SELECT cmp_ok((pg_temp.job(:a2)).ready_txid, '=', pg_current_xact_id(), 'the released job is marked ready now (claims resuming find it)');

-- cancel a blocked job: nothing else moves
SELECT ok(treadle.cancel(:a3), 'a blocked job can be cancelled');
SELECT is(pg_temp.states('kq'), 'completed available* cancelled running* running', 'cancelling a blocked job frees nothing');
-- cancel the released one: its slot goes and the key's row with it
SELECT ok(treadle.cancel(:a2), 'the released job is cancelled');
SELECT is(pg_temp.held('kq', 'c1'), NULL, 'no slot held: the key''s row is gone');

--------------------------------------------------------------------------------
-- fail: a retry keeps the slot, failing for good gives it back
--------------------------------------------------------------------------------
SELECT treadle.enqueue('k', queue => 'fq', concurrency_key => 'x', max_attempts => 2) AS f1 \gset
SELECT treadle.enqueue('k', queue => 'fq', concurrency_key => 'x') AS f2 \gset
SELECT id AS ft, lease_token AS ft_tok FROM pg_temp.take('fq') \gset
SELECT is(treadle.fail(:f1, :'ft_tok', 'boom', retry_in => '1 second'), 'retryable', 'a failed attempt with attempts left: retryable');
SELECT is(pg_temp.states('fq'), 'retryable* blocked', 'a retrying job keeps its slot');
SET LOCAL treadle.now = '2999-01-01 12:00:05+00';
SELECT id AS ft, lease_token AS ft_tok FROM pg_temp.take('fq') \gset
SELECT is(:ft::bigint, :f1::bigint, 'the retry is claimed');
SELECT is(treadle.fail(:f1, :'ft_tok', 'boom again'), 'discarded', 'out of attempts: discarded');
SELECT is(pg_temp.states('fq'), 'discarded available*', 'failing for good gives the slot back (not an ordered queue)');
-- retry of the discarded job while the key is full: it waits blocked
SELECT ok(treadle.retry(:f1), 'the discarded job is retried');
SELECT is(pg_temp.states('fq'), 'blocked available*', 'a retried job whose key is full is blocked, holding nothing');
SELECT is(pg_temp.held('fq', 'x'), 1, 'the count did not move');

--------------------------------------------------------------------------------
-- snooze and release keep the slot; rescue of an expired lease keeps it
--------------------------------------------------------------------------------
SELECT id AS st, lease_token AS st_tok FROM pg_temp.take('fq') \gset
SELECT is(treadle.snooze(:f2, :'st_tok', '1 minute'), 'available', 'a keyed job snoozes');
SELECT is(pg_temp.states('fq'), 'blocked available*', 'a snoozed job keeps its slot');
SET LOCAL treadle.now = '2999-01-01 12:02:00+00';
SELECT id AS st, lease_token AS st_tok FROM pg_temp.take('fq') \gset
SET LOCAL treadle.now = '2999-01-01 12:10:00+00';
SELECT cmp_ok(treadle.rescue(), '>=', 1, 'rescue takes back the expired lease');
SELECT is(pg_temp.states('fq'), 'blocked retryable*', 'a rescued job keeps its slot: the lane waits for it, nothing runs twice at once');
SELECT id AS st, lease_token AS st_tok FROM pg_temp.take('fq') \gset
SELECT is(treadle.complete(:f2, :'st_tok'), 'completed', 'the rescued job completes');
SELECT is(pg_temp.states('fq'), 'available* completed', 'and the retried job is released');

--------------------------------------------------------------------------------
-- complete_many gives slots back; a rescue that discards the last attempt does too
--------------------------------------------------------------------------------
SELECT treadle.enqueue('k', queue => 'cq', concurrency_key => 'm') AS m1 \gset
SELECT treadle.enqueue('k', queue => 'cq', concurrency_key => 'm') AS m2 \gset
SELECT id AS mt, lease_token AS mt_tok FROM pg_temp.take('cq') \gset
SELECT is((SELECT state FROM treadle.complete_many(ARRAY[:mt::bigint], ARRAY[:'mt_tok'::uuid])), 'completed',
          'complete_many completes the keyed job');
SELECT is(pg_temp.states('cq'), 'completed available*', 'and releases the next of its key');
SELECT treadle.enqueue('k', queue => 'rq', concurrency_key => 'r', max_attempts => 1) AS r1 \gset
SELECT treadle.enqueue('k', queue => 'rq', concurrency_key => 'r') AS r2 \gset
SELECT id AS rt FROM pg_temp.take('rq') \gset
SET LOCAL treadle.now = '2999-01-01 12:11:00+00';
SELECT cmp_ok(treadle.rescue(), '>=', 1, 'rescue takes back the expired last attempt');
SELECT is(pg_temp.states('rq'), 'discarded available*', 'discarded by rescue: its slot goes to the next job');
SET LOCAL treadle.now = '2999-01-01 12:10:00+00';

--------------------------------------------------------------------------------
-- key_limit: N released at once; raising it releases at once; per queue
--------------------------------------------------------------------------------
SELECT treadle.set_queue('lq', key_limit => 2);
SELECT treadle.enqueue('k', queue => 'lq', concurrency_key => 'c') FROM generate_series(1, 5);
SELECT is(pg_temp.states('lq'), 'available* available* blocked blocked blocked', 'key_limit 2: two released');
SELECT is(pg_temp.held('lq', 'c'), 2, 'two slots held');
SELECT treadle.enqueue('k', queue => 'lq2', concurrency_key => 'c');
SELECT is(pg_temp.states('lq2'), 'available*', 'the same key in another queue is another lane (tenants'' keys never meet)');
SELECT treadle.set_queue('lq', key_limit => 4);
SELECT is(pg_temp.states('lq'), 'available* available* available* available* blocked', 'raising key_limit releases into the new room at once');
SELECT treadle.set_queue('lq', key_limit => 1);
SELECT is(pg_temp.states('lq'), 'available* available* available* available* blocked', 'lowering it takes nothing back');
-- (the ids read first: on Citus a statement over one queue's rows runs whole on its shard)
SELECT array_agg(id ORDER BY id) AS lq_ids
  FROM (SELECT id FROM treadle.jobs WHERE queue = 'lq' AND state = 'available' ORDER BY id LIMIT 3) AS j \gset
SELECT ok(treadle.cancel(c.id), 'cancel') FROM unnest(:'lq_ids'::bigint[]) AS c(id);
SELECT is(pg_temp.states('lq'), 'cancelled cancelled cancelled available* blocked', 'below the lowered limit only: nothing released yet');
SELECT treadle.set_queue('lq');
SELECT is((SELECT count(*) FROM treadle.queues WHERE queue = 'lq'), 0::bigint, 'a queue whose only settings were key settings loses its row');

--------------------------------------------------------------------------------
-- ordered lanes: a failed head blocks its lane until retried or cancelled
--------------------------------------------------------------------------------
SELECT treadle.set_queue('oq', key_ordered => true);
SELECT treadle.enqueue('hook', queue => 'oq', concurrency_key => 'cust-1', max_attempts => 1) AS o1 \gset
SELECT treadle.enqueue('hook', queue => 'oq', concurrency_key => 'cust-1') AS o2 \gset
SELECT treadle.enqueue('hook', queue => 'oq', concurrency_key => 'cust-2') AS p1 \gset
SELECT id AS ot, lease_token AS ot_tok FROM treadle.claim('w', ARRAY['oq']) WHERE id = :o1 \gset
SELECT is(treadle.fail(:o1, :'ot_tok', 'endpoint down'), 'discarded', 'the head of cust-1 fails for good');
SELECT is((pg_temp.take('oq')).id, :p1::bigint, 'the next claim takes cust-2''s job');
SELECT is(pg_temp.states('oq'), 'discarded* blocked running*', 'the failed head keeps its slot: its lane stays blocked; cust-2 is not held back');
SELECT is((SELECT reason FROM treadle.explain(:o2)), 'lane_blocked', 'explain: lane_blocked');
SELECT matches((SELECT message FROM treadle.explain(:o2)), format('lane blocked by failed head #%s', :o1), 'explain names the failed head');
SELECT is((SELECT array_agg(reason ORDER BY reason) FROM treadle.explain(:o1)), ARRAY['discarded', 'lane_blocked'],
          'explain of the head: discarded, and it blocks its lane');
SET LOCAL treadle.now = '2999-01-01 12:30:00+00';
SELECT treadle.archive();
SELECT is((pg_temp.job(:o1)).state, 'discarded', 'archive does not move a head that blocks its lane');
SELECT ok(treadle.retry(:o1), 'the head is retried');
SELECT is(pg_temp.states('oq'), 'available* blocked running*', 'a retried head keeps its slot and goes first again');
SELECT id AS ot, lease_token AS ot_tok FROM treadle.claim('w', ARRAY['oq']) \gset
SELECT is(:ot::bigint, :o1::bigint, 'the head is claimed again, before the rest of its lane');
SELECT is(treadle.fail(:o1, :'ot_tok', 'down again'), 'discarded', 'it fails again');
SET LOCAL treadle.now = '2999-06-01 00:00:00+00';
SELECT treadle.prune('1 second');
SELECT treadle.apply_retention();
SELECT is((pg_temp.job(:o1)).state, 'discarded', 'prune and retention leave a head that blocks its lane');
SELECT ok(treadle.cancel(:o1), 'cancel takes the failed head out of its lane');
SELECT is(pg_temp.states('oq'), 'cancelled available* running*', 'and the lane goes on');
SELECT ok(NOT treadle.cancel(:o1), 'a second cancel changes nothing');
SELECT throws_ok($$ SELECT treadle.set_queue('oq', key_limit => 2, key_ordered => true) $$, '22023', NULL,
                 'an ordered queue with key_limit 2 is refused');

--------------------------------------------------------------------------------
-- delete: retention of a held job gives its slot back
--------------------------------------------------------------------------------
SELECT treadle.enqueue('k', queue => 'dq', concurrency_key => 'z') AS d1 \gset
SELECT treadle.enqueue('k', queue => 'dq', concurrency_key => 'z') AS d2 \gset
SELECT ok(treadle.cancel(:d1), 'cancel the job that holds the slot');
SELECT is(pg_temp.states('dq'), 'cancelled available*', 'cancelling a job that holds a slot releases the next');
SELECT is(pg_temp.held('dq', 'z'), 1, 'the count follows');

--------------------------------------------------------------------------------
-- explain: key full
--------------------------------------------------------------------------------
SELECT treadle.enqueue('k', queue => 'dq', concurrency_key => 'z') AS d3 \gset
SELECT is((SELECT reason FROM treadle.explain(:d3) LIMIT 1), 'key_full', 'explain: key_full');
SELECT is((SELECT message FROM treadle.explain(:d3) LIMIT 1),
          format('key full: 1 of 1 held by jobs #%s (key z of queue dq); it is released when one of them finishes', :d2),
          'explain names the jobs holding the slots');

--------------------------------------------------------------------------------
-- enqueue_many, keys on conflict, max_depth
--------------------------------------------------------------------------------
SELECT is((SELECT count(*) FROM treadle.enqueue_many(
              '[{"name": "m", "queue": "mq", "concurrency_key": "k1"}, {"name": "m", "queue": "mq", "concurrency_key": "k1"},
                {"name": "m", "queue": "mq", "concurrency_key": "k2"}, {"name": "m", "queue": "mq"}]')), 4::bigint, 'enqueue_many takes concurrency_key');
SELECT is(pg_temp.states('mq'), 'available* blocked available* available', 'enqueue_many gates each key');
SELECT treadle.enqueue('m', '{"v": 1}', queue => 'mq', concurrency_key => 'k1', idempotency_key => 'i') AS i1 \gset
SELECT is(treadle.enqueue('m', '{"v": 2}', queue => 'mq', concurrency_key => 'k1', idempotency_key => 'i', on_conflict => 'replace'),
          :i1::bigint, 'on_conflict replace merges into a blocked holder of the key');
SELECT is((pg_temp.job(:i1)).args, '{"v": 2}'::jsonb, 'the blocked holder takes the new args');
SELECT treadle.set_queue('mq', max_depth => 5);
SELECT throws_ok($$ SELECT treadle.enqueue('m', queue => 'mq') $$, 'TQ001', NULL, 'blocked jobs count toward max_depth');

--------------------------------------------------------------------------------
-- bad input: refused, nothing written
--------------------------------------------------------------------------------
SELECT throws_ok($$ SELECT treadle.enqueue('m', queue => 'bq', concurrency_key => '') $$, '22023',
                 'treadle: concurrency_key must be 1 to 200 characters, not only spaces, without control characters',
                 'an empty concurrency_key is refused');
SELECT throws_ok(format($$ SELECT treadle.enqueue('m', queue => 'bq', concurrency_key => %L) $$, repeat('k', 201)), '22023', NULL,
                 'a concurrency_key over 200 characters is refused');
SELECT throws_ok($$ SELECT treadle.enqueue('m', queue => 'bq', concurrency_key => E'a\nb') $$, '22023', NULL,
                 'a concurrency_key with a control character is refused');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "m", "queue": "bq", "concurrency_key": 7}]') $$, '22023',
                 'treadle: jobs element 0 has a "concurrency_key" that is not a string', 'enqueue_many: a key that is not a string');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "m", "queue": "bq"}, {"name": "m", "queue": "bq", "concurrency_key": " "}]') $$, '22023',
                 NULL, 'enqueue_many: a blank key');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE queue = 'bq'), 0::bigint, 'nothing was written');
SELECT throws_ok($$ SELECT treadle.set_queue('bq', key_limit => 0) $$, '22023',
                 'treadle: key_limit must be between 1 and 100000, got 0', 'key_limit 0 is refused');
SELECT throws_ok($$ SELECT treadle.set_queue('bq', key_limit => 100001) $$, '22023', NULL, 'key_limit over 100000 is refused');
SELECT is((SELECT count(*) FROM treadle.queues WHERE queue = 'bq'), 0::bigint, 'no settings were written');
SELECT is((SELECT count(*) FROM treadle.key_slots WHERE held < 1), 0::bigint, 'no key row is left at zero');

--------------------------------------------------------------------------------
-- roles: producers set keys, workers finish keyed jobs, tenants' keys never meet
--------------------------------------------------------------------------------
CREATE ROLE kl_prod; SELECT treadle.grant_producer('kl_prod');
CREATE ROLE kl_a; SELECT treadle.grant_worker('kl_a'); SELECT treadle.set_tenant('kl_a', 'a.');
CREATE ROLE kl_b; SELECT treadle.grant_worker('kl_b'); SELECT treadle.set_tenant('kl_b', 'b.');
SELECT is(pg_temp.as_role('kl_prod', $$ SELECT treadle.enqueue('k', queue => 'pq', concurrency_key => 'c') $$), 'ok',
          'a producer enqueues with a concurrency key');
SELECT is(pg_temp.as_role('kl_prod', $$ SELECT treadle.enqueue_many('[{"name": "k", "queue": "pq", "concurrency_key": "c"}]') $$),
          'ok', 'and with enqueue_many');
SELECT is(pg_temp.states('pq'), 'available* blocked', 'the producer''s jobs are gated');
SELECT is(pg_temp.as_role('kl_prod', $$ SELECT treadle.set_queue('pq', key_limit => 5) $$), '42501',
          'a producer may not change a queue''s key settings');
SELECT is(pg_temp.as_role('kl_a', $$ SELECT treadle.enqueue('k', queue => 'a.hooks', concurrency_key => 'customer') $$), 'ok',
          'tenant a enqueues with key customer');
SELECT is(pg_temp.as_role('kl_b', $$ SELECT treadle.enqueue('k', queue => 'b.hooks', concurrency_key => 'customer') $$), 'ok',
          'tenant b enqueues with the same key');
SELECT is(pg_temp.states('a.hooks') || ' | ' || pg_temp.states('b.hooks'), 'available* | available*',
          'the same key in two tenants'' queues: two lanes, each with its own slot');
SELECT is(pg_temp.as_role('kl_a', $$ SELECT treadle.enqueue('k', queue => 'b.hooks', concurrency_key => 'customer') $$), '42501',
          'a tenant cannot reach another''s lane');
SELECT is(pg_temp.as_role_value('kl_a', $$ SELECT treadle.complete(c.id, c.lease_token)
                                             FROM treadle.claim('wa', ARRAY['a.hooks']) AS c $$),
          'completed', 'tenant a claims and completes its keyed job as a worker');
SELECT is(pg_temp.held('a.hooks', 'customer'), NULL, 'its slot is given back');
SELECT is(pg_temp.held('b.hooks', 'customer'), 1, 'tenant b''s lane is untouched');

--------------------------------------------------------------------------------
-- due first: a job scheduled for later never holds a slot while a due job of its
-- key waits; an ordered lane keeps enqueue order (its head holds the lane)
--------------------------------------------------------------------------------
SET LOCAL treadle.now = '2999-01-02 12:00:00+00';
SELECT treadle.enqueue('k', queue => 'duq', concurrency_key => 'd', run_at => '2999-01-02 13:00:00+00') AS l1 \gset
SELECT is(pg_temp.states('duq'), 'available*', 'a job scheduled for later takes its key''s free slot');
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['duq'])), 0::bigint, '(it is not claimable before its time)');
SELECT treadle.enqueue('k', queue => 'duq', concurrency_key => 'd') AS d1 \gset
SELECT is(pg_temp.states('duq'), 'blocked available*',
          'a due job of the key takes the slot of the job scheduled later, which had not started: that one is blocked again');
SELECT is(pg_temp.held('duq', 'd'), 1, 'the count did not move');
SELECT treadle.enqueue('k', queue => 'duq', concurrency_key => 'd', run_at => '2999-01-02 12:10:00+00') AS l2 \gset
SELECT is(pg_temp.states('duq'), 'blocked available* blocked', 'a job scheduled for later does not take a due job''s slot');
SELECT is((SELECT message FROM treadle.explain(:l1) WHERE reason = 'key_waiting'),
          '1 job(s) of key d wait for a slot before it', 'explain counts the jobs due before it (12:10), not the older ones');
SELECT id AS dt, lease_token AS dt_tok FROM pg_temp.take('duq') \gset
SELECT is(:dt::bigint, :d1::bigint, 'the due job is claimed');
SELECT is(treadle.complete(:d1, :'dt_tok'), 'completed', 'and completes');
SELECT is(pg_temp.states('duq'), 'blocked completed available*',
          'no job is due: the slot goes to the one due soonest (12:10), not to the oldest (13:00)');
SELECT treadle.enqueue('k', queue => 'duq', concurrency_key => 'd') AS d2 \gset
SELECT is(pg_temp.states('duq'), 'blocked completed blocked available*', 'a due job takes that slot in turn');
SET LOCAL treadle.now = '2999-01-02 12:11:00+00';
SELECT id AS dt, lease_token AS dt_tok FROM pg_temp.take('duq') \gset
SELECT is(:dt::bigint, :d2::bigint, 'the due job is claimed');
SELECT is(treadle.complete(:d2, :'dt_tok'), 'completed', 'and completes');
SELECT is(pg_temp.states('duq'), 'blocked completed available* completed',
          'the job due since 12:10 is released: due by now, it runs without waiting for another finish');
SELECT id AS lt, lease_token AS lt_tok FROM pg_temp.take('duq') \gset
SELECT is(:lt::bigint, :l2::bigint, 'it is claimed');
SELECT is(treadle.snooze(:l2, :'lt_tok', '1 hour'), 'available', 'and snoozed for an hour');
SELECT treadle.enqueue('k', queue => 'duq', concurrency_key => 'd') AS d3 \gset
SELECT is(pg_temp.states('duq'), 'blocked completed available* completed blocked',
          'a snoozed job is under way: it keeps its slot and a due job waits');
SELECT is(pg_temp.held('duq', 'd'), 1, 'one slot held');

SELECT treadle.set_queue('dlq', key_ordered => true);
SELECT treadle.enqueue('k', queue => 'dlq', concurrency_key => 'o', run_at => '2999-01-02 14:00:00+00') AS o1 \gset
SELECT treadle.enqueue('k', queue => 'dlq', concurrency_key => 'o') AS o2 \gset
SELECT is(pg_temp.states('dlq'), 'available* blocked',
          'an ordered lane''s head scheduled for later holds the lane: the due job behind it waits (enqueue order)');
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['dlq'])), 0::bigint, 'nothing of the lane runs before its head''s time');
SET LOCAL treadle.now = '2999-01-02 14:00:00+00';
SELECT id AS ot, lease_token AS ot_tok FROM pg_temp.take('dlq') \gset
SELECT is(:ot::bigint, :o1::bigint, 'at its time the head runs first');
SELECT is(treadle.complete(:o1, :'ot_tok'), 'completed', 'and completes');
SELECT is(pg_temp.states('dlq'), 'completed available*', 'then the job behind it');

SELECT * FROM finish();
ROLLBACK;
