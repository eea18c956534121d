-- Run once by the postgres image, in $POSTGRES_DB, when its data folder is new.
CREATE EXTENSION IF NOT EXISTS treadle;
CREATE EXTENSION IF NOT EXISTS pgtap;
