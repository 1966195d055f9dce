-- turn_advantages: ARCO's credit per step (shape stage): reward-to-go, the position bucket and its baseline,
-- the advantage every token of the turn carries, and the phase (sparse / dense). {{data}} is bound by
-- storage/catalog.py.
create or replace view turn_advantages as
select * from read_parquet('{{data}}/turn_advantages/**/*.parquet', union_by_name = true, hive_partitioning = false);
