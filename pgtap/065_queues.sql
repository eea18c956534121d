-- pgtap/065_queues.sql: queues as objects. set_queue, pause and resume, each bad
-- input refused with nothing written; what claim takes from paused, concurrency-
-- and rate-limited queues; backpressure (TQ001) in enqueue and enqueue_many; the
-- tenant rule; and treadle.explain for each reason it gives.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(107);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

SELECT has_table('treadle', 'queues', 'treadle.queues exists');
SELECT has_view('treadle', 'queue_settings', 'treadle.queue_settings exists');
SELECT has_function('treadle', 'set_queue', ARRAY['text', 'integer', 'integer', 'interval', 'integer', 'interval', 'interval',
                                                  'integer', 'boolean'],
                    'treadle.set_queue exists');
SELECT has_function('treadle', 'pause', ARRAY['text'], 'treadle.pause(text) exists');
SELECT has_function('treadle', 'resume', ARRAY['text'], 'treadle.resume(text) exists');
SELECT has_function('treadle', 'explain', ARRAY['bigint', 'text'], 'treadle.explain(bigint, text) exists');

--------------------------------------------------------------------------------
-- Bad input: each refused with its SQLSTATE, nothing written
--------------------------------------------------------------------------------
SELECT throws_ok($$ SELECT treadle.set_queue(NULL) $$, '22004', NULL, 'set_queue: a null queue raises 22004');
SELECT throws_ok($$ SELECT treadle.set_queue('') $$, '22023', NULL, 'an empty queue raises 22023');
SELECT throws_ok($$ SELECT treadle.set_queue('   ') $$, '22023', NULL, 'a blank queue raises 22023');
SELECT throws_ok($$ SELECT treadle.set_queue(E'a\nb') $$, '22023', NULL, 'a queue with a control character raises 22023');
SELECT throws_ok($$ SELECT treadle.set_queue(repeat('q', 201)) $$, '22023', NULL, 'a queue over 200 characters raises 22023');
SELECT throws_ok($$ SELECT treadle.set_queue('q', concurrency => 0) $$, '22023',
                 'treadle: concurrency must be between 1 and 100000, got 0', 'concurrency 0 raises 22023 (pause stops a queue)');
SELECT throws_ok($$ SELECT treadle.set_queue('q', concurrency => -1) $$, '22023', NULL, 'a negative concurrency raises 22023');
SELECT throws_ok($$ SELECT treadle.set_queue('q', concurrency => 100001) $$, '22023', NULL, 'concurrency over 100000 raises 22023');
SELECT throws_ok($$ SELECT treadle.set_queue('q', rate_limit => 5) $$, '22023',
                 'treadle: rate_limit and rate_period go together: give both or neither', 'a rate_limit without a period raises 22023');
SELECT throws_ok($$ SELECT treadle.set_queue('q', rate_period => '1 second') $$, '22023', NULL,
                 'a rate_period without a limit raises 22023');
SELECT throws_ok($$ SELECT treadle.set_queue('q', rate_limit => 0, rate_period => '1 second') $$, '22023', NULL,
                 'rate_limit 0 raises 22023');
SELECT throws_ok($$ SELECT treadle.set_queue('q', rate_limit => 1000001, rate_period => '1 second') $$, '22023', NULL,
                 'rate_limit over 1000000 raises 22023');
SELECT throws_ok($$ SELECT treadle.set_queue('q', rate_limit => 5, rate_period => '0') $$, '22023', NULL,
                 'a zero rate_period raises 22023');
SELECT throws_ok($$ SELECT treadle.set_queue('q', rate_limit => 5, rate_period => '-1 second') $$, '22023', NULL,
                 'a negative rate_period raises 22023');
SELECT throws_ok($$ SELECT treadle.set_queue('q', rate_limit => 5, rate_period => '25 hours') $$, '22023', NULL,
                 'a rate_period over a day raises 22023');
