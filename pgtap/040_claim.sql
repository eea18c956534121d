-- pgtap/040_claim.sql: treadle.claim. What is claimable, in which order, the
-- queues and names filters, batch bounds, the claimed row, and bad arguments.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(94);

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

SELECT has_function('treadle', 'claim', ARRAY['text', 'text[]', 'text[]', 'integer', 'interval', 'uuid'],
                    'treadle.claim exists with the contract''s argument types');
SELECT function_returns('treadle', 'claim', ARRAY['text', 'text[]', 'text[]', 'integer', 'interval', 'uuid'],
                        'setof treadle.jobs', 'it returns setof treadle.jobs');
SELECT is_empty($$ SELECT * FROM treadle.claim('w') $$, 'nothing to claim from an empty queue');

-- Order: priority, then run_at, then id. A job not yet due is never claimed.
SELECT treadle.enqueue('o', priority => 1, run_at => '2999-01-01 09:00:00+00') AS p1_early \gset
SELECT treadle.enqueue('o', priority => 0, run_at => '2999-01-01 11:00:00+00') AS p0_late \gset
SELECT treadle.enqueue('o', priority => 0, run_at => '2999-01-01 10:00:00+00') AS p0_first \gset
SELECT treadle.enqueue('o', priority => 0, run_at => '2999-01-01 10:00:00+00') AS p0_second \gset
SELECT treadle.enqueue('o', priority => -9, run_at => '2999-01-01 12:00:01+00') AS not_due \gset
SELECT is((SELECT id FROM treadle.claim('w')), :p0_first::bigint, 'the lowest priority, earliest run_at, lowest id first');
SELECT is((SELECT id FROM treadle.claim('w')), :p0_second::bigint, 'the same priority and run_at: the lower id next');
SELECT is((SELECT id FROM treadle.claim('w')), :p0_late::bigint, 'the same priority: the earlier run_at next');
SELECT is((SELECT id FROM treadle.claim('w')), :p1_early::bigint, 'a higher priority number runs later, however early');
SELECT is_empty($$ SELECT * FROM treadle.claim('w') $$, 'a job whose run_at is in the future is not claimed');
SELECT is((SELECT state FROM treadle.jobs WHERE id = :not_due), 'available', 'the job not due stays available');
SET LOCAL treadle.now = '2999-01-01 12:00:01+00';
SELECT is((SELECT id FROM treadle.claim('w')), :not_due::bigint, 'a job is claimable once its run_at is reached');
SELECT is_empty($$ SELECT * FROM treadle.claim('w') $$, 'running jobs are never claimed again');

-- The claimed row
SET LOCAL treadle.now = '2999-01-01 13:00:00+00';
SELECT treadle.enqueue('row', '{"a": 1}', queue => 'rows') AS claimed \gset
CREATE TEMP TABLE got AS SELECT * FROM treadle.claim('worker-7', ARRAY['rows'], lease => '2 minutes');
SELECT results_eq(
    $$ SELECT id, state, attempt, lease_until, worker_id, started_at, args FROM got $$,
    format($$ VALUES (%s::bigint, 'running'::text, 1, '2999-01-01 13:02:00+00'::timestamptz, 'worker-7'::text,
                      '2999-01-01 13:00:00+00'::timestamptz, '{"a": 1}'::jsonb) $$, :claimed),
    'a claimed job is running, attempt 1, leased until now + lease, by the worker');
SELECT isnt((SELECT lease_token FROM got), NULL, 'a claim returns a lease token');
SELECT results_eq(
    $$ SELECT state, attempt, lease_until, lease_token, worker_id FROM treadle.jobs WHERE id = (SELECT id FROM got) $$,
    $$ SELECT state, attempt, lease_until, lease_token, worker_id FROM got $$,
    'the returned row is the stored row');
SELECT treadle.enqueue('row', queue => 'rows') AS default_lease \gset
SELECT is((SELECT lease_until FROM treadle.claim('w', ARRAY['rows'])), '2999-01-01 13:00:30+00'::timestamptz,
          'the default lease is 30 seconds');

