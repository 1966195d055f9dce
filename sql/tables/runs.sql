-- runs: one row per run: profile, method, seed, resolved config (JSON, with the changes made on resume listed in
-- config_changes), created_at, git sha, the process that owns it (host, pid, heartbeat_at, flow_ended_at), and the
-- question sets it trains and evaluates on (train_set = data.train, eval_sets = data.eval as a list).
-- Parquet is the source of truth (storage/parquet.py); the view reads every committed file. {{data}} is the
-- workspace's data folder, substituted by storage/catalog.py (views store the path; a moved workspace is re-bound).
-- The zero-row {{data}}/runs/_schema.parquet carries the declared schema (storage/schemas.py), so the view is typed
-- and queryable before any run wrote a row, and files written before a column existed read it as null.
create or replace view runs as
select * from read_parquet('{{data}}/runs/**/*.parquet', union_by_name = true, hive_partitioning = false);
