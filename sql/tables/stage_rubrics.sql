-- stage_rubrics: RubricEM's stage rubric buffer, one row per lifecycle event (issue 15; the paper's App. C):
-- generated (by the judge, contrasting a group), kept / dropped after the group's grading (variance = the
-- population variance of its 0/1/2 grades across the group, which decided a drop at the stage's cap).
-- {{data}} is bound by storage/catalog.py.
create or replace view stage_rubrics as
select * from read_parquet('{{data}}/stage_rubrics/**/*.parquet', union_by_name = true, hive_partitioning = false);
