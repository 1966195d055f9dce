-- guided_step_summary: per run, step and rubric source, how many guided turns there were, how many had a rubric,
-- the share failing verification, the mean verification score before and after a retry, and the share of retries
-- that passed (Co-ReAct §4.5: 21.4% of steps fail verification).
create or replace view guided_step_summary as
select run_id, step, source,
       count(*) as turns,
       count(*) filter (where rubric is not null) as guided_turns,
       avg(case when passed then 0.0 else 1.0 end) filter (where passed is not null) as fail_rate,
       avg(verify_score) as mean_verify_score,
       count(*) filter (where retried) as retries,
       avg(retry_score) filter (where retried) as mean_retry_score,
       avg(case when retry_passed then 1.0 else 0.0 end) filter (where retried and retry_passed is not null)
           as retry_pass_rate,
       count(*) filter (where rubric_error is not null or verify_error is not null) as errors
from guided_steps
group by run_id, step, source;
