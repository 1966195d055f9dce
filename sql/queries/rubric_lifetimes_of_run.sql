-- rubric_lifetimes_of_run: how long did each common rubric of run $run_id stay in the pool, how often was it used,
-- and why did it leave?
select rubric_id, title, entered_step, left_step, status, reason, steps_active, uses, kept_uses
from rubric_lifetimes
where run_id = $run_id
order by entered_step, rubric_id
