-- guided_pairs_of_run: at run $run_id's latest evaluated step, per question and Co-ReAct source, what strict F1 did
-- the unguided and the guided answers get (each averaged over the question's runs)? The pairs behind a paired
-- standard error of guidance's effect (bench/guidance.py).
with scored as (
    select question_id, coalesce(guidance, 'off') as guidance,
           avg(case when format_valid then f1 else 0 end) as strict_f1
    from eval_results
    where run_id = $run_id
      and step = (select max(step) from eval_results where run_id = $run_id)
    group by question_id, guidance
)
select g.guidance, g.question_id, o.strict_f1 as f1_off, g.strict_f1 as f1_on
from scored g
join scored o on o.question_id = g.question_id and o.guidance = 'off'
where g.guidance <> 'off'
order by g.guidance, g.question_id
