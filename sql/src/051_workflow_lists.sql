--------------------------------------------------------------------------------
-- A batch's list steps moved together. treadle._advance_run moves a run after
-- one of its steps, a statement or two per step: the run row's UPDATE and the
-- next step's INSERT, each paying its executor start-up. When treadle._follow_up
-- has several finished rows (treadle.complete_many, and treadle.complete_and_claim
-- through it), the common case among them (a completed step of a running list run
-- without step options: the next step's job, or the run completed) is done for all
-- of them by two statements: one read that locks the runs in id order (descending,
-- 053_workflow_lock_order.sql), then one
-- UPDATE of them that also INSERTs their next jobs. Every other step takes
-- treadle._advance_run, after.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._advance_lists(done) -> bigint[]
--
-- Transition: for each row of `done` that is a completed step of a running list
-- run (run.after null) without step options, that is not a compensation and
-- whose run no other row of `done` names: its result joins the run's results, and
-- the run's next step becomes a job, available now (as treadle._enqueue_steps's
-- common case: workers hear of it through treadle._notify_steps), or, for the
-- run's last step, the run becomes completed. A child run's last step is left to
-- treadle._advance_run: its parent moves (treadle._child_run_ended), and a parent
-- is moved in the order of the batch's rows, as one row at a time would move it (a
-- step of the parent's that was cancelled before must stop it first). Two
-- statements for them all: the runs are locked in id order (descending: a child
-- before its parent, 053_workflow_lock_order.sql) by one read (a fixed
-- order, as two batches may meet; a batch with none ends there), then updated by
-- one statement that also inserts the next jobs, in the order of the steps' ids. Returns the ids of the steps it moved
-- (null for none); treadle._follow_up moves the others' runs one by one
-- (treadle._advance_run), as before. Not on Citus, where a statement over many
-- runs would not be one shard's: there every step takes treadle._advance_run.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._advance_lists(done treadle.jobs[])
RETURNS bigint[]
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now       timestamptz := treadle.now();
    v_l_queues  text[];    -- the runs locked, and the steps that move them
    v_l_ids     bigint[];
    v_l_rows    tid[];     -- (where the locked rows are)
    v_l_jobs    bigint[];
    v_l_steps   text[];
    v_l_results jsonb[];
    v_ended     bigint[];  -- child runs that completed (their parents move)
    v_ended_q   text[];
    v_ids       bigint[];  -- the next steps' jobs
    v_queues    text[];
    v_names     text[];
    v_prios     integer[];
    v_run       treadle.workflow_runs;
