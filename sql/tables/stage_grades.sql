-- stage_grades: every 0/1/2 grade the stage judge gave a trajectory against a rubric of its question's buffer
-- (RubricEM App. C.3; a negative rubric's grade is how fully the flaw is there), with the judge's justification.
-- RubricEM's reflection judge reads them as privileged context (D.6.2). {{data}} is bound by storage/catalog.py.
create or replace view stage_grades as
select * from read_parquet('{{data}}/stage_grades/**/*.parquet', union_by_name = true, hive_partitioning = false);