-- Queues: only those named; a claim goes round them, starting after the queue the
-- session's previous claim took from (priority and run_at order hold within a queue)
SELECT treadle.enqueue('q', queue => 'qa', priority => 5) AS qa \gset
SELECT treadle.enqueue('q', queue => 'qb', priority => 2) AS qb \gset
SELECT treadle.enqueue('q', queue => 'qc', priority => 0) AS qc \gset
SELECT treadle.enqueue('q', queue => 'qa', priority => 5) AS qa2 \gset
SELECT is((SELECT id FROM treadle.claim('w', ARRAY['qa', 'qb'])), :qa::bigint,
          'a session''s first claim over several queues starts at the first one named');
SELECT is((SELECT id FROM treadle.claim('w', ARRAY['qa', 'qb'])), :qb::bigint,
          'the next claim starts at the next queue, though the first still holds a job');
SELECT is((SELECT array_agg(id) FROM treadle.claim('w', ARRAY['qa', 'qb', 'qa'], batch => 5)), ARRAY[:qa2::bigint],
          'a queue named twice is harmless: its job is claimed once');
SET treadle.claim_turn = 'not a turn';
SELECT is_empty($$ SELECT * FROM treadle.claim('w', ARRAY['qa', 'qb']) $$,
                'jobs in other queues are not claimed (and a turn that is not a number is harmless)');
RESET treadle.claim_turn;
SELECT is((SELECT state FROM treadle.jobs WHERE id = :qc), 'available', 'the job in the unnamed queue waits');
SELECT treadle.enqueue('r', queue => 'rx') AS rx \gset
SELECT treadle.enqueue('r', queue => 'ry', priority => 9) AS ry1 \gset
SELECT treadle.enqueue('r', queue => 'ry', priority => 1) AS ry2 \gset
SELECT treadle.enqueue('r', queue => 'ry', priority => 5) AS ry3 \gset
SELECT is((SELECT array_agg(id) FROM treadle.claim('w', ARRAY['rx', 'rz', 'ry'], batch => 3)),
          ARRAY[:rx::bigint, :ry2::bigint, :ry3::bigint],
          'a claim goes on through the queues until it has batch, each queue''s jobs in priority order');

-- Names: only the names given
SELECT treadle.enqueue('resize', queue => 'n') AS resize \gset
SELECT treadle.enqueue('email', queue => 'n', priority => -1) AS email \gset
SELECT treadle.enqueue('thumb', queue => 'n') AS thumb \gset
SELECT is((SELECT id FROM treadle.claim('w', ARRAY['n'], names => ARRAY['resize', 'thumb'])), :resize::bigint,
          'names restrict the claim, past a lower-priority job of another name');
SELECT is((SELECT array_agg(id) FROM treadle.claim('w', ARRAY['n'], names => ARRAY['thumb', 'missing'], batch => 5)),
          ARRAY[:thumb::bigint], 'a name with no jobs is harmless');
SELECT is((SELECT state FROM treadle.jobs WHERE id = :email), 'available', 'a job whose name is not asked for waits');
SELECT is((SELECT id FROM treadle.claim('w', ARRAY['n'])), :email::bigint, 'without names every name is claimable');
SELECT treadle.enqueue('a', queue => 'nb', priority => 1) AS nb_a1 \gset
SELECT treadle.enqueue('a', queue => 'nb', priority => 5) AS nb_a2 \gset
SELECT treadle.enqueue('b', queue => 'nb', priority => 2) AS nb_b1 \gset
SELECT treadle.enqueue('c', queue => 'nb', priority => 0) AS nb_c1 \gset
SELECT treadle.enqueue('c', queue => 'nb', priority => 6) AS nb_c2 \gset
SELECT is((SELECT array_agg(id) FROM treadle.claim('w', ARRAY['nb'], names => ARRAY['a', 'b', 'c'], batch => 3)),
          ARRAY[:nb_c1::bigint, :nb_a1::bigint, :nb_b1::bigint],
          'several names: a queue''s best jobs over all of them, in priority order');
SELECT is((SELECT array_agg(id) FROM treadle.claim('w', ARRAY['nb'], names => ARRAY['c', 'a'], batch => 5)),
          ARRAY[:nb_a2::bigint, :nb_c2::bigint], 'and the rest after them');
