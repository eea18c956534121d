-- pgtap/081_step_keys.sql: a step's concurrency_key (step_options): its jobs (plain
-- steps, graph steps, map elements, compensations) are admitted as keyed enqueues
-- are (blocked while the key is full, the slot given back when the job leaves);
-- explain_run shows a keyed step that waits; cancel_workflow and compensating
-- cancel a blocked step; bad keys are refused with nothing written; a periodic
-- job's next occurrence keeps its key. start_workflow's meta: on the run, on every
-- step job (list, graph, map, compensation), on child runs and forks; bad meta
-- refused with nothing written.
\set ON_ERROR_STOP true
BEGIN;
SELECT plan(59);
\ir helpers.psql

SET LOCAL treadle.now = '2999-01-01 12:00:00+00';

-- a run's step jobs as 'step state' (a * for a job holding its key's slot), in id order
CREATE FUNCTION pg_temp.steps(run_id bigint) RETURNS text LANGUAGE sql AS $$
    SELECT string_agg(j.step || ' ' || j.state || CASE WHEN j.key_slot THEN '*' ELSE '' END, ', ' ORDER BY j.id)
      FROM treadle.jobs AS j WHERE j.workflow_run_id = run_id $$;
CREATE FUNCTION pg_temp.held(q text, k text) RETURNS integer LANGUAGE sql AS $$
    SELECT held FROM treadle.key_slots WHERE queue = q AND key = k $$;
-- claim the one available job of a run's step and complete it (or fail it for good)
CREATE FUNCTION pg_temp.finish(run_id bigint, step_name text, step_result jsonb DEFAULT '{}', fail boolean DEFAULT false)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_job treadle.jobs;
    v_token uuid := gen_random_uuid();
BEGIN
    SELECT * INTO STRICT v_job FROM treadle.jobs AS j
     WHERE j.workflow_run_id = run_id AND j.step = step_name AND j.state = 'available' ORDER BY j.id LIMIT 1;
    UPDATE treadle.jobs AS j SET state = 'running', lease_until = treadle.now() + interval '1 hour',
           lease_token = v_token, worker_id = 'w', attempt = CASE WHEN fail THEN j.max_attempts ELSE 1 END
     WHERE j.id = v_job.id;
    IF fail THEN
        RETURN treadle.fail(v_job.id, v_token, 'boom');
    END IF;
    RETURN treadle.complete(v_job.id, v_token, step_result);
END;
$$;

--------------------------------------------------------------------------------
-- a list step with a key: one run's step at a time (key_limit 1, the default)
--------------------------------------------------------------------------------
SELECT lives_ok($$ SELECT treadle.define_workflow('render', ARRAY['prep', 'gpu'],
                          step_options => '{"gpu": {"concurrency_key": "gpu-0"}}') $$, 'a step with a concurrency_key');
SELECT is((SELECT step_options FROM treadle.workflows WHERE name = 'render'), '{"gpu": {"concurrency_key": "gpu-0"}}'::jsonb,
          'the key is stored with the step''s options');
SELECT treadle.start_workflow('render', queue => 'sk') AS r1 \gset
SELECT treadle.start_workflow('render', queue => 'sk') AS r2 \gset
SELECT treadle.start_workflow('render', queue => 'sk') AS r3 \gset
SELECT is(pg_temp.steps(:r1), 'prep available', 'a step without a key is a plain job');
SELECT is(pg_temp.finish(:r1, 'prep'), 'completed', 'run 1: prep completes');
SELECT is(pg_temp.finish(:r2, 'prep'), 'completed', 'run 2: prep completes');
SELECT is(pg_temp.finish(:r3, 'prep'), 'completed', 'run 3: prep completes');
SELECT is(pg_temp.steps(:r1), 'prep completed, gpu available*', 'run 1''s keyed step is released holding the slot');
SELECT is(pg_temp.steps(:r2), 'prep completed, gpu blocked', 'run 2''s keyed step waits blocked');
SELECT is(pg_temp.steps(:r3), 'prep completed, gpu blocked', 'run 3''s too');
SELECT is((SELECT concurrency_key FROM treadle.jobs WHERE workflow_run_id = :r2 AND step = 'gpu'), 'gpu-0',
          'the step job carries the key');
