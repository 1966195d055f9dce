-- evidence_by_step: per run and step of examples/evidence_check, how many answers the judge checked and how many
-- of them a retrieved result supported, beside their mean exact match (did grounded answers score better?).
create or replace view evidence_by_step as
select e.run_id, e.step,
       count(*) filter (where e.asked) as n_checked,
       count(*) filter (where e.supported) as n_supported,
       count(*) filter (where e.asked and e.supported is null) as n_failed,
       avg(t.em) filter (where e.supported) as em_supported,
       avg(t.em) filter (where e.asked and not e.supported) as em_unsupported
from evidence_checks e
join trajectories t on t.run_id = e.run_id and t.traj_id = e.traj_id
group by e.run_id, e.step;
