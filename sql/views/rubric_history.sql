-- rubric_history: each common rubric's trajectory through training, per run, rubric and step (paper §3.3):
-- groups scored, how many passed the shaping variance filter (kept), the mean and minimum within-group score
-- variance (as stored: memory.variance's kind, population by default), the Pearson correlation between its scores
-- and trajectory F1 over that step's groups (null when either side is constant), and the cumulative statistics
-- after the step's last activation: n_r (consecutive low-variance count), rho_r (cumulative Pearson),
-- n_activations, mean variance.
create or replace view rubric_history as
with act as (
    select *, step * 1000000 + "group" as ord from rubric_activations
),
scored as (
    select s.run_id, s.step, s.rubric_id, s.score, t.f1
    from (select run_id, step, "group", rubric_id, unnest(scores) as score,
                 generate_subscripts(scores, 1) - 1 as sample
          from rubric_activations) s
    join trajectories t on t.run_id = s.run_id and t.step = s.step and t."group" = s."group" and t.sample = s.sample
),
step_corr as (
    select run_id, rubric_id, step,
           case when var_pop(score) > 0 and var_pop(f1) > 0 then corr(score, f1) end as step_pearson,
           count(*) as n_scores
    from scored group by run_id, rubric_id, step
)
select a.run_id, a.rubric_id, a.step,
       count(*) as n_groups,
       count(*) filter (where a.kept) as n_kept,
       count(*) filter (where a.judge_error) as n_judge_error,
       avg(a.variance) as mean_variance,
       min(a.variance) as min_variance,
       any_value(c.step_pearson) as step_pearson,
       arg_max(a.n_r_after, a.ord) as n_r,
       arg_max(a.rho_r_after, a.ord) as rho_r,
       arg_max(a.n_activations_after, a.ord) as n_activations,
       arg_max(a.mean_variance_after, a.ord) as mean_variance_cumulative
from act a left join step_corr c using (run_id, rubric_id, step)
group by a.run_id, a.rubric_id, a.step;
