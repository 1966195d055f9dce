-- rubric_reuse_concentration: share of scoring events covered by the top 5% and the top 20% of common rubrics
-- ranked by reuse (paper §4.5 / Appendix C.4 report 20% and 44%).
-- Fractional rubric counts are not rounded: the top fraction f of N rubrics is f*N rubrics, read off the
-- piecewise-linear cumulative curve of Figure 5. With k = floor(f*N) and e = f*N - k,
--   share(f) = (events of the k most-used rubrics + e * events of rubric k+1) / all scoring events,
-- i.e. the rubric at rank r counts with weight clamp(f*N - (r - 1), 0, 1). Example: 5% of 30 rubrics = 1.5
-- rubrics = the most-used one plus half of the second. (docs/decisions/storage-layer.md)
create or replace view rubric_reuse_concentration as
with fractions as (select unnest([0.05, 0.20]::double[]) as top_fraction)
select r.run_id, f.top_fraction, any_value(r.n_rubrics) as n_rubrics,
       f.top_fraction * any_value(r.n_rubrics) as rubrics_covered,
       any_value(r.scoring_events) as scoring_events,
       case when any_value(r.scoring_events) > 0 then
           sum(r.uses * least(greatest(f.top_fraction * r.n_rubrics - (r.rank - 1), 0), 1)) / any_value(r.scoring_events)
       end as share
from rubric_reuse r cross join fractions f
group by r.run_id, f.top_fraction;
