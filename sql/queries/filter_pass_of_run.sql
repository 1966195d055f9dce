-- filter_pass_of_run: what share of run $run_id's (rubric, group) scorings passed the shaping filter, by the group's
-- pattern (mixed, or Table 2's all-correct / all-wrong / mixed-uniform zero-variance groups)?
select pattern, scorings, passed, pass_share, judge_errors, mean_variance
from filter_pass_by_pattern
where run_id = $run_id
order by case pattern when 'mixed' then 0 when 'all_correct' then 1 when 'all_wrong' then 2 else 3 end
