-- rubric_bank: the agent rubric bank's events (RubricEM App. D.5): an accepted reflection is 'written' for its
-- question, or 'replaced' the question's earlier item (replaced_item_id). {{data}} is bound by storage/catalog.py.
create or replace view rubric_bank as
select * from read_parquet('{{data}}/rubric_bank/**/*.parquet', union_by_name = true, hive_partitioning = false);