-- each name's range is read alone: names next to it in sort order, better placed, are not taken
SELECT treadle.enqueue('b', queue => 'nn', priority => 5) AS nn_b \gset
SELECT treadle.enqueue('c', queue => 'nn', priority => 4) AS nn_c \gset
SELECT treadle.enqueue('a', queue => 'nn', priority => 0) AS nn_a \gset
SELECT treadle.enqueue('ba', queue => 'nn', priority => 0) AS nn_ba \gset
SELECT treadle.enqueue('bz', queue => 'nn', priority => 1) AS nn_bz \gset
SELECT treadle.enqueue('ca', queue => 'nn', priority => 0) AS nn_ca \gset
SELECT is((SELECT array_agg(id) FROM treadle.claim('w', ARRAY['nn'], names => ARRAY['b', 'c'], batch => 1)),
          ARRAY[:nn_c::bigint], 'several names, one job: the best of those names, not of names beside them');
SELECT is((SELECT array_agg(id) FROM treadle.claim('w', ARRAY['nn'], names => ARRAY['c', 'b'], batch => 1)),
          ARRAY[:nn_b::bigint], 'then the next of them');
SELECT is_empty($$ SELECT * FROM treadle.claim('w', ARRAY['nn'], names => ARRAY['b', 'c'], batch => 3) $$,
                'then none: a, ba, bz and ca wait');

-- Retryable jobs are claimable when due, not before
SET LOCAL treadle.now = '2999-01-01 14:00:00+00';
SELECT treadle.enqueue('r', queue => 'retry') AS due_retry \gset
SELECT treadle.enqueue('r', queue => 'retry') AS later_retry \gset
CREATE TEMP TABLE r AS SELECT * FROM treadle.claim('w', ARRAY['retry'], batch => 2);
SELECT is(treadle.fail(:due_retry, (SELECT lease_token FROM r WHERE id = :due_retry), 'boom', '0 seconds'),
          'retryable', 'a failed job with attempts left is retryable');
SELECT is(treadle.fail(:later_retry, (SELECT lease_token FROM r WHERE id = :later_retry), 'boom', '1 minute'),
          'retryable', 'a second failed job is retryable');
SELECT results_eq($$ SELECT id, attempt FROM treadle.claim('w', ARRAY['retry'], batch => 5) $$,
                  format($$ VALUES (%s::bigint, 2) $$, :due_retry),
                  'a due retryable job is claimed again with attempt 2; one not due is not');
SET LOCAL treadle.now = '2999-01-01 14:01:00+00';
SELECT is((SELECT id FROM treadle.claim('w', ARRAY['retry'])), :later_retry::bigint,
          'a retryable job is claimable at its run_at');

-- Finished jobs are never claimed
SELECT treadle.enqueue('f', queue => 'fin') AS fin \gset
SELECT ok(treadle.cancel(:fin), 'a waiting job is cancelled');
SELECT is_empty($$ SELECT * FROM treadle.claim('w', ARRAY['fin']) $$, 'a cancelled job is not claimed');

-- Batches
SELECT is((SELECT count(*) FROM treadle.enqueue_many(
              (SELECT jsonb_agg(jsonb_build_object('name', 'b', 'queue', 'batch')) FROM generate_series(1, 5)))),
          5::bigint, 'five jobs enqueued');
CREATE TEMP TABLE b1 AS SELECT * FROM treadle.claim('w', ARRAY['batch'], batch => 3);
SELECT is((SELECT count(*) FROM b1), 3::bigint, 'a batch claims up to batch jobs');
SELECT is((SELECT count(DISTINCT lease_token) FROM b1), 3::bigint, 'each claimed job has its own token');
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['batch'], batch => 1000)), 2::bigint,
          'a batch of 1000 takes what is left');
SELECT lives_ok($$ SELECT treadle.claim('w', batch => 1) $$, 'batch 1 is allowed');

-- A claim given a lease token: every job it takes holds that token, and claimed()
-- finds them again (a worker whose answer to the claim was lost)
SELECT treadle.enqueue('t', queue => 'tok') AS t1 \gset
SELECT treadle.enqueue('t', queue => 'tok') AS t2 \gset
SELECT results_eq(
    $$ SELECT id, lease_token FROM treadle.claim('w', ARRAY['tok'], batch => 5,
                                                 lease_token => '00000000-0000-4000-8000-00000000000a') $$,
    format($$ VALUES (%s::bigint, '00000000-0000-4000-8000-00000000000a'::uuid),
                     (%s, '00000000-0000-4000-8000-00000000000a') $$, :t1, :t2),
    'a claim with a lease token gives it to every job it takes');
SELECT results_eq(
    $$ SELECT id, state, attempt FROM treadle.claimed('00000000-0000-4000-8000-00000000000a') $$,
    format($$ VALUES (%s::bigint, 'running'::text, 1), (%s, 'running', 1) $$, :t1, :t2),
    'claimed() returns the running jobs holding the token, in claim order');
