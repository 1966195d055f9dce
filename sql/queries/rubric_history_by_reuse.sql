-- rubric_history_by_reuse: per step, each common rubric's within-group score variance and cumulative Pearson rho_r,
-- most reused rubrics first (§3.3)?
select h.rubric_id, h.step, h.n_groups, h.n_kept, h.mean_variance, h.step_pearson, h.rho_r, h.n_r
from rubric_history h left join rubric_reuse u using (run_id, rubric_id)
where h.run_id = $run_id
order by coalesce(u.rank, 1e9), h.rubric_id, h.step
