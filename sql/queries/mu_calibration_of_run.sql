-- ARCO's rubric model per step and outcome class: mean sum_t s̄_t against mean R and their mean absolute gap
-- (the decomposition constraint), and the spread of step scores within a trajectory (view mu_calibration).
select step, outcome_class, trajectories, mean_outcome, mean_score_sum, mean_abs_gap, mean_within_spread
from mu_calibration
where run_id = $run_id
order by step, outcome_class