SELECT is(treadle.complete(:t1, '00000000-0000-4000-8000-00000000000a'), 'completed', 'the token finishes a job');
SELECT results_eq($$ SELECT id FROM treadle.claimed('00000000-0000-4000-8000-00000000000a') $$,
                  format($$ VALUES (%s::bigint) $$, :t2), 'a finished job is no longer claimed');
SELECT is_empty($$ SELECT * FROM treadle.claimed(gen_random_uuid()) $$, 'an unknown token holds nothing');
SELECT throws_ok($$ SELECT treadle.claimed(NULL) $$, '22004', NULL, 'a null token raises 22004');

-- A claim from a cursor (a session whose claims got slow; here a cursor written by
-- hand, taken now and blind to every transaction, this one's included, so that its
-- first claim finds each lane among the rows made claimable since) takes the same
-- jobs in the same order as the plain claim: priorities, run_at, ids, jobs that come
-- due, and a job made claimable again below where the cursor stands.
SET LOCAL treadle.now = '2999-01-02 12:00:00+00';
SELECT set_config(treadle._claim_setting(ARRAY['cur'], NULL),
                  format('(1,%1$s,%1$s,f,0,{%2$s},{},{},{},{},{})', treadle._us(treadle.now()), pg_current_xact_id()),
                  true);
SELECT treadle.enqueue('c', queue => 'cur', priority => 2, run_at => '2999-01-02 11:00:00+00') AS c_p2 \gset
SELECT treadle.enqueue('c', queue => 'cur', priority => 1, run_at => '2999-01-02 11:30:00+00') AS c_p1_late \gset
SELECT treadle.enqueue('c', queue => 'cur', priority => 1, run_at => '2999-01-02 11:00:00+00') AS c_p1 \gset
SELECT treadle.enqueue('c', queue => 'cur', priority => 0, run_at => '2999-01-02 12:00:05+00') AS c_soon \gset
SELECT results_eq($$ SELECT id FROM treadle.claim('w', ARRAY['cur'], batch => 2) $$,
                  format($$ VALUES (%s::bigint), (%s) $$, :c_p1, :c_p1_late), 'a cursor claims in claim order');
SELECT is(ARRAY(SELECT p FROM unnest((current_setting(treadle._claim_setting(ARRAY['cur'], NULL))
                                      ::treadle._claim_cursor).lane_priority) AS p ORDER BY 1),
          '{0,1,2}'::bigint[], 'the session keeps a cursor, a lane per priority');
SELECT treadle.enqueue('c', queue => 'cur', priority => 1, run_at => '2999-01-01 00:00:00+00') AS c_past \gset
SELECT is((SELECT id FROM treadle.claim('w', ARRAY['cur'])), :c_past::bigint,
          'a job enqueued below the cursor (a past run_at) is claimed first');
SET LOCAL treadle.now = '2999-01-02 12:00:06+00';
SELECT results_eq($$ SELECT id FROM treadle.claim('w', ARRAY['cur'], batch => 5) $$,
                  format($$ VALUES (%s::bigint), (%s) $$, :c_soon, :c_p2),
                  'a better priority that came due is claimed before the rest');
SELECT lives_ok($$ SELECT set_config(treadle._claim_setting(ARRAY['cur'], NULL),
                                     format('(1,%1$s,%1$s,f,1,{},"{1,99999}","{0,1}","{-2147483649,0}","{1,1}","{1,1}")',
                                            treadle._us(treadle.now())), true);
                   SELECT treadle.claim('w', ARRAY['cur']) $$,
                'a cursor set by hand (lanes out of range) raises nothing');

