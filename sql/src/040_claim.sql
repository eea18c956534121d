--------------------------------------------------------------------------------
-- Claim cursors' helpers. A cursor is kept as a bigint[] in a session setting, so
-- times are kept as microseconds since 1970 (null for an infinite time).
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
-- treadle.claim(worker_id, queues, names, batch, lease, lease_token)
--     -> setof treadle.jobs
--
-- Transition: available | retryable (run_at <= now) -> running.
-- Claims up to `batch` due jobs from `queues` (only those named in `names`, when
-- given), in priority, run_at, id order, with FOR UPDATE SKIP LOCKED: concurrent
-- claimers never receive the same job. Each claimed job gets attempt + 1, a lease
-- until now + lease, the worker id and a lease token, which every later write by
-- the worker must name: `lease_token` when given (the same for every job of this
-- call, so that a worker whose answer was lost can ask treadle.claimed what it
-- took), otherwise a fresh random one per job. Returns the claimed rows.
-- Each (queue[, name]) pair is read from its own index range, so a backlog of
-- jobs whose names the claimer does not handle is never walked past.
-- A paused queue gives nothing; a queue with a concurrency or rate limit gives at
-- most the room it has left (treadle._queue_room, treadle.set_queue).
--
-- Where a claim starts reading. A claimed job leaves a dead entry at the front of
-- the claim index, and while any snapshot older than the claim stays open (a long
-- transaction, a replication slot) nothing removes it: a claim that starts at the
-- front walks every one. So a session whose claims take over 2 ms switches to a
-- cursor, kept per (queues, names) in a setting (treadle.claim_<hash>): for each
-- lane, a (queue[, name], priority), the key (run_at, id) below which it found
-- nothing left to take, and the snapshot its previous claim read with. A claim reads
-- each lane from its key, and besides the rows made claimable by transactions that
-- snapshot did not see (ready_txid: late commits, retries, releases, rescues, new
-- priorities), which can lie below a key. A row can hide below every key only when
-- a transaction locked it and then rolled back without writing it (a claim that
-- failed after locking), or a writer made it claimable without setting ready_txid:
-- a sweep from the front every 60 s finds it, and a quick sweep ends the cursor.
-- The cursor only narrows what this session reads: a setting changed by hand can
-- delay this session's claims, never let it take a job twice or hide one from
-- other sessions.
-- Raises 22004: worker_id or queues null. 22023: worker_id or a queue or name
-- that is not a valid name; queues or names empty or over 1000; batch outside
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
-- table holds. The rows to update are found by id = ANY(...), not by a join whose
-- size the planner would have to guess. The penalty those settings add to the
-- plan's cost would start JIT compiling, which never pays off here: off too.
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := treadle.now();
    v_slow    CONSTANT interval := interval '2 ms';        -- a plain claim this slow, 3 in a row: a cursor
    v_quick_sweep CONSTANT interval := interval '1 ms';    -- a sweep this quick: back to the plain claim
    v_setting text;       -- this session's cursor for these queues and names
    v_text    text;
    v_plain   boolean;    -- the plain claim, without a cursor
    v_started timestamptz;
    v_ids     bigint[];
    v_room    jsonb;      -- what each queue may give, when a requested queue is paused or limited
    -- the cursor's
    v_now_us  bigint;
    v_snap    pg_snapshot;  -- taken before any row is read
    v_own     xid8;
    v_queues  text[];     -- distinct, sorted: lanes name them by number
    v_names   text[];
    v_cursor  bigint[];   -- 1, now, swept, xmax, #xip, xip..., lanes
    v_swept   bigint;     -- when the lanes were last found from the front of the index
    v_sweep_at timestamptz;
    v_quick   boolean;    -- a sweep that found few dead entries: back to the plain claim
    v_lanes   bigint[];   -- per lane: queue no, name no (0 without names), priority, run_at, id
    v_straggler bigint[];
    v_priority bigint;
    v_left    integer;    -- jobs still wanted
    v_read_p  bigint[];   -- per priority read: the priority,
    v_read_limit integer[];  -- the rows asked of each of its lanes,
    v_read_from integer[];   -- and where its candidates start in v_cand
    v_lane    bigint[];   -- the candidates, a priority after the other, each in claim
    v_cand    bigint[];   -- order: their lane's first subscript in v_lanes, ids, run_at
    v_cand_us bigint[];