SELECT throws_ok($$ SELECT treadle.set_queue('q', max_depth => 0) $$, '22023', NULL, 'max_depth 0 raises 22023');
SELECT throws_ok($$ SELECT treadle.set_queue('q', max_depth => 1000001) $$, '22023', NULL, 'max_depth over 1000000 raises 22023');
SELECT throws_ok($$ SELECT treadle.set_queue('q', retain_completed => '-1 day') $$, '22023', NULL,
                 'a negative retain_completed raises 22023');
SELECT throws_ok($$ SELECT treadle.set_queue('q', retain_failed => '101 years') $$, '22023', NULL,
                 'a retain_failed over 100 years raises 22023');
SELECT throws_ok($$ SELECT treadle.pause(NULL) $$, '22004', NULL, 'pause: a null queue raises 22004');
SELECT throws_ok($$ SELECT treadle.pause(E'tab\there') $$, '22023', NULL, 'pause: a control character raises 22023');
SELECT throws_ok($$ SELECT treadle.resume(NULL) $$, '22004', NULL, 'resume: a null queue raises 22004');
SELECT throws_ok($$ SELECT treadle.resume('') $$, '22023', NULL, 'resume: an empty queue raises 22023');
SELECT throws_ok($$ SELECT * FROM treadle.explain(NULL) $$, '22004', NULL, 'explain: a null job_id raises 22004');
SELECT is((SELECT count(*) FROM treadle.queues), 0::bigint, 'no bad call wrote a row');

--------------------------------------------------------------------------------
-- pause and resume
--------------------------------------------------------------------------------
SELECT treadle.enqueue('p', queue => 'paused') AS p1 \gset
SELECT treadle.enqueue('o', queue => 'open') AS o1 \gset
SELECT is(treadle.pause('paused'), true, 'pause: true when the queue was not paused');
SELECT is(treadle.pause('paused'), false, 'pause again: false');
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['paused'], batch => 10)), 0::bigint,
          'a claim takes nothing from a paused queue');
SELECT isnt(treadle.enqueue('p', queue => 'paused'), NULL, 'enqueue into a paused queue still works');
SELECT results_eq($$ SELECT id FROM treadle.claim('w', ARRAY['paused', 'open'], batch => 10) $$, ARRAY[:o1::bigint],
                  'a claim of a paused and an open queue takes only the open one''s jobs');
SELECT is((SELECT state FROM treadle.jobs WHERE id = :p1), 'available', 'the paused queue''s job waits');
SELECT is(treadle.resume('paused'), true, 'resume: true when the queue was paused');
SELECT is(treadle.resume('paused'), false, 'resume again: false');
SELECT is((SELECT count(*) FROM treadle.queues WHERE queue = 'paused'), 0::bigint,
          'a resumed queue without settings has no row left');
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['paused'], batch => 10)), 2::bigint,
          'a resumed queue gives its jobs');
SELECT is(treadle.resume('never-paused'), false, 'resume of a queue without a row: false, nothing written');
SELECT is((SELECT count(*) FROM treadle.queues), 0::bigint, 'and no row was made');

--------------------------------------------------------------------------------
-- set_queue: the settings become exactly those given
--------------------------------------------------------------------------------
SELECT lives_ok($$ SELECT treadle.set_queue('s', concurrency => 3, rate_limit => 10, rate_period => '1 minute',
                                            max_depth => 100, retain_completed => '1 day', retain_failed => '7 days') $$,
                'set_queue with every setting');
SELECT results_eq($$ SELECT paused, concurrency, rate_limit, rate_period, max_depth, retain_completed, retain_failed
                       FROM treadle.queue_settings WHERE queue = 's' $$,
                  $$ VALUES (false, 3, 10, interval '1 minute', 100, interval '1 day', interval '7 days') $$,
                  'queue_settings shows them');