SELECT is(pg_temp.held('sk', 'gpu-0'), 1, 'one slot held');
SELECT is((SELECT count(*) FROM treadle.claim('w', ARRAY['sk'], batch => 10)), 1::bigint, 'a claim takes only the released one');
SELECT is((SELECT array_agg(reason ORDER BY reason) FROM treadle.explain_run(:r2) WHERE step = 'gpu'), ARRAY['key_full'],
          'explain_run: the waiting step''s key is full');
SELECT is((SELECT array_agg(reason ORDER BY reason) FROM treadle.explain_run(:r3) WHERE step = 'gpu'),
          ARRAY['key_full', 'key_waiting'], 'explain_run: the third also waits behind the second');
SELECT ok((SELECT bool_or(message LIKE 'key full: 1 of 1 held by jobs #%') FROM treadle.explain_run(:r2)),
          'explain_run names the jobs that hold the key');

-- the running step completes: the slot goes to the next run's step
SELECT is((SELECT treadle.complete(j.id, j.lease_token, '{}') FROM treadle.jobs AS j
            WHERE j.workflow_run_id = :r1 AND j.step = 'gpu'), 'completed', 'run 1''s keyed step completes');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :r1), 'completed', 'run 1 completes');
SELECT is(pg_temp.steps(:r2), 'prep completed, gpu available*', 'its slot released run 2''s step');
SELECT is(pg_temp.steps(:r3), 'prep completed, gpu blocked', 'run 3''s still waits');

-- cancel_workflow reaches a blocked step; a failed step gives its slot back
SELECT ok(treadle.cancel_workflow(:r3), 'a run whose keyed step is blocked can be cancelled');
SELECT is(pg_temp.steps(:r3), 'prep completed, gpu cancelled', 'its blocked step is cancelled at once');
SELECT is((SELECT state FROM treadle.workflow_runs WHERE id = :r3), 'cancelled', 'and the run with it');
SELECT is(pg_temp.finish(:r2, 'gpu', fail => true), 'discarded', 'run 2''s keyed step fails for good');
SELECT is(pg_temp.held('sk', 'gpu-0'), NULL, 'no slot is held any more');

--------------------------------------------------------------------------------
-- graph steps and map elements in one key of limit 2
--------------------------------------------------------------------------------
SELECT treadle.set_queue('mq', key_limit => 2);
SELECT treadle.start_workflow('fan', steps => ARRAY['list', 'each', 'a', 'b', 'c'], queue => 'mq',
                              after => '{"each": ["list"], "a": ["list"], "b": ["list"], "c": ["list"]}',
                              maps => '{"each": "list"}',
                              step_options => '{"each": {"concurrency_key": "k"}, "a": {"concurrency_key": "k"},
                                                "b": {"concurrency_key": "k"}, "c": {"concurrency_key": "other"}}') AS r4 \gset
SELECT is(pg_temp.finish(:r4, 'list', '[1, 2, 3]'), 'completed', 'list completes with three elements');
SELECT is(pg_temp.steps(:r4),
          'list completed, each available*, each available*, each blocked, a blocked, b blocked, c available*',
          'the map''s first two elements fill key k''s two slots (written first), a and b wait, c has its own key');
SELECT is(pg_temp.held('mq', 'k'), 2, 'key k: two slots held');
SELECT is(pg_temp.finish(:r4, 'each'), 'completed', 'an element completes');
SELECT is(pg_temp.steps(:r4),
          'list completed, each completed, each available*, each available*, a blocked, b blocked, c available*',
          'the oldest waiting job of the key (the third element) takes its slot');

--------------------------------------------------------------------------------
-- a compensation with a key
--------------------------------------------------------------------------------
SELECT treadle.enqueue('hold', queue => 'bank', concurrency_key => 'ledger') AS holder \gset
SELECT treadle.start_workflow('transfer', steps => ARRAY['debit', 'credit'], queue => 'bank',
                              compensations => '{"debit": "refund"}',
                              step_options => '{"refund": {"concurrency_key": "ledger"}}') AS r5 \gset
