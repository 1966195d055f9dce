-- guided_turns_of_run: per Co-ReAct rubric source of run $run_id, how many guided turns were there, how many carried
-- a rubric, what share failed verification, how many were retried, how many source or verifier calls failed, and
-- how many extra judge calls (step_rubric, step_verify) did each guided answer cost?
with answers as (select count(*) as n from eval_results where run_id = $run_id and guidance is not null),
calls as (select count(*) as n from judge_calls
          where run_id = $run_id and role in ('step_rubric', 'step_verify'))
select s.source, sum(s.turns) as turns, sum(s.guided_turns) as guided_turns,
       sum(s.fail_rate * s.turns) / nullif(sum(s.turns), 0) as fail_rate,
       sum(s.retries) as retries, sum(s.errors) as errors,
       (select n from calls) / nullif((select n from answers), 0) as judge_calls_per_answer
from guided_step_summary s
where s.run_id = $run_id
group by s.source
order by s.source
