-- pgtap/045_cycle.sql: complete_and_claim (complete_many then claim, one statement)
-- and heartbeat_many (heartbeat for many jobs). Each keeps its halves' rules: lease
-- tokens, repeat-safe finishes, claimed(token) after a lost answer, tenants, bounds.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(55);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

SELECT has_function('treadle', 'complete_and_claim',
                    ARRAY['bigint[]', 'uuid[]', 'jsonb[]', 'text', 'text[]', 'text[]', 'integer', 'interval', 'uuid', 'text[]'],
                    'treadle.complete_and_claim exists');
SELECT has_function('treadle', 'heartbeat_many', ARRAY['bigint[]', 'uuid[]', 'interval', 'text[]'], 'treadle.heartbeat_many exists');

-- pg_temp.cycle_jobs(n): n jobs in queue 'cyc', due long ago
CREATE FUNCTION pg_temp.cycle_jobs(n integer) RETURNS void LANGUAGE sql AS $$
    SELECT count(treadle.enqueue('c', jsonb_build_object('i', i), queue => 'cyc', run_at => '2000-01-01 00:00:00+00'))
      FROM generate_series(1, n) AS i;
$$;
SELECT pg_temp.cycle_jobs(5);

--------------------------------------------------------------------------------
-- claim only (empty arrays), then finish and claim, then finish only (batch 0)
--------------------------------------------------------------------------------
CREATE TEMP TABLE first_claim AS
SELECT (c.job).id, (c.job).lease_token, (c.job).state, c.finished_id, c.finished_state
  FROM treadle.complete_and_claim('{}', '{}', NULL, 'w', ARRAY['cyc'], batch => 2,
                                  lease_token => '00000000-0000-0000-0000-00000000000a') AS c;
SELECT is((SELECT count(*) FROM first_claim), 2::bigint, 'empty arrays: only a claim, of batch jobs');
SELECT is((SELECT count(*) FROM first_claim WHERE finished_id IS NULL AND finished_state IS NULL
                                              AND state = 'running'
                                              AND lease_token = '00000000-0000-0000-0000-00000000000a'), 2::bigint,
          'claimed rows carry the job, running under the given token, and no finish columns');
SELECT results_eq($$ SELECT id FROM treadle.claimed('00000000-0000-0000-0000-00000000000a') $$,
                  $$ SELECT id FROM first_claim ORDER BY id $$,
                  'claimed(token) reads back what the claim half took (a lost answer)');
SELECT min(id) AS j1, max(id) AS j2 FROM first_claim \gset
SELECT lease_token AS tok FROM first_claim LIMIT 1 \gset

SET LOCAL treadle.now = '2999-01-01 12:00:01+00';
CREATE TEMP TABLE second AS
SELECT row_number() OVER () AS n, c.finished_id, c.finished_state, (c.job).id AS claimed_id, (c.job).state
  FROM treadle.complete_and_claim(ARRAY[:j2, :j1, :j1]::bigint[],
                                  ARRAY[:'tok', :'tok', gen_random_uuid()]::uuid[],
                                  ARRAY['{"r": 2}', '{"r": 1}', NULL]::jsonb[],
                                  'w', ARRAY['cyc'], batch => 2,
                                  lease_token => '00000000-0000-0000-0000-00000000000b') AS c;
SELECT results_eq($$ SELECT finished_id, finished_state FROM second WHERE n <= 3 ORDER BY n $$,
                  format($$ VALUES (%s::bigint, 'completed'::text), (%s, 'completed'), (%s, NULL) $$, :j2, :j1, :j1),
                  'the finish rows come first, one per input in input order; null where the token does not hold the job');
SELECT is((SELECT count(*) FROM second WHERE n > 3 AND finished_id IS NULL AND state = 'running'), 2::bigint,
          'then the claimed rows');
SELECT results_eq(format($$ SELECT id, state, result, finished_at FROM treadle.jobs WHERE id IN (%s, %s) ORDER BY id $$, :j1, :j2),
                  format($$ VALUES (%s::bigint, 'completed'::text, '{"r": 1}'::jsonb, '2999-01-01 12:00:01+00'::timestamptz),
                                   (%s, 'completed', '{"r": 2}', '2999-01-01 12:00:01+00') $$, :j1, :j2),
                  'each finished job has its own result and finish time');
