-- filter_pass_by_pattern: which (rubric, group) scorings pass the shaping filter (§3.4: within-group variance >=
-- delta_v, or the step's verdict under memory.shaping_filter=batch; rubric_activations.kept), split by the group's
-- pattern. One row per run and pattern:
--   mixed:         the base reward varies in the group (outcome contrast; a format-invalid trajectory counts);
--   all_correct, all_wrong, mixed_uniform: the zero-variance groups of Table 2, by the same rules as
--                  zero_variance_groups (F1 = 1 and valid everywhere; F1 = 0 everywhere; one partial F1)
-- scorings = activations of a common rubric on a group (a judge error counts, and never passes).
create or replace view filter_pass_by_pattern as
with g as (
    select run_id, step, "group",
           case when max(base_reward) - min(base_reward) > 1e-9 then 'mixed'
                when min(f1) >= 1 - 1e-9 and bool_and(format_valid) then 'all_correct'
                when max(f1) <= 1e-9 then 'all_wrong'
                else 'mixed_uniform' end as pattern
    from trajectories
    group by run_id, step, "group"
)
select a.run_id, g.pattern,
       count(*) as scorings,
       count(*) filter (where a.kept) as passed,
       count(*) filter (where a.kept)::double / count(*) as pass_share,
       count(*) filter (where a.judge_error) as judge_errors,
       avg(a.variance) as mean_variance
from rubric_activations a
join g on g.run_id = a.run_id and g.step = a.step and g."group" = a."group"
group by a.run_id, g.pattern;
