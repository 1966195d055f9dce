-- reflection_scores: per RubricEM step, the reflection meta-policy's candidates (App. D.4): how many, the share
-- with both blocks (valid), their mean judge utility and its within-group spread, and how many entered the bank.
create or replace view reflection_scores as
select run_id, step,
       count(*) as candidates,
       count(distinct "group") as reflected_queries,
       avg(case when format_valid then 1.0 else 0.0 end) as valid_share,
       avg(utility) as mean_utility,
       avg(diagnosis) as mean_diagnosis,
       avg(specificity) as mean_specificity,
       avg(scope) as mean_scope,
       count(*) filter (where chosen) as written_to_bank,
       count(*) filter (where judge_error is not null) as judge_errors
from reflections
group by run_id, step;
