-- guided_steps: Co-ReAct's guided turns (issue 17): the step rubric placed before each turn, the proposed action,
-- its verification score and pass, and the retry that replaced a failed action. {{data}} is bound by
-- storage/catalog.py.
create or replace view guided_steps as
select * from read_parquet('{{data}}/guided_steps/**/*.parquet', union_by_name = true, hive_partitioning = false);
