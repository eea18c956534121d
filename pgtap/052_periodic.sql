-- pgtap/052_periodic.sql: periodic series (enqueue ... every). The next occurrence at
-- finish time + every, a copy of the last without its key; at most one pending.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(38);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

-- pending occurrences of the series named 'tick'
CREATE FUNCTION pg_temp.pending() RETURNS bigint LANGUAGE sql AS $$
    SELECT count(*) FROM treadle.jobs
     WHERE name = 'tick' AND state = ANY (ARRAY['available', 'retryable', 'running'])
$$;

SELECT treadle.enqueue('tick', '{"n": 1}', queue => 'cron', priority => 3, max_attempts => 2,
                       idempotency_key => 'tick-series', every => '10 minutes',
                       run_at => '2999-01-01 12:00:00+00') AS s0 \gset
SELECT is(pg_temp.pending(), 1::bigint, 'a series starts with one pending occurrence');
SELECT lease_token AS s0_tok FROM treadle.claim('w', ARRAY['cron']) \gset
SET LOCAL treadle.now = '2999-01-01 12:01:30+00';
SELECT is(treadle.complete(:s0, :'s0_tok'), 'completed', 'the first occurrence completes');

SELECT id AS s1 FROM treadle.jobs WHERE name = 'tick' AND id <> :s0 \gset
SELECT results_eq(
    format($$ SELECT name, args, queue, priority, max_attempts, every, idempotency_key, state, run_at, attempt, created_at
                FROM treadle.jobs WHERE id = %s $$, :s1),
    $$ VALUES ('tick'::text, '{"n": 1}'::jsonb, 'cron'::text, 3, 2, '10 minutes'::interval, NULL::text,
               'available'::text, '2999-01-01 12:11:30+00'::timestamptz, 0, '2999-01-01 12:01:30+00'::timestamptz) $$,
    'the next occurrence: same name, args, queue, priority, max_attempts and every, no key, due at finish + every');
SELECT is((pg_temp.job(:s0)).next_id, :s1::bigint, 'the finished occurrence names its successor');
SELECT is(pg_temp.pending(), 1::bigint, 'still one pending occurrence');
SELECT is(treadle.enqueue('tick', queue => 'cron', idempotency_key => 'tick-series'), :s0::bigint,
          'the series'' key still belongs to its first occurrence');
SELECT is_empty($$ SELECT * FROM treadle.claim('w', ARRAY['cron']) $$, 'the next occurrence is not due before its time');

-- A failed attempt with attempts left is the same occurrence
SET LOCAL treadle.now = '2999-01-01 12:11:30+00';
SELECT lease_token AS s1_tok FROM treadle.claim('w', ARRAY['cron']) \gset
SELECT is(treadle.fail(:s1, :'s1_tok', 'flaky', '0 seconds'), 'retryable', 'the occurrence fails with an attempt left');
SELECT is(pg_temp.pending(), 1::bigint, 'a retryable failure starts no new occurrence');
SELECT is((pg_temp.job(:s1)).next_id, NULL, 'and names no successor');

-- Discarded: the series goes on
SELECT lease_token AS s1_tok FROM treadle.claim('w', ARRAY['cron']) \gset
SET LOCAL treadle.now = '2999-01-01 12:12:00+00';
SELECT is(treadle.fail(:s1, :'s1_tok', 'down'), 'discarded', 'its last attempt fails: discarded');
SELECT (pg_temp.job(:s1)).next_id AS s2 \gset
SELECT results_eq(format($$ SELECT state, run_at FROM treadle.jobs WHERE id = %s $$, :s2),
                  $$ VALUES ('available'::text, '2999-01-01 12:22:00+00'::timestamptz) $$,
                  'a discarded occurrence starts the next one at finish + every');
SELECT is(pg_temp.pending(), 1::bigint, 'still one pending occurrence');

-- Retrying a discarded occurrence runs it once more, and starts nothing new
SELECT ok(treadle.retry(:s1), 'the discarded occurrence is retried');
SELECT lease_token AS s1_tok FROM treadle.claim('w', ARRAY['cron'], names => ARRAY['tick']) \gset
SELECT is((pg_temp.job(:s1)).state, 'running', 'the retried occurrence runs');
SELECT is(treadle.complete(:s1, :'s1_tok'), 'completed', 'the retried occurrence completes');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE name = 'tick'), 3::bigint, 'its completion starts no other occurrence');
SELECT is((pg_temp.job(:s1)).next_id, :s2::bigint, 'it still names the successor it started before');
SELECT is(pg_temp.pending(), 1::bigint, 'one pending occurrence: the one started before');

