-- verdict_ties_of_run: how often did run $run_id's judge call a pairwise comparison a tie, over the run (rubric_id
-- null) and per common rubric, on edges of equal and of differing base rewards?
select rubric_id, edges, judged_edges, ties, tie_rate, equal_outcome_edges, tie_rate_equal_outcome, decisive_edges,
       tie_rate_decisive
from verdict_ties
where run_id = $run_id
order by rubric_id nulls first
