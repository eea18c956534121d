-- pgtap/032_enqueue_keys.sql: idempotency keys that merge into a waiting holder
-- (on_conflict), that are held while the job waits, waits or runs, or until
-- retention (unique_while), and per period (unique_period); every bad option.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(81);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

CREATE FUNCTION pg_temp.keyed(key text, q text DEFAULT 'keys') RETURNS bigint LANGUAGE sql AS $$
    SELECT count(*) FROM treadle.jobs WHERE idempotency_key = key AND queue = q $$;
CREATE FUNCTION pg_temp.claim_one(q text DEFAULT 'keys') RETURNS treadle.jobs LANGUAGE sql AS $$
    SELECT * FROM treadle.claim('w', ARRAY[q]) $$;

-- keep (the default): the holder's id, whatever its state
SELECT treadle.enqueue('k', '{"n": 1}', queue => 'keys', idempotency_key => 'keep') AS keep1 \gset
SELECT is(treadle.enqueue('k', '{"n": 2}', queue => 'keys', idempotency_key => 'keep'), :keep1::bigint,
          'keep: a second call returns the waiting holder');
SELECT is(treadle.enqueue('k', '{"n": 2}', queue => 'keys', idempotency_key => 'keep', on_conflict => 'keep'),
          :keep1::bigint, 'keep named: the same');
SELECT is((pg_temp.job(:keep1)).args, '{"n": 1}'::jsonb, 'keep: the holder''s args are untouched');
SELECT is((pg_temp.job(:keep1)).key_scope, 'retained', 'a keyed job is stored with its scope, retained by default');
SELECT is((pg_temp.job(treadle.enqueue('nokey', queue => 'keys'))).key_scope, NULL, 'a job without a key has no scope');
SELECT is((pg_temp.claim_one()).id, :keep1::bigint, 'the holder is claimed');
SELECT is(treadle.enqueue('k', queue => 'keys', idempotency_key => 'keep'), :keep1::bigint,
          'keep: a running holder is returned');
SELECT is(treadle.complete(:keep1, (pg_temp.job(:keep1)).lease_token, NULL), 'completed', 'the holder completes');
SELECT is(treadle.enqueue('k', queue => 'keys', idempotency_key => 'keep'), :keep1::bigint,
          'keep, retained: a completed holder is still returned');
SELECT is(pg_temp.keyed('keep'), 1::bigint, 'keep: one row for the key');
DELETE FROM treadle.jobs WHERE queue = 'keys';

-- replace (debounce): args and run_at replaced, the timer restarts
SELECT treadle.enqueue('search', '{"q": "h"}', queue => 'keys', run_at => '2999-01-01 11:00:01+00',
                       idempotency_key => 'deb', on_conflict => 'replace') AS deb \gset
SELECT is(treadle.enqueue('search', '{"q": "he"}', queue => 'keys', run_at => '2999-01-01 11:00:02+00',
                          idempotency_key => 'deb', on_conflict => 'replace'), :deb::bigint,
          'replace: the waiting holder''s id');
SELECT results_eq(format($$ SELECT args, run_at, state FROM treadle.jobs WHERE id = %s $$, :deb),
    $$ VALUES ('{"q": "he"}'::jsonb, '2999-01-01 11:00:02+00'::timestamptz, 'available'::text) $$,
    'replace: the last call''s args and run_at');
SELECT is(pg_temp.keyed('deb'), 1::bigint, 'replace: still one row');
SELECT cmp_ok((pg_temp.job(:deb)).ready_txid, '=', pg_current_xact_id(),
              'replace: the job is marked claimable again for claims that resume');

-- replace_args (throttle): args replaced, run_at kept
SELECT treadle.enqueue('t', '{"v": 1}', queue => 'keys', run_at => '2999-01-01 12:05:00+00',
                       idempotency_key => 'thr', on_conflict => 'replace_args') AS thr \gset
SELECT is(treadle.enqueue('t', '{"v": 2}', queue => 'keys', run_at => '2999-01-01 12:09:00+00',
                          idempotency_key => 'thr', on_conflict => 'replace_args'), :thr::bigint,
          'replace_args: the waiting holder''s id');
