-- question_f1_of_runs: per run of the list $run_ids and held-out question, the strict F1 (a format-invalid answer
-- scores 0) averaged over the evaluation runs (run_index) of the run's latest evaluated step?
select run_id, split, question_id, count(*) as n_answers,
       avg(case when format_valid then f1 else 0 end) as strict_f1
from eval_results
where list_contains($run_ids, run_id) and guidance is null
  and step = (select max(step) from eval_results e where e.run_id = eval_results.run_id)
group by run_id, split, question_id
order by run_id, split, question_id
