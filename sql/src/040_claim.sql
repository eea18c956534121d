--------------------------------------------------------------------------------
-- Claim cursors' helpers. A cursor (treadle._claim_cursor) is kept as text in a
-- session setting, so times are kept as microseconds since 1970 (null for an
-- infinite time).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._us(t timestamptz)
RETURNS bigint
LANGUAGE sql
STABLE  -- as extract is for a timestamptz: a function no more volatile than its body is inlined
RETURN CASE WHEN isfinite(t) THEN (extract(epoch FROM t) * 1000000)::bigint END;
COMMENT ON FUNCTION treadle._us(timestamptz) IS
    'A time as microseconds since 1970; null for an infinite time.';

CREATE OR REPLACE FUNCTION treadle._from_us(us bigint)
RETURNS timestamptz
LANGUAGE sql
STABLE
-- null (an infinite time, or a cursor that lost a value) reads from the very start
RETURN CASE WHEN us IS NULL THEN '-infinity'::timestamptz
            -- whole seconds and the rest apart: exact where a float of microseconds is not
            ELSE to_timestamp(us / 1000000) + (us % 1000000) * interval '1 microsecond' END;
COMMENT ON FUNCTION treadle._from_us(bigint) IS
    'The time treadle._us gave as microseconds; -infinity for null.';

--------------------------------------------------------------------------------
-- treadle._cursor_form(kinds) -> text
-- treadle._is_cursor_text(setting, kinds) -> boolean
--
-- Whether `setting` is, in full, the text of a session's cursor (a
-- treadle._claim_cursor, a treadle._rescue_cursor) of version 1 whose further
-- fields are of `kinds`: 'number' (a bigint of at most 18 digits), 'number or
-- null', 'boolean', 'numbers' (a bigint[] of such numbers or nulls; quoted when it
-- has a comma, as a composite's text has it); _cursor_form gives the regular
-- expression. A setting is cast to its cursor type only once it passed: no field
-- is then out of its type's range, so a setting changed by hand, whatever it
-- holds, never raises. Called with constant kinds, the expression is computed once
-- when the caller's statement is planned (immutable, and _is_cursor_text is
-- inlined). The digits are counted apart: a bound in the expression makes a match
-- several times slower, and a claim from a cursor makes one each time.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._cursor_form(kinds text[])
RETURNS text
LANGUAGE sql
IMMUTABLE
BEGIN ATOMIC
    WITH p AS (SELECT '-?[0-9]+' AS number, '(?:-?[0-9]+|NULL)' AS element)
    SELECT '^\(1' || string_agg(',' || CASE k.kind
                    WHEN 'number' THEN p.number
                    WHEN 'number or null' THEN '(?:' || p.number || ')?'
                    WHEN 'boolean' THEN '[tf]'
                    WHEN 'numbers' THEN '(?:\{' || p.element || '?\}|"\{' || p.element || '(?:,' || p.element || ')+\}")'
                    END, '' ORDER BY k.n) || '\)$'
      FROM p, unnest(kinds) WITH ORDINALITY AS k(kind, n);
END;
COMMENT ON FUNCTION treadle._cursor_form(text[]) IS
    'The regular expression a session cursor''s text must match in full before it is cast.';

CREATE OR REPLACE FUNCTION treadle._is_cursor_text(setting text, kinds text[])
RETURNS boolean
LANGUAGE sql
IMMUTABLE
RETURN setting ~ treadle._cursor_form(kinds) AND setting !~ '[0-9]{19}';
COMMENT ON FUNCTION treadle._is_cursor_text(text, text[]) IS
    'Whether a setting holds the text of a session cursor whose fields are of the kinds given: safe to cast.';

--------------------------------------------------------------------------------
-- treadle._claim_next_lane(queue, name, after) -> (priority, run_at, id)
--
-- The first claimable row (due or not) of the first priority above `after` (any,
-- when null) among `queue`'s jobs (named `name`, when given), in claim order:
-- where a claim cursor's lane starts. It reads the index from the front of that
-- priority, dead entries included. Runs inside treadle.claim, under its settings.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._claim_next_lane(queue text, name text, after integer)
RETURNS TABLE (priority integer, run_at timestamptz, id bigint)
LANGUAGE plpgsql
STABLE
ROWS 1
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF _claim_next_lane.name IS NULL THEN
        RETURN QUERY
        SELECT j.priority, j.run_at, j.id FROM treadle.jobs AS j
         WHERE j.queue = _claim_next_lane.queue
           AND j.state = ANY (ARRAY['available', 'retryable'])
           AND j.priority > coalesce(_claim_next_lane.after, -2147483648)
         ORDER BY j.priority, j.run_at, j.id
         LIMIT 1;
    ELSE
        RETURN QUERY
        SELECT j.priority, j.run_at, j.id FROM treadle.jobs AS j
         WHERE j.queue = _claim_next_lane.queue
           AND j.name = _claim_next_lane.name
           AND j.state = ANY (ARRAY['available', 'retryable'])
           AND j.priority > coalesce(_claim_next_lane.after, -2147483648)
         ORDER BY j.priority, j.run_at, j.id
         LIMIT 1;
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._claim_next_lane(text, text, integer) IS
    'The first claimable row of the next priority of a queue (and name): where a claim lane starts.';

--------------------------------------------------------------------------------
-- treadle._claim_sweep(queues, names, max_lanes) -> treadle._claim_cursor
--
-- A cursor's lanes found from the front of the index: for each (queue[, name]) of
-- `queues` and `names` (sorted, distinct; null names: every name), the first
-- claimable row, due or not, of each of its priorities, up to max_lanes + 1 of
-- them (more than max_lanes: too many for a cursor). The one read that walks
-- every dead entry, once per lane. Only the lanes are filled in. Runs inside
-- treadle.claim, under its settings.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._claim_sweep(queues text[], names text[], max_lanes integer)
RETURNS treadle._claim_cursor
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c treadle._claim_cursor;
BEGIN
    WITH RECURSIVE lanes AS (
        SELECT r.qi, r.ni, f.priority, f.run_at, f.id, 1 AS n
          FROM (SELECT u.qi, 0 AS ni FROM generate_subscripts(queues, 1) AS u(qi)
                 WHERE names IS NULL
                UNION ALL
                SELECT u.qi, n.ni FROM generate_subscripts(queues, 1) AS u(qi),
                                       generate_subscripts(names, 1) AS n(ni)) AS r
         CROSS JOIN LATERAL treadle._claim_next_lane(queues[r.qi], names[r.ni], NULL) AS f
        UNION ALL
        SELECT l.qi, l.ni, f.priority, f.run_at, f.id, l.n + 1
          FROM lanes AS l
         CROSS JOIN LATERAL treadle._claim_next_lane(queues[l.qi], names[l.ni], l.priority) AS f
         WHERE l.n <= max_lanes
    )
    SELECT coalesce(array_agg(l.qi), '{}'), coalesce(array_agg(l.ni), '{}'), coalesce(array_agg(l.priority), '{}'),
           coalesce(array_agg(treadle._us(l.run_at)), '{}'), coalesce(array_agg(l.id), '{}')
      INTO c.lane_queue, c.lane_name, c.lane_priority, c.lane_run_at, c.lane_id
      FROM lanes AS l;
    RETURN c;
END;
$$;
COMMENT ON FUNCTION treadle._claim_sweep(text[], text[], integer) IS
    'A claim cursor''s lanes read from the front of the claim index: each queue''s (and name''s) first row per priority.';

