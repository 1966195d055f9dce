-- mu_calibration: per ARCO step and outcome class, how well the rubric model's step scores add up to the outcome
-- (the decomposition constraint): mean sum_t s̄_t against mean R, the mean absolute gap, and the spread of s̄_t
-- within a trajectory (0: mu gives every step the same score and assigns no credit).
create or replace view mu_calibration as
with per_traj as (
    select run_id, step, traj_id, any_value(outcome) as outcome, sum(step_score) as score_sum,
           count(*) as n_steps, coalesce(stddev_pop(step_score), 0) as within_spread
    from mu_scores
    group by run_id, step, traj_id
)
select run_id, step,
       case when outcome > 0.5 then 'positive' else 'negative' end as outcome_class,
       count(*) as trajectories,
       avg(outcome) as mean_outcome,
       avg(score_sum) as mean_score_sum,
       avg(abs(score_sum - outcome)) as mean_abs_gap,
       avg(within_spread) as mean_within_spread,
       avg(n_steps) as mean_steps
from per_traj
group by run_id, step, outcome_class;