-- Every writer that makes a job claimable again marks it with its transaction
SELECT treadle.enqueue('c', queue => 'cur2') AS m1 \gset
SELECT treadle.enqueue('c', queue => 'cur2') AS m2 \gset
SELECT treadle.enqueue('c', queue => 'cur2') AS m3 \gset
CREATE TEMP TABLE m AS SELECT * FROM treadle.claim('w', ARRAY['cur2'], batch => 3, lease => '1 second');
UPDATE treadle.jobs SET ready_txid = '1' WHERE queue = 'cur2';
SELECT treadle.fail(:m1, (SELECT lease_token FROM m WHERE id = :m1), 'x', '0 seconds');
SELECT treadle.release(:m2, (SELECT lease_token FROM m WHERE id = :m2));
SET LOCAL treadle.now = '2999-01-02 12:10:00+00';
SELECT ok(treadle.rescue() > 0, 'rescue ran');
SELECT is((SELECT state FROM treadle.jobs WHERE id = :m3), 'retryable', 'the third lease ran out: rescued');
SELECT results_eq($$ SELECT count(*) FROM treadle.jobs WHERE queue = 'cur2' AND ready_txid = pg_current_xact_id() $$,
                  $$ VALUES (3::bigint) $$, 'fail, release and rescue set ready_txid');

-- Bad input: each raises its SQLSTATE and claims nothing
SELECT treadle.enqueue('bad', queue => 'bad') AS untouched \gset
SELECT throws_ok($$ SELECT treadle.claim(NULL, ARRAY['bad']) $$, '22004', NULL, 'a null worker_id raises 22004');
SELECT throws_ok($$ SELECT treadle.claim('', ARRAY['bad']) $$, '22023', NULL, 'an empty worker_id raises 22023');
SELECT throws_ok($$ SELECT treadle.claim('w', NULL) $$, '22004', NULL, 'null queues raise 22004');
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY[]::text[]) $$, '22023', NULL, 'an empty queues array raises 22023');
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY['bad', '']) $$, '22023', NULL, 'an empty queue name raises 22023');
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY['bad', NULL]) $$, '22023', NULL, 'a null queue name raises 22023');
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY['bad'], names => ARRAY[]::text[]) $$, '22023', NULL,
                 'an empty names array raises 22023');
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY['bad'], names => ARRAY['']) $$, '22023', NULL,
                 'an empty job name raises 22023');
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY['bad'], batch => 0) $$, '22023',
                 'treadle: batch must be between 1 and 1000, got 0', 'batch 0 raises 22023');
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY['bad'], batch => 1001) $$, '22023', NULL, 'batch 1001 raises 22023');
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY['bad'], batch => NULL) $$, '22023', NULL, 'a null batch raises 22023');
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY['bad'], lease => '0 seconds') $$, '22023', NULL, 'a zero lease raises 22023');
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY['bad'], lease => '-5 seconds') $$, '22023', NULL, 'a negative lease raises 22023');
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY['bad'], lease => NULL) $$, '22004', NULL, 'a null lease raises 22004');
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY['bad'], lease => '1000 years') $$, '22023',
                 'treadle: lease must be positive and at most 1 day, got 1000 years', 'a lease over a day raises 22023');
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY['bad'], lease => '300000 years') $$, '22023', NULL,
                 'a lease of 300,000 years raises 22023, not 22008');
SELECT throws_ok($$ SELECT treadle.claim(repeat('w', 201), ARRAY['bad']) $$, '22023', NULL,
                 'a worker_id over 200 characters raises 22023');
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY[['bad'], ['bad']]) $$, '22023', NULL,
                 'a two-dimensional queues array raises 22023');
-- The list's names are tested in full once per list and session (treadle.claim_checked):
-- a list found valid does not let another through, and the setting, forged, lets no
-- bound or null through.
SELECT lives_ok($$ SELECT treadle.claim('w', ARRAY['nojob', 'nojob2']) $$, 'a valid list is claimed from');
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY['nojob', 'nojob2' || chr(9)]) $$, '22023', NULL,
                 'a control character in a list after a valid one raises 22023');
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY['bad', '   ']) $$, '22023', NULL,
                 'a blank queue name after a valid list raises 22023');
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY['bad', 'bad' || chr(1) || 'bad2']) $$, '22023', NULL,
                 'a queue name holding the separator raises 22023');
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY['bad', repeat('q', 201)]) $$, '22023', NULL,
                 'a queue name over 200 characters raises 22023');
SELECT lives_ok($$ SELECT treadle.claim('w', ARRAY['nojob', repeat('é', 200)]) $$,
                'a queue name of 200 characters of two bytes each is accepted');
SELECT lives_ok($$ SELECT treadle.claim('w', ARRAY(SELECT 'nojob' || g FROM generate_series(1, 1000) AS g)) $$,
                '1000 queues are accepted');
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY(SELECT 'bad' || g FROM generate_series(1, 1001) AS g)) $$, '22023', NULL,
                 '1001 queues raise 22023');
