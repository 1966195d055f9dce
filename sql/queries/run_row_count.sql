-- run_row_count: how many rows does a run have in runs, trajectories and rubric_events together (0 = unknown run)?
select (select count(*) from runs where run_id = $run_id)
     + (select count(*) from trajectories where run_id = $run_id)
     + (select count(*) from rubric_events where run_id = $run_id) as n
