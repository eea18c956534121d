-- pgtap/033_job_meta.sql: metadata on jobs (meta): set by enqueue and enqueue_many,
-- returned by claims, copied to a periodic job's next occurrence and into the history;
-- every bad meta refused with nothing written.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(37);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

CREATE FUNCTION pg_temp.in_queue() RETURNS bigint LANGUAGE sql AS $$
    SELECT count(*) FROM treadle.jobs WHERE queue = 'meta' $$;

SELECT has_column('treadle', 'jobs', 'meta', 'treadle.jobs has meta');
SELECT col_type_is('treadle', 'jobs', 'meta', 'jsonb', 'meta is jsonb');
SELECT is((SELECT attname FROM pg_attribute WHERE attrelid = 'treadle.jobs'::regclass AND attnum > 0
            AND NOT attisdropped AND attname > '' AND attnum > (SELECT attnum FROM pg_attribute
             WHERE attrelid = 'treadle.jobs'::regclass AND attname = 'key_period') ORDER BY attnum LIMIT 1),
          'meta'::name, 'meta follows key_period at the end of treadle.jobs');
SELECT has_column('treadle', 'job_history', 'meta', 'the history has meta');

-- enqueue
SELECT treadle.enqueue('m', queue => 'meta', meta => '{"traceparent": "00-abc-def-01", "tenant": "acme"}') AS m1 \gset
SELECT is((pg_temp.job(:m1)).meta, '{"traceparent": "00-abc-def-01", "tenant": "acme"}'::jsonb, 'enqueue stores meta');
SELECT is((pg_temp.job(treadle.enqueue('m', queue => 'meta'))).meta, NULL, 'no meta: null');
SELECT is((pg_temp.job(treadle.enqueue('m', queue => 'meta', meta => 'null'))).meta, NULL, 'JSON null: null');
SELECT is((pg_temp.job(treadle.enqueue('m', queue => 'meta', meta => '{}'))).meta, '{}'::jsonb, 'an empty object is kept');

-- bad meta: 22023, nothing written
DELETE FROM treadle.jobs WHERE queue = 'meta';
SELECT throws_ok($$ SELECT treadle.enqueue('m', queue => 'meta', meta => '[1]') $$,
                 '22023', 'treadle: meta must be a JSON object, not array', 'meta an array is refused');
SELECT throws_ok($$ SELECT treadle.enqueue('m', queue => 'meta', meta => '"x"') $$,
                 '22023', 'treadle: meta must be a JSON object, not string', 'meta a string is refused');
SELECT throws_ok($$ SELECT treadle.enqueue('m', queue => 'meta', meta => '7') $$,
                 '22023', 'treadle: meta must be a JSON object, not number', 'meta a number is refused');
SELECT throws_ok(format($$ SELECT treadle.enqueue('m', queue => 'meta', meta => %L) $$,
                        repeat('{"a": ', 101) || '1' || repeat('}', 101)),
                 '22023', 'treadle: meta is nested more than 100 levels deep', 'meta too deep is refused');
SELECT treadle.configure(max_payload_bytes => 2048);
SELECT throws_like(format($$ SELECT treadle.enqueue('m', queue => 'meta', meta => %L) $$,
                          jsonb_build_object('blob', (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 200) AS i))),
                   'treadle: meta is % bytes, more than the limit of 2048 bytes', 'meta over the size limit is refused');
SELECT is(pg_temp.in_queue(), 0::bigint, 'no bad meta wrote a job');

-- enqueue_many: a key of its rows, checked as enqueue checks it
SELECT array_agg(id ORDER BY id) AS many FROM treadle.enqueue_many('[
    {"name": "a", "queue": "meta", "meta": {"n": 1}},
    {"name": "b", "queue": "meta"},
    {"name": "c", "queue": "meta", "meta": null}]') AS e(id) \gset
SELECT results_eq(format($$ SELECT meta FROM treadle.jobs WHERE id = ANY (%L::bigint[]) ORDER BY name $$, :'many'),
                  $$ VALUES ('{"n": 1}'::jsonb), (NULL), (NULL) $$, 'enqueue_many stores each row''s meta');
DELETE FROM treadle.jobs WHERE queue = 'meta';
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "a", "queue": "meta"}, {"name": "b", "queue": "meta", "meta": [1]}]') $$,
                 '22023', 'treadle: jobs element 1 has a "meta" that is not an object', 'enqueue_many: meta an array is refused');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "b", "queue": "meta", "meta": "x"}]') $$,
                 '22023', 'treadle: jobs element 0 has a "meta" that is not an object', 'enqueue_many: meta a string is refused');
SELECT throws_ok(format($$ SELECT treadle.enqueue_many(%L) $$,
                        jsonb_build_array(jsonb_build_object('name', 'b', 'queue', 'meta',
                            'meta', (repeat('{"a": ', 101) || '1' || repeat('}', 101))::jsonb))),
                 '22023', 'treadle: jobs element 0 has a "meta" nested more than 100 levels deep',
                 'enqueue_many: meta too deep is refused');
