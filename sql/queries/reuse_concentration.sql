-- reuse_concentration: what share of a run's scoring events do its top 5% and top 20% of common rubrics cover
-- (paper App. C.4)?
select top_fraction, share
from rubric_reuse_concentration
where run_id = $run_id
order by top_fraction
