-- reflections: RubricEM's reflection candidates (§3.4, App. D.4), m per reflected query: the candidate text, the
-- trajectory it reflects on (source_traj_id), the judge's diagnosis / specificity / scope in [0, 1], the utility
-- u = 0.4 d + 0.3 s + 0.3 c (D.6.2; also base_reward, the reward of the GRPO group on reflection tokens), and
-- whether it entered the bank (chosen). Trained one step later (D.2). {{data}} is bound by storage/catalog.py.
create or replace view reflections as
select * from read_parquet('{{data}}/reflections/**/*.parquet', union_by_name = true, hive_partitioning = false);
