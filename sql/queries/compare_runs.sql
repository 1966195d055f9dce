-- compare_runs: for each run in the list $run_ids, its method, the trajectories it rolled out per step (its stored
-- trajectories of its completed steps over those steps: DAPO's refill samples more), mean training rewards,
-- format-valid rate, zero-variance fractions, judge calls, whether it ran degraded (steps whose judge answers were
-- mostly refused) and held-out EM / F1 / judge accuracy (arbor compare; paper Tables 1, 2, 7)?
select r.method,
       r.run_id,
       (select count(*) from trajectories t join steps d on d.run_id = t.run_id and d.step = t.step
         where t.run_id = r.run_id) / count(*) as rollouts_per_step,
       avg(s.mean_base_reward)  as base_reward,
       avg(s.mean_total_reward) as total_reward,
       avg(s.format_valid_rate) as valid_rate,
       avg(s.zero_var_base)     as zero_var_base,
       avg(s.zero_var_total)    as zero_var_total,
       sum(s.judge_calls)       as judge_calls,
       case when count(s.judge_degraded) > 0
            then 'degraded ' || count(s.judge_degraded) || '/' || count(*) || ' steps' end as degraded,
       (select avg(e.em) from eval_results e where e.run_id = r.run_id and e.guidance is null)  as heldout_em,
       (select avg(e.f1) from eval_results e where e.run_id = r.run_id and e.guidance is null)  as heldout_f1,
       (select avg(case when e.judge_correct then 1.0 else 0.0 end) from eval_results e
         where e.run_id = r.run_id and e.guidance is null)               as heldout_acc
from runs r join steps s using (run_id)
where list_contains($run_ids, r.run_id)
group by r.method, r.run_id
order by r.method