--------------------------------------------------------------------------------
-- treadle._claim_by_cursor(setting, mode, queues, names, batch, now) -> bigint[]
--
-- treadle.claim's candidates for a session in cursor mode (see treadle.claim):
-- up to `batch` due jobs locked, the ids of those to claim, read from the lanes
-- of the cursor that `mode` (the setting's text) holds, moved back to the rows
-- made claimable since its snapshot, or found by a sweep (treadle._claim_sweep)
-- when it holds none, queue by queue in turn (treadle.claim_turn, moved on as a
-- plain claim moves it); the next cursor saved in `setting`. Null: this claim reads
-- plainly (the cursor has too many lanes). Runs inside treadle.claim, under its
-- settings. (One function: each call of a function that pins search_path costs
-- a claim about as much as a small query.)
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._claim_by_cursor(
    setting text, mode text, queues text[], names text[], batch integer, now timestamptz)
RETURNS bigint[]
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- Sweep at least this often: the sweep finds rows a cursor can miss (rows that a
    -- claim locked and then rolled back without writing them), so this bounds their
    -- delay; a sweep walks every dead entry once, so it is not done on every claim.
    c_sweep_every CONSTANT bigint := 60 * 1000000;  -- microseconds
    -- A sweep this quick finds few dead entries in front: back to the plain claim,
    -- which then costs less than a cursor.
    c_quick_sweep CONSTANT interval := interval '1 ms';
    -- Lanes a cursor keeps at most: each costs an index descent per claim, so a
    -- session whose queues hold more priorities claims plainly until the next sweep.
    c_max_lanes CONSTANT integer := 32;
    c_first_us CONSTANT bigint := -210866803200000000;  -- 4714 BC: the first time treadle._from_us gives
    v_now_us  bigint := treadle._us(now);
    v_snap    pg_snapshot := pg_current_snapshot();  -- taken before any row is read
    v_own     xid8 := pg_current_xact_id_if_assigned();  -- a snapshot lists every running id but its own
    v_queues  text[] := ARRAY(SELECT DISTINCT u.q FROM unnest(queues) AS u(q) ORDER BY 1);  -- lanes name them by number
    v_names   text[] := CASE WHEN names IS NOT NULL THEN ARRAY(SELECT DISTINCT n.n FROM unnest(names) AS n(n) ORDER BY 1) END;
    c         treadle._claim_cursor;
    v_since   treadle._claim_cursor;  -- lanes of the rows made claimable since c's snapshot
    v_quick   boolean := false;
    v_started timestamptz;
    v_count   integer := cardinality(queues);
    v_turn    text;
    v_first   integer := 0;  -- where the turn starts in queues, from 0
    v_order   bigint[];   -- the numbers of the lanes' queues to read, in turn order,
    v_places  integer[];  -- and their places in the turn, from v_first
    v_qi      bigint;     -- the queue being read
    v_last    integer;    -- the place of the last queue taken from
    v_left    integer := batch;  -- jobs still wanted
    v_ids     bigint[] := '{}'::bigint[];
    v_lane    bigint[];   -- a priority's candidates in claim order: their lane's number,
    v_cand    bigint[];   -- their ids,
    v_cand_us bigint[];   -- and run_at
BEGIN
    -- The cursor: one this session may resume from, when the setting holds one. Well
    -- formed (cast only once its text matched the form, so that no text raises), from
    -- a clock that did not go back, swept less than c_sweep_every ago, its lanes in
    -- range: each names one of the queues, and one of the names (0 without names).
    -- Anything else means a sweep.
    IF treadle._is_cursor_text(mode, '{number,number,boolean,number,numbers,numbers,numbers,numbers,numbers,numbers}') THEN
        c := mode::treadle._claim_cursor;
        IF (c.taken_at <= v_now_us AND c.swept_at <= v_now_us AND c.swept_at >= v_now_us - c_sweep_every
            AND (c.plain OR (
                c.xmax >= 0 AND 0 <= ALL (c.xip)
                AND cardinality(c.lane_name) = cardinality(c.lane_queue)
                AND cardinality(c.lane_priority) = cardinality(c.lane_queue)
                AND cardinality(c.lane_run_at) = cardinality(c.lane_queue)
                AND cardinality(c.lane_id) = cardinality(c.lane_queue)
                AND 1 <= ALL (c.lane_queue) AND cardinality(v_queues) >= ALL (c.lane_queue)
                AND CASE WHEN v_names IS NULL THEN 0 = ALL (c.lane_name)
                         ELSE 1 <= ALL (c.lane_name) AND cardinality(v_names) >= ALL (c.lane_name) END
                AND -2147483648 <= ALL (c.lane_priority) AND 2147483647 >= ALL (c.lane_priority)
                AND 0 <= ALL (c.lane_id)
                -- (a null run_at, an infinite time, reads from the start)
                AND NOT coalesce(c_first_us > ANY (c.lane_run_at), false)))) IS NOT TRUE THEN
            c := NULL;  -- (a null anywhere but in lane_run_at ends here too)
        END IF;
    END IF;

    IF c IS NULL THEN
        v_started := clock_timestamp();
        c := treadle._claim_sweep(v_queues, v_names, c_max_lanes);
        c.swept_at := v_now_us;
        v_quick := clock_timestamp() - v_started < c_quick_sweep;
    ELSIF c.plain THEN
        RETURN NULL;
    ELSE
        -- Resume: the cursor's lanes, each moved back to the first row made claimable
        -- by a transaction the cursor's snapshot did not see (ready_txid at or above its
        -- xmax, or in its xip), wherever that row lies, and new lanes for such rows of
        -- other priorities. (A ready_txid at or beyond this snapshot's xmax came from
        -- another cluster, restored: such rows are found from their lanes' keys.)
        SELECT coalesce(array_agg(g.qi), '{}'), coalesce(array_agg(g.ni), '{}'), coalesce(array_agg(g.p), '{}'),
               coalesce(array_agg(g.k[1]), '{}'), coalesce(array_agg(g.k[2]), '{}')
          INTO v_since.lane_queue, v_since.lane_name, v_since.lane_priority, v_since.lane_run_at,
               v_since.lane_id
          FROM (SELECT array_position(v_queues, r.queue) AS qi, coalesce(array_position(v_names, r.name), 0) AS ni,
                       r.priority AS p, min(ARRAY[treadle._us(r.run_at), r.id]) AS k
                  FROM (SELECT j.queue, j.name, j.priority, j.run_at, j.id FROM treadle.jobs AS j
                         WHERE j.state = ANY (ARRAY['available', 'retryable'])
                           AND j.ready_txid >= c.xmax::text::xid8
                           AND j.ready_txid < pg_snapshot_xmax(v_snap)
                        UNION ALL
                        -- and this transaction's own (a complete_and_claim writes the next
                        -- steps, then claims them): a snapshot's xmax follows the ids that
                        -- have ended, so the running transaction's id can lie at or past it
                        SELECT j.queue, j.name, j.priority, j.run_at, j.id FROM treadle.jobs AS j
                         WHERE j.state = ANY (ARRAY['available', 'retryable'])
                           AND j.ready_txid = ANY (c.xip::text[]::xid8[] || v_own)) AS r
                 WHERE r.queue = ANY (v_queues)
                   AND (v_names IS NULL OR r.name = ANY (v_names))
                 GROUP BY 1, 2, 3) AS g;
        IF cardinality(v_since.lane_queue) > 0 THEN
            -- (rows of many commits, a producer's, a release's, come down to one key
            -- per lane above; here, per lane, the lower of its two keys)
            SELECT array_agg(g.qi), array_agg(g.ni), array_agg(g.p), array_agg(g.k[1]), array_agg(g.k[2])
              INTO c.lane_queue, c.lane_name, c.lane_priority, c.lane_run_at, c.lane_id
              FROM (SELECT l.qi, l.ni, l.p, min(ARRAY[l.run_at, l.id]) AS k
                      FROM (SELECT * FROM unnest(c.lane_queue, c.lane_name, c.lane_priority, c.lane_run_at, c.lane_id)
                            UNION ALL
                            SELECT * FROM unnest(v_since.lane_queue, v_since.lane_name, v_since.lane_priority,
                                               v_since.lane_run_at, v_since.lane_id))
                           AS l(qi, ni, p, run_at, id)
                     GROUP BY l.qi, l.ni, l.p) AS g;
        END IF;
    END IF;
    IF cardinality(c.lane_queue) > c_max_lanes THEN
        PERFORM set_config(setting, CASE WHEN v_quick THEN ''
                                         ELSE ROW(1, v_now_us, c.swept_at, true, 0, '{}', '{}', '{}', '{}', '{}',
                                                  '{}')::treadle._claim_cursor::text END, false);
        RETURN NULL;
    END IF;

    -- Lock the candidates one queue at a time, in turn as the plain claim goes round
    -- them (treadle.claim_turn: from the session's turn, the next turn after the
    -- last queue taken from), so that a queue's backlog or better priorities never
    -- keep the others waiting. A queue whose lanes' keys all lie past now holds no
    -- due row (rows made claimable below a key moved it back above) and is not read.
    -- Each lane of the queue read from its key in claim order, skipping rows other
    -- claimers hold, as many as are still wanted; the best of them are claimed. Each
    -- lane read gets a new key: its first candidate left unclaimed; past now when it
    -- had fewer rows than asked for (all taken, or held by others); else just past
    -- its last claimed row. Lanes of the queues not read keep their keys.
    IF v_count > 1 THEN
        v_turn := coalesce(current_setting('treadle.claim_turn', true), '');
        v_first := CASE WHEN v_turn ~ '^[0-9]{1,9}$' THEN v_turn::integer % v_count ELSE 0 END;
    END IF;
    IF cardinality(v_queues) = 1 AND cardinality(c.lane_queue) > 0 THEN
        v_order := '{1}';  -- (one queue with lanes: read, as a statement to order it would cost as much)
        v_places := '{0}';
    ELSE
        SELECT array_agg(t.qi ORDER BY t.place), array_agg(t.place ORDER BY t.place)
          INTO v_order, v_places
          FROM (SELECT l.qi, min(((o.n - 1 - v_first) % v_count + v_count) % v_count) AS place
                  FROM unnest(c.lane_queue, c.lane_run_at) AS l(qi, run_at)
                  JOIN unnest(queues) WITH ORDINALITY AS o(q, n) ON o.q = v_queues[l.qi::integer]
                 WHERE coalesce(l.run_at <= v_now_us, true)
                 GROUP BY l.qi) AS t;
    END IF;
    FOR v_k IN 1 .. coalesce(cardinality(v_order), 0) LOOP
        v_qi := v_order[v_k];
        -- the candidates in claim order, each with its lane's number
        IF v_names IS NULL THEN
            SELECT coalesce(array_agg(l.n ORDER BY l.p, r.run_at, r.id), '{}'),
                   coalesce(array_agg(r.id ORDER BY l.p, r.run_at, r.id), '{}'),
                   coalesce(array_agg(treadle._us(r.run_at) ORDER BY l.p, r.run_at, r.id), '{}')
              INTO v_lane, v_cand, v_cand_us
              FROM unnest(c.lane_queue, c.lane_priority, c.lane_run_at, c.lane_id) WITH ORDINALITY
                   AS l(qi, p, run_at, id, n)
             CROSS JOIN LATERAL (
                    SELECT j.id, j.run_at
                      FROM treadle.jobs AS j
                     WHERE j.queue = v_queues[l.qi::integer]
                       AND j.priority = l.p
                       AND j.state = ANY (ARRAY['available', 'retryable'])
                       AND (j.run_at, j.id) >= (treadle._from_us(l.run_at), l.id)
                       AND j.run_at <= now
                     ORDER BY j.priority, j.run_at, j.id
                     LIMIT v_left
                       FOR UPDATE SKIP LOCKED) AS r
             WHERE l.qi = v_qi;
        ELSE
            SELECT coalesce(array_agg(l.n ORDER BY l.p, r.run_at, r.id), '{}'),
                   coalesce(array_agg(r.id ORDER BY l.p, r.run_at, r.id), '{}'),
                   coalesce(array_agg(treadle._us(r.run_at) ORDER BY l.p, r.run_at, r.id), '{}')
              INTO v_lane, v_cand, v_cand_us
              FROM unnest(c.lane_queue, c.lane_name, c.lane_priority, c.lane_run_at, c.lane_id) WITH ORDINALITY
                   AS l(qi, ni, p, run_at, id, n)
             CROSS JOIN LATERAL (
                    SELECT j.id, j.run_at
                      FROM treadle.jobs AS j
                     WHERE j.queue = v_queues[l.qi::integer]
                       AND j.name = v_names[l.ni::integer]
                       AND j.priority = l.p
                       AND j.state = ANY (ARRAY['available', 'retryable'])
                       AND (j.run_at, j.id) >= (treadle._from_us(l.run_at), l.id)
                       AND j.run_at <= now
                     ORDER BY j.priority, j.run_at, j.id
                     LIMIT v_left
                       FOR UPDATE SKIP LOCKED) AS r
             WHERE l.qi = v_qi;
        END IF;
        IF cardinality(v_cand) > 0 THEN
            v_ids := v_ids || v_cand[1:v_left];
            v_last := v_places[v_k];
        END IF;
        -- the lanes' keys: candidate i is claimed when i <= v_left
        SELECT array_agg(k.k[1] ORDER BY l.n), array_agg(k.k[2] ORDER BY l.n)
          INTO c.lane_run_at, c.lane_id
          FROM unnest(c.lane_queue, c.lane_run_at, c.lane_id) WITH ORDINALITY AS l(qi, run_at, id, n)
         CROSS JOIN LATERAL (
                SELECT count(*) AS got, min(x.i) FILTER (WHERE x.i > v_left) AS first_left, max(x.i) AS last
                  FROM generate_subscripts(v_lane, 1) AS x(i)
                 WHERE v_lane[x.i] = l.n) AS s
         CROSS JOIN LATERAL (
                SELECT CASE WHEN l.qi <> v_qi THEN ARRAY[l.run_at, l.id]
                            WHEN s.first_left IS NOT NULL THEN ARRAY[v_cand_us[s.first_left], v_cand[s.first_left]]
                            WHEN s.got < v_left THEN ARRAY[v_now_us + 1, 0]
                            ELSE ARRAY[v_cand_us[s.last], v_cand[s.last] + 1] END AS k) AS k;
        v_left := batch - cardinality(v_ids);
        EXIT WHEN v_left = 0;
    END LOOP;
    IF v_count > 1 AND v_last IS NOT NULL THEN
        PERFORM set_config('treadle.claim_turn', ((v_first + v_last + 1) % v_count)::text, false);
    END IF;

    -- The next cursor. Its snapshot: the one taken before reading, with this
    -- transaction's own id, when it had one, among those it did not see. After a
    -- quick sweep, none: back to the plain claim.
    c.version := 1;
    c.taken_at := v_now_us;
    c.plain := false;
    c.xmax := pg_snapshot_xmax(v_snap)::text::bigint;
    c.xip := ARRAY(SELECT x.x::text::bigint FROM pg_snapshot_xip(v_snap) AS x(x)
                   UNION ALL
                   SELECT v_own::text::bigint WHERE v_own IS NOT NULL);
    PERFORM set_config(setting, CASE WHEN v_quick THEN '' ELSE c::text END, false);
    RETURN v_ids;
