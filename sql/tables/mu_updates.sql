-- mu_updates: ARCO's rubric-model update per step (mu_update stage): warm-up or decomposition, its loss parts,
-- and mu's calibration before it. {{data}} is bound by storage/catalog.py.
create or replace view mu_updates as
select * from read_parquet('{{data}}/mu_updates/**/*.parquet', union_by_name = true, hive_partitioning = false);
