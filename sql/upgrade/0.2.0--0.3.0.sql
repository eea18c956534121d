--------------------------------------------------------------------------------
-- Claims under a held snapshot (sql/src/040_claim.sql): the transaction that last
-- made each job claimable, and its index, as in sql/src/010_tables.sql. Rows of
-- 0.2.0 keep null: a claim's sweep from the front finds them.
--------------------------------------------------------------------------------
ALTER TABLE treadle.jobs ADD COLUMN ready_txid xid8;
ALTER TABLE treadle.jobs ALTER COLUMN ready_txid SET DEFAULT pg_current_xact_id();
CREATE INDEX jobs_ready_txid_idx ON treadle.jobs (ready_txid)
    WHERE state = ANY (ARRAY['available', 'retryable']);
