-- consolidation_lineage: which drafts, induced from which questions, was each common rubric of a run consolidated
-- from (App. D)?
select common_rubric_id, common_title, common_status, consolidated_step, draft_rubric_id, draft_title,
       draft_step, "group", question_id, question
from rubric_lineage
where run_id = $run_id
order by consolidated_step, common_rubric_id, draft_step, draft_rubric_id