SELECT is(pg_temp.finish(:r5, 'debit'), 'completed', 'debit completes');
SELECT is(pg_temp.finish(:r5, 'credit', fail => true), 'discarded', 'credit fails for good');
SELECT is(pg_temp.steps(:r5), 'debit completed, credit discarded, refund blocked',
          'the compensation waits for its key (another job holds it)');
SELECT ok(treadle.cancel(:holder), 'the holder leaves');
SELECT is(pg_temp.steps(:r5), 'debit completed, credit discarded, refund available*', 'the compensation is released');

--------------------------------------------------------------------------------
-- bad keys: 22023 naming the step, nothing written
--------------------------------------------------------------------------------
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a'], step_options => '{"a": {"concurrency_key": ""}}') $$,
                 '22023', 'treadle: step "a" has a "concurrency_key" that is not 1 to 200 characters, not only spaces, without control characters: ""',
                 'an empty key');
SELECT throws_ok($$ SELECT treadle.define_workflow('bad', ARRAY['a'], step_options => '{"a": {"concurrency_key": 5}}') $$,
                 '22023', NULL, 'a key that is not a string');
SELECT throws_ok(format($$ SELECT treadle.define_workflow('bad', ARRAY['a'], step_options => '{"a": {"concurrency_key": "%s"}}') $$,
                        repeat('x', 201)),
                 '22023', NULL, 'a key over 200 characters');
SELECT throws_ok($$ SELECT treadle.start_workflow('bad', steps => ARRAY['a'], queue => 'badq',
                                                  step_options => '{"a": {"concurrency_key": "a\u0001b"}}') $$,
                 '22023', NULL, 'start_workflow: a key with a control character');
SELECT ok(NOT EXISTS (SELECT 1 FROM treadle.workflows WHERE name = 'bad')
          AND NOT EXISTS (SELECT 1 FROM treadle.workflow_runs WHERE name = 'bad')
          AND NOT EXISTS (SELECT 1 FROM treadle.jobs WHERE queue = 'badq'), 'nothing was written');

--------------------------------------------------------------------------------
-- a periodic job's next occurrence keeps its key
--------------------------------------------------------------------------------
SELECT treadle.enqueue('tick', queue => 'pq', every => '1 hour', concurrency_key => 'p') AS p1 \gset
SELECT treadle.enqueue('other', queue => 'pq', concurrency_key => 'p') AS o1 \gset
SELECT is((SELECT treadle.complete(c.id, c.lease_token, '{}') FROM treadle.claim('w', ARRAY['pq']) AS c), 'completed',
          'the periodic job completes');
SELECT is((SELECT string_agg(concat_ws(' ', name, state || CASE WHEN key_slot THEN '*' ELSE '' END, concurrency_key), ', '
                             ORDER BY id) FROM treadle.jobs WHERE queue = 'pq'),
          'tick completed p, other available* p, tick blocked p',
          'its slot went to the older blocked job; the next occurrence keeps the key and waits its turn');

--------------------------------------------------------------------------------
-- a run's meta reaches every step job, and child runs
--------------------------------------------------------------------------------
SELECT treadle.start_workflow('render', queue => 'metaq', meta => '{"tenant": "acme", "traceparent": "00-ab-cd-01"}') AS m1 \gset
SELECT is((SELECT meta FROM treadle.workflow_runs WHERE id = :m1), '{"tenant": "acme", "traceparent": "00-ab-cd-01"}'::jsonb,
          'the run keeps its meta');
SELECT treadle.start_workflow('plain', steps => ARRAY['one', 'two'], queue => 'metaq', meta => '{"tenant": "acme"}') AS m2 \gset
SELECT is((SELECT meta FROM treadle.jobs WHERE workflow_run_id = :m2), '{"tenant": "acme"}'::jsonb,
          'a list step without options (the short path) carries it');
