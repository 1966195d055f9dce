-- eval_summary_of_runs: evaluation scores (strict / valid-only EM, F1, valid rate) per step and split of the runs in
-- the list $run_ids?
select *
from eval_summary
where list_contains($run_ids, run_id)
order by run_id, step, checkpoint, split
