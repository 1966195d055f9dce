-- mu_scores: ARCO's rubric model mu on every step (policy turn) of every trajectory, in the score stage: the
-- criteria it wrote and its K scores, the step score, the outcome, and during the warm-up the teacher's labels
-- (raw and projected onto the outcome). {{data}} is bound by storage/catalog.py.
create or replace view mu_scores as
select * from read_parquet('{{data}}/mu_scores/**/*.parquet', union_by_name = true, hive_partitioning = false);
