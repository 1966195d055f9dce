-- table2_zero_variance: over a whole run, what fraction of query-groups had zero reward variance under R_base and
-- R_total, split all-correct / all-wrong / mixed-uniform (paper Table 2, §4.3)?
select n_groups, base_all_correct, base_all_wrong, base_mixed_uniform, base_total,
       total_all_correct, total_all_wrong, total_mixed_uniform, total_total
from zero_variance_groups
where run_id = $run_id and level = 'run'