-- (counts of one queue as results_eq's query: on Citus is() around it would run on the queue's node)
SELECT results_eq($$ SELECT count(*) FROM treadle.jobs WHERE queue = 'cyc' AND state = 'running'
                                                     AND lease_token = '00000000-0000-0000-0000-00000000000b' $$,
                  ARRAY[2::bigint], 'the claim half took two more under its token');
SELECT results_eq(format($$ SELECT job_id, state FROM treadle.complete_many(ARRAY[%s, %s]::bigint[], ARRAY[%L, %L]::uuid[]) $$,
                         :j2, :j1, :'tok', :'tok'),
                  format($$ VALUES (%s::bigint, 'completed'::text), (%s, 'completed') $$, :j2, :j1),
                  'repeating the finish half (a lost answer) answers what it did');
SELECT is((SELECT result FROM treadle.jobs WHERE id = :j1), '{"r": 1}'::jsonb, 'and writes nothing more');

SELECT array_agg(claimed_id ORDER BY claimed_id) AS second_ids FROM second WHERE n > 3 \gset
CREATE TEMP TABLE third AS
SELECT c.* FROM treadle.complete_and_claim(:'second_ids'::bigint[],
                                           ARRAY['00000000-0000-0000-0000-00000000000b',
                                                 '00000000-0000-0000-0000-00000000000b']::uuid[],
                                           NULL, 'w', ARRAY['cyc'], batch => 0) AS c;
SELECT results_eq($$ SELECT finished_state, job IS NULL FROM third $$,
                  $$ VALUES ('completed'::text, true), ('completed', true) $$,
                  'batch 0: finishes only');
SELECT results_eq($$ SELECT count(*) FROM treadle.jobs WHERE queue = 'cyc' AND state = 'available' $$,
                  ARRAY[1::bigint], 'and claims nothing');

--------------------------------------------------------------------------------
-- a cancel requested while it ran; a workflow's next step claimed by the same call
--------------------------------------------------------------------------------
SELECT (c.job).id AS k, (c.job).lease_token AS k_tok
  FROM treadle.complete_and_claim('{}', '{}', NULL, 'w', ARRAY['cyc'], batch => 1) AS c \gset
SELECT ok(treadle.cancel(:k), 'a cancel is requested while the job runs');
SELECT is((SELECT finished_state FROM treadle.complete_and_claim(ARRAY[:k]::bigint[], ARRAY[:'k_tok']::uuid[], NULL,
                                                                 'w', ARRAY['cyc'], batch => 0)),
          'cancelled', 'finishing it says cancelled, as complete_many does');

SELECT treadle.start_workflow('cyc-flow', '{}', ARRAY['one', 'two'], queue => 'cyc-flows') AS run \gset
SELECT (c.job).id AS s1, (c.job).lease_token AS s1_tok
  FROM treadle.complete_and_claim('{}', '{}', NULL, 'w', ARRAY['cyc-flows'], batch => 1) AS c \gset
CREATE TEMP TABLE flow AS
SELECT c.finished_state, (c.job).step, (c.job).state
  FROM treadle.complete_and_claim(ARRAY[:s1]::bigint[], ARRAY[:'s1_tok']::uuid[], ARRAY['{"one": 1}']::jsonb[],
                                  'w', ARRAY['cyc-flows'], batch => 5) AS c;
SELECT results_eq($$ SELECT finished_state, step, state FROM flow $$,
                  $$ VALUES ('completed'::text, NULL::text, NULL::text), (NULL, 'two', 'running') $$,
                  'the step a finish enqueued is claimed by the same call');
SELECT is(treadle.workflow_results(:run), '{"one": {"one": 1}}'::jsonb, 'the run holds the first step''s result');

--------------------------------------------------------------------------------
-- bounds: each refused with its SQLSTATE, nothing written (the finish is undone)
--------------------------------------------------------------------------------
SELECT pg_temp.cycle_jobs(1);
SELECT id AS b, lease_token AS b_tok FROM treadle.claim('w', ARRAY['cyc']) \gset
CREATE FUNCTION pg_temp.cyc(tail text) RETURNS text LANGUAGE sql AS $$
    SELECT format('SELECT * FROM treadle.complete_and_claim(ARRAY[%s]::bigint[], ARRAY[%L]::uuid[], NULL, %s)',
                  current_setting('cyc.b'), current_setting('cyc.b_tok'), tail)