SELECT throws_ok(format($$ SELECT treadle.enqueue_many(%L) $$,
                        jsonb_build_array(jsonb_build_object('name', 'b', 'queue', 'meta',
                            'meta', jsonb_build_object('blob', (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 200) AS i))))),
                 '22023', 'treadle: jobs element 0 has a "meta" larger than the limit of 2048 bytes',
                 'enqueue_many: meta over the size limit is refused');
SELECT is(pg_temp.in_queue(), 0::bigint, 'no bad batch wrote a job');
-- a merging row goes through enqueue, meta and all
SELECT treadle.enqueue_many('[{"name": "d", "queue": "meta", "idempotency_key": "mk", "on_conflict": "replace",
                               "meta": {"k": 1}}]') AS mk \gset
SELECT is((pg_temp.job(:mk)).meta, '{"k": 1}'::jsonb, 'enqueue_many: a merging row stores its meta');
SELECT is((SELECT meta FROM treadle.jobs WHERE idempotency_key = 'mk'),
          (SELECT meta FROM treadle.jobs WHERE id = treadle.enqueue('d', queue => 'meta', idempotency_key => 'mk',
                                                                    on_conflict => 'replace', meta => '{"k": 2}')),
          'a merge into a held key''s job keeps that job''s meta');
SELECT is((SELECT meta FROM treadle.jobs WHERE idempotency_key = 'mk'), '{"k": 1}'::jsonb, 'the holder''s meta is unchanged');
DELETE FROM treadle.jobs WHERE queue = 'meta';

-- a claim returns it
SELECT treadle.enqueue('c', queue => 'meta', meta => '{"who": "claim"}', run_at => '2000-01-01') AS c1 \gset
SELECT is((SELECT meta FROM treadle.claim('w', ARRAY['meta'])), '{"who": "claim"}'::jsonb, 'a claimed row carries meta');

-- a periodic job's next occurrence takes its meta
SELECT treadle.enqueue('tick', queue => 'meta-p', every => '1 minute', run_at => '2000-01-01',
                       meta => '{"series": "t"}') AS p1 \gset
SELECT lease_token AS p1_tok FROM treadle.claim('w', ARRAY['meta-p']) \gset
SELECT is(treadle.complete(:p1, :'p1_tok', NULL), 'completed', 'the occurrence completes');
SELECT isnt((pg_temp.job(:p1)).next_id, NULL, 'it has a successor');
SELECT is((pg_temp.job((pg_temp.job(:p1)).next_id)).meta, '{"series": "t"}'::jsonb, 'the successor has the same meta');
SELECT is((pg_temp.job((pg_temp.job(:p1)).next_id)).state, 'available', 'the successor waits');

-- the history keeps it
SELECT treadle.enqueue('h', queue => 'meta-h', meta => '{"kept": true}', run_at => '2000-01-01') AS h1 \gset
SELECT lease_token AS h1_tok FROM treadle.claim('w', ARRAY['meta-h']) \gset
SELECT is(treadle.complete(:h1, :'h1_tok', NULL), 'completed', 'a job with meta completes');
UPDATE treadle.jobs SET finished_at = '2999-01-01 11:58:00+00' WHERE id = :h1;
SELECT cmp_ok(treadle.archive(1000), '>=', 1::bigint, 'archive moves it');
SELECT is((SELECT meta FROM treadle.job_history WHERE id = :h1), '{"kept": true}'::jsonb, 'the history row has its meta');
-- a retry brings a job back from the history, meta and all
SELECT treadle.enqueue('hc', queue => 'meta-h', meta => '{"back": 1}', run_at => '2999-01-01') AS h2 \gset
SELECT is(treadle.cancel(:h2), true, 'a job with meta is cancelled');
UPDATE treadle.jobs SET finished_at = '2999-01-01 11:58:00+00' WHERE id = :h2;
SELECT cmp_ok(treadle.archive(1000), '>=', 1::bigint, 'archive moves it');
SELECT is(treadle.retry(:h2), true, 'the cancelled job is retried from the history');
SELECT is((SELECT meta FROM treadle.jobs WHERE id = :h2 AND state = 'available'), '{"back": 1}'::jsonb,
          'a retry from the history keeps meta');

-- a producer (the produce part) may pass meta
CREATE ROLE treadle_meta_producer;
SELECT treadle.grant_producer('treadle_meta_producer');
SELECT is(pg_temp.as_role('treadle_meta_producer',
          $$ SELECT treadle.enqueue('r', queue => 'meta', meta => '{"r": 1}') $$), 'ok', 'a producer enqueues with meta');
SELECT is((SELECT meta FROM treadle.jobs WHERE queue = 'meta' AND name = 'r'), '{"r": 1}'::jsonb, 'the producer''s meta is stored');

SELECT * FROM finish();
ROLLBACK;
