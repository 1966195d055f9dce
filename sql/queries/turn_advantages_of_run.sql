-- turn_advantages_of_run: what advantage did ARCO credit every policy turn of run $run_id with, per step, phase
-- (sparse or dense) and position bucket (table turn_advantages)?
select step, phase, bucket, advantage
from turn_advantages
where run_id = $run_id
order by step, traj_id, turn