$$;
SELECT set_config('cyc.b', :'b', true), set_config('cyc.b_tok', :'b_tok', true);
SELECT throws_ok(pg_temp.cyc($$ 'w', ARRAY['cyc'], batch => NULL $$), '22004', NULL, 'a null batch raises 22004');
SELECT throws_ok(pg_temp.cyc($$ 'w', ARRAY['cyc'], batch => -1 $$), '22023', NULL, 'batch -1 raises 22023');
SELECT throws_ok(pg_temp.cyc($$ 'w', ARRAY['cyc'], batch => 1001 $$), '22023', NULL, 'batch 1001 raises 22023');
SELECT throws_ok(pg_temp.cyc($$ NULL, ARRAY['cyc'] $$), '22004', NULL, 'a null worker_id raises 22004');
SELECT throws_ok(pg_temp.cyc($$ NULL, ARRAY['cyc'], batch => 0 $$), '22004', NULL, 'even with batch 0');
SELECT throws_ok(pg_temp.cyc($$ E'w\x01', ARRAY['cyc'] $$), '22023', NULL, 'a worker_id with a control character raises 22023');
SELECT throws_ok(pg_temp.cyc($$ 'w', NULL $$), '22004', NULL, 'null queues raise 22004');
SELECT throws_ok(pg_temp.cyc($$ 'w', '{}' $$), '22023', NULL, 'empty queues raise 22023');
SELECT throws_ok(pg_temp.cyc($$ 'w', '{}', batch => 0 $$), '22023', NULL, 'even with batch 0');
SELECT throws_ok(pg_temp.cyc($$ 'w', ARRAY['cyc'], names => '{}' $$), '22023', NULL, 'empty names raise 22023');
SELECT throws_ok(pg_temp.cyc($$ 'w', ARRAY['cyc'], lease => NULL $$), '22004', NULL, 'a null lease raises 22004');
SELECT throws_ok(pg_temp.cyc($$ 'w', ARRAY['cyc'], lease => '0 s', batch => 0 $$), '22023', NULL,
                 'a lease of 0 raises 22023');
SELECT throws_ok(pg_temp.cyc($$ 'w', ARRAY['cyc'], lease => '2 days' $$), '22023', NULL, 'a lease over 1 day raises 22023');
SELECT throws_ok(format($$ SELECT * FROM treadle.complete_and_claim(NULL, ARRAY[%L]::uuid[], NULL, 'w') $$, :'b_tok'),
                 '22004', NULL, 'null job_ids raise 22004');
SELECT throws_ok(format($$ SELECT * FROM treadle.complete_and_claim(ARRAY[%s]::bigint[], NULL, NULL, 'w') $$, :b),
                 '22004', NULL, 'null lease_tokens raise 22004');
SELECT throws_ok(format($$ SELECT * FROM treadle.complete_and_claim(ARRAY[%s, 1]::bigint[], ARRAY[%L]::uuid[], NULL, 'w') $$,
                        :b, :'b_tok'), '22023', NULL, 'arrays of different lengths raise 22023');
SELECT throws_ok($$ SELECT * FROM treadle.complete_and_claim('{}', '{}', ARRAY['{}']::jsonb[], 'w') $$, '22023', NULL,
                 'results longer than job_ids raise 22023');
SELECT throws_ok(format($$ SELECT * FROM treadle.complete_and_claim(ARRAY[%s]::bigint[], ARRAY[%L]::uuid[],
                                                                     ARRAY[repeat('[', 101) || repeat(']', 101)]::jsonb[], 'w') $$,
                        :b, :'b_tok'), '22023', NULL, 'a result nested over 100 levels raises 22023');
SELECT results_eq(format($$ SELECT state, lease_token FROM treadle.jobs WHERE id = %s $$, :b),
                  format($$ VALUES ('running'::text, %L::uuid) $$, :'b_tok'),
                  'after all of these the job still runs under its token: nothing was written');

CREATE ROLE cyc_tenant; SELECT treadle.grant_worker('cyc_tenant');
SELECT treadle.set_tenant('cyc_tenant', 'a.');
SELECT is(pg_temp.as_role('cyc_tenant', pg_temp.cyc($$ 'w', ARRAY['b.mail'] $$)), '42501',
          'a tenant''s worker cannot claim another tenant''s queue through it');
SELECT is((SELECT state FROM treadle.jobs WHERE id = :b), 'running', 'and its finish half is undone with it');
SELECT is(pg_temp.as_role('cyc_tenant', pg_temp.cyc($$ 'w', ARRAY['b.mail'], batch => 0 $$)), 'ok',
          'with batch 0 nothing is claimed, and the finish half is tried');