SELECT lives_ok($$ SELECT treadle.set_queue('s', max_depth => 5) $$, 'set_queue with one setting');
SELECT results_eq($$ SELECT concurrency, rate_limit, max_depth, retain_completed FROM treadle.queues WHERE queue = 's' $$,
                  $$ VALUES (NULL::integer, NULL::integer, 5, NULL::interval) $$,
                  'a setting left out is none: set_queue says all of them');
SELECT treadle.pause('s');
SELECT lives_ok($$ SELECT treadle.set_queue('s') $$, 'set_queue with no setting on a paused queue');
SELECT results_eq($$ SELECT paused, max_depth FROM treadle.queues WHERE queue = 's' $$,
                  $$ VALUES (true, NULL::integer) $$, 'set_queue leaves paused as it was');
SELECT treadle.resume('s');
SELECT is((SELECT count(*) FROM treadle.queues WHERE queue = 's'), 0::bigint,
          'resumed with no setting: the row goes');
SELECT treadle.set_queue('gone', max_depth => 3);
SELECT treadle.set_queue('gone');
SELECT is((SELECT count(*) FROM treadle.queues WHERE queue = 'gone'), 0::bigint,
          'set_queue with no setting on a queue that is not paused removes its row');

--------------------------------------------------------------------------------
-- Concurrency limit
--------------------------------------------------------------------------------
SELECT treadle.enqueue('c', queue => 'conc') FROM generate_series(1, 5);
SELECT treadle.set_queue('conc', concurrency => 2);
CREATE TEMP TABLE conc_claimed AS SELECT id, lease_token FROM treadle.claim('w', ARRAY['conc'], batch => 10);
SELECT is((SELECT count(*) FROM conc_claimed), 2::bigint, 'a claim of batch 10 takes the limit of 2');
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['conc'], batch => 10)), 0::bigint,
          'with 2 running, a claim takes nothing');
SELECT treadle.complete(id, lease_token) FROM conc_claimed ORDER BY id LIMIT 1;
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['conc'], batch => 10)), 1::bigint,
          'one finished: a claim takes one');
-- (a count of one queue as results_eq's query: on Citus is() around it would run on the queue's node)
SELECT results_eq($$ SELECT count(*) FROM treadle.jobs WHERE queue = 'conc' AND state = 'running' $$,
                  ARRAY[2::bigint], 'never more than 2 running');
SELECT treadle.enqueue('u', queue => 'unlimited') FROM generate_series(1, 5);
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['conc', 'unlimited'], batch => 10)), 5::bigint,
          'a full queue beside an unlimited one: the claim takes the unlimited one''s jobs');
SELECT treadle.set_queue('conc', concurrency => 3);
SELECT results_eq($$ SELECT queue FROM treadle.claim('w', ARRAY['conc', 'unlimited'], batch => 10) $$,
                  ARRAY['conc'], 'a raised limit gives exactly its new room');

--------------------------------------------------------------------------------
-- Rate limit: a bucket of rate_limit tokens, refilled at rate_limit per period
--------------------------------------------------------------------------------
SELECT treadle.enqueue('r', queue => 'rated') FROM generate_series(1, 20);
SELECT treadle.set_queue('rated', rate_limit => 3, rate_period => '1 minute');
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['rated'], batch => 10)), 3::bigint,
          'a full bucket gives a burst of rate_limit claims');
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['rated'], batch => 10)), 0::bigint,
          'an empty bucket gives none');
SET LOCAL treadle.now = '2999-01-01 12:00:20+00';
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['rated'], batch => 10)), 1::bigint,
          'a third of the period later, one token has come back');
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['rated'], batch => 10)), 0::bigint, 'and is spent');
SET LOCAL treadle.now = '2999-01-01 12:10:00+00';
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['rated'], batch => 10)), 3::bigint,
          'after ten periods the bucket holds rate_limit, not more');
