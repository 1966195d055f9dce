-- zero_variance_of_run: every zero-variance row of a run, the whole run and each step (what arbor demo prints)?
select * from zero_variance_groups where run_id = $run_id order by level, step
