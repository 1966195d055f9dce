-- mu_calibration_of_run: per step and outcome class of run $run_id, how far is ARCO's rubric model from the
-- decomposition constraint (mean sum_t s̄_t against mean R, their mean absolute gap) and how spread are its step scores
-- within a trajectory (view mu_calibration)?
select step, outcome_class, trajectories, mean_outcome, mean_score_sum, mean_abs_gap, mean_within_spread
from mu_calibration
where run_id = $run_id
order by step, outcome_class
