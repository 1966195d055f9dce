-- eval_results_of_run: a run's eval_results rows at $step (its latest evaluated step when $step is null), of
-- $checkpoint only when it is not null (unguided answers; guided_eval_of_run compares the guided ones)?
select *
from eval_results
where run_id = $run_id
  and step = coalesce($step, (select max(step) from eval_results where run_id = $run_id))
  and ($checkpoint is null or checkpoint = $checkpoint)
  and guidance is null
order by split, question_id, run_index