-- A retry of a discarded one that fails again starts nothing either
SELECT id AS once, lease_token AS once_tok FROM pg_temp.leased('once', max_attempts => 1, every => '1 day') \gset
SELECT is(treadle.fail(:once, :'once_tok', 'x'), 'discarded', 'a one-attempt occurrence is discarded');
SELECT ok(treadle.retry(:once), 'and retried');
SELECT is(treadle.fail(:once, (SELECT lease_token FROM treadle.claim('w', ARRAY[(pg_temp.job(:once)).queue], names => ARRAY['once']) WHERE id = :once), 'x'),
          'discarded', 'its retry is discarded again');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE name = 'once'), 2::bigint, 'the series has one successor, not two');

-- Cancelling ends a series
SELECT ok(treadle.cancel(:s2), 'the pending occurrence is cancelled');
SELECT is(pg_temp.pending(), 0::bigint, 'a cancelled occurrence ends the series: nothing pending');
SELECT is((pg_temp.job(:s2)).next_id, NULL, 'it names no successor');

SELECT id AS run, lease_token AS run_tok FROM pg_temp.leased('ticker', every => '1 minute') \gset
SELECT ok(treadle.cancel(:run), 'a cancel is requested of a running occurrence');
SELECT is(treadle.complete(:run, :'run_tok'), 'cancelled', 'it finishes as cancelled');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE name = 'ticker'), 1::bigint, 'a running occurrence cancelled ends the series');

-- A cancelled occurrence retried resumes the series when it finishes
SELECT ok(treadle.retry(:s2), 'the cancelled occurrence is retried');
SELECT lease_token AS s2_tok FROM treadle.claim('w', ARRAY['cron'], names => ARRAY['tick']) \gset
SELECT is(treadle.complete(:s2, :'s2_tok'), 'completed', 'and completes');
SELECT is(pg_temp.pending(), 1::bigint, 'the series goes on with one pending occurrence');

-- Series started by enqueue_many, finished by complete_many
SELECT id AS many FROM treadle.enqueue_many('[{"name": "batch-tick", "queue": "cron-many", "every": "1 hour"}]') AS t(id) \gset
SELECT lease_token AS many_tok FROM treadle.claim('w', ARRAY['cron-many']) \gset
SELECT results_eq(
    format($$ SELECT state FROM treadle.complete_many(ARRAY[%s]::bigint[], ARRAY[%L]::uuid[]) $$, :many, :'many_tok'),
    ARRAY['completed'], 'an occurrence from enqueue_many completes through complete_many');
SELECT results_eq($$ SELECT run_at, every FROM treadle.jobs WHERE queue = 'cron-many' AND state = 'available' $$,
                  $$ VALUES ('2999-01-01 13:12:00+00'::timestamptz, '1 hour'::interval) $$,
                  'complete_many starts its next occurrence');

-- Every successor (a periodic occurrence's, a schedule's next, a schedule's first) is
-- inserted by one function, at most once per predecessor
SELECT is(treadle._successor(:s0, 'cron', 'tick', '{}', 0, '2999-01-02 00:00:00+00', 2, '10 minutes', NULL), NULL,
          'a job that has a successor starts no second one');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE run_at = '2999-01-02 00:00:00+00'), 0::bigint, 'and nothing is inserted');
SELECT treadle._successor(NULL, 'cron-none', 'first', '{}', 0, '2999-01-02 00:00:00+00', 2, NULL, NULL) AS first \gset
SELECT is((SELECT name FROM treadle.jobs WHERE id = :first AND state = 'available'), 'first',
          'one that follows nothing is inserted, available, and its id returned');
SELECT is(ARRAY(SELECT p.proname::text FROM pg_proc AS p
                 WHERE p.pronamespace = 'treadle'::regnamespace AND p.prosrc ~* 'next_id\s*=' AND p.prosrc ~* 'nextval'),
          ARRAY['_successor'], 'no other function claims a successor''s id');

SELECT * FROM finish();
ROLLBACK;
