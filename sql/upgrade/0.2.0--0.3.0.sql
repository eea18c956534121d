--------------------------------------------------------------------------------
-- Migration 0.2.0 -> 0.3.0, before the definitions: what CREATE OR REPLACE
-- cannot do. The functions and views that follow come from sql/src, as in a fresh
-- install; sql/upgrade/0.2.0--0.3.0.after.sql finishes after them.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- Retention (treadle.apply_retention, treadle.configure(retain_completed, retain_failed))
--------------------------------------------------------------------------------
ALTER TABLE treadle.settings
    ADD COLUMN retain_completed interval
        CONSTRAINT settings_retain_completed_check CHECK (retain_completed BETWEEN interval '0' AND interval '100 years'),
    ADD COLUMN retain_failed interval
        CONSTRAINT settings_retain_failed_check CHECK (retain_failed BETWEEN interval '0' AND interval '100 years');
-- a settings row made by 0.2.0 gets treadle._retention()'s defaults, as a new row does
UPDATE treadle.settings SET retain_completed = interval '7 days', retain_failed = interval '30 days';

-- THE QUEUES WORK OWNS THIS TABLE; retention reads only these columns (see 010_tables.sql).
CREATE TABLE treadle.queues (
    queue            text PRIMARY KEY,
    retain_completed interval,
    retain_failed    interval
);
SELECT pg_catalog.pg_extension_config_dump('treadle.queues', '');

CREATE INDEX workflow_runs_finished_at_idx ON treadle.workflow_runs (finished_at) WHERE finished_at IS NOT NULL;
