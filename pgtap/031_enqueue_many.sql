-- pgtap/031_enqueue_many.sql: treadle.enqueue_many. Ids in input order, enqueue's
-- defaults, keys repeated in the array or already held, and bad arrays that write nothing.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(44);

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

SELECT has_function('treadle', 'enqueue_many', ARRAY['jsonb'], 'treadle.enqueue_many(jsonb) exists');
SELECT function_returns('treadle', 'enqueue_many', ARRAY['jsonb'], 'setof bigint', 'it returns setof bigint');

-- Ids come back in input order, one per element
CREATE TEMP TABLE batch AS
SELECT id, ord
  FROM treadle.enqueue_many($$[
        {"name": "b"},
        {"name": "a", "args": {"k": 1}, "queue": "mail", "priority": 3, "max_attempts": 2},
        {"name": "c", "run_at": "2999-01-03T08:00:00Z", "every": "5 minutes", "idempotency_key": "c-1"},
        {"name": "d", "args": null},
        {"name": "e", "args": [1, 2], "run_at": null, "every": null, "idempotency_key": null}
      ]$$) WITH ORDINALITY AS t(id, ord);
SELECT is((SELECT count(*) FROM batch), 5::bigint, 'one id per element');
SELECT ok((SELECT bool_and(b.id IS NOT NULL) FROM batch AS b), 'every id is given');
SELECT results_eq(
    $$ SELECT j.name FROM batch AS b JOIN treadle.jobs AS j ON j.id = b.id ORDER BY b.ord $$,
    ARRAY['b', 'a', 'c', 'd', 'e'],
    'the ids are returned in input order');
SELECT results_eq(
    $$ SELECT id FROM batch ORDER BY ord $$,
    $$ SELECT id FROM batch ORDER BY id $$,
    'ids grow in input order');

SELECT results_eq(
    $$ SELECT j.queue, j.args, j.priority, j.run_at, j.max_attempts, j.idempotency_key, j.every, j.state,
              j.created_at
         FROM batch AS b JOIN treadle.jobs AS j ON j.id = b.id WHERE b.ord = 1 $$,
    $$ VALUES ('default'::text, '{}'::jsonb, 0, '2999-01-01 12:00:00+00'::timestamptz, 25, NULL::text,
               NULL::interval, 'available'::text, '2999-01-01 12:00:00+00'::timestamptz) $$,
    'missing keys take enqueue''s defaults');
SELECT results_eq(
    $$ SELECT j.queue, j.args, j.priority, j.max_attempts
         FROM batch AS b JOIN treadle.jobs AS j ON j.id = b.id WHERE b.ord = 2 $$,
    $$ VALUES ('mail'::text, '{"k": 1}'::jsonb, 3, 2) $$,
    'queue, args, priority and max_attempts are taken from the element');
SELECT results_eq(
    $$ SELECT j.run_at, j.every, j.idempotency_key
         FROM batch AS b JOIN treadle.jobs AS j ON j.id = b.id WHERE b.ord = 3 $$,
    $$ VALUES ('2999-01-03 08:00:00+00'::timestamptz, '5 minutes'::interval, 'c-1'::text) $$,
    'run_at is read as ISO 8601, every as an interval string');
SELECT is((SELECT j.args FROM batch AS b JOIN treadle.jobs AS j ON j.id = b.id WHERE b.ord = 4), '{}'::jsonb,
          'null args are stored as {}');
SELECT results_eq(
    $$ SELECT j.args, j.run_at, j.every, j.idempotency_key
         FROM batch AS b JOIN treadle.jobs AS j ON j.id = b.id WHERE b.ord = 5 $$,
    $$ VALUES ('[1, 2]'::jsonb, '2999-01-01 12:00:00+00'::timestamptz, NULL::interval, NULL::text) $$,
    'explicit nulls take the defaults; array args are kept');

-- Keys: repeated in the array, or already held by a job
SELECT treadle.enqueue('held', idempotency_key => 'held-key') AS held \gset
CREATE TEMP TABLE keyed AS
SELECT id, ord
  FROM treadle.enqueue_many($$[
        {"name": "k", "idempotency_key": "new-key", "args": {"first": true}},
        {"name": "k", "idempotency_key": "held-key"},
        {"name": "k", "idempotency_key": "new-key", "args": {"first": false}},
        {"name": "k"},
        {"name": "k", "idempotency_key": "c-1"}
      ]$$) WITH ORDINALITY AS t(id, ord);