SELECT set_config('treadle.claim_checked', to_hex(hash_array_extended(ARRAY[NULL]::text[], 0)), false);
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY[NULL]::text[]) $$, '22023', NULL,
                 'a null queue name raises 22023 whatever treadle.claim_checked holds');
SELECT set_config('treadle.claim_checked', to_hex(hash_array_extended(ARRAY[]::text[], 0)), false);
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY[]::text[]) $$, '22023', NULL,
                 'an empty queues array raises 22023 whatever treadle.claim_checked holds');
SELECT set_config('treadle.claim_checked', to_hex(hash_array_extended(ARRAY[['bad'], ['bad']], 0)), false);
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY[['bad'], ['bad']]) $$, '22023', NULL,
                 'a two-dimensional queues array raises 22023 whatever treadle.claim_checked holds');
SELECT set_config('treadle.claim_checked', to_hex(hash_array_extended(ARRAY[' ', 'nojob'], 0)), false);
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY[' ', 'nojob'])), 0::bigint,
          'a forged treadle.claim_checked lets a blank name through, which claims nothing');
SELECT ok(NOT treadle._are_names(ARRAY['bad', 'bad' || chr(1) || 'bad']) AND NOT treadle._are_names(ARRAY[' '])
          AND NOT treadle._are_names(ARRAY['bad', NULL]) AND treadle._are_names(ARRAY[' bad ', repeat('q', 200)]),
          'treadle._are_names: separators, blanks and nulls refused, spaces around a name and 200 characters accepted');
SELECT set_config('treadle.claim_checked', '', false);
-- The job names too, once per list and session (treadle.claim_names_checked)
SELECT lives_ok($$ SELECT treadle.claim('w', ARRAY['nojob'], names => ARRAY['a', 'b']) $$,
                'a valid names list is claimed from');
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY['nojob'], names => ARRAY['a', 'b' || chr(9)]) $$, '22023', NULL,
                 'a control character in a names list after a valid one raises 22023');
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY['nojob'], names => ARRAY['a', repeat('n', 411)]) $$, '22023', NULL,
                 'a job name over 410 characters after a valid list raises 22023');
SELECT set_config('treadle.claim_names_checked', to_hex(hash_array_extended(ARRAY['a', NULL], 0)), false);
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY['nojob'], names => ARRAY['a', NULL]) $$, '22023', NULL,
                 'a null job name raises 22023 whatever treadle.claim_names_checked holds');
SELECT set_config('treadle.claim_names_checked', to_hex(hash_array_extended(ARRAY[['a'], ['b']], 0)), false);
SELECT throws_ok($$ SELECT treadle.claim('w', ARRAY['nojob'], names => ARRAY[['a'], ['b']]) $$, '22023', NULL,
                 'a two-dimensional names array raises 22023 whatever treadle.claim_names_checked holds');
SELECT set_config('treadle.claim_names_checked', to_hex(hash_array_extended(ARRAY[' ', 'x'], 0)), false);
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['forged_names'], names => ARRAY[' ', 'x'])), 0::bigint,
          'a forged treadle.claim_names_checked lets a blank name through, which claims nothing');
SELECT set_config('treadle.claim_names_checked', '', false);
-- A long list (over 32 queues) looks its paused and limited queues up by one read of
-- treadle.queues: a paused one gives nothing, a limited one its room.
SELECT treadle.enqueue('p', queue => 'long_paused') AS long_paused \gset
SELECT treadle.enqueue('l', queue => 'long_limited') AS long_l1 \gset
SELECT treadle.enqueue('l', queue => 'long_limited') AS long_l2 \gset
SELECT treadle.pause('long_paused');
SELECT treadle.set_queue('long_limited', concurrency => 1);
SELECT is(ARRAY(SELECT id FROM treadle.claim('w', ARRAY(SELECT 'nojob' || g FROM generate_series(1, 40) AS g)
                                                   || ARRAY['long_paused', 'long_limited'], batch => 10)),
          ARRAY[:long_l1]::bigint[], 'over 40 queues: a paused queue gives nothing, a limited one its room');
SELECT results_eq(format($$ SELECT state, attempt FROM treadle.jobs WHERE id = %s $$, :untouched),
                  $$ VALUES ('available'::text, 0) $$, 'no bad claim took the job');

SELECT * FROM finish();
ROLLBACK;
