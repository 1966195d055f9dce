-- eval_summary: evaluation scores per run, step, checkpoint and split, averaged over questions and repeated runs
-- (run_index). strict_*: every answer counts (format-invalid answers score 0); valid_*: only format-valid answers,
-- with valid_rate the share of format-valid answers; guidance: null unguided, else the Co-ReAct source. judge accuracy ignores rows without a judge verdict.
create or replace view eval_summary as
select run_id, step, checkpoint, guidance, split,
       count(*) as n_answers,
       count(distinct question_id) as n_questions,
       avg(format_valid::int) as valid_rate,
       avg(case when format_valid then em else 0 end) as strict_em,
       avg(case when format_valid then f1 else 0 end) as strict_f1,
       avg(case when format_valid then coalesce(judge_correct, false)::int else 0 end)
           filter (where judge_correct is not null or not format_valid) as strict_judge_acc,
       avg(em) filter (where format_valid) as valid_em,
       avg(f1) filter (where format_valid) as valid_f1,
       avg(judge_correct::int) filter (where format_valid and judge_correct is not null) as valid_judge_acc,
       any_value(judge_model) as judge_model
from eval_results
group by run_id, step, checkpoint, guidance, split;
