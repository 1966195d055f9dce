-- zero_variance_by_step: per step of a run, what fraction of query-groups had zero variance under R_base and
-- R_total, and what share of the R_base ones did rubric shaping convert?
select step, n_groups, base_total, total_total, converted_share
from zero_variance_groups
where run_id = $run_id and level = 'step'
order by step
