-- stage_credit_groups: RubricEM's analogue of the paper's Table 2. Per run and step (level 'step')
-- and per run (level 'run', step null): how many query-groups are outcome-homogeneous (every trajectory the
-- same base reward: GRPO's advantage is 0 on all of them) and how many of those still carry a non-zero stage
-- advantage under SS-GRPO (|A_{i,k}| > 1e-9 for some trajectory and stage), split by outcome pattern.
create or replace view stage_credit_groups as
with g as (
    select t.run_id, t.step, t."group",
           max(t.base_reward) - min(t.base_reward) <= 1e-9 as homogeneous,
           case when min(t.f1) >= 1 - 1e-9 and bool_and(t.format_valid) then 'all_correct'
                when max(t.f1) <= 1e-9 then 'all_wrong'
                else 'other' end as outcome
    from trajectories t group by t.run_id, t.step, t."group"
), a as (
    select run_id, step, "group", max(abs(advantage)) > 1e-9 as stage_signal
    from stage_scores group by run_id, step, "group"
)
select g.run_id,
       case when grouping(g.step) = 1 then 'run' else 'step' end as level,
       g.step,
       count(*) as n_groups,
       sum(g.homogeneous::int) as homogeneous_groups,
       sum((g.homogeneous and a.stage_signal)::int) as homogeneous_with_stage_signal,
       sum((g.homogeneous and g.outcome = 'all_wrong')::int) as all_wrong_groups,
       sum((g.homogeneous and g.outcome = 'all_wrong' and a.stage_signal)::int) as all_wrong_with_stage_signal,
       sum((g.homogeneous and g.outcome = 'all_correct')::int) as all_correct_groups,
       sum((g.homogeneous and g.outcome = 'all_correct' and a.stage_signal)::int) as all_correct_with_stage_signal,
       case when sum(g.homogeneous::int) > 0
            then sum((g.homogeneous and a.stage_signal)::int) / sum(g.homogeneous::int) end as recovered_share
from g join a using (run_id, step, "group")
group by grouping sets ((g.run_id, g.step), (g.run_id));