END;
$$;
COMMENT ON FUNCTION treadle._claim_by_cursor(text, text, text[], text[], integer, timestamptz) IS
    'The candidates of a claim made from the session''s cursor, and the next cursor; null: claim plainly.';

--------------------------------------------------------------------------------
-- treadle._claim_setting(queues, names) -> text
--
-- The name of the setting that holds a session's claim mode for these queues and
-- names (see treadle.claim): a hash of each list, element by element (no text of
-- the list is built: a claim computes it at every call), the queues' the same as
-- treadle.claim_checked holds, so that a claim hashes its list once (treadle.claim
-- builds this name itself from that hash).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._claim_setting(queues text[], names text[])
RETURNS text
LANGUAGE sql
IMMUTABLE
RETURN 'treadle.claim_' || to_hex(hash_array_extended(queues, 0))
       || coalesce('_' || to_hex(hash_array_extended(names, 0)), '');
COMMENT ON FUNCTION treadle._claim_setting(text[], text[]) IS
    'The name of the setting holding a session''s claim mode for a list of queues and names.';

--------------------------------------------------------------------------------
-- treadle.claim(worker_id, queues, names, batch, lease, lease_token)
--     -> setof treadle.jobs
--
-- Transition: available | retryable (run_at <= now) -> running.
-- Claims up to `batch` due jobs from `queues` (only those named in `names`, when
-- given), with FOR UPDATE SKIP LOCKED: concurrent claimers never receive the same
-- job. Within a queue, jobs are claimed in priority, run_at, id order. Across
-- queues the claim goes round them: it reads one queue at a time, starting at the
-- session's turn, and stops once it has `batch`; the session's next claim starts
-- at the queue after the last one this claim took from (a setting,
-- treadle.claim_turn). So a claim's cost does not grow with the queues it names
-- while they hold work, and every queue gets its turn; a better priority in
-- another queue does not jump ahead of the queue being read. Each claimed job gets
-- attempt + 1, a lease until now + lease, the worker id and a lease token, which
-- every later write by the worker must name: `lease_token` when given (the same
-- for every job of this call, so that a worker whose answer was lost can ask
-- treadle.claimed what it took), otherwise a fresh random one per job. Returns the
-- claimed rows, queue by queue in the order they were read.
-- Each (queue[, name]) pair is read from its own index range, so a backlog of
-- jobs whose names the claimer does not handle is never walked past. Over several
-- names the best candidates are read first, unlocked, then locked by key: a claim
-- locks only the rows it takes (a cursor's read aside).
-- Past a queue that gave nothing, a probe finds the next one holding a due row; the
-- queues it passed are kept for a second (treadle.claim_passed) and gone past while no
-- row was made claimable since, so a row that only became due waits at most that. The
-- second is the server's (statement_timestamp()); a clock moved otherwise
-- (the setting treadle.now, treadle.now) ends it, a clock held still keeps it.
-- A paused queue gives nothing; a queue with a concurrency or rate limit gives at
-- most the room it has left (treadle._queue_room, treadle.set_queue).
--
-- Where a claim starts reading. A claimed job leaves a dead entry at the front of
-- the claim index, and while any snapshot older than the claim stays open (a long
-- transaction, a replication slot) nothing removes it: a claim that starts at the
-- front walks every one. So a session whose claims get slow switches to a cursor
-- (treadle._claim_by_cursor), kept per (queues, names) in a setting
-- (treadle.claim_<hash>): for each lane, a (queue[, name], priority), the key
-- (run_at, id) below which it found nothing left to take, and the snapshot its
-- previous claim read with (a treadle._claim_cursor). A claim reads each lane from
-- its key, its queues in turn as the plain claim reads them, and besides the rows
-- made claimable by transactions that snapshot did not see (ready_txid: late
-- commits, retries, releases, rescues, new priorities), which can lie below a key. A row can hide below every key only when a
-- transaction locked it and then rolled back without writing it (a claim that
-- failed after locking), or a writer made it claimable without setting ready_txid:
-- a sweep from the front every 60 s finds it, and a quick sweep ends the cursor.
-- The cursor only narrows what this session reads: a setting changed by hand can
-- delay this session's claims, never let it take a job twice or hide one from
-- other sessions; one that is not a usable cursor means a sweep.
-- Raises 22004: worker_id or queues null. 22023: worker_id or a queue that is not
-- a valid name, a name that is not a valid job name (treadle._are_job_names: up
-- to 410 characters, a step job's name); queues or names empty or over 1000; batch outside
-- 1..1000; lease not positive or over 1 day. 42501: a tenant's queue outside its
-- prefix.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.claim(
    worker_id text,
    queues    text[]   DEFAULT ARRAY['default'],
    names     text[]   DEFAULT NULL,
    batch     integer  DEFAULT 1,
    lease     interval DEFAULT '30 seconds',
    lease_token uuid   DEFAULT NULL
)
RETURNS SETOF treadle.jobs
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
ROWS 10
SET search_path = pg_catalog, pg_temp
-- Planning the claim costs as much as running it, so it is planned once per session.
-- A generic plan does not know the batch and guesses that LIMIT takes a tenth of the
-- rows; with sorts, sequential and bitmap scans off, the one plan left reads each
-- lane in claim order from its index and stops after `batch` rows, whatever the
-- table holds. The rows to update are found by queue and id = ANY(...), not by a
-- join whose size the planner would have to guess. (Each statement that reads or
-- writes jobs here names one table and one queue, so that a generic plan of it
-- can still be routed to one shard where jobs are distributed by queue.) The
-- penalty those settings add to the plan's cost would start JIT compiling, which
-- never pays off here: off too.
-- (The cursor's helpers run under these settings too.) Where treadle is distributed
-- by Citus (treadle._distributed), Citus cannot route a generic plan of a statement
-- whose queue is a parameter: there the claim sets plan_cache_mode back to auto for
-- its own run, and claims plainly (the cursor's reads cross queues).
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    -- A plain claim this slow walks about 10,000 dead entries; one without dead
    -- entries in front takes well under a millisecond. A cursor claim costs at most
    -- a few tenths of a millisecond more than a plain one, so a switch made in vain
    -- costs little and a late one costs throughput.
    c_slow    CONSTANT interval := interval '2 ms';
    -- Empty queues left that make a probe for the next with work pay: reading an empty
    -- queue costs about 10 us, the probe's statement about 50 us and 1 us a queue.
    c_probe   CONSTANT integer := 16;
    -- How long the queues a probe passed count as empty (treadle.claim_passed) unless rows
    -- were made claimable since: a row that only became due meanwhile waits at most this
    -- (as long as a worker's default poll interval, the most an idle worker waits for it).
    c_passed_for CONSTANT bigint := 1000000;  -- microseconds
    v_now     timestamptz := treadle.now();
    v_setting text;       -- this session's claim mode for these queues and names
    v_checked text;       -- the queues' hash
    v_names_hash text;    -- the names' (null without names)
    v_mode    text;
    v_plain   boolean;    -- the session claims plainly, without a cursor
    v_started timestamptz;
    v_ids     bigint[];
    v_room    jsonb;      -- what each queue may give, when a requested queue is paused or limited
    v_until   timestamptz;
    v_row     record;
    v_tokens  uuid[];     -- the claimed jobs' lease tokens, in v_ids' order (when lease_token is null)
    v_names   text[];     -- the names, each once
    v_count   integer;
    v_turn    text;
    v_first   integer := 0;  -- where this claim starts in queues, from 0
    v_last    integer;    -- the last queue this claim took from, counted from v_first
    v_i       integer := 0;  -- the queue being read, counted from v_first
    v_next    integer;    -- the next queue, counted from v_first, that holds a due row
    v_allow   interval := interval '0';  -- the probes' allowance: slow beyond c_slow plus this
    v_passed  text[];     -- treadle.claim_passed's fields, once read; '{}': none that holds
    v_snap    pg_snapshot;  -- a probe's snapshot, taken before it reads
    v_d       integer;    -- how far into the queues passed this claim's position is
    v_queue   text;
    v_name    text;
    v_left    integer;    -- jobs still wanted
    v_want    integer;    -- jobs wanted from this queue
    v_got     bigint[];
    v_took    text[] := '{}'::text[];  -- the queues jobs were taken from
    v_cand    bigint[];   -- a queue's candidates over several names: ids,
    v_cand_p  integer[];  -- priorities
    v_cand_at timestamptz[];  -- and run_at
    v_bound_p integer;    -- the worst of the best v_want candidates, once there are that many:
    v_bound_at timestamptz;  -- its priority, run_at
    v_bound_id bigint;    -- and id
    v_take    integer;    -- candidates read next over several names
    -- the claimable states, as a variable where a statement must not read the claim indexes
    -- (a generic plan cannot prove their predicate from a parameter): the lock by key
    v_claimable text[] := ARRAY['available', 'retryable'];
    -- treadle is distributed by Citus (one setting's read where Citus is not loaded)
    v_citus   boolean := treadle._on_citus();
BEGIN
    IF v_citus THEN
        -- (undone when the claim returns, as its SET clauses are)
        PERFORM set_config('plan_cache_mode', 'auto', true);
    END IF;
    -- Each argument is tested inline, as enqueue does, and its helper called only to
    -- raise: a call costs more than the test, and a worker claims all the time.
    IF claim.worker_id IS NULL OR NOT treadle._is_name(claim.worker_id) THEN
        PERFORM treadle._check_text(claim.worker_id, 'worker_id');
    END IF;
    -- The queues: their bounds and nulls tested at every call, each name in full
    -- (treadle._are_names, 0.1 ms per 1,000 names) once per list and session: the
    -- list last found valid is kept as a hash in a setting (treadle.claim_checked),
    -- the hash that also names the mode's setting below: a claim hashes its list once.
    -- A setting changed by hand lets through only names that are blank, too long or
    -- hold a control character: no queue is so named (enqueue and set_queue refuse
    -- them), so they claim nothing, and the tenant's prefix is still tested below.
    IF claim.queues IS NULL OR cardinality(claim.queues) NOT BETWEEN 1 AND 1000 OR array_ndims(claim.queues) <> 1 THEN
        PERFORM treadle._check_names(claim.queues, 'queues');
    END IF;
    IF array_position(claim.queues, NULL) IS NOT NULL THEN
        PERFORM treadle._check_names(claim.queues, 'queues');
    END IF;
    v_checked := to_hex(hash_array_extended(claim.queues, 0));
    IF current_setting('treadle.claim_checked', true) IS DISTINCT FROM v_checked THEN
        IF NOT treadle._are_names(claim.queues) THEN
            PERFORM treadle._check_names(claim.queues, 'queues');
        END IF;
        PERFORM set_config('treadle.claim_checked', v_checked, false);
    END IF;
    -- (treadle._claim_setting's name, from the hash above)
    v_names_hash := to_hex(hash_array_extended(claim.names, 0));
    v_setting := 'treadle.claim_' || v_checked || coalesce('_' || v_names_hash, '');
    -- The names as the queues: bounds and nulls at every call, each name in full once per
    -- list and session (the list last found valid kept as its hash, treadle.claim_names_checked)
    IF claim.names IS NOT NULL
       AND (cardinality(claim.names) NOT BETWEEN 1 AND 1000 OR array_ndims(claim.names) <> 1
            OR array_position(claim.names, NULL) IS NOT NULL
            OR current_setting('treadle.claim_names_checked', true) IS DISTINCT FROM v_names_hash) THEN
        IF NOT treadle._are_job_names(claim.names) THEN
            PERFORM treadle._check_job_names(claim.names, 'names');
        END IF;
        PERFORM set_config('treadle.claim_names_checked', v_names_hash, false);
    END IF;
    IF claim.batch IS NULL OR claim.batch NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'treadle: batch must be between 1 and 1000, got %', coalesce(claim.batch::text, 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF claim.lease IS NULL THEN
        RAISE EXCEPTION 'treadle: lease must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF claim.lease <= interval '0' OR claim.lease > interval '1 day' THEN
        PERFORM treadle._check_interval(claim.lease, 'lease', interval '1 day');
    END IF;
    -- treadle._check_queue_allowed's rule, inline: a helper call would cost more than the check
    IF EXISTS (SELECT 1 FROM treadle.tenants AS t, unnest(claim.queues) AS q(q)
                WHERE t.tenant_role = treadle._caller_role() AND NOT starts_with(q.q, t.queue_prefix)) THEN
        PERFORM treadle._check_queue_allowed(q.q) FROM unnest(claim.queues) AS q(q);
    END IF;
    -- completed steps of these queues left for a re-check move their runs first (and
    -- a join they enqueue can be claimed now); complete_and_claim does it at its end
    -- (073_workflow_rechecks.sql)
    IF NOT v_citus AND current_setting('treadle.claim_follows', true) IS DISTINCT FROM 'on'
       AND EXISTS (SELECT 1 FROM treadle.run_rechecks) THEN  -- (any at all: the list's own probe sorts it, which costs with 1,000 queues)
        PERFORM treadle._move_rechecks(claim.queues);
    END IF;
    -- Paused and limited queues (treadle.queues): claim only from those with room,
    -- and below keep to each one's room. Queues without settings pay this probe only:
    -- an index descent per queue named, or, for a long list while the table is at most
    -- a few pages, one read of the table, each row with settings looked up in the list
    -- (a thousand descents, the list sorted first, cost a claim more than the rest of it).
    IF (CASE WHEN cardinality(claim.queues) > 32 AND NOT v_citus AND pg_relation_size('treadle.queues') <= 32768
            THEN EXISTS (SELECT 1 FROM treadle.queues AS s
                          WHERE (s.paused OR s.concurrency IS NOT NULL OR s.rate_limit IS NOT NULL)
                            AND ARRAY[s.queue] <@ claim.queues)
            ELSE EXISTS (SELECT 1 FROM treadle.queues AS s
                          WHERE s.queue = ANY (claim.queues)
                            AND (s.paused OR s.concurrency IS NOT NULL OR s.rate_limit IS NOT NULL)) END) THEN
        v_room := treadle._queue_room(claim.queues, claim.batch);
        claim.queues := ARRAY(SELECT u.q FROM unnest(claim.queues) AS u(q) WHERE (v_room ->> u.q)::integer > 0);
        IF cardinality(claim.queues) = 0 THEN
            RETURN;
        END IF;
        claim.batch := least(claim.batch, (SELECT sum(r.value::integer) FROM jsonb_each(v_room) AS r
                                            WHERE r.value::integer > 0));
        v_setting := treadle._claim_setting(claim.queues, claim.names);  -- (the queues with room)
    END IF;

    -- The session's mode for these queues and names: nothing, 'slow' or 'slow2' (the
    -- plain claim, after one or two slow claims in a row), 'sweep' (after the third:
    -- not just one, as the first claim of a session is also planned, and a busy
    -- server has slow moments) or a cursor. A paused or limited queue is claimed
    -- plainly: its room may leave candidates unclaimed, which a cursor would count
    -- as taken.
    v_mode := coalesce(current_setting(v_setting, true), '');
    v_plain := v_room IS NOT NULL OR v_citus OR v_mode IN ('', 'slow', 'slow2');
    IF NOT v_plain THEN
        v_ids := treadle._claim_by_cursor(v_setting, v_mode, claim.queues, claim.names, claim.batch, v_now);
    END IF;

    v_until := v_now + claim.lease;
    IF v_ids IS NOT NULL THEN
        -- From the cursor: its candidates, locked, may lie in several queues.
        IF v_room IS NOT NULL THEN
            v_ids := treadle._take_room(v_ids, v_room);
        END IF;
        IF coalesce(cardinality(v_ids), 0) = 0 THEN
            RETURN;
        END IF;
        IF claim.lease_token IS NULL THEN
            v_tokens := array_fill(NULL::uuid, ARRAY[cardinality(v_ids)]);
            FOR v_k IN 1 .. cardinality(v_ids) LOOP
                v_tokens[v_k] := gen_random_uuid();
            END LOOP;
        END IF;
        RETURN QUERY
        WITH claimed AS (
            UPDATE treadle.jobs AS j
               SET state = 'running',
                   attempt = j.attempt + 1,
                   lease_until = v_until,
                   -- (the tokens drawn through text: Citus 13.2 cannot take a bare array
                   -- element in a distributed UPDATE's SET, and its backend crashes)
                   lease_token = coalesce(claim.lease_token, v_tokens[array_position(v_ids, j.id)]::text::uuid),
                   worker_id = claim.worker_id,
                   started_at = v_now,
                   progress = NULL,
                   progress_message = NULL
             WHERE j.id = ANY (v_ids)
            RETURNING j.*
        )
        SELECT * FROM claimed AS d ORDER BY array_position(v_ids, d.id);  -- (queue by queue, as read)
        RETURN;
    END IF;

    -- The claim, one queue at a time: each queue's claimable rows locked from the
    -- front of its range in claim order, skipping rows other claimers hold, as many
    -- as are still wanted (and its room allows), until `batch` are found. Every
    -- statement that locks or writes names one queue. A claim naming several queues
    -- starts at this session's turn (treadle.claim_turn) and goes round them from
    -- there; the next claim starts after the last queue this one took from, so that
    -- each queue gets its turn whatever the others hold.
    v_started := clock_timestamp();
    IF cardinality(claim.names) > 1 THEN  -- (apart: a CASE around a subquery would be a query each time)
        v_names := ARRAY(SELECT DISTINCT n.n FROM unnest(claim.names) AS n(n));
    ELSE
        v_names := claim.names;
    END IF;
    v_count := cardinality(claim.queues);
    IF v_count > 1 THEN
        v_turn := coalesce(current_setting('treadle.claim_turn', true), '');
        v_first := CASE WHEN v_turn ~ '^[0-9]{1,9}$' THEN v_turn::integer % v_count ELSE 0 END;
    END IF;
    v_left := claim.batch;
    WHILE v_i < v_count LOOP
        v_queue := claim.queues[(v_first + v_i) % v_count + 1];
        v_want := CASE WHEN v_room IS NULL THEN v_left ELSE least(v_left, (v_room ->> v_queue)::integer) END;
        v_got := NULL;
        -- (a queue named twice is read once: its rows this claim locked would come back)
        IF v_want IS NULL OR v_want <= 0 OR v_queue = ANY (v_took) THEN
            -- (nothing read)
        ELSIF v_names IS NULL THEN
            v_got := ARRAY(
                SELECT j.id FROM treadle.jobs AS j
                 WHERE j.queue = v_queue
                   AND j.state = ANY (ARRAY['available', 'retryable'])
                   AND j.run_at <= v_now
                 ORDER BY j.priority, j.run_at, j.id
                 LIMIT v_want
                   FOR UPDATE SKIP LOCKED);
        ELSIF cardinality(v_names) = 1 THEN
            v_got := ARRAY(
                SELECT j.id FROM treadle.jobs AS j
                 WHERE j.queue = v_queue
                   AND j.name = v_names[1]
                   AND j.state = ANY (ARRAY['available', 'retryable'])
                   AND j.run_at <= v_now
                 ORDER BY j.priority, j.run_at, j.id
                 LIMIT v_want
                   FOR UPDATE SKIP LOCKED);
        ELSIF NOT v_citus THEN
            -- Several names: the best candidates over the names, each (queue, name) range
            -- read from its own front (a backlog of other names is never walked past) and
            -- none locked, then those locked by key, skipping rows other claimers hold. A
            -- candidate held elsewhere (or claimed since) leaves the batch short: the next
            -- read goes on past the last candidate, for what is still wanted. So the claim
            -- locks only what it takes. (Each read bounds the name from both sides, as the
            -- reads below: the one plan without sorts of each range is its index's.)
            v_got := '{}'::bigint[];
            v_bound_id := NULL;
            LOOP
                -- (a read past candidates held elsewhere reads twice as many as the last, so
                -- that a claim passes n held rows in about log2(n) reads, not n / batch)
                v_take := CASE WHEN v_bound_id IS NULL THEN v_want - cardinality(v_got)
                               ELSE least(greatest(2 * v_take, v_want - cardinality(v_got)), 1000) END;
                IF v_bound_id IS NULL THEN
                    SELECT coalesce(array_agg(c.id ORDER BY c.priority, c.run_at, c.id), '{}'),
                           array_agg(c.priority ORDER BY c.priority, c.run_at, c.id),
                           array_agg(c.run_at ORDER BY c.priority, c.run_at, c.id)
                      INTO v_cand, v_cand_p, v_cand_at
                      FROM (SELECT l.id, l.priority, l.run_at FROM unnest(v_names) AS n(n)
                             CROSS JOIN LATERAL (
                                   SELECT j.id, j.priority, j.run_at FROM treadle.jobs AS j
                                    WHERE j.queue = v_queue
                                      AND j.name >= n.n AND j.name <= n.n
                                      AND j.state = ANY (ARRAY['available', 'retryable'])
                                      AND j.run_at <= v_now
                                    ORDER BY j.name, j.priority, j.run_at, j.id
                                    LIMIT v_take) AS l
                             ORDER BY l.priority, l.run_at, l.id
                             LIMIT v_take) AS c;
                ELSE
                    SELECT coalesce(array_agg(c.id ORDER BY c.priority, c.run_at, c.id), '{}'),
                           array_agg(c.priority ORDER BY c.priority, c.run_at, c.id),
                           array_agg(c.run_at ORDER BY c.priority, c.run_at, c.id)
                      INTO v_cand, v_cand_p, v_cand_at
                      FROM (SELECT l.id, l.priority, l.run_at FROM unnest(v_names) AS n(n)
                             CROSS JOIN LATERAL (
                                   SELECT j.id, j.priority, j.run_at FROM treadle.jobs AS j
                                    WHERE j.queue = v_queue
                                      AND j.name <= n.n
                                      AND j.state = ANY (ARRAY['available', 'retryable'])
                                      AND j.run_at <= v_now
                                      AND (j.name, j.priority, j.run_at, j.id) > (n.n, v_bound_p, v_bound_at, v_bound_id)
                                    ORDER BY j.name, j.priority, j.run_at, j.id
                                    LIMIT v_take) AS l
                             ORDER BY l.priority, l.run_at, l.id
                             LIMIT v_take) AS c;
                END IF;
                -- (in the candidates' order; a row claimed or changed since is left out: every
                -- predicate of the read is tested again here, the name too, which a schedule
                -- changes on its waiting occurrence, and a row moved behind the last candidate,
                -- where rows not read may now come first, is left to the next read, past it;
                -- one candidate locked at a time, a nested loop in the candidates' order, which
                -- stops once the batch is full: no row is locked that is not taken; each by
                -- jobs_pkey, not by a claim index, which a generic plan may pick and walk the
                -- queue's whole backlog in for each candidate)
                v_got := v_got || ARRAY(
                    SELECT l.id FROM unnest(v_cand) AS c(id)
                     CROSS JOIN LATERAL (
                           SELECT j.id FROM treadle.jobs AS j
                            WHERE j.queue = v_queue
                              AND j.id = c.id
                              AND j.name = ANY (v_names)
                              AND (cardinality(v_cand) < v_take
                                   OR (j.priority, j.run_at, j.id)
                                      <= (v_cand_p[v_take], v_cand_at[v_take], v_cand[v_take]))
                              AND j.state = ANY (v_claimable)
                              AND j.run_at <= v_now
                              FOR UPDATE SKIP LOCKED) AS l
                     LIMIT v_want - cardinality(v_got));
                EXIT WHEN cardinality(v_got) = v_want OR cardinality(v_cand) < v_take;
                v_bound_p := v_cand_p[v_take];
                v_bound_at := v_cand_at[v_take];
                v_bound_id := v_cand[v_take];
            END LOOP;
        ELSE
            -- Several names where treadle is distributed (Citus): each (queue, name) range
            -- read from its own front (a backlog of other names is never walked past), then
            -- the queue's best of them. Once
            -- `v_want` candidates are held, a further range is read only below the worst
            -- of the best `v_want`, so that rows which could not be taken are not locked.
            -- (Each read bounds the name from both sides, not by `=`, and puts it first in
            -- the ORDER BY, so that the one plan left without sorts reads
            -- jobs_claim_name_idx in that order: with `j.name = v_name` the planner drops the
            -- name from the order, a constant, and when statistics saw few names the
            -- generic plan read jobs_claim_idx, filtering on the name, past every other
            -- name's waiting job. A read below the bound has the name in its row
            -- comparison, which then ends the index scan at the bound.)
            v_cand := '{}'::bigint[];
            v_cand_p := '{}'::integer[];
            v_cand_at := '{}'::timestamptz[];
            v_bound_id := NULL;
            FOREACH v_name IN ARRAY v_names LOOP
                IF v_bound_id IS NULL THEN
                    FOR v_row IN
                        SELECT j.id, j.priority, j.run_at FROM treadle.jobs AS j
                         WHERE j.queue = v_queue
                           AND j.name >= v_name AND j.name <= v_name
                           AND j.state = ANY (ARRAY['available', 'retryable'])
                           AND j.run_at <= v_now
                         ORDER BY j.name, j.priority, j.run_at, j.id
                         LIMIT v_want
                           FOR UPDATE SKIP LOCKED
                    LOOP
                        v_cand := v_cand || v_row.id;
                        v_cand_p := v_cand_p || v_row.priority;
                        v_cand_at := v_cand_at || v_row.run_at;
                    END LOOP;
                ELSE
                    FOR v_row IN
                        SELECT j.id, j.priority, j.run_at FROM treadle.jobs AS j
                         WHERE j.queue = v_queue
                           AND j.name >= v_name
                           AND j.state = ANY (ARRAY['available', 'retryable'])
                           AND j.run_at <= v_now
                           AND (j.name, j.priority, j.run_at, j.id) < (v_name, v_bound_p, v_bound_at, v_bound_id)
                         ORDER BY j.name, j.priority, j.run_at, j.id
                         LIMIT v_want
                           FOR UPDATE SKIP LOCKED
                    LOOP
                        v_cand := v_cand || v_row.id;
                        v_cand_p := v_cand_p || v_row.priority;
                        v_cand_at := v_cand_at || v_row.run_at;
                    END LOOP;
                END IF;
                IF cardinality(v_cand) >= v_want THEN
                    SELECT c.priority, c.run_at, c.id INTO v_bound_p, v_bound_at, v_bound_id
                      FROM unnest(v_cand, v_cand_p, v_cand_at) AS c(id, priority, run_at)
                     ORDER BY c.priority, c.run_at, c.id
                    OFFSET v_want - 1 LIMIT 1;
                END IF;
            END LOOP;
            v_got := ARRAY(SELECT c.id FROM unnest(v_cand, v_cand_p, v_cand_at) AS c(id, priority, run_at)
                            ORDER BY c.priority, c.run_at, c.id LIMIT v_want);
        END IF;
        IF cardinality(v_got) > 0 THEN
            v_ids := coalesce(v_ids, '{}') || v_got;
            v_took := v_took || v_queue;
            v_left := v_left - cardinality(v_got);
            v_last := v_i;
            EXIT WHEN v_left = 0;
        END IF;
        v_i := v_i + 1;
        -- A queue that gave nothing, and more than c_probe left: the next of them (in turn
        -- order) holding a due row this snapshot sees is found in one statement, an
        -- index probe per queue and no lock, where reading each would cost a statement
        -- per queue (a worker over many queues that each hold a trickle of jobs finds
        -- most of them empty). Each probe a LATERAL subquery with LIMIT, the one plan
        -- left is a nested loop over the positions in generate_series' order, which
        -- stops at the first. A queue whose due rows others hold gives nothing when
        -- read, and the probe goes on after it. (Not where treadle is distributed:
        -- there every statement that reads jobs names one queue.)
        IF coalesce(cardinality(v_got), 0) = 0 AND v_count - v_i > c_probe AND NOT v_citus THEN
            -- The queues this session's last probe passed (treadle.claim_passed: the mode's
            -- setting name, when by treadle's clock, the probe's snapshot, the queues as a
            -- start and a count in queues' order, and when by the server's) held no due row:
            -- while that is less than c_passed_for old by the server's time
            -- (statement_timestamp()), treadle's clock moved with the server's or stood still
            -- (a test's clock held), and no row was made claimable since its snapshot
            -- (ready_txid at or above its xmax, or in its xip: a commit's enqueue, retry,
            -- release or rescue, anywhere), they hold none still, but for rows that only
            -- became due meanwhile, which wait until it ends (a clock moved otherwise, as a
            -- test moves it, may have made any row due: it ends it). So a claim whose turn
            -- falls in them goes on after them, where a probe would visit each (the
            -- session's claims over 1,000 queues of which one holds work probe once a
            -- second). Read once per claim, tested field by field before any cast: a setting
            -- changed by hand may delay this session's claims by c_passed_for at most,
            -- never raise.
            IF v_passed IS NULL THEN
                v_passed := string_to_array(coalesce(current_setting('treadle.claim_passed', true), ''), '/');
                IF NOT (cardinality(v_passed) = 7 AND v_room IS NULL AND v_passed[1] = v_setting
                        AND v_passed[2] ~ '^[0-9]{1,18}$' AND v_passed[3] ~ '^[0-9]{1,18}$'
                        AND v_passed[4] ~ '^([0-9]{1,18}(,[0-9]{1,18})*)?$'
                        AND v_passed[5] ~ '^[0-9]{1,9}$' AND v_passed[6] ~ '^[0-9]{1,9}$'
                        AND v_passed[7] ~ '^[0-9]{1,18}$') THEN
                    v_passed := '{}';
                ELSIF NOT (v_passed[7]::bigint BETWEEN treadle._us(statement_timestamp()) - c_passed_for
                                                   AND treadle._us(statement_timestamp())
                           AND (v_passed[2]::bigint = treadle._us(v_now)
                                OR v_passed[2]::bigint - v_passed[7]::bigint
                                   = treadle._us(v_now) - treadle._us(statement_timestamp()))
                           AND v_passed[5]::integer < v_count AND v_passed[6]::integer <= v_count)
                      OR EXISTS (SELECT FROM treadle.jobs AS j
                                  WHERE j.state = ANY (ARRAY['available', 'retryable'])
                                    AND j.ready_txid >= v_passed[3]::xid8)
                      OR EXISTS (SELECT FROM treadle.jobs AS j
                                  WHERE j.state = ANY (ARRAY['available', 'retryable'])
                                    AND j.ready_txid = ANY (string_to_array(v_passed[4], ',')::xid8[])) THEN
                    v_passed := '{}';
                END IF;
            END IF;
            v_d := CASE WHEN cardinality(v_passed) = 7
                        THEN ((v_first + v_i - v_passed[5]::integer) % v_count + v_count) % v_count END;
            IF v_d < v_passed[6]::integer THEN
                EXIT WHEN v_i + v_passed[6]::integer - v_d >= v_count;
                v_i := v_i + v_passed[6]::integer - v_d;
                CONTINUE;
            END IF;
            -- (a probe costs 1-2 us per queue: a long list of empty queues is not a slow claim)
            v_allow := v_allow + (v_count - v_i) * interval '3 us';
            v_snap := pg_current_snapshot();  -- (no older than the probe's own)
            IF v_names IS NULL THEN
                v_next := (SELECT q.i FROM generate_series(v_i, v_count - 1) AS q(i)
                            CROSS JOIN LATERAL (
                                  SELECT FROM treadle.jobs AS j
                                   WHERE j.queue = claim.queues[(v_first + q.i) % v_count + 1]
                                     AND j.state = ANY (ARRAY['available', 'retryable'])
                                     AND j.run_at <= v_now
                                   LIMIT 1) AS l
                            LIMIT 1);
            ELSIF cardinality(v_names) = 1 THEN
                v_next := (SELECT q.i FROM generate_series(v_i, v_count - 1) AS q(i)
                            CROSS JOIN LATERAL (
                                  SELECT FROM treadle.jobs AS j
                                   WHERE j.queue = claim.queues[(v_first + q.i) % v_count + 1]
                                     AND j.name = v_names[1]
                                     AND j.state = ANY (ARRAY['available', 'retryable'])
                                     AND j.run_at <= v_now
                                   LIMIT 1) AS l
                            LIMIT 1);
            ELSE
                -- (each (queue, name) range probed apart, as it is read)
                v_next := (SELECT q.i FROM generate_series(v_i, v_count - 1) AS q(i)
                            CROSS JOIN LATERAL (
                                  SELECT FROM unnest(v_names) AS n(n)
                                   CROSS JOIN LATERAL (
                                         SELECT FROM treadle.jobs AS j
                                          WHERE j.queue = claim.queues[(v_first + q.i) % v_count + 1]
                                            AND j.name = n.n
                                            AND j.state = ANY (ARRAY['available', 'retryable'])
                                            AND j.run_at <= v_now
                                          LIMIT 1) AS l
                                   LIMIT 1) AS m
                            LIMIT 1);
            END IF;
            -- the queues passed, with the snapshot and this transaction's own id when it has
            -- one (a snapshot lists every running id but its own; one assigned later is at
            -- or above its xmax)
            IF v_room IS NULL AND coalesce(v_next, v_count) > v_i THEN
                PERFORM set_config('treadle.claim_passed', concat_ws('/', v_setting, treadle._us(v_now),
                                   pg_snapshot_xmax(v_snap),
                                   array_to_string(ARRAY(SELECT x.x::text FROM pg_snapshot_xip(v_snap) AS x(x)
                                                         UNION ALL
                                                         SELECT pg_current_xact_id_if_assigned()::text), ','),
                                   (v_first + v_i) % v_count, coalesce(v_next, v_count) - v_i,
                                   treadle._us(statement_timestamp())), false);
            END IF;
            EXIT WHEN v_next IS NULL;
            v_i := v_next;
        END IF;
    END LOOP;
    IF v_count > 1 AND v_last IS NOT NULL THEN
        PERFORM set_config('treadle.claim_turn', ((v_first + v_last + 1) % v_count)::text, false);
    END IF;
    -- A slow claim (its probes allowed for) moves the mode on ('' -> 'slow' -> 'slow2' -> 'sweep'); a quick
    -- one after a slow one starts it again.
    IF v_plain AND NOT v_citus AND (clock_timestamp() - v_started > c_slow + v_allow OR v_mode LIKE 'slow%') THEN
        PERFORM set_config(v_setting, CASE WHEN clock_timestamp() - v_started <= c_slow + v_allow THEN ''
                                           WHEN v_mode = 'slow2' THEN 'sweep'
                                           WHEN v_mode = 'slow' THEN 'slow2' ELSE 'slow' END, false);
    END IF;
    IF v_room IS NOT NULL AND v_ids IS NOT NULL THEN
        -- (each queue's read kept to its room: this spends the rate tokens)
        v_ids := treadle._take_room(v_ids, v_room);
    END IF;
    IF coalesce(cardinality(v_ids), 0) = 0 THEN
        RETURN;
    END IF;

    -- The write, one queue at a time, with the tokens drawn first: a fresh one per
    -- job unless lease_token is given.
    IF claim.lease_token IS NULL THEN
        v_tokens := array_fill(NULL::uuid, ARRAY[cardinality(v_ids)]);
        FOR v_k IN 1 .. cardinality(v_ids) LOOP
            v_tokens[v_k] := gen_random_uuid();
        END LOOP;
    END IF;
    FOREACH v_queue IN ARRAY v_took LOOP
        RETURN QUERY
        WITH claimed AS (
            UPDATE treadle.jobs AS j
               SET state = 'running',
                   attempt = j.attempt + 1,
                   lease_until = v_until,
                   -- (the tokens drawn through text: Citus 13.2 cannot take a bare array
                   -- element in a distributed UPDATE's SET, and its backend crashes)
                   lease_token = coalesce(claim.lease_token, v_tokens[array_position(v_ids, j.id)]::text::uuid),
                   worker_id = claim.worker_id,
                   started_at = v_now,
                   progress = NULL,
                   progress_message = NULL
             WHERE j.queue = v_queue
               AND j.id = ANY (v_ids)
            RETURNING j.*
        )
        SELECT * FROM claimed AS d ORDER BY d.priority, d.run_at, d.id;
    END LOOP;
END;
$$;
COMMENT ON FUNCTION treadle.claim(text, text[], text[], integer, interval, uuid) IS
    'Claim up to batch due jobs (available or retryable -> running) under a lease token.';

--------------------------------------------------------------------------------
-- treadle.claimed(lease_token) -> setof treadle.jobs
--
-- Transition: none. The running jobs that hold lease_token, in claim order: what a
-- claim given that token took, for a worker whose answer to the claim was lost.
-- Empty when the claim did not commit, or its jobs were finished or rescued since;
-- a tenant finds only jobs of its own queues.
-- Raises 22004: lease_token null.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.claimed(lease_token uuid)
RETURNS SETOF treadle.jobs
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
ROWS 10
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_prefix text;
BEGIN
    IF claimed.lease_token IS NULL THEN
        RAISE EXCEPTION 'treadle: lease_token must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- a tenant finds only its own queues' jobs (another tenant's leaked token finds none)
    v_prefix := treadle._caller_prefix();
    -- running jobs are few (bounded by the workers' concurrency): their index is enough
    RETURN QUERY
    SELECT * FROM treadle.jobs AS j
     WHERE j.state = 'running' AND j.lease_token = claimed.lease_token
       AND starts_with(j.queue, v_prefix)
     ORDER BY j.priority, j.run_at, j.id;
END;
$$;
COMMENT ON FUNCTION treadle.claimed(uuid) IS
    'The running jobs holding a lease token: what a claim whose answer was lost took.';

--------------------------------------------------------------------------------
-- treadle.heartbeat(job_id, lease_token, lease, queue) -> text
--
-- Transition: none (running stays running; the lease moves to now + lease).
-- Returns 'held', 'cancel' (held, and a cancel was requested: abort the handler)
-- or 'lost' (the token no longer holds the job, or the job is outside a tenant
-- caller's queues). An expired lease that nobody
-- took over is still held. queue, when given, is the job's queue (as for
-- treadle.complete): a job of another queue is lost.
-- Raises 22004: job_id, lease_token or lease null. 22023: lease not positive or
-- over 1 day.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.heartbeat(
    job_id      bigint,
    lease_token uuid,
    lease       interval DEFAULT '30 seconds',
    queue       text     DEFAULT NULL
)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_cancel boolean;
    v_until  timestamptz;
    v_queue  text := heartbeat.queue;
BEGIN
    PERFORM treadle._check_lease_args(heartbeat.job_id, heartbeat.lease_token);
    IF heartbeat.lease IS NULL THEN
        RAISE EXCEPTION 'treadle: lease must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM treadle._check_interval(heartbeat.lease, 'lease', interval '1 day');
    v_until := treadle.now() + heartbeat.lease;  -- computed here: no clock call inside the UPDATE
    IF v_queue IS NULL THEN
        SELECT j.queue INTO v_queue FROM treadle.jobs AS j WHERE j.id = heartbeat.job_id;
    END IF;
    -- a tenant's token holds only its own queues' jobs: another tenant's leaked token
    -- is treated as a stale one (nothing held, nothing written, nothing told of it)
    IF EXISTS (SELECT FROM treadle.tenants AS t
                WHERE t.tenant_role = treadle._caller_role() AND NOT starts_with(v_queue, t.queue_prefix)) THEN
        v_queue := NULL;
    END IF;

    UPDATE treadle.jobs AS j
       SET lease_until = v_until
     WHERE j.id = heartbeat.job_id
       AND j.queue = v_queue
       AND j.state = 'running'
       AND j.lease_token = heartbeat.lease_token
    RETURNING j.cancel_requested INTO v_cancel;

    IF NOT FOUND THEN
        RETURN 'lost';
    END IF;
    RETURN CASE WHEN v_cancel THEN 'cancel' ELSE 'held' END;
END;
$$;
COMMENT ON FUNCTION treadle.heartbeat(bigint, uuid, interval, text) IS
    'Extend a running job''s lease; returns held, cancel or lost.';

--------------------------------------------------------------------------------
-- treadle.progress(job_id, lease_token, fraction, message, queue) -> boolean
--
-- Transition: none; records how far a running job has come (0..1, and a note),
-- shown by the views. Returns false when the token no longer holds the job (or,
-- when queue is given, the job is not in it).
-- Raises 22004: job_id, lease_token or fraction null. 22023: fraction outside 0..1,
-- message over the payload size limit.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.progress(
    job_id      bigint,
    lease_token uuid,
    fraction    double precision,
    message     text DEFAULT NULL,
    queue       text DEFAULT NULL
)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_queue text := progress.queue;
BEGIN
    PERFORM treadle._check_lease_args(progress.job_id, progress.lease_token);
    IF octet_length(progress.message) > treadle._max_payload_bytes() THEN
        RAISE EXCEPTION 'treadle: message is % bytes, more than the limit of % bytes',
                        octet_length(progress.message), treadle._max_payload_bytes()
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF progress.fraction IS NULL THEN
        RAISE EXCEPTION 'treadle: fraction must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT (progress.fraction BETWEEN 0 AND 1) THEN
        RAISE EXCEPTION 'treadle: fraction must be between 0 and 1, got %', progress.fraction
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    IF v_queue IS NULL THEN
        SELECT j.queue INTO v_queue FROM treadle.jobs AS j WHERE j.id = progress.job_id;
    END IF;
    -- a tenant's token holds only its own queues' jobs: another tenant's leaked token
    -- is treated as a stale one (nothing held, nothing written, nothing told of it)
    IF EXISTS (SELECT FROM treadle.tenants AS t
                WHERE t.tenant_role = treadle._caller_role() AND NOT starts_with(v_queue, t.queue_prefix)) THEN
        v_queue := NULL;
    END IF;
    UPDATE treadle.jobs AS j
       SET progress = progress.fraction,
           progress_message = progress.message
     WHERE j.id = progress.job_id
       AND j.queue = v_queue
       AND j.state = 'running'
       AND j.lease_token = progress.lease_token;
    RETURN FOUND;
END;
$$;
COMMENT ON FUNCTION treadle.progress(bigint, uuid, double precision, text, text) IS
    'Record a running job''s progress (0..1) and a message; false when the lease is lost.';
