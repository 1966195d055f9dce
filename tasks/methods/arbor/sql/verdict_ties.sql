-- verdict_ties: how often does a run's judge call a pairwise comparison a tie? One row per run and common rubric
-- (rubric_id null: the run over all its rubrics), from every verdict of the score stage (§3.4's sparse graph).
--   judged_edges = edges with a verdict (failed calls apart); tie_rate = ties / judged_edges;
--   split by the edge's two base rewards: equal (a zero-variance group's edges, and equal pairs of a mixed one),
--   where only a process difference can break the tie, and decisive (they differ)
create or replace view verdict_ties as
select run_id, rubric_id,
       count(*) as edges,
       count(outcome) as judged_edges,
       count(*) filter (where outcome = 0.5) as ties,
       count(*) filter (where outcome = 0.5)::double / nullif(count(outcome), 0) as tie_rate,
       count(outcome) filter (where base_i = base_j) as equal_outcome_edges,
       count(*) filter (where outcome = 0.5 and base_i = base_j)::double
           / nullif(count(outcome) filter (where base_i = base_j), 0) as tie_rate_equal_outcome,
       count(outcome) filter (where base_i <> base_j) as decisive_edges,
       count(*) filter (where outcome = 0.5 and base_i <> base_j)::double
           / nullif(count(outcome) filter (where base_i <> base_j), 0) as tie_rate_decisive
from rubric_verdicts
group by grouping sets ((run_id, rubric_id), (run_id));
