-- steps_of_runs: every logged training step of the runs in the list $run_ids, in step order?
select *
from steps
where list_contains($run_ids, run_id)
order by run_id, step