SELECT is((SELECT id FROM keyed WHERE ord = 3), (SELECT id FROM keyed WHERE ord = 1),
          'a key repeated in the array returns the first element''s id');
SELECT is((SELECT args FROM treadle.jobs WHERE idempotency_key = 'new-key'), '{"first": true}'::jsonb,
          'the first element with a key is the one stored');
SELECT is((SELECT id FROM keyed WHERE ord = 2), :held::bigint, 'a key already held returns the holder''s id');
SELECT is((SELECT id FROM keyed WHERE ord = 5), (SELECT id FROM batch WHERE ord = 3),
          'a key held by an earlier batch returns that job''s id');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE name = 'k'), 2::bigint,
          'only the new key and the unkeyed element were inserted');
SELECT is((SELECT count(*) FROM keyed), 5::bigint, 'an id is returned for every element, inserted or not');

-- An empty array enqueues nothing and returns nothing
SELECT is_empty($$ SELECT * FROM treadle.enqueue_many('[]') $$, 'an empty array returns no ids');

-- Bad input: each raises its SQLSTATE and writes nothing, even after good elements
CREATE TEMP TABLE before AS SELECT count(*) AS jobs FROM treadle.jobs;

SELECT throws_ok($$ SELECT treadle.enqueue_many(NULL) $$, '22004', NULL, 'null jobs raise 22004');
SELECT throws_ok($$ SELECT treadle.enqueue_many('{"name": "x"}') $$, '22023',
                 'treadle: jobs must be a JSON array of objects, not object', 'an object instead of an array raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('"x"') $$, '22023', NULL, 'a string instead of an array raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('null') $$, '22023', NULL, 'JSON null instead of an array raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "ok"}, 3]') $$, '22023',
                 'treadle: jobs element 1 is not an object', 'an element that is not an object raises 22023, naming it');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "ok"}, {"args": {}}]') $$, '22023', NULL,
                 'an element without a name raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": ""}]') $$, '22023', NULL, 'an empty name raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": 5}]') $$, '22023', NULL, 'a name that is not a string raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "colour": "red"}]') $$, '22023', NULL,
                 'an unknown key raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "queue": ""}]') $$, '22023', NULL, 'an empty queue raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "queue": null}]') $$, '22023', NULL, 'a null queue raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "args": 7}]') $$, '22023', NULL, 'scalar args raise 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "priority": 1.5}]') $$, '22023', NULL,
                 'a fractional priority raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "priority": "1"}]') $$, '22023', NULL,
                 'a priority given as a string raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "max_attempts": 0}]') $$, '22023', NULL,
                 'max_attempts 0 raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "run_at": 17}]') $$, '22023', NULL,
                 'a run_at that is not a string raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "run_at": "next tuesday-ish"}]') $$, '22023', NULL,
                 'a run_at that is not a time raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "run_at": "-infinity"}]') $$, '22023', NULL,
                 'an infinite run_at raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x"}, {"name": "x", "every": "300000 years"}]') $$, '22023', NULL,
                 'an every whose next occurrence cannot be stored raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "every": "often"}]') $$, '22023', NULL,
                 'an every that is not an interval raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "every": "0 seconds"}]') $$, '22023', NULL,
                 'an every of zero raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "every": "-5 minutes"}]') $$, '22023', NULL,
                 'a negative every raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "idempotency_key": 12}]') $$, '22023', NULL,
                 'a key that is not a string raises 22023');
SELECT throws_ok($$ SELECT treadle.enqueue_many('[{"name": "x", "idempotency_key": "fresh"}, {"name": "y", "every": "0 s"}]') $$,
                 '22023', NULL, 'a bad element after a good keyed one raises 22023');
SELECT is((SELECT count(*) FROM treadle.jobs), (SELECT jobs FROM before), 'no bad array wrote a job');
SELECT is((SELECT count(*) FROM treadle.jobs WHERE idempotency_key = 'fresh'), 0::bigint,
          'the key of a good element in a failed call was not taken');

SELECT * FROM finish();
ROLLBACK;
