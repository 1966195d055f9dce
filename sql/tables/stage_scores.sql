-- stage_scores: per trajectory and stage (1 plan, 2 research, 3 review, 4 answer) of a RubricEM / SS-GRPO run:
-- the stage's response-token span [token_start, token_end), its score R in [0, 1], its return G and advantage A
-- (eq. 1), and the judge error when the grading call failed (then R falls back to the answer score only).
-- {{data}} is bound by storage/catalog.py.
create or replace view stage_scores as
select * from read_parquet('{{data}}/stage_scores/**/*.parquet', union_by_name = true, hive_partitioning = false);