SELECT treadle.set_queue('rated', rate_limit => 3, rate_period => '1 minute', max_depth => 1000);
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['rated'], batch => 10)), 0::bigint,
          'set_queue with the same rate keeps the bucket as it was (empty)');
SELECT treadle.set_queue('rated', rate_limit => 2, rate_period => '1 minute');
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['rated'], batch => 10)), 2::bigint,
          'a new rate starts with a full bucket');
SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

--------------------------------------------------------------------------------
-- Backpressure: max_depth counts waiting jobs (available, retryable)
--------------------------------------------------------------------------------
SELECT treadle.set_queue('deep', max_depth => 2);
SELECT treadle.enqueue('d', queue => 'deep') AS deep1 \gset
SELECT treadle.enqueue('d', queue => 'deep', run_at => '3000-01-01') AS deep2 \gset
SELECT throws_ok($$ SELECT treadle.enqueue('d', queue => 'deep') $$, 'TQ001',
                 'treadle: queue deep is full: 2 waiting jobs, its max_depth is 2',
                 'an enqueue past max_depth raises TQ001 (jobs not yet due count)');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "d", "queue": "other"}, {"name": "d", "queue": "deep"}]') $$,
                 'TQ001', NULL, 'enqueue_many past max_depth raises TQ001');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE queue IN ('deep', 'other')), 2::bigint, 'nothing was written');
SELECT ok((SELECT count(*) FROM treadle.claim('w', ARRAY['deep'])) = 1, 'a claim makes room (running jobs do not count)');
SELECT isnt(treadle.enqueue('d', queue => 'deep'), NULL, 'so an enqueue fits again');
SELECT treadle.set_queue('deep', max_depth => 4);
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "d", "queue": "deep"}, {"name": "d", "queue": "deep"},
                                                  {"name": "d", "queue": "deep"}]') $$,
                 'TQ001', NULL, 'enqueue_many counts every element it adds');
SELECT is((SELECT count(*) FROM treadle.enqueue_many('[{"name": "d", "queue": "deep"}, {"name": "d", "queue": "deep"}]')),
          2::bigint, 'and takes a batch that fits');

--------------------------------------------------------------------------------
-- Tenants: settings of their own queues only
--------------------------------------------------------------------------------
CREATE ROLE queues_tenant; SELECT treadle.grant_admin('queues_tenant');
SELECT treadle.set_tenant('queues_tenant', 'a.');
SELECT treadle.set_queue('b.mail', concurrency => 1);
SELECT treadle.enqueue('x', queue => 'b.mail') AS b_job \gset
SELECT is(pg_temp.as_role('queues_tenant', $$ SELECT treadle.pause('b.mail') $$), '42501',
          'a tenant cannot pause another tenant''s queue');
SELECT is(pg_temp.as_role('queues_tenant', $$ SELECT treadle.set_queue('b.mail', concurrency => 9) $$), '42501',
          'nor set its limits');
SELECT is(pg_temp.as_role('queues_tenant', $$ SELECT treadle.resume('b.mail') $$), '42501', 'nor resume it');
SELECT is((SELECT concurrency FROM treadle.queues WHERE queue = 'b.mail'), 1, 'its settings are untouched');
SELECT is(pg_temp.as_role('queues_tenant', $$ SELECT treadle.pause('a.mail') $$), 'ok', 'a tenant pauses its own queue');
SELECT is(pg_temp.as_role_value('queues_tenant', $$ SELECT string_agg(queue, ',') FROM treadle.queue_settings $$), 'a.mail',
          'and sees only its own queues'' settings');
SELECT is(pg_temp.as_role_value('queues_tenant', format($$ SELECT count(*) FROM treadle.explain(%s) $$, :b_job)), '0',
          'explain tells a tenant nothing about another tenant''s job');

--------------------------------------------------------------------------------
-- explain: one reason per case
--------------------------------------------------------------------------------
CREATE FUNCTION pg_temp.reasons(job_id bigint) RETURNS text LANGUAGE sql AS $$
    SELECT string_agg(reason, ',' ORDER BY ord) FROM treadle.explain(job_id) WITH ORDINALITY AS e(reason, message, at, ord)
