-- bank_retrievals: each bank item shown in a rollout prompt (RubricEM D.5, D.6.3): the step and group it was
-- shown to, mode 'within' (the question's own item) or 'cross' (a related question's, rank 1..k by similarity),
-- and the step the item was written at. {{data}} is bound by storage/catalog.py.
create or replace view bank_retrievals as
select * from read_parquet('{{data}}/bank_retrievals/**/*.parquet', union_by_name = true, hive_partitioning = false);
