--------------------------------------------------------------------------------
-- The one lock order of a workflow's rows, for the paths that lock many of them:
-- job rows first, in (queue, concurrency_key, id) order (the key lanes' order,
-- 034_key_lanes.sql), then run rows, a child run before its parent: run ids
-- descending (a child run is always inserted after its parent). A path that moves
-- one step (treadle._advance_run) keeps it as it goes (its job, its run, then the
-- run's parent and up); a batch's finish (treadle._follow_up over several rows),
-- treadle.cancel_workflow and a step whose end cancels its run, which reach many
-- rows, take their locks up front here, so that two of them never hold a row the
-- other one waits for (a batch of list runs' steps, runs without a parent, locks
-- them once, in that order, as it moves them: treadle._follow_up).
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._run_tree(roots) -> bigint[]
--
-- The given runs and their running descendant runs (children, their children, ...),
-- read without locks.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._run_tree(roots bigint[])
RETURNS bigint[]
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_runs  bigint[] := roots;
    v_layer bigint[] := roots;
BEGIN
    WHILE cardinality(v_layer) > 0 LOOP
        v_layer := ARRAY(SELECT r.id FROM treadle.workflow_runs AS r
                          WHERE r.parent_run_id = ANY (v_layer) AND r.state = 'running'
                            AND r.id <> ALL (v_runs));
        v_runs := v_runs || v_layer;
    END LOOP;
    RETURN v_runs;
END;
$$;
COMMENT ON FUNCTION treadle._run_tree(bigint[]) IS
    'The given workflow runs and their running descendant runs.';

--------------------------------------------------------------------------------
-- treadle._lock_run_tree_jobs(run_ids, runs, wait) -> boolean
--
-- Locks (FOR UPDATE) the step jobs under way (available, retryable, running,
-- blocked) of the run trees that hold the given runs: from each run's topmost
-- ancestor (a cancelled child cancels its running parent, and that one the rest of
-- its tree), that run and its running descendant runs, in (queue, concurrency_key,
-- id) order, before its caller locks any run row to cancel: treadle.cancel_workflow,
-- a step whose end cancels its run (treadle._advance_run), a batch's finish with
-- such a step (treadle._lock_batch_runs). A job that another session is finishing
-- is waited for while this holds no run: that finish may lock the tree's runs (a
-- child's last step moves its parent) and commit. The trees are read again until a
-- pass finds no job it had not locked (a finish it waited for may have enqueued the
-- next steps, or started a child run); then no step of them can finish elsewhere
-- until this transaction ends. Then the trees' run rows, with `runs` (others the
-- caller moves: a batch's), ids descending, a child before its parent: the cancel
-- that follows locks a parent (its waiting step's cancel) before its child runs',
-- and a path that moves a run without a step job to lock first (a re-check's move,
-- a sleep's end, a signal: each locks a run, then its parent) would wait for it in
-- a circle. Those are locked in a subtransaction: when a session that held one of
-- them added a step or started a child run meanwhile, they are given back (a finish
-- of the new step would wait for them while this waited for it) and the trees read
-- again. So the caller reads the runs' steps after no one else can add one (a
-- sleep's end or a signal that enqueued a step committed first, and its cancel
-- sees the step), and holds every job it may cancel. Returns true. With wait
-- false (a caller that holds a job of its own: a finish) it first takes the trees'
-- jobs that no other session holds, and returns false, locking no run, when
-- another session holds one (a finish of it may be waiting for the caller's job:
-- two steps of a run that end cancelled at once, on two connections). The trees
-- are read at most 100 times: each read again follows a commit of another session
-- that changed them while this waited, and a tree that keeps changing past that
-- (sessions that add steps or child runs to it without end) stops the wait: with
-- wait true it raises 40001 (the caller's transaction is rolled back: retry it);
-- with wait false it returns false (the caller leaves its step for a re-check, as
-- when another session holds a job). Not on Citus (one statement over many shards'
-- rows): true.
-- Raises 40001: with wait true, trees that changed under the lock 100 times.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._lock_run_tree_jobs(run_ids bigint[], runs bigint[] DEFAULT '{}',
                                                      wait boolean DEFAULT true)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_roots bigint[] := coalesce(run_ids, '{}'::bigint[]);
    v_up    bigint[] := coalesce(run_ids, '{}'::bigint[]);
    v_runs  bigint[];
    v_held  bigint[] := '{}'::bigint[];
    v_now   bigint[];
    v_reads integer := 0;  -- the trees' reads, at most 100
BEGIN
    IF treadle._on_citus() THEN
        RETURN true;
    END IF;
    -- the runs and their ancestors (the topmost among them are the trees' roots)
    WHILE cardinality(v_up) > 0 LOOP
        v_up := ARRAY(SELECT DISTINCT r.parent_run_id FROM treadle.workflow_runs AS r
                       WHERE r.id = ANY (v_up) AND r.parent_run_id IS NOT NULL
                         AND r.parent_run_id <> ALL (v_roots));
        v_roots := v_roots || v_up;
    END LOOP;
    LOOP
        v_reads := v_reads + 1;
        IF v_reads > 100 THEN
            -- every read again followed another session's change: one that adds to the
            -- trees without end would keep this here for ever, holding what it locked
            IF NOT wait THEN
                RETURN false;
            END IF;
            RAISE EXCEPTION 'treadle: the run tree of workflow run % changed 100 times while its jobs were being locked',
                            run_ids[1]
                USING ERRCODE = 'serialization_failure',
                      HINT = 'Other sessions keep adding steps or child runs to it: retry the transaction.';
        END IF;
        v_runs := treadle._run_tree(v_roots);
        IF wait THEN
            v_now := ARRAY(SELECT j.id FROM treadle.jobs AS j
                            WHERE j.workflow_run_id = ANY (v_runs)
                              AND j.state = ANY (ARRAY['available', 'retryable', 'running', 'blocked'])
                            ORDER BY j.queue, j.concurrency_key, j.id
                              FOR UPDATE OF j);
        ELSE
            -- a session that holds a job of its own (a finish) waits for no other's: one
            -- that another session holds (it may be waiting for this one's) ends it here
            v_now := ARRAY(SELECT j.id FROM treadle.jobs AS j
                            WHERE j.workflow_run_id = ANY (v_runs)
                              AND j.state = ANY (ARRAY['available', 'retryable', 'running', 'blocked'])
                            ORDER BY j.queue, j.concurrency_key, j.id
                              FOR UPDATE OF j SKIP LOCKED);
            IF NOT ARRAY(SELECT j.id FROM treadle.jobs AS j
                          WHERE j.workflow_run_id = ANY (v_runs)
                            AND j.state = ANY (ARRAY['available', 'retryable', 'running', 'blocked'])) <@ (v_held || v_now) THEN
                RETURN false;
            END IF;
        END IF;
        IF NOT v_now <@ v_held THEN
            v_held := v_held || v_now;
            CONTINUE;  -- read again: a finish waited for may have added steps or runs
        END IF;
        -- then the runs, a child before its parent (the one order of run rows), in a
        -- subtransaction: when a session this waited for changed the trees meanwhile (it
        -- held a run and added a step or started a child run), they are given back and
        -- the new jobs locked first, while this holds none of the runs
        BEGIN
            PERFORM 1 FROM treadle.workflow_runs AS r
             WHERE r.id = ANY (v_runs || coalesce(runs, '{}'::bigint[]))
             ORDER BY r.id DESC
               FOR UPDATE OF r;
            IF treadle._run_tree(v_roots) <@ v_runs
               AND ARRAY(SELECT j.id FROM treadle.jobs AS j
                          WHERE j.workflow_run_id = ANY (v_runs)
                            AND j.state = ANY (ARRAY['available', 'retryable', 'running', 'blocked'])) <@ v_held THEN
                RETURN true;
            END IF;
            RAISE EXCEPTION 'treadle: the run tree changed' USING ERRCODE = 'TRRUN';
        EXCEPTION WHEN SQLSTATE 'TRRUN' THEN
            NULL;  -- (the run rows given back: read the trees again)
        END;
    END LOOP;
END;
$$;
COMMENT ON FUNCTION treadle._lock_run_tree_jobs(bigint[], bigint[], boolean) IS
    'Lock the step jobs under way of the workflow run trees that hold the given runs, in the key lanes'' order, then their runs, child before parent.';

--------------------------------------------------------------------------------
-- treadle._lock_batch_runs(done) -> bigint[]
--
-- For a batch's finish (treadle._follow_up over several rows, their jobs locked
-- by the statement that finished them): when a step ended cancelled, the jobs
-- under way of its run's tree first (treadle._lock_run_tree_jobs), unless another
-- session holds one: the batch holds its own rows, and that session may wait for
-- one of them (two batches whose cancelled steps cancel each other's runs), so the
-- cancelled steps are left for a re-check (treadle._cancel_later) and returned (the
-- caller does not move their runs); then the run
-- rows the batch's workflow steps may move, each step's run and that run's
-- ancestors (with the tree's runs, when a step ended cancelled), in one order,
-- ids descending (a child before its parent, as
-- treadle._advance_run locks them one step at a time), before
-- treadle._advance_lists and treadle._advance_run lock them again in theirs. Two
-- batches whose child runs' ends move the same parents then never wait for each
-- other in a circle. A run whose rows in the batch are all completed steps that
-- may be left for a re-check (a graph's step that may make a join ready, not a
-- map's element, in a run without compensations, whose state this reads without
-- the row's lock: treadle._may_recheck, treadle._recheck_later,
-- 073_workflow_rechecks.sql; a step whose successors wait for it alone is recorded
-- by treadle._advance_run's first UPDATE, which waits for the row) is not locked
-- here, unless it is another's ancestor: treadle._advance_run tries it with SKIP
-- LOCKED, which never waits, so it takes no part in a circle, and the branch does
-- not wait for a run row another branch holds. Not on Citus (there every step
-- moves its run by itself, treadle._advance_run).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._lock_batch_runs(done treadle.jobs[])
RETURNS bigint[]
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_layer bigint[];
    v_up    bigint[];
    v_anc   bigint[] := '{}'::bigint[];  -- the ancestors of the batch's runs
    v_skip  bigint[];  -- runs whose rows may all be left for a re-check
    v_tree  bigint[] := '{}'::bigint[];  -- running runs that a step of the batch that ended cancelled cancels
    v_lock  bigint[] := '{}'::bigint[];  -- the runs locked here
    v_later bigint[] := '{}'::bigint[];  -- the steps left for a re-check
BEGIN
    IF treadle._on_citus() THEN
        RETURN v_later;
    END IF;
    v_layer := ARRAY(SELECT DISTINCT d.workflow_run_id FROM unnest(done) AS d WHERE d.workflow_run_id IS NOT NULL);
    IF EXISTS (SELECT 1 FROM unnest(done) AS d WHERE d.workflow_run_id IS NOT NULL AND d.state = 'cancelled') THEN
        -- a step that ended cancelled cancels its running run, and the rest of its
        -- tree: their jobs first (treadle._advance_run would lock them after runs that
        -- the batch's other rows locked), then the runs below with the tree's, in one order
        v_tree := ARRAY(
            SELECT d.workflow_run_id FROM unnest(done) AS d
              JOIN treadle.workflow_runs AS r ON r.id = d.workflow_run_id
             WHERE d.state = 'cancelled' AND NOT d.args ? 'compensates' AND r.state = 'running');
    END IF;
    IF cardinality(v_layer) < 2 THEN
        -- one run: treadle._advance_run locks it, then its parent and up, in this order
        IF cardinality(v_tree) > 0 THEN
            IF NOT treadle._lock_run_tree_jobs(v_tree, '{}', false) THEN
                v_later := treadle._cancel_later(done, v_tree);  -- 073_workflow_cancel_rechecks.sql
            END IF;
        END IF;
        RETURN v_later;
    END IF;
    v_up := v_layer;
    WHILE cardinality(v_up) > 0 LOOP
        v_up := ARRAY(SELECT DISTINCT r.parent_run_id FROM treadle.workflow_runs AS r
                       WHERE r.id = ANY (v_up) AND r.parent_run_id IS NOT NULL
                         AND r.parent_run_id <> ALL (v_anc));
        v_anc := v_anc || v_up;
    END LOOP;
    -- treadle._recheck_later's test (treadle._may_recheck, 073_workflow_rechecks.sql), on
    -- the rows as the batch left them and on what never changes in a run (its state,
    -- read here without the row's lock, may change before treadle._advance_run reads it:
    -- a run with compensations is locked up front)
    v_skip := ARRAY(SELECT r.id FROM treadle.workflow_runs AS r
                     WHERE r.id = ANY (v_layer) AND r.id <> ALL (v_anc) AND r.after IS NOT NULL
                       AND r.compensations IS NULL
                       AND NOT EXISTS (
                           SELECT 1 FROM unnest(done) AS d
                            WHERE d.workflow_run_id = r.id
                              AND NOT (d.state = 'completed'
                                       AND treadle._may_recheck(r.after, r.maps, r.compensations, d.step, d.args)
                                       -- (one whose successors wait for it alone is recorded by
                                       -- treadle._advance_run's first UPDATE, which waits)
                                       AND EXISTS (SELECT 1 FROM jsonb_each(r.after) AS e
                                                    WHERE e.value ? d.step AND jsonb_array_length(e.value) > 1))));
    v_lock := ARRAY(SELECT u.id FROM unnest(v_layer || v_anc) AS u(id) WHERE u.id <> ALL (v_skip));
    IF cardinality(v_tree) > 0 THEN
        IF treadle._lock_run_tree_jobs(v_tree, v_lock, false) THEN
            RETURN v_later;  -- the trees' jobs, then their runs and these
        END IF;
        v_later := treadle._cancel_later(done, v_tree);  -- 073_workflow_cancel_rechecks.sql
    END IF;
    PERFORM 1 FROM treadle.workflow_runs AS r
     WHERE r.id = ANY (v_lock)
     ORDER BY r.id DESC
       FOR UPDATE OF r;
    RETURN v_later;
END;
$$;
COMMENT ON FUNCTION treadle._lock_batch_runs(treadle.jobs[]) IS
    'Lock the workflow runs a batch of finished steps may move, and their ancestors, child before parent; returns the steps left for a re-check.';