$$;
CREATE FUNCTION pg_temp.message(job_id bigint, key text) RETURNS text LANGUAGE sql AS $$
    SELECT message FROM treadle.explain(job_id) AS e WHERE e.reason = key
$$;
SELECT is((SELECT count(*) FROM treadle.explain(-1)), 0::bigint, 'explain of an unknown id: no rows');
SELECT treadle.enqueue('later', queue => 'ex', run_at => '2999-01-02 00:00:00+00') AS later \gset
SELECT is(pg_temp.reasons(:later), 'not_due,no_worker', 'a job not due yet, and no live worker serves its queue');
SELECT is(pg_temp.message(:later, 'not_due'), 'not due until 2999-01-02 00:00:00+00', 'says until when');
SELECT treadle.worker_seen('wn', 'host', 2, ARRAY['ex'], 4, names => ARRAY['other', 'another']);
SELECT is(pg_temp.reasons(:later), 'not_due,no_worker', 'a live worker on its queue that handles other names');
SELECT is(pg_temp.message(:later, 'no_worker'),
          'no live worker handles later on queue ex: the 1 live worker(s) serving it handle other job names',
          'says which name no worker handles');
SELECT throws_ok($$ SELECT treadle.worker_seen('wn', 'host', 2, ARRAY['ex'], 4, names => ARRAY['']) $$, '22023', NULL,
                 'worker_seen: an empty job name raises 22023');
SELECT throws_ok($$ SELECT treadle.worker_seen('wn', 'host', 2, ARRAY['ex'], 4, names => '{}') $$, '22023', NULL,
                 'worker_seen: an empty list of names raises 22023');
SELECT is((SELECT names FROM treadle.workers WHERE id = 'wn'), ARRAY['other', 'another'], 'and nothing changed');
SELECT treadle.worker_seen('wn', 'host', 2, ARRAY['ex'], 4, names => ARRAY['other', 'later']);
SELECT is(pg_temp.reasons(:later), 'not_due', 'a live worker that handles its name: no no_worker reason');
SELECT treadle.worker_seen('wx', 'host', 1, ARRAY['ex', 'ex-conc', 'ex-rate', 'paused-ex'], 4);
SELECT is(pg_temp.reasons(:later), 'not_due', 'a live worker that did not say its names may handle it');
SELECT treadle.enqueue('now', queue => 'ex', priority => 5) AS low \gset
SELECT treadle.enqueue('now', queue => 'ex', priority => 1) AS high1 \gset
SELECT treadle.enqueue('now', queue => 'ex', priority => 1) AS high2 \gset
SELECT is(pg_temp.reasons(:high1), 'ready', 'the first in claim order is ready');
SELECT is(pg_temp.reasons(:low), 'behind', 'a low-priority job waits behind the others');
SELECT alike(pg_temp.message(:low, 'behind'), 'waiting behind 2 due job(s) of queue ex%', 'and says behind how many');
SELECT treadle.pause('paused-ex');
SELECT treadle.enqueue('p', queue => 'paused-ex') AS paused_job \gset
SELECT is(pg_temp.reasons(:paused_job), 'paused', 'a job of a paused queue');
SELECT treadle.set_queue('ex-conc', concurrency => 1);
SELECT treadle.enqueue('c', queue => 'ex-conc') FROM generate_series(1, 2);
SELECT id AS conc_running, lease_token AS conc_tok FROM treadle.claim('wx', ARRAY['ex-conc']) \gset
SELECT max(id) AS conc_waiting FROM treadle.jobs WHERE queue = 'ex-conc' \gset
SELECT is(pg_temp.reasons(:conc_waiting), 'concurrency_limit', 'a job of a queue at its concurrency limit');
SELECT is(pg_temp.message(:conc_waiting, 'concurrency_limit'), 'queue ex-conc is at its concurrency limit: 1 running, limit 1',
          'says how many run');
