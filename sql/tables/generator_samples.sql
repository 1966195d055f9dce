-- generator_samples: Co-ReAct's rubric generator training (arbor-guidance-train; issue 17; storage/schemas.py says what each
-- column holds). {{data}} is bound by storage/catalog.py.
create or replace view generator_samples as
select * from read_parquet('{{data}}/generator_samples/**/*.parquet', union_by_name = true, hive_partitioning = false);
