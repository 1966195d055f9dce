-- guided_eval_of_run: at run $run_id's latest evaluated step, how do the guided answers (per Co-ReAct source) compare
-- with the unguided ones on the same questions: strict EM and F1, the valid rate and the answers behind them?
select coalesce(guidance, 'off') as guidance, split,
       count(*) as n_answers,
       avg(format_valid::int) as valid_rate,
       avg(case when format_valid then em else 0 end) as strict_em,
       avg(case when format_valid then f1 else 0 end) as strict_f1
from eval_results
where run_id = $run_id
  and step = (select max(step) from eval_results where run_id = $run_id)
group by guidance, split
order by split, guidance nulls first
