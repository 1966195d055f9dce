-- table1_of_runs: paper Table 1 for the runs in $run_ids: at each run's last evaluated step (its final policy),
-- per benchmark split, EM, F1 and LLM-judge accuracy under the format gate (a format-invalid answer scores 0),
-- pass@1 averaged over the evaluation runs, each with its standard error over questions (each question's mean over
-- its runs first). Unguided answers only.
with last as (
    select run_id, max(step) as step
    from eval_results
    where list_contains($run_ids, run_id) and guidance is null
    group by run_id
),
per_question as (
    select e.run_id, e.step, e.split, e.question_id,
           avg(case when e.format_valid then e.em else 0 end) as em,
           avg(case when e.format_valid then e.f1 else 0 end) as f1,
           avg(case when e.format_valid then coalesce(e.judge_correct, false)::int else 0 end)
               filter (where e.judge_correct is not null or not e.format_valid) as acc
    from eval_results e
    join last l on l.run_id = e.run_id and l.step = e.step
    where e.guidance is null
    group by e.run_id, e.step, e.split, e.question_id
)
select run_id, step, split, count(*) as n_questions,
       avg(em) as em, coalesce(stddev_samp(em) / sqrt(count(*)), 0) as em_se,
       avg(f1) as f1, coalesce(stddev_samp(f1) / sqrt(count(*)), 0) as f1_se,
       avg(acc) as acc, coalesce(stddev_samp(acc) / sqrt(count(acc)), 0) as acc_se, count(acc) as n_judged
from per_question
group by run_id, step, split
order by run_id, split