SELECT results_eq(format($$ SELECT args, run_at FROM treadle.jobs WHERE id = %s $$, :thr),
    $$ VALUES ('{"v": 2}'::jsonb, '2999-01-01 12:05:00+00'::timestamptz) $$,
    'replace_args: the new args, the first run_at');

-- append (batch)
SELECT treadle.enqueue('digest', '{"items": [1], "to": "a"}', queue => 'keys',
                       idempotency_key => 'dig', on_conflict => 'append') AS dig \gset
SELECT is(treadle.enqueue('digest', '{"items": [2, 3], "to": "b", "tags": ["x"]}', queue => 'keys',
                          idempotency_key => 'dig', on_conflict => 'append'), :dig::bigint,
          'append: the waiting holder''s id');
SELECT is((pg_temp.job(:dig)).args, '{"items": [1, 2, 3], "to": "b", "tags": ["x"]}'::jsonb,
          'append: arrays appended by member (a missing one starts empty), other members replaced');
SELECT throws_ok($$ SELECT treadle.enqueue('digest', '[4]', queue => 'keys', idempotency_key => 'dig', on_conflict => 'append') $$,
                 '22023', NULL, 'append: args that are not an object raise 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('digest', '{"to": ["c"]}', queue => 'keys', idempotency_key => 'dig', on_conflict => 'append') $$,
                 '22023', NULL, 'append to a member that is not an array raises 22023');
SELECT is((pg_temp.job(:dig)).args, '{"items": [1, 2, 3], "to": "b", "tags": ["x"]}'::jsonb,
          'append: refused calls changed nothing');
SELECT treadle.enqueue('arr', '[1]', queue => 'keys', idempotency_key => 'arr') AS arr \gset
SELECT throws_ok($$ SELECT treadle.enqueue('arr', '{"a": [2]}', queue => 'keys', idempotency_key => 'arr', on_conflict => 'append') $$,
                 '22023', NULL, 'append into a holder whose args are an array raises 22023');
SELECT treadle.configure(max_payload_bytes => 2048);
SELECT treadle.enqueue('big', jsonb_build_object('s', jsonb_build_array(repeat('x', 1500))), queue => 'keys',
                       idempotency_key => 'big', on_conflict => 'append') AS big \gset
SELECT throws_ok($$ SELECT treadle.enqueue('big', jsonb_build_object('s', jsonb_build_array(repeat('y', 1500))), queue => 'keys',
                                           idempotency_key => 'big', on_conflict => 'append') $$,
                 '22023', NULL, 'append past the size limit raises 22023');
SELECT is(jsonb_array_length((pg_temp.job(:big)).args -> 's'), 1, 'and leaves the holder as it was');
SELECT treadle.configure(max_payload_bytes => 1048576);

-- A running holder is never changed: the call makes a new job behind it, which takes the key
SELECT is((pg_temp.claim_one()).id, :deb::bigint, 'the debounced job is claimed');
SELECT treadle.enqueue('search', '{"q": "hel"}', queue => 'keys', idempotency_key => 'deb',
                       on_conflict => 'replace') AS deb2 \gset
SELECT isnt(:deb2::bigint, :deb::bigint, 'replace with a running holder makes a new job');
SELECT results_eq(format($$ SELECT args, state, key_scope FROM treadle.jobs WHERE id = %s $$, :deb),
    $$ VALUES ('{"q": "he"}'::jsonb, 'running'::text, 'released'::text) $$,
    'the running holder keeps its args and state, and gives its key up');
SELECT is(treadle.enqueue('search', '{"q": "hell"}', queue => 'keys', idempotency_key => 'deb',
                          on_conflict => 'replace'), :deb2::bigint, 'the next call merges into the new waiting job');
SELECT is((pg_temp.job(:deb2)).args, '{"q": "hell"}'::jsonb, 'with the last args');
SELECT is(treadle.enqueue('search', queue => 'keys', idempotency_key => 'deb'), :deb2::bigint,
          'keep finds the new holder');
