--------------------------------------------------------------------------------
-- Finishes notify only when someone waits. NOTIFY makes every notifying commit
-- take one lock in turn, so finishing a job sends treadle_done only when a live
-- session waits on its queue (treadle.done_waiters). A waiter registers, then
-- LISTENs, then reads the state. A finish tries for one advisory lock in shared
-- mode, held until its transaction ends, then looks for waiters; registering
-- takes the lock exclusively, so:
--   - a finish that holds the lock before the registration: the registration
--     waits until that finish has committed, and the waiter's read sees it;
--   - a finish that takes the lock after: it sees the committed registration and
--     notifies at its commit; the waiter hears it if that commit came after its
--     LISTEN, and reads the finished state if it came before;
--   - a finish that cannot take the lock (a registration holds it or waits for
--     it) never waits: it notifies without looking.
-- A finish in a REPEATABLE READ or SERIALIZABLE transaction reads with a snapshot
-- that may predate a registration: it notifies without looking too.
-- The lock's key: (1953653092, 1685024357), 'trad' and 'done' in ASCII.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle.listen_done(queue) -> boolean
--
-- Registers the calling session as waiting for jobs of `queue` to finish (null:
-- every queue the caller may use), so that finishing one sends NOTIFY
-- treadle_done with its queue. Call it, then LISTEN treadle_done, then read the
-- state: no finish is missed. Removes the rows of sessions that have ended
-- (but those another open transaction is removing: it never waits for them).
-- Returns true once every finish that was under way has committed; false when one
-- was still open after 100 ms (a long transaction that finished a job): the
-- session stays registered, and such a finish is seen at the next read. Call it
-- in a transaction of its own: until that transaction ends, finishes notify
-- without looking. Raises 22023: a queue that is empty, blank, over 200
-- characters or holds a control character; 42501: a tenant names a queue
-- outside its prefix.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.listen_done(queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_lock_timeout text := current_setting('lock_timeout');
BEGIN
    IF listen_done.queue IS NOT NULL THEN
        PERFORM treadle._check_text(listen_done.queue, 'queue');
        PERFORM treadle._check_queue_allowed(listen_done.queue);
    END IF;
    DELETE FROM treadle.done_waiters AS w
     WHERE w.pid = pg_backend_pid() AND w.queue IS NOT DISTINCT FROM listen_done.queue;
    -- the rows of ended sessions that no other transaction is removing: a session
    -- that removed some and keeps its transaction open makes no one else wait
    DELETE FROM treadle.done_waiters AS w
     WHERE w.ctid = ANY (ARRAY(
           SELECT d.ctid FROM treadle.done_waiters AS d
            WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_stat_activity AS a WHERE a.pid = d.pid)
              FOR UPDATE SKIP LOCKED));
    INSERT INTO treadle.done_waiters (pid, queue, queue_prefix)
    VALUES (pg_backend_pid(), listen_done.queue, treadle._caller_prefix());

    -- wait up to 100 ms for the finishes under way (a failed wait undoes this setting)
    BEGIN
        PERFORM set_config('lock_timeout', '100ms', true);
        PERFORM pg_advisory_xact_lock(1953653092, 1685024357);
    EXCEPTION WHEN lock_not_available THEN
        RETURN false;
    END;
    PERFORM set_config('lock_timeout', v_lock_timeout, true);
    RETURN true;
END;
$$;
COMMENT ON FUNCTION treadle.listen_done(text) IS
    'Register this session as waiting for jobs of a queue (null: every queue) to finish, so finishes send NOTIFY treadle_done.';

--------------------------------------------------------------------------------
-- treadle.unlisten_done() -> void
--
-- The calling session no longer waits for finishes: its rows of
-- treadle.done_waiters go (a session that ends without calling it leaves rows
-- that the next treadle.listen_done removes). Raises nothing.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.unlisten_done()
RETURNS void
LANGUAGE sql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    DELETE FROM treadle.done_waiters AS w WHERE w.pid = pg_catalog.pg_backend_pid();
END;
COMMENT ON FUNCTION treadle.unlisten_done() IS
    'Stop waiting for finishes in this session: remove its treadle.done_waiters rows.';

--------------------------------------------------------------------------------
-- treadle._notify_done(queues) -> void
--
-- After jobs of `queues` finished: NOTIFY treadle_done for each queue that a
-- registered session waits on (treadle.listen_done); for every queue when the
-- transaction is not READ COMMITTED or a registration holds the lock. Raises nothing.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._notify_done(queues text[])
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed'
       OR NOT pg_try_advisory_xact_lock_shared(1953653092, 1685024357) THEN
        PERFORM pg_notify('treadle_done', q.q) FROM unnest(queues) AS q(q);
        RETURN;
    END IF;
    -- statements of their own: their snapshots are taken once the lock is held. Most
    -- finishes find no waiter at all: that test alone has a plan kept for the session
    -- (the lookup by the queues, an array, is planned again at each call).
    IF NOT EXISTS (SELECT FROM treadle.done_waiters) THEN
        RETURN;
    END IF;
    PERFORM pg_notify('treadle_done', q.q)
       FROM unnest(queues) AS q(q)
      WHERE EXISTS (SELECT FROM treadle.done_waiters AS w
                     WHERE w.queue = q.q OR (w.queue IS NULL AND starts_with(q.q, w.queue_prefix)));
END;
$$;
COMMENT ON FUNCTION treadle._notify_done(text[]) IS
    'Notify treadle_done for the queues of finished jobs that a session waits on.';

--------------------------------------------------------------------------------
-- treadle._notify_run_done(run) -> void
--
-- After `run` (the row as its last UPDATE left it) reached a final state
-- (completed, failed, cancelled, compensated): NOTIFY treadle_done for its queue
-- and for its ancestor runs' queues (a run that ended before a child of it is
-- waited for until its children are done: wait_workflow), to the sessions that
-- wait on them (treadle._notify_done). Every path that ends a run calls it
-- through treadle._child_run_ended, whether or not a job of the run's queue
-- finished in the same transaction: a cancel of a run that only sleeps, a sleep's
-- end, a signal wait's timeout, a signal, a compensation with nothing to undo.
-- Nothing for any other state (or a null row). Raises nothing.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._notify_run_done(run treadle.workflow_runs)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_queues text[] := ARRAY[run.queue];
    v_id     bigint := run.parent_run_id;
    v_queue  text := run.parent_queue;
BEGIN
    IF run.state IS NULL OR run.state <> ALL (ARRAY['completed', 'failed', 'cancelled', 'compensated']) THEN
        RETURN;
    END IF;
    -- the ancestors, each named by id and queue (one shard on Citus); a child is
    -- always inserted after its parent, so the walk ends
    WHILE v_id IS NOT NULL LOOP
        IF NOT v_queue = ANY (v_queues) THEN
            v_queues := v_queues || v_queue;
        END IF;
        SELECT r.parent_run_id, r.parent_queue INTO v_id, v_queue
          FROM treadle.workflow_runs AS r WHERE r.queue = v_queue AND r.id = v_id;
    END LOOP;
    PERFORM treadle._notify_done(v_queues);
END;
$$;
COMMENT ON FUNCTION treadle._notify_run_done(treadle.workflow_runs) IS
    'Notify treadle_done for a workflow run that ended, and its ancestors'' queues, to the sessions that wait on them.';
