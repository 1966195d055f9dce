-- search_behaviour_of_runs: searches per trajectory and repeated-query shares per step of the runs in the list
-- $run_ids?
select *
from search_behaviour
where list_contains($run_ids, run_id)
order by run_id, step