SELECT is(pg_temp.finish(:m2, 'one'), 'completed', 'the first step completes');
SELECT is((SELECT array_agg(meta ->> 'tenant' ORDER BY id) FROM treadle.jobs WHERE workflow_run_id = :m2),
          ARRAY['acme', 'acme'], 'the next step carries it too');
SELECT is(pg_temp.finish(:m1, 'prep'), 'completed', 'a keyed run''s first step completes');
SELECT is((SELECT meta ->> 'tenant' FROM treadle.jobs WHERE workflow_run_id = :m1 AND step = 'gpu'), 'acme',
          'a step with options (and a key) carries it');
SELECT treadle.start_workflow('fan2', steps => ARRAY['list', 'each'], queue => 'metaq', after => '{"each": ["list"]}',
                              maps => '{"each": "list"}', compensations => '{"list": "undo"}',
                              meta => '{"tenant": "globex"}') AS m3 \gset
SELECT is(pg_temp.finish(:m3, 'list', '[1, 2]'), 'completed', 'a map''s source completes');
SELECT is((SELECT array_agg(meta ->> 'tenant' ORDER BY id) FROM treadle.jobs WHERE workflow_run_id = :m3 AND step = 'each'),
          ARRAY['globex', 'globex'], 'each map element carries it');
SELECT is(pg_temp.finish(:m3, 'each', fail => true), 'discarded', 'an element fails for good');
SELECT is((SELECT meta ->> 'tenant' FROM treadle.jobs WHERE workflow_run_id = :m3 AND step = 'undo'), 'globex',
          'the compensation carries it');
SELECT treadle.define_workflow('kid', ARRAY['k']);
SELECT treadle.start_workflow('parent', steps => ARRAY['spawn'], queue => 'metaq', children => '{"spawn": {"workflow": "kid"}}',
                              meta => '{"tenant": "initech"}') AS m4 \gset
SELECT is((SELECT r.meta ->> 'tenant' FROM treadle.workflow_runs AS r WHERE r.parent_run_id = :m4), 'initech',
          'a child run inherits it');
SELECT is((SELECT j.meta ->> 'tenant' FROM treadle.jobs AS j JOIN treadle.workflow_runs AS r ON r.id = j.workflow_run_id
            WHERE r.parent_run_id = :m4), 'initech', 'and its steps carry it');
SELECT treadle.fork_run(:m2, 'two') AS m5 \gset
SELECT is((SELECT meta FROM treadle.workflow_runs WHERE id = :m5), '{"tenant": "acme"}'::jsonb, 'a fork keeps it');
SELECT treadle.start_workflow('plain', steps => ARRAY['one'], queue => 'metaq', meta => 'null') AS m6 \gset
SELECT is((SELECT count(*) FROM treadle.workflow_runs AS r JOIN treadle.jobs AS j ON j.workflow_run_id = r.id
            WHERE r.id = :m6 AND r.meta IS NULL AND j.meta IS NULL), 1::bigint, 'JSON null is none');

SELECT throws_ok($$ SELECT treadle.start_workflow('badmeta', steps => ARRAY['a'], queue => 'badq', meta => '[1]') $$,
                 '22023', 'treadle: meta must be a JSON object, not array', 'meta that is not an object');
SELECT throws_ok(format($$ SELECT treadle.start_workflow('badmeta', steps => ARRAY['a'], queue => 'badq', meta => %L) $$,
                        repeat('{"a":', 101) || '1' || repeat('}', 101)),
                 '22023', NULL, 'meta nested over 100 levels');
SELECT throws_ok(format($$ SELECT treadle.start_workflow('badmeta', steps => ARRAY['a'], queue => 'badq', meta => %L) $$,
                        jsonb_build_object('big', (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 40000) AS i))),
                 '22023', NULL, 'meta over the size limit');
SELECT ok(NOT EXISTS (SELECT 1 FROM treadle.workflow_runs WHERE name = 'badmeta')
          AND NOT EXISTS (SELECT 1 FROM treadle.jobs WHERE queue = 'badq'), 'nothing was written');

SELECT * FROM finish();
ROLLBACK;
