-- profile_sweep: for every run of the same profile as $run_id, what are its lambda and K_consol (from config_json)
-- and its average pass@1 at its latest evaluated step: accuracy under the judge with the most rows there (ties: by
-- name) when every split is judged, and F1 (paper Figure 4, §4.6)?
with unguided as (select * from eval_results where guidance is null),
last as (select run_id, max(step) as step from unguided group by run_id),
latest as (select e.* from unguided e join last using (run_id, step)),
judges as (select run_id, judge_model,
                  row_number() over (partition by run_id order by count(*) desc, judge_model) as k
           from latest where judge_model is not null group by run_id, judge_model),
main as (select l.* from latest l left join judges j on j.run_id = l.run_id and j.k = 1
         where j.judge_model is null or l.judge_model = j.judge_model),
per_run_index as (select run_id, split, run_index,
                         avg(case when judge_correct then 1.0 else 0.0 end) as acc,
                         bool_or(judge_model is not null) as judged, avg(f1) as f1
                  from main group by run_id, split, run_index),
per_split as (select run_id, split, avg(acc) as acc, bool_and(judged) as judged, avg(f1) as f1
              from per_run_index group by run_id, split)
select r.run_id, r.method,
       (r.config_json::json -> 'memory' ->> 'lambda_')::double as lambda_,
       (r.config_json::json -> 'memory' ->> 'k_consol')::bigint as k_consol,
       case when bool_and(s.judged) then avg(s.acc) end as acc, avg(s.f1) as f1
from runs r left join per_split s using (run_id)
where r.profile is not distinct from (select profile from runs where run_id = $run_id)
group by r.run_id, r.method, r.config_json
order by r.run_id