SELECT is(treadle.complete(:deb, (pg_temp.job(:deb)).lease_token, NULL), 'completed',
          'the released job completes as usual');
-- a finished holder (retained) also gives its key up to a merging call
SELECT treadle.enqueue('f', queue => 'keys', idempotency_key => 'fin', run_at => '2000-01-01 00:00:00+00') AS fin \gset
SELECT is(treadle.cancel(:fin), true, 'a holder is cancelled');
SELECT isnt(treadle.enqueue('f', queue => 'keys', idempotency_key => 'fin', on_conflict => 'replace_args'), :fin::bigint,
            'replace_args with a finished holder makes a new job');
SELECT is((pg_temp.job(:fin)).key_scope, 'released', 'the finished holder gave its key up');
DELETE FROM treadle.jobs WHERE queue = 'keys';

-- unique_while 'waiting': held until the first claim
SELECT treadle.enqueue('w', queue => 'keys', idempotency_key => 'wt', unique_while => 'waiting') AS wt1 \gset
SELECT is(treadle.enqueue('w', queue => 'keys', idempotency_key => 'wt', unique_while => 'waiting'), :wt1::bigint,
          'waiting: a waiting holder is returned');
SELECT is((pg_temp.claim_one()).id, :wt1::bigint, 'the holder is claimed');
SELECT treadle.enqueue('w', queue => 'keys', idempotency_key => 'wt', unique_while => 'waiting') AS wt2 \gset
SELECT isnt(:wt2::bigint, :wt1::bigint, 'waiting: once the holder runs the key is free: a new job');
SELECT is(treadle.fail(:wt1, (pg_temp.job(:wt1)).lease_token, 'boom'), 'retryable',
          'the first job fails back to waiting, beside the new holder, without a conflict');
SELECT is(treadle.enqueue('w', queue => 'keys', idempotency_key => 'wt', unique_while => 'waiting'), :wt2::bigint,
          'waiting: the key stays with the job that took it');
SELECT treadle.enqueue('w', queue => 'keys', idempotency_key => 'wc', unique_while => 'waiting') AS wc \gset
SELECT is(treadle.cancel(:wc), true, 'a waiting holder is cancelled');
SELECT treadle.enqueue('w', queue => 'keys', idempotency_key => 'wc', unique_while => 'waiting') AS wc2 \gset
SELECT isnt(:wc2::bigint, :wc::bigint, 'waiting: a cancelled holder frees its key');
SELECT is(treadle.retry(:wc), true, 'the cancelled job is retried while another holds its key');
SELECT results_eq(format($$ SELECT state, key_scope FROM treadle.jobs WHERE id = %s $$, :wc),
    $$ VALUES ('available'::text, 'released'::text) $$, 'retry does not take the key back');
DELETE FROM treadle.jobs WHERE queue = 'keys';

-- unique_while 'active': held until the job finishes
SELECT treadle.enqueue('a', queue => 'keys', idempotency_key => 'act', unique_while => 'active') AS act1 \gset
SELECT is((pg_temp.claim_one()).id, :act1::bigint, 'the holder is claimed');
SELECT is(treadle.enqueue('a', queue => 'keys', idempotency_key => 'act', unique_while => 'active'), :act1::bigint,
          'active: a running holder is returned');
SELECT is(treadle.complete(:act1, (pg_temp.job(:act1)).lease_token, NULL), 'completed', 'the holder completes');
SELECT treadle.enqueue('a', queue => 'keys', idempotency_key => 'act', unique_while => 'active') AS act2 \gset
SELECT isnt(:act2::bigint, :act1::bigint, 'active: a completed holder frees its key at once');
SELECT is(pg_temp.keyed('act'), 2::bigint, 'the completed job stays, without its key');
-- a retryable holder still holds the key (it has not finished)
SELECT is((pg_temp.claim_one()).id, :act2::bigint, 'the new holder is claimed');
SELECT is(treadle.fail(:act2, (pg_temp.job(:act2)).lease_token, 'boom'), 'retryable', 'and fails, to retry');
SELECT is(treadle.enqueue('a', queue => 'keys', idempotency_key => 'act', unique_while => 'active'), :act2::bigint,
          'active: a retryable holder is returned');
