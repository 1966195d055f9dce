-- top_reused_rubrics: which $top_n common rubrics of a run were reused most (uses = query-groups scored; paper
-- Table 3, §4.5)?
select rank, rubric_id, title, uses
from rubric_reuse
where run_id = $run_id
order by rank
limit $top_n