SELECT is((SELECT state FROM treadle.jobs WHERE id = :b), 'running',
          'but a tenant''s token holds no job outside its queues (as a stale one): nothing is finished');
SELECT treadle.complete(:b, :'b_tok') AS b_done \gset

--------------------------------------------------------------------------------
-- heartbeat_many
--------------------------------------------------------------------------------
SELECT pg_temp.cycle_jobs(3);
SELECT array_agg(id ORDER BY id) AS hb_ids, array_agg(lease_token ORDER BY id) AS hb_toks
  FROM treadle.claim('w', ARRAY['cyc'], batch => 3, lease => '10 seconds') \gset
SELECT ok(treadle.cancel((:'hb_ids'::bigint[])[2]), 'a cancel is requested on the second');
SET LOCAL treadle.now = '2999-01-01 12:10:00+00';
SELECT results_eq(
    format($$ SELECT job_id, answer FROM treadle.heartbeat_many(%L::bigint[] || ARRAY[%s]::bigint[],
                                                               %L::uuid[] || ARRAY[gen_random_uuid()], '1 minute') $$,
           :'hb_ids', (:'hb_ids'::bigint[])[1], :'hb_toks'),
    format($$ VALUES (%s::bigint, 'held'::text), (%s, 'cancel'), (%s, 'held'), (%s, 'lost') $$,
           (:'hb_ids'::bigint[])[1], (:'hb_ids'::bigint[])[2], (:'hb_ids'::bigint[])[3], (:'hb_ids'::bigint[])[1]),
    'one answer per input in input order: held, cancel, or lost for a token that does not hold the job');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE id = ANY (:'hb_ids'::bigint[])
                                              AND lease_until = '2999-01-01 12:11:00+00'), 3::bigint,
          'every held lease (cancel too) moved to now + lease, even an expired one nobody took over');
SELECT is((SELECT count(*) FROM treadle.heartbeat_many('{}', '{}')), 0::bigint, 'empty arrays: no rows');
SELECT results_eq($$ SELECT answer FROM treadle.heartbeat_many(ARRAY[-1]::bigint[], ARRAY[gen_random_uuid()]) $$,
                  $$ VALUES ('lost'::text) $$, 'an unknown job is lost');
SELECT throws_ok($$ SELECT * FROM treadle.heartbeat_many(NULL, '{}') $$, '22004', NULL, 'null job_ids raise 22004');
SELECT throws_ok($$ SELECT * FROM treadle.heartbeat_many('{}', NULL) $$, '22004', NULL, 'null lease_tokens raise 22004');
SELECT throws_ok($$ SELECT * FROM treadle.heartbeat_many('{}', '{}', NULL) $$, '22004', NULL, 'a null lease raises 22004');
SELECT throws_ok($$ SELECT * FROM treadle.heartbeat_many(ARRAY[NULL]::bigint[], ARRAY[gen_random_uuid()]) $$, '22004', NULL,
                 'a null job id raises 22004');
SELECT throws_ok($$ SELECT * FROM treadle.heartbeat_many(ARRAY[1]::bigint[], ARRAY[NULL]::uuid[]) $$, '22004', NULL,
                 'a null token raises 22004');
SELECT throws_ok($$ SELECT * FROM treadle.heartbeat_many(ARRAY[1]::bigint[], '{}') $$, '22023', NULL,
                 'arrays of different lengths raise 22023');
SELECT throws_ok($$ SELECT * FROM treadle.heartbeat_many(array_fill(1::bigint, ARRAY[10001]),
                                                         array_fill(gen_random_uuid(), ARRAY[10001])) $$, '22023', NULL,
                 'more than 10,000 raise 22023');
SELECT throws_ok(format($$ SELECT * FROM treadle.heartbeat_many(%L, %L, '0 s') $$, :'hb_ids', :'hb_toks'), '22023', NULL,
                 'a lease of 0 raises 22023');
SELECT throws_ok(format($$ SELECT * FROM treadle.heartbeat_many(%L, %L, '25 hours') $$, :'hb_ids', :'hb_toks'), '22023', NULL,
                 'a lease over 1 day raises 22023');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE id = ANY (:'hb_ids'::bigint[])
                                              AND lease_until = '2999-01-01 12:11:00+00'), 3::bigint,
          'a refused call moved no lease');

SELECT * FROM finish();
ROLLBACK;