SELECT is(treadle.retry(:act2), true, 'a retryable holder is retried');
SELECT is((pg_temp.job(:act2)).key_scope, 'active', 'and keeps its key');
DELETE FROM treadle.jobs WHERE queue = 'keys';

-- unique_period: the key is taken per period of treadle's clock
SELECT treadle.enqueue('p', queue => 'keys', idempotency_key => 'hour', unique_period => '1 hour') AS h1 \gset
SET LOCAL treadle.now = '2999-01-01 12:59:59+00';
SELECT is(treadle.enqueue('p', queue => 'keys', idempotency_key => 'hour', unique_period => '1 hour'), :h1::bigint,
          'unique_period: the same period returns the holder');
SET LOCAL treadle.now = '2999-01-01 13:00:00+00';
SELECT treadle.enqueue('p', queue => 'keys', idempotency_key => 'hour', unique_period => '1 hour') AS h2 \gset
SELECT isnt(:h2::bigint, :h1::bigint, 'unique_period: the next period makes a new job');
SELECT is((pg_temp.job(:h2)).key_period, '2999-01-01 13:00:00+00'::timestamptz, 'which holds the key for its period');
SELECT is(treadle.enqueue('p', queue => 'keys', idempotency_key => 'hour'), treadle.enqueue('p', queue => 'keys', idempotency_key => 'hour'),
          'the key without a period is a key of its own');
SELECT is(pg_temp.keyed('hour'), 3::bigint, 'three jobs: two periods and no period');
SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

-- keys are per queue: tenants' keys never meet
SELECT treadle.enqueue('x', '{"v": 1}', queue => 'keys', idempotency_key => 'shared') AS s1 \gset
SELECT treadle.enqueue('x', '{"v": 2}', queue => 'other', idempotency_key => 'shared', on_conflict => 'replace') AS s2 \gset
SELECT isnt(:s1::bigint, :s2::bigint, 'the same key in another queue is another job');
SELECT is((pg_temp.job(:s1)).args, '{"v": 1}'::jsonb, 'and a merging call there leaves this queue''s job alone');

-- enqueue_many takes the same options
SELECT treadle.enqueue('b', '{"ids": [1]}', queue => 'keys', idempotency_key => 'many', on_conflict => 'append') AS m1 \gset
CREATE TEMPORARY TABLE many_ids AS
SELECT row_number() OVER () AS ord, m.id
  FROM treadle.enqueue_many('[{"name": "b", "queue": "keys", "idempotency_key": "many", "on_conflict": "append", "args": {"ids": [2]}},
                             {"name": "b", "queue": "keys", "args": {"ids": [9]}},
                             {"name": "b", "queue": "keys", "idempotency_key": "many", "on_conflict": "append", "args": {"ids": [3]}}]') AS m(id);
SELECT results_eq($$ SELECT id FROM many_ids ORDER BY ord $$,
    format($$ VALUES (%s::bigint), ((SELECT max(id) FROM treadle.jobs WHERE args = '{"ids": [9]}')), (%s::bigint) $$, :m1, :m1),
    'enqueue_many: appending elements return the holder''s id, others their own');
SELECT is((pg_temp.job(:m1)).args, '{"ids": [1, 2, 3]}'::jsonb, 'enqueue_many: appended in input order');
SELECT m.id AS mp FROM treadle.enqueue_many('[{"name": "b", "queue": "keys", "idempotency_key": "mp", "unique_while": "active", "unique_period": "1 day"}]') AS m(id) \gset
SELECT results_eq(format($$ SELECT key_scope, key_period FROM treadle.jobs WHERE id = %s $$, :mp),
    $$ VALUES ('active'::text, '2999-01-01 00:00:00+00'::timestamptz) $$,
    'enqueue_many: unique_while and unique_period are stored');