SELECT treadle.set_queue('ex-rate', rate_limit => 1, rate_period => '1 hour');
SELECT treadle.enqueue('r', queue => 'ex-rate') FROM generate_series(1, 2);
SELECT count(*) FROM treadle.claim('wx', ARRAY['ex-rate']);
SELECT max(id) AS rate_waiting FROM treadle.jobs WHERE queue = 'ex-rate' \gset
SELECT is(pg_temp.reasons(:rate_waiting), 'rate_limit', 'a job of a queue at its rate limit');
SELECT is((SELECT at FROM treadle.explain(:rate_waiting) WHERE reason = 'rate_limit'), '2999-01-01 13:00:00+00'::timestamptz,
          'with the time of its next slot');
SELECT results_eq(format($$ SELECT reason FROM treadle.explain(%s) $$, :conc_running), ARRAY['running', 'worker'],
                  'a running job: where it runs, and its worker');
SELECT alike(pg_temp.message(:conc_running, 'running'), 'running on worker wx since 2999-01-01 12:00:00+00 (attempt 1 of 25), lease until%',
            'names the worker, the attempt and the lease');
SELECT alike(pg_temp.message(:conc_running, 'worker'), 'worker wx (host host, pid 1) last reported at 2999-01-01 12:00:00+00',
            'and the worker''s last report');
SELECT treadle.cancel(:conc_running);
SET LOCAL treadle.now = '2999-01-01 12:05:00+00';
SELECT is(pg_temp.reasons(:conc_running), 'running,worker,lease_expired,cancel_requested',
          'an expired lease and a requested cancel are said too');
SELECT alike(pg_temp.message(:conc_running, 'worker'), '%, over 30 seconds ago', 'a silent worker is said to be silent');
SELECT is(pg_temp.message(:conc_running, 'cancel_requested'),
          'a cancel was requested: its worker was told at once (treadle_cancel), and the heartbeat it sends on hearing it (without LISTEN, its next heartbeat) answers cancel; the job ends cancelled',
          'a requested cancel: the worker hears of it at once, not only at its next heartbeat');
SET LOCAL treadle.now = '2999-01-01 12:00:00+00';
SELECT id AS failing, lease_token AS fail_tok FROM pg_temp.leased(max_attempts => 2) \gset
SELECT treadle.fail(:failing, :'fail_tok', 'boom', '10 minutes');
SELECT is(pg_temp.message(:failing, 'retrying'), 'retrying at 2999-01-01 12:10:00+00 after attempt 1 of 2 failed: boom',
          'a retryable job: when, after which attempt, and why');
SELECT id AS dead, lease_token AS dead_tok FROM pg_temp.leased(max_attempts => 1) \gset
SELECT treadle.fail(:dead, :'dead_tok', 'out of luck');
SELECT is(pg_temp.message(:dead, 'discarded'), 'discarded at 2999-01-01 12:00:00+00 after attempt 1 of 1 failed: out of luck',
          'a discarded job: its last error');
SELECT id AS done, lease_token AS done_tok FROM pg_temp.leased() \gset
SELECT treadle.complete(:done, :'done_tok');
SELECT is(pg_temp.reasons(:done), 'completed', 'a completed job');
SELECT treadle.enqueue('x') AS cancelled \gset
SELECT treadle.cancel(:cancelled);
SELECT is(pg_temp.reasons(:cancelled), 'cancelled', 'a cancelled job');
CREATE ROLE queues_reader; SELECT treadle.grant_reader('queues_reader');
SELECT is(pg_temp.as_role_value('queues_reader', format($$ SELECT string_agg(reason, ',') FROM treadle.explain(%s) $$, :done)),
          'completed', 'a reader may call explain');

SELECT * FROM finish();
ROLLBACK;
