-- treadle 0.2.0 -> 0.3.0: tables, columns and indexes new in 0.3.0, and what the
-- functions and views defined after this need dropped first.

--------------------------------------------------------------------------------
-- queues: per-queue settings (pause, limits, backpressure, retention), explain
--------------------------------------------------------------------------------
CREATE TABLE treadle.queues (
    queue            text        PRIMARY KEY,
    paused           boolean     NOT NULL DEFAULT false,
    concurrency      integer,                -- at most this many running at once, over all workers
    rate_limit       integer,                -- at most this many claims per rate_period
    rate_period      interval,
    max_depth        integer,                -- enqueue refused (TQ001) at this many waiting jobs
    retain_completed interval,               -- how long completed jobs are kept (null: the default)
    retain_failed    interval,               -- how long discarded and cancelled jobs are kept
    rate_tokens      double precision,       -- claims the bucket allows, as of rate_updated_at
    rate_updated_at  timestamptz,
    updated_at       timestamptz NOT NULL,
    CONSTRAINT queues_queue_check CHECK (queue <> ''),
    CONSTRAINT queues_concurrency_check CHECK (concurrency BETWEEN 1 AND 100000),
    CONSTRAINT queues_rate_check CHECK (
        (rate_limit IS NULL) = (rate_period IS NULL)
        AND (rate_limit IS NULL) = (rate_tokens IS NULL)
        AND (rate_limit IS NULL) = (rate_updated_at IS NULL)),
    CONSTRAINT queues_rate_limit_check CHECK (rate_limit BETWEEN 1 AND 1000000),
    CONSTRAINT queues_rate_period_check CHECK (rate_period > interval '0' AND rate_period <= interval '1 day'),
    CONSTRAINT queues_max_depth_check CHECK (max_depth BETWEEN 1 AND 1000000),
    CONSTRAINT queues_retain_check CHECK (retain_completed >= interval '0' AND retain_failed >= interval '0')
);
ALTER TABLE treadle.queues ENABLE ROW LEVEL SECURITY;
CREATE POLICY queues_tenant_read ON treadle.queues FOR SELECT
    USING (starts_with(queue, coalesce(
        (SELECT t.queue_prefix FROM treadle.tenants AS t WHERE t.role_name = current_user), '')));
SELECT pg_catalog.pg_extension_config_dump('treadle.queues', '');
