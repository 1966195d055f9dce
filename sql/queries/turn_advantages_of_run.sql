-- ARCO's per-turn advantages of one run (table turn_advantages): what every policy turn was credited with.
select step, phase, bucket, advantage
from turn_advantages
where run_id = $run_id
order by step, traj_id, turn