BEGIN
    -- the runs, locked in id order (descending); a batch with none (a graph's steps) ends here
    SELECT array_agg(l.queue), array_agg(l.id), array_agg(l.ctid), array_agg(l.job_id), array_agg(l.step),
           array_agg(l.result)
      INTO v_l_queues, v_l_ids, v_l_rows, v_l_jobs, v_l_steps, v_l_results
      FROM (SELECT r.queue, r.id, r.ctid, i.id AS job_id, i.step, i.result
              FROM treadle.workflow_runs AS r
              JOIN (SELECT d.id, coalesce(d.run_queue, d.queue) AS run_queue, d.workflow_run_id AS run_id, d.step,
                           d.result, d.args ? 'compensates' AS compensates,
                           count(*) OVER (PARTITION BY d.workflow_run_id) AS named
                      FROM unnest(done) AS d
                     WHERE d.workflow_run_id IS NOT NULL AND d.state = 'completed') AS i
                ON r.queue = i.run_queue AND r.id = i.run_id
             WHERE i.named = 1  -- (a run two rows name is left to treadle._advance_run, step by step)
               AND r.state = 'running'
               AND r.after IS NULL
               AND r.maps IS NULL
               AND r.step_options IS NULL
               AND (r.compensations IS NULL OR NOT i.compensates)
               -- (a child run's last step moves its parent: left to treadle._advance_run)
               AND (r.parent_run_id IS NULL OR array_position(r.steps, i.step) < cardinality(r.steps))
             ORDER BY r.id DESC
               FOR UPDATE OF r) AS l;
    IF v_l_ids IS NULL THEN
        RETURN NULL;
    END IF;
    -- then one UPDATE of them, and one INSERT of their next steps' jobs (in the order of
    -- the steps that finished). The rows are reached where the read locked them (a TID
    -- scan: a join on their ids may be planned as a scan of a small table), each with its
    -- step by its place in the arrays.
    WITH moved AS (
        UPDATE treadle.workflow_runs AS r
           SET results = r.results || jsonb_build_object(l.step, l.result),
               state = CASE WHEN array_position(r.steps, l.step) < cardinality(r.steps) THEN r.state ELSE 'completed' END,
               finished_at = CASE WHEN array_position(r.steps, l.step) < cardinality(r.steps) THEN r.finished_at
                                  ELSE v_now END
          FROM (SELECT v_l_jobs[k.i] AS job_id, v_l_steps[k.i] AS step, v_l_results[k.i] AS result, k.i
                  FROM generate_subscripts(v_l_ids, 1) AS k(i)) AS l
         WHERE r.ctid = ANY (v_l_rows)
           AND l.i = array_position(v_l_rows, r.ctid)
           AND r.queue = v_l_queues[l.i]
           AND r.id = v_l_ids[l.i]
        RETURNING l.job_id, r.id, r.queue, r.steps[array_position(r.steps, l.step) + 1] AS next,
                  r.state = 'completed' AND r.parent_run_id IS NOT NULL AS ended,
                  r.name, r.priority, r.max_attempts, r.meta
    ), added AS (
        INSERT INTO treadle.jobs
            (queue, name, args, priority, run_at, max_attempts, created_at, workflow_run_id, step, meta)
        SELECT m.queue, 'workflow:' || m.name || '/' || m.next, '{}', m.priority, v_now, m.max_attempts, v_now,
               m.id, m.next, m.meta
          FROM moved AS m
         WHERE m.next IS NOT NULL
         ORDER BY m.job_id
        RETURNING id, queue, name, priority
    )
    SELECT (SELECT array_agg(m.id ORDER BY m.id) FILTER (WHERE m.ended) FROM moved AS m),
           (SELECT array_agg(m.queue ORDER BY m.id) FILTER (WHERE m.ended) FROM moved AS m),
           a.ids, a.queues, a.names, a.prios
      INTO v_ended, v_ended_q, v_ids, v_queues, v_names, v_prios
      FROM (SELECT array_agg(a.id ORDER BY a.id) AS ids, array_agg(a.queue ORDER BY a.id) AS queues,
                   array_agg(a.name ORDER BY a.id) AS names, array_agg(a.priority ORDER BY a.id) AS prios
              FROM added AS a) AS a;
    IF v_ids IS NOT NULL THEN
        PERFORM treadle._notify_steps(v_ids, v_queues, v_names, v_prios, v_now);  -- 071_workflow_notify.sql
    END IF;
    IF v_ended IS NOT NULL THEN
        -- a child run completed by its last step: its parent moves (locked after it). The
        -- read above leaves those steps out; every statement that changes a run's state
        -- is followed by this call all the same (pgTAP 076_workflow_child_ends)
        FOR i IN 1 .. cardinality(v_ended) LOOP
            SELECT * INTO v_run FROM treadle.workflow_runs AS r WHERE r.queue = v_ended_q[i] AND r.id = v_ended[i];
            PERFORM treadle._child_run_ended(v_run);  -- 076_workflow_children.sql
        END LOOP;
    END IF;
    RETURN v_l_jobs;
END;
$$;
COMMENT ON FUNCTION treadle._advance_lists(treadle.jobs[]) IS
    'Move the list runs of many completed workflow steps at once: one UPDATE of the runs, one INSERT of their next steps.';