SELECT m.id AS plain_key FROM treadle.enqueue_many('[{"name": "b", "queue": "keys", "idempotency_key": "plain"}]') AS m(id) \gset
SELECT is((pg_temp.job(:plain_key)).key_scope, 'retained', 'enqueue_many: a batch without key options stores a key retained');

-- explain names a waiting job that holds its key "debounced until"
SELECT treadle.enqueue('e', queue => 'keys', idempotency_key => 'exp', on_conflict => 'replace',
                       run_at => '2999-01-01 12:00:30+00') AS exp \gset
SELECT results_eq(format($$ SELECT reason, message, at FROM treadle.explain(%s) WHERE reason = 'not_due' $$, :exp),
    $$ VALUES ('not_due'::text, 'debounced until 2999-01-01 12:00:30+00: it holds key exp, and a call with that key and on_conflict replace moves this time'::text,
               '2999-01-01 12:00:30+00'::timestamptz) $$,
    'explain: a waiting job that holds its key is debounced until its run_at');

-- Bad options: a clear error and nothing written
SELECT count(*) AS before FROM treadle.jobs \gset
SELECT throws_ok($$ SELECT treadle.enqueue('k', queue => 'keys', idempotency_key => 'keep', on_conflict => NULL) $$,
                 '22004', 'treadle: on_conflict must not be null', 'a null on_conflict raises 22004');
SELECT throws_ok($$ SELECT treadle.enqueue('k', queue => 'keys', idempotency_key => 'keep', unique_while => NULL) $$,
                 '22004', 'treadle: unique_while must not be null', 'a null unique_while raises 22004');
SELECT throws_ok($$ SELECT treadle.enqueue('k', queue => 'keys', idempotency_key => 'deb', on_conflict => 'merge') $$,
                 '22023', NULL, 'an unknown on_conflict raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('k', queue => 'keys', idempotency_key => 'deb', unique_while => 'running') $$,
                 '22023', NULL, 'an unknown unique_while raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('k', queue => 'keys', idempotency_key => 'p', unique_period => '0') $$,
                 '22023', NULL, 'a zero unique_period raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('k', queue => 'keys', idempotency_key => 'p', unique_period => '-1 hour') $$,
                 '22023', NULL, 'a negative unique_period raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('k', queue => 'keys', idempotency_key => 'p', unique_period => '1 month') $$,
                 '22023', NULL, 'a unique_period in months raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('k', queue => 'keys', idempotency_key => 'p', unique_period => '367 days') $$,
                 '22023', NULL, 'a unique_period over 366 days raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('k', queue => 'keys', on_conflict => 'replace') $$,
                 '22023', 'treadle: on_conflict, unique_while and unique_period need an idempotency_key',
                 'on_conflict without a key raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue('k', queue => 'keys', unique_period => '1 hour') $$,
                 '22023', NULL, 'unique_period without a key raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "b", "idempotency_key": "z", "on_conflict": "merge"}]') $$,
                 '22023', NULL, 'enqueue_many: an unknown on_conflict raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "b", "idempotency_key": "z"}, {"name": "b", "idempotency_key": "z", "unique_while": null}]') $$,
                 '22023', NULL, 'enqueue_many: a null unique_while raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "b", "idempotency_key": "z", "unique_period": "soon"}]') $$,
                 '22023', NULL, 'enqueue_many: a malformed unique_period raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "b", "on_conflict": "replace"}]') $$,
                 '22023', NULL, 'enqueue_many: on_conflict without a key raises 22023');
SELECT is((SELECT count(*) FROM treadle.jobs), :before::bigint, 'no refused call wrote a job');

-- roles as enqueue: a producer may use the options
CREATE ROLE tap_keys_producer;
SELECT treadle.grant_producer('tap_keys_producer');
SELECT is(pg_temp.as_role('tap_keys_producer',
          $$ SELECT treadle.enqueue('r', queue => 'keys', idempotency_key => 'role', on_conflict => 'replace', unique_while => 'active', unique_period => '1 hour') $$),
          'ok', 'a producer enqueues with the key options');

SELECT * FROM finish();
ROLLBACK;
