-- rubric_lifetimes: how long does each common rubric of a run live, and how much is it used? One row per common
-- rubric that entered the pool (consolidated or loaded from a pool file), §3.3:
--   entered_step / left_step (null: still in the pool at the run's end), status (active, retired, replaced) and
--   the reason the memory gave (n_r > kappa, rho_r < rho_min, lowest variance among matured);
--   steps_active = steps in which it scored a group; uses = query-groups it scored (Table 3's count, a judge
--   error included); kept_uses = those whose scores passed the shaping filter
create or replace view rubric_lifetimes as
with entered as (
    select run_id, rubric_id, min(step) as entered_step, arg_min(title, step * 1000000 + seq) as title
    from rubric_events
    where kind = 'common' and event = 'consolidated'
    group by run_id, rubric_id
),
gone as (
    select run_id, rubric_id, min(step) as left_step, arg_min(event, step * 1000000 + seq) as status,
           arg_min(reason, step * 1000000 + seq) as reason
    from rubric_events
    where kind = 'common' and event in ('retired', 'replaced')
    group by run_id, rubric_id
),
used as (
    select run_id, rubric_id, count(distinct step) as steps_active, count(*) as uses,
           count(*) filter (where kept) as kept_uses
    from rubric_activations
    group by run_id, rubric_id
)
select e.run_id, e.rubric_id, e.title, e.entered_step, g.left_step, coalesce(g.status, 'active') as status,
       g.reason, coalesce(u.steps_active, 0) as steps_active, coalesce(u.uses, 0) as uses,
       coalesce(u.kept_uses, 0) as kept_uses
from entered e
left join gone g on g.run_id = e.run_id and g.rubric_id = e.rubric_id
left join used u on u.run_id = e.run_id and u.rubric_id = e.rubric_id;