BEGIN
    -- Each argument is tested inline, as enqueue does, and its helper called only to
    -- raise: a call costs more than the test, and a worker claims all the time.
    IF claim.worker_id IS NULL OR NOT treadle._is_name(claim.worker_id) THEN
        PERFORM treadle._check_text(claim.worker_id, 'worker_id');
    END IF;
    IF NOT treadle._are_names(claim.queues) THEN
        PERFORM treadle._check_names(claim.queues, 'queues');
    END IF;
    IF claim.names IS NOT NULL AND NOT treadle._are_names(claim.names) THEN
        PERFORM treadle._check_names(claim.names, 'names');
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
    -- Paused and limited queues (treadle.queues): claim only from those with room,
    -- and below keep to each one's room. Queues without settings pay this probe only.
    IF EXISTS (SELECT 1 FROM treadle.queues AS s
                WHERE s.queue = ANY (claim.queues)
                  AND (s.paused OR s.concurrency IS NOT NULL OR s.rate_limit IS NOT NULL)) THEN
        v_room := treadle._queue_room(claim.queues, claim.batch);
        claim.queues := ARRAY(SELECT r.key FROM jsonb_each(v_room) AS r WHERE r.value::integer > 0);
        IF cardinality(claim.queues) = 0 THEN
            RETURN;
        END IF;
        claim.batch := least(claim.batch, (SELECT sum(r.value::integer) FROM jsonb_each(v_room) AS r
                                            WHERE r.value::integer > 0));
    END IF;

    -- A session claims from the front of each range (the plain claim) until three in
    -- a row take over v_slow, as when dead entries pile up in front (not just one: the
    -- first claim of a session is also planned, and a busy server has slow moments);
    -- then it sweeps and keeps a cursor, back to the plain claim once a sweep (at once,
    -- then every 60 s) reads its lanes within v_quick_sweep. A plain claim without dead
    -- entries in front takes well under a millisecond, and one that walks 10,000 takes
    -- about 2; a cursor claim costs at most a few tenths of a millisecond more than a plain
    -- one, so a switch made in vain costs little and a late one costs throughput. The setting holds nothing, 'slow' or 'slow2' (plain),
    -- 'sweep' (or 'pin': sweep, and keep the cursor however quick: for tests), or the
    -- cursor.
    v_setting := 'treadle.claim_' || to_hex(hashtextextended(
        array_to_string(claim.queues, chr(1)) || chr(2) || coalesce(array_to_string(claim.names, chr(1)), ''), 0));
    v_text := current_setting(v_setting, true);
    -- A paused or limited queue is claimed plainly: its room may leave candidates
    -- unclaimed, which a cursor would count as taken.
    IF v_room IS NOT NULL OR coalesce(v_text, '') IN ('', 'slow', 'slow2') THEN
        v_started := clock_timestamp();
    ELSE
        v_now_us := treadle._us(v_now);
        v_snap := pg_current_snapshot();
        v_own := pg_current_xact_id_if_assigned();  -- a snapshot lists every running id but its own
        v_queues := ARRAY(SELECT DISTINCT u.q FROM unnest(claim.queues) AS u(q) ORDER BY 1);
        IF claim.names IS NOT NULL THEN
            v_names := ARRAY(SELECT DISTINCT n.n FROM unnest(claim.names) AS n(n) ORDER BY 1);
        END IF;
        v_quick := false;
        v_plain := false;
        -- A usable cursor: well formed (anything else means a sweep, never an error),
        -- from a clock that did not go back, swept less than 60 s ago.
        IF v_text ~ '^\{[12](,-?[0-9]{1,18}){2,}\}$' THEN
            v_cursor := v_text::bigint[];
            IF v_cursor[2] > v_now_us OR v_cursor[3] > v_now_us OR v_cursor[3] < v_now_us - 60000000 THEN
                v_cursor := NULL;
            ELSIF cardinality(v_cursor) > 3 AND NOT (
                    v_cursor[4] >= 0 AND v_cursor[5] >= 0
                    AND cardinality(v_cursor) >= 5 + v_cursor[5]
                    AND (cardinality(v_cursor) - 5 - v_cursor[5]) % 5 = 0) THEN
                -- (a lane's queue or name number out of range reads nothing: see below)
                v_cursor := NULL;
            END IF;
        END IF;
        v_swept := coalesce(v_cursor[3], v_now_us);

        IF cardinality(v_cursor) = 3 THEN
            -- jobs over too many priorities for a cursor: the plain claim until the next sweep
            v_plain := true;
        ELSIF v_cursor IS NULL THEN
            -- Sweep: each lane's first claimable row, due or not, read from the front of
            -- the index: the one read that walks every dead entry, once per lane.
            v_sweep_at := clock_timestamp();
            v_lanes := ARRAY(
                WITH RECURSIVE lanes AS (
                    SELECT r.qi, r.ni, f.priority, f.run_at, f.id, 1 AS n
                      FROM (SELECT u.qi, 0 AS ni FROM generate_subscripts(v_queues, 1) AS u(qi)
                             WHERE v_names IS NULL
                            UNION ALL
                            SELECT u.qi, n.ni FROM generate_subscripts(v_queues, 1) AS u(qi),
                                                   generate_subscripts(v_names, 1) AS n(ni)) AS r
                     CROSS JOIN LATERAL treadle._claim_next_lane(v_queues[r.qi], v_names[r.ni], NULL) AS f
                    UNION ALL
                    SELECT l.qi, l.ni, f.priority, f.run_at, f.id, l.n + 1
                      FROM lanes AS l
                     CROSS JOIN LATERAL treadle._claim_next_lane(v_queues[l.qi], v_names[l.ni], l.priority) AS f
                     WHERE l.n <= 32
                )
                SELECT x FROM lanes AS l, unnest(ARRAY[l.qi, l.ni, l.priority, treadle._us(l.run_at), l.id]) AS x);
            -- ('pin', and a cursor made from it, keep the cursor: for tests)
            v_quick := clock_timestamp() - v_sweep_at < v_quick_sweep AND v_text <> 'pin'
                       AND v_text NOT LIKE '{2,%';
            IF cardinality(v_lanes) > 5 * 32 THEN
                v_plain := true;
                PERFORM set_config(v_setting, CASE WHEN v_quick THEN '' ELSE ARRAY[1, v_now_us, v_now_us]::text END,
                                   false);
            END IF;
        ELSE
            -- Resume: the cursor's lanes, each moved back to the first row made claimable
            -- by a transaction the previous snapshot did not see (or this one's), wherever
            -- that row lies, and new lanes for such rows of other priorities.
            v_lanes := v_cursor[6 + v_cursor[5]:];
            v_straggler := ARRAY(
                -- each lane's first such row: rows of many commits (a producer's, a
                -- release's) come down to one key per lane here, not in the merge below
                SELECT x
                  FROM (SELECT array_position(v_queues, s.queue) AS qi,
                               coalesce(array_position(v_names, s.name), 0) AS ni, s.priority AS p,
                               min(ARRAY[treadle._us(s.run_at), s.id]) AS k
                          FROM (SELECT j.queue, j.name, j.priority, j.run_at, j.id FROM treadle.jobs AS j
                                 WHERE j.state = ANY (ARRAY['available', 'retryable'])
                                   AND j.ready_txid >= v_cursor[4]::text::xid8
                                   -- a ready_txid beyond the server's came from another cluster
                                   -- (restored): such rows are found from their lanes' keys
                                   AND j.ready_txid < pg_snapshot_xmax(v_snap)
                                UNION ALL
                                SELECT j.queue, j.name, j.priority, j.run_at, j.id FROM treadle.jobs AS j
                                 WHERE j.state = ANY (ARRAY['available', 'retryable'])
                                   AND j.ready_txid = ANY (v_cursor[6:5 + v_cursor[5]]::text[]::xid8[])) AS s
                         WHERE s.queue = ANY (v_queues)
                           AND (v_names IS NULL OR s.name = ANY (v_names))
                         GROUP BY 1, 2, 3) AS g,
                       unnest(ARRAY[g.qi, g.ni, g.p, g.k[1], g.k[2]]) AS x);
            IF cardinality(v_straggler) > 0 THEN
                v_lanes := ARRAY(
                    SELECT x
                      FROM (SELECT m.qi, m.ni, m.p, min(m.k) AS k
                              FROM (SELECT c[i] AS qi, c[i + 1] AS ni, c[i + 2] AS p, ARRAY[c[i + 3], c[i + 4]] AS k
                                      FROM (SELECT v_lanes || v_straggler) AS a(c),
                                           generate_series(1, cardinality(a.c), 5) AS i) AS m
                             GROUP BY m.qi, m.ni, m.p) AS g,
                           unnest(ARRAY[g.qi, g.ni, g.p, g.k[1], g.k[2]]) AS x);
                IF cardinality(v_lanes) > 5 * 32 THEN
                    v_plain := true;
                    PERFORM set_config(v_setting, ARRAY[1, v_now_us, v_swept]::text, false);
                END IF;
            END IF;
        END IF;
    END IF;

    IF v_started IS NOT NULL OR v_plain THEN
        -- Lock the candidates: each (queue[, name]) range from its front in claim
        -- order, skipping rows other claimers hold, then the best `batch` of them.
        IF claim.names IS NULL THEN
            v_ids := ARRAY(
                SELECT c.id
                  FROM (SELECT DISTINCT u.q FROM unnest(claim.queues) AS u(q)) AS u
                 CROSS JOIN LATERAL (
                        SELECT j.id, j.priority, j.run_at
                          FROM treadle.jobs AS j
                         WHERE j.queue = u.q
                           AND j.state = ANY (ARRAY['available', 'retryable'])
                           AND j.run_at <= v_now
                         ORDER BY j.priority, j.run_at, j.id
                         LIMIT claim.batch
                           FOR UPDATE SKIP LOCKED) AS c
                 ORDER BY c.priority, c.run_at, c.id
                 LIMIT claim.batch);
        ELSE
            v_ids := ARRAY(
                SELECT c.id
                  FROM (SELECT DISTINCT u.q FROM unnest(claim.queues) AS u(q)) AS u
                 CROSS JOIN (SELECT DISTINCT n.n FROM unnest(claim.names) AS n(n)) AS n
                 CROSS JOIN LATERAL (
                        SELECT j.id, j.priority, j.run_at
                          FROM treadle.jobs AS j
                         WHERE j.queue = u.q
                           AND j.name = n.n
                           AND j.state = ANY (ARRAY['available', 'retryable'])
                           AND j.run_at <= v_now
                         ORDER BY j.priority, j.run_at, j.id
                         LIMIT claim.batch
                           FOR UPDATE SKIP LOCKED) AS c
                 ORDER BY c.priority, c.run_at, c.id
                 LIMIT claim.batch);
        END IF;
        -- two slow claims in a row (the first claim of a session is also planned)
        IF clock_timestamp() - v_started > v_slow OR v_text LIKE 'slow%' THEN
            -- (v_started is null for the plain claim of too many priorities)
            PERFORM set_config(v_setting, CASE WHEN clock_timestamp() - v_started <= v_slow THEN ''
                                               WHEN v_text = 'slow2' THEN 'sweep'
                                               WHEN v_text = 'slow' THEN 'slow2' ELSE 'slow' END, false);
        END IF;
    ELSE
        -- Lock the candidates one priority at a time, the best first: each lane of that
        -- priority read from its key in claim order, skipping rows other claimers hold,
        -- as many as are still wanted; the best of them are claimed. Lanes of the
        -- priorities not reached keep their keys.
        v_left := claim.batch;
        v_ids := '{}'; v_read_p := '{}'; v_read_limit := '{}'; v_read_from := '{}';
        v_lane := '{}'; v_cand := '{}'; v_cand_us := '{}';
        FOREACH v_priority IN ARRAY ARRAY(SELECT DISTINCT v_lanes[i + 2]
                                            FROM generate_series(1, cardinality(v_lanes), 5) AS i ORDER BY 1) LOOP
            IF v_names IS NULL THEN
                SELECT v_lane || array_agg(l.i ORDER BY c.run_at, c.id),
                       v_cand || array_agg(c.id ORDER BY c.run_at, c.id),
                       v_cand_us || array_agg(treadle._us(c.run_at) ORDER BY c.run_at, c.id),
                       v_ids || (array_agg(c.id ORDER BY c.run_at, c.id))[1:v_left],
                       v_read_p || v_priority, v_read_limit || v_left, v_read_from || cardinality(v_cand) + 1
                  INTO v_lane, v_cand, v_cand_us, v_ids, v_read_p, v_read_limit, v_read_from
                  FROM generate_series(1, cardinality(v_lanes), 5) AS l(i)
                 CROSS JOIN LATERAL (
                        SELECT j.id, j.run_at
                          FROM treadle.jobs AS j
                         WHERE j.queue = v_queues[greatest(least(v_lanes[l.i], 1001), 0)::integer]
                           AND j.priority = v_priority
                           AND j.state = ANY (ARRAY['available', 'retryable'])
                           AND (j.run_at, j.id) >= (treadle._from_us(v_lanes[l.i + 3]), v_lanes[l.i + 4])
                           AND j.run_at <= v_now
                         ORDER BY j.priority, j.run_at, j.id
                         LIMIT v_left
                           FOR UPDATE SKIP LOCKED) AS c
                 WHERE v_lanes[l.i + 2] = v_priority;
            ELSE
                SELECT v_lane || array_agg(l.i ORDER BY c.run_at, c.id),
                       v_cand || array_agg(c.id ORDER BY c.run_at, c.id),
                       v_cand_us || array_agg(treadle._us(c.run_at) ORDER BY c.run_at, c.id),
                       v_ids || (array_agg(c.id ORDER BY c.run_at, c.id))[1:v_left],
                       v_read_p || v_priority, v_read_limit || v_left, v_read_from || cardinality(v_cand) + 1
                  INTO v_lane, v_cand, v_cand_us, v_ids, v_read_p, v_read_limit, v_read_from
                  FROM generate_series(1, cardinality(v_lanes), 5) AS l(i)
                 CROSS JOIN LATERAL (
                        SELECT j.id, j.run_at
                          FROM treadle.jobs AS j
                         WHERE j.queue = v_queues[greatest(least(v_lanes[l.i], 1001), 0)::integer]
                           AND j.name = v_names[greatest(least(v_lanes[l.i + 1], 1001), 0)::integer]
                           AND j.priority = v_priority
                           AND j.state = ANY (ARRAY['available', 'retryable'])
                           AND (j.run_at, j.id) >= (treadle._from_us(v_lanes[l.i + 3]), v_lanes[l.i + 4])
                           AND j.run_at <= v_now
                         ORDER BY j.priority, j.run_at, j.id
                         LIMIT v_left
                           FOR UPDATE SKIP LOCKED) AS c
                 WHERE v_lanes[l.i + 2] = v_priority;
            END IF;
            v_left := claim.batch - cardinality(v_ids);
            EXIT WHEN v_left = 0;
        END LOOP;

        -- The next cursor. A lane read now gets as key its first candidate left
        -- unclaimed; past now when it had fewer rows than asked for (all taken, or
        -- held by others); else just past its last claimed row. The snapshot: the one
        -- taken before reading, with this transaction's own id, when it had one, among
        -- those it did not see.
        PERFORM set_config(v_setting, CASE WHEN v_quick THEN '' ELSE (
            ARRAY[CASE WHEN v_text = 'pin' OR v_text LIKE '{2,%' THEN 2 ELSE 1 END,
                  v_now_us, v_swept, pg_snapshot_xmax(v_snap)::text::bigint]
            || ARRAY(SELECT count(*) FROM (SELECT pg_snapshot_xip(v_snap) UNION ALL SELECT v_own) AS x(x)
                      WHERE x.x IS NOT NULL)
            || ARRAY(SELECT x.x::text::bigint FROM (SELECT pg_snapshot_xip(v_snap) UNION ALL SELECT v_own) AS x(x)
                      WHERE x.x IS NOT NULL)
            || ARRAY(
                SELECT x
                  FROM generate_series(1, cardinality(v_lanes), 5) AS l(i)
                 CROSS JOIN LATERAL (
                        SELECT r.asked, count(p.p) AS n,
                               min(p.p) FILTER (WHERE p.p - r.from_at >= r.asked) AS left_at,
                               max(p.p) FILTER (WHERE p.p - r.from_at < r.asked) AS last_at
                          FROM (SELECT v_read_limit[k.k] AS asked, v_read_from[k.k] AS from_at
                                  FROM array_position(v_read_p, v_lanes[l.i + 2]) AS k(k)) AS r
                          LEFT JOIN generate_subscripts(v_lane, 1) AS p(p) ON v_lane[p.p] = l.i
                         GROUP BY r.asked) AS s
                 CROSS JOIN LATERAL unnest(ARRAY[
                        v_lanes[l.i], v_lanes[l.i + 1], v_lanes[l.i + 2],
                        CASE WHEN s.asked IS NULL THEN v_lanes[l.i + 3]
                             WHEN s.left_at IS NOT NULL THEN v_cand_us[s.left_at]
                             WHEN s.n < s.asked THEN v_now_us + 1
                             ELSE v_cand_us[s.last_at] END,
                        CASE WHEN s.asked IS NULL THEN v_lanes[l.i + 4]
                             WHEN s.left_at IS NOT NULL THEN v_cand[s.left_at]
                             WHEN s.n < s.asked THEN 0
                             ELSE v_cand[s.last_at] + 1 END]) AS x)
            )::text END, false);
    END IF;
    IF v_room IS NOT NULL THEN
        v_ids := treadle._take_room(v_ids, v_room);
    END IF;
    IF coalesce(cardinality(v_ids), 0) = 0 THEN
        RETURN;
    END IF;

    RETURN QUERY
    WITH claimed AS (
        UPDATE treadle.jobs AS j
           SET state = 'running',
               attempt = j.attempt + 1,
               lease_until = v_now + claim.lease,
               lease_token = coalesce(claim.lease_token, gen_random_uuid()),
               worker_id = claim.worker_id,
               started_at = v_now,
               progress = NULL,
               progress_message = NULL
         WHERE j.id = ANY (v_ids)
        RETURNING j.*
    )
    SELECT * FROM claimed AS d ORDER BY d.priority, d.run_at, d.id;
END;
$$;
COMMENT ON FUNCTION treadle.claim(text, text[], text[], integer, interval, uuid) IS
    'Claim up to batch due jobs (available or retryable -> running) under a lease token.';

--------------------------------------------------------------------------------
-- treadle.claimed(lease_token) -> setof treadle.jobs
--
-- Transition: none. The running jobs that hold lease_token, in claim order: what a
-- claim given that token took, for a worker whose answer to the claim was lost.
-- Empty when the claim did not commit, or its jobs were finished or rescued since.
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
BEGIN
    IF claimed.lease_token IS NULL THEN
        RAISE EXCEPTION 'treadle: lease_token must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- running jobs are few (bounded by the workers' concurrency): their index is enough
    RETURN QUERY
    SELECT * FROM treadle.jobs AS j
     WHERE j.state = 'running' AND j.lease_token = claimed.lease_token
     ORDER BY j.priority, j.run_at, j.id;
END;
$$;
COMMENT ON FUNCTION treadle.claimed(uuid) IS
    'The running jobs holding a lease token: what a claim whose answer was lost took.';

--------------------------------------------------------------------------------
-- treadle.heartbeat(job_id, lease_token, lease) -> text
--
-- Transition: none (running stays running; the lease moves to now + lease).
-- Returns 'held', 'cancel' (held, and a cancel was requested: abort the handler)
-- or 'lost' (the token no longer holds the job). An expired lease that nobody
-- took over is still held.
-- Raises 22004: job_id, lease_token or lease null. 22023: lease not positive or
-- over 1 day.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.heartbeat(
    job_id      bigint,
    lease_token uuid,
    lease       interval DEFAULT '30 seconds'
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
BEGIN
    PERFORM treadle._check_lease_args(heartbeat.job_id, heartbeat.lease_token);
    IF heartbeat.lease IS NULL THEN
        RAISE EXCEPTION 'treadle: lease must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM treadle._check_interval(heartbeat.lease, 'lease', interval '1 day');

    UPDATE treadle.jobs AS j
       SET lease_until = treadle.now() + heartbeat.lease
     WHERE j.id = heartbeat.job_id
       AND j.state = 'running'
       AND j.lease_token = heartbeat.lease_token
    RETURNING j.cancel_requested INTO v_cancel;

    IF NOT FOUND THEN
        RETURN 'lost';
    END IF;
    RETURN CASE WHEN v_cancel THEN 'cancel' ELSE 'held' END;
END;
$$;
COMMENT ON FUNCTION treadle.heartbeat(bigint, uuid, interval) IS
    'Extend a running job''s lease; returns held, cancel or lost.';

--------------------------------------------------------------------------------
-- treadle.progress(job_id, lease_token, fraction, message) -> boolean
--
-- Transition: none; records how far a running job has come (0..1, and a note),
-- shown by the views. Returns false when the token no longer holds the job.
-- Raises 22004: job_id, lease_token or fraction null. 22023: fraction outside 0..1,
-- message over the payload size limit.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.progress(
    job_id      bigint,
    lease_token uuid,
    fraction    double precision,
    message     text DEFAULT NULL
)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
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

    UPDATE treadle.jobs AS j
       SET progress = progress.fraction,
           progress_message = progress.message
     WHERE j.id = progress.job_id
       AND j.state = 'running'
       AND j.lease_token = progress.lease_token;
    RETURN FOUND;
END;
$$;
COMMENT ON FUNCTION treadle.progress(bigint, uuid, double precision, text) IS
    'Record a running job''s progress (0..1) and a message; false when the lease is lost.';
