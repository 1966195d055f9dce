-- reuse_curve: with a run's common rubrics ranked by reuse, what cumulative share of scoring events do the top
-- fraction of them cover (paper Figure 5, App. C.4)?
select rank, rubric_fraction, cum_share, n_rubrics, scoring_events
from rubric_reuse
where run_id = $run_id
order by rank
