--------------------------------------------------------------------------------
-- treadle.explain_run(run_id) -> table(step, job_id, reason, message, at)
--
-- Transition: none. Why a workflow run is where it is, in words: one row that
-- sums the run up (step null), then one row per reason for each step that has not
-- completed, in step order, with a stable key (reason), a sentence (message) and
-- the time it names, if any (at):
--   run (step null): the run's workflow, version, queue, state, and how many of
--     its steps completed, naming them (up to 20); for a finished run the only row
--     but for the two that follow;
--   forked_from (step null): a fork (treadle.fork_run), the run and step it was
--     forked from, when (at: its creation);
--   forks (step null): a run forked from, how many forks it has, naming them with
--     their step (up to 20, newest first), the newest's creation (at);
--   dependencies: a step not started, naming the steps it waits for;
--   sleeping: a sleep step under way, until when (at);
--   signal: a wait step under way, the signal it waits for and until when its
--     timeout runs (at; null without a timeout);
--   map: a map step under way, how many of its element jobs have not completed
--     (the oldest of them is explained as a step job is);
--   child: a child step under way, the child run it waits for, its workflow,
--     queue and state (at: the child's creation);
--   recheck: a step whose end moves the run by a re-check, not yet done (a
--     completed step of a join, a cancelled step whose cancel of the run waits),
--     with its queue, whose next claim does it, and when it was left (at);
--   for a compensating run, instead of the above: each of its step jobs that has
--     not ended (a step still running, a compensation under way) with the reasons
--     treadle.explain gives it, then compensation: each compensation of a
--     completed step that has not started;
--   a step job that waits or runs: the reasons treadle.explain(job_id) gives it
--     (not_due, retrying, paused, concurrency_limit, rate_limit, no_worker,
--     behind, ready; key_full, key_waiting, lane_blocked for a step of a
--     concurrency key, 081_step_keys.sql; running, worker, lease_expired, cancel_requested; and for a
--     job that finished while its run did not move on, its end).
-- No rows for an unknown id, or a run of a queue a tenant may not see. Readers
-- may call it (treadle.grant_reader); it reads as the owner and applies the
-- tenant rule itself, as treadle.explain does.
-- Raises 22004: run_id null.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.explain_run(run_id bigint)
RETURNS TABLE (step text, job_id bigint, reason text, message text, at timestamptz)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    c_named  CONSTANT integer := 20;  -- the most completed steps the run row names
    v_run    treadle.workflow_runs;
    v_after  jsonb;
    v_done   text[];
    v_step   text;
    v_job    record;
    v_deps   text[];
    v_forks  record;
    v_child  record;
BEGIN
    IF explain_run.run_id IS NULL THEN
        RAISE EXCEPTION 'treadle: run_id must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT * INTO v_run FROM treadle.workflow_runs AS r
     WHERE r.id = explain_run.run_id AND starts_with(r.queue, treadle._caller_prefix());
    IF NOT FOUND THEN
        RETURN;
    END IF;

    SELECT coalesce(array_agg(u.s ORDER BY u.i), '{}') INTO v_done
      FROM unnest(v_run.steps) WITH ORDINALITY AS u(s, i)
     WHERE v_run.results ? u.s;
    RETURN QUERY SELECT NULL::text, NULL::bigint, 'run',
        format('run %s of workflow %s%s on queue %s is %s%s: %s of %s step(s) completed%s', v_run.id, v_run.name,
               CASE WHEN v_run.version IS NOT NULL THEN format(' (version %s)', v_run.version) ELSE '' END,
               v_run.queue, v_run.state,
               CASE WHEN v_run.finished_at IS NOT NULL THEN format(' since %s', v_run.finished_at)
                    ELSE format(' since %s', v_run.created_at) END,
               cardinality(v_done), cardinality(v_run.steps),
               CASE WHEN cardinality(v_done) = 0 THEN ''
                    ELSE format(' (%s%s)', array_to_string(v_done[1:c_named], ', '),
                                CASE WHEN cardinality(v_done) > c_named THEN ', ...' ELSE '' END) END),
        coalesce(v_run.finished_at, v_run.created_at);
    IF v_run.forked_from IS NOT NULL THEN
        RETURN QUERY SELECT NULL::text, NULL::bigint, 'forked_from',
            format('run %s was forked from run %s at step %s', v_run.id, v_run.forked_from, v_run.forked_step),
            v_run.created_at;
    END IF;
    SELECT count(*) AS n, max(f.created_at) AS at,
           string_agg(format('%s (from %s)', f.id, f.forked_step), ', ' ORDER BY f.id DESC)
               FILTER (WHERE f.rn <= c_named) AS named
      INTO v_forks
      FROM (SELECT r.id, r.forked_step, r.created_at, row_number() OVER (ORDER BY r.id DESC) AS rn
              FROM treadle.workflow_runs AS r
             WHERE r.forked_from = v_run.id AND starts_with(r.queue, treadle._caller_prefix())) AS f;
    IF v_forks.n > 0 THEN
        RETURN QUERY SELECT NULL::text, NULL::bigint, 'forks',
            format('run %s has %s fork(s): %s%s', v_run.id, v_forks.n, v_forks.named,
                   CASE WHEN v_forks.n > c_named THEN ', ...' ELSE '' END),
            v_forks.at;
    END IF;
    IF v_run.state = 'compensating' THEN
        -- its step jobs that have not ended (a step still running, its compensations
        -- start once none runs; the compensation under way), then the compensations
        -- of its completed steps that have not started
        FOR v_job IN SELECT j.id, j.step FROM treadle.jobs AS j
                      WHERE j.workflow_run_id = v_run.id AND j.state NOT IN ('completed', 'cancelled', 'discarded')
                      ORDER BY j.id LOOP
            RETURN QUERY SELECT v_job.step, v_job.id, e.reason, e.message, e.at FROM treadle.explain(v_job.id) AS e;
        END LOOP;
        RETURN QUERY
            SELECT c.value #>> '{}', NULL::bigint, 'compensation',
                   format('compensation %s of step %s waits for its turn: one compensation runs at a time, '
                          'the last completed step''s first', c.value #>> '{}', c.key),
                   NULL::timestamptz
              FROM jsonb_each(coalesce(v_run.compensations, '{}')) AS c
             WHERE v_run.results ? c.key AND NOT v_run.results ? (c.value #>> '{}')
               AND NOT EXISTS (SELECT 1 FROM treadle.jobs AS j
                                WHERE j.workflow_run_id = v_run.id AND j.step = c.value #>> '{}')
             ORDER BY array_position(v_run.steps, c.key) DESC;
        RETURN;
    END IF;
    IF v_run.state <> 'running' THEN
        RETURN;
    END IF;
    -- steps whose end waits to move the run (073_workflow_rechecks.sql,
    -- 073_workflow_cancel_rechecks.sql): a cancelled one cancels it then
    RETURN QUERY
        SELECT j.step, j.id, 'recheck',
               format('step %s %s: %s by the next claim on queue %s or treadle.rescue', j.step, j.state,
                      CASE WHEN j.state = 'cancelled' THEN 'the run''s cancel is left for a re-check, done'
                           ELSE 'the run moves on after it by a re-check' END, c.queue),
               c.added_at
          FROM treadle.run_rechecks AS c
          JOIN treadle.jobs AS j ON j.queue = c.queue AND j.id = c.job_id
         WHERE c.run_queue = v_run.queue AND c.run_id = v_run.id
         ORDER BY c.added_at, c.job_id;

    v_after := coalesce(v_run.after, treadle._linear_after(v_run.steps));
    FOR v_step IN SELECT u.s FROM unnest(v_run.steps) WITH ORDINALITY AS u(s, i) ORDER BY u.i LOOP
        CONTINUE WHEN v_run.results ? v_step;
        IF v_run.wakes IS NOT NULL AND v_run.wakes ? v_step THEN
            RETURN QUERY SELECT v_step, NULL::bigint, 'sleeping',
                                format('sleep step %s sleeps until %s', v_step, (v_run.wakes ->> v_step)::timestamptz),
                                (v_run.wakes ->> v_step)::timestamptz;
            CONTINUE;
        END IF;
        IF v_run.waiting IS NOT NULL AND v_run.waiting ? v_step THEN
            RETURN QUERY SELECT v_step, NULL::bigint, 'signal',
                                format('wait step %s waits for signal %s%s', v_step,
                                       v_run.waiting -> v_step ->> 'signal',
                                       CASE WHEN v_run.waiting -> v_step ->> 'until' IS NULL THEN ' (no timeout)'
                                            ELSE format(' until %s, when it %s', (v_run.waiting -> v_step ->> 'until')::timestamptz,
                                                        CASE WHEN v_run.waits -> v_step ->> 'on_timeout' = 'continue'
                                                             THEN 'times out and the run goes on'
                                                             ELSE 'times out and the run fails' END) END),
                                (v_run.waiting -> v_step ->> 'until')::timestamptz;
            CONTINUE;
        END IF;
        IF v_run.children IS NOT NULL AND v_run.children ? v_step THEN
            SELECT c.id, c.name, c.queue, c.state, c.created_at INTO v_child FROM treadle.workflow_runs AS c
             WHERE c.parent_run_id = v_run.id AND c.parent_step = v_step
               AND c.queue = coalesce(v_run.children -> v_step ->> 'queue', v_run.queue)
               AND starts_with(c.queue, treadle._caller_prefix());
            IF FOUND THEN
                RETURN QUERY SELECT v_step, NULL::bigint, 'child',
                                    format('child step %s waits for run %s of workflow %s on queue %s, which is %s',
                                           v_step, v_child.id, v_child.name, v_child.queue, v_child.state),
                                    v_child.created_at;
                CONTINUE;
            END IF;
        END IF;
        IF v_run.map_left IS NOT NULL AND v_run.map_left ? v_step THEN
            RETURN QUERY SELECT v_step, NULL::bigint, 'map',
                                format('map step %s: %s of its %s element job(s) not completed', v_step,
                                       v_run.map_left ->> v_step,
                                       (SELECT count(*) FROM treadle.jobs AS j
                                         WHERE j.workflow_run_id = v_run.id AND j.step = v_step)),
                                NULL::timestamptz;
            SELECT j.id, j.state INTO v_job FROM treadle.jobs AS j
             WHERE j.workflow_run_id = v_run.id AND j.step = v_step AND j.state <> 'completed'
             ORDER BY j.id LIMIT 1;
        ELSE
            SELECT j.id, j.state INTO v_job FROM treadle.jobs AS j
             WHERE j.workflow_run_id = v_run.id AND j.step = v_step
             ORDER BY j.id DESC LIMIT 1;
        END IF;
        IF FOUND THEN
            RETURN QUERY SELECT v_step, v_job.id, e.reason, e.message, e.at FROM treadle.explain(v_job.id) AS e;
            CONTINUE;
        END IF;
        CONTINUE WHEN v_run.map_left IS NOT NULL AND v_run.map_left ? v_step;
        SELECT coalesce(array_agg(d.v ORDER BY d.i), '{}') INTO v_deps
          FROM jsonb_array_elements_text(v_after -> v_step) WITH ORDINALITY AS d(v, i)
         WHERE NOT v_run.results ? d.v;
        IF cardinality(v_deps) > 0 THEN
            RETURN QUERY SELECT v_step, NULL::bigint, 'dependencies',
                                format('step %s waits for its dependencies to complete: %s', v_step,
                                       array_to_string(v_deps, ', ')),
                                NULL::timestamptz;
        ELSE
            RETURN QUERY SELECT v_step, NULL::bigint, 'pending',
                                format('step %s has its dependencies completed but has not started', v_step),
                                NULL::timestamptz;
        END IF;
    END LOOP;
END;
$$;
COMMENT ON FUNCTION treadle.explain_run(bigint) IS
    'Why a workflow run is where it is: a summary row, then one row per reason for each step not completed.';
