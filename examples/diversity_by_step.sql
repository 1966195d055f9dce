-- diversity_by_step: per run and step of examples/diversity.py, how diverse its groups' responses were: the mean
-- and spread of d over trajectories, and how many groups had every response alike (d = 0 for all).
create or replace view diversity_by_step as
with per_group as (
    select run_id, step, "group", avg(diversity) as mean_d, max(diversity) as max_d
    from group_diversity
    group by run_id, step, "group"
)
select run_id, step,
       count(*) as n_groups,
       avg(mean_d) as mean_diversity,
       coalesce(stddev_pop(mean_d), 0) as spread_between_groups,
       count(*) filter (where max_d = 0) as groups_all_alike
from per_group
group by run_id, step;
