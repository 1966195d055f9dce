-- search_behaviour: how the policy searches, per run and step (the process the rubrics are about).
-- Over all trajectories and over the trajectories of all-correct groups (F1 = 1 and format valid on every
-- trajectory, as in zero_variance_groups): the outcome reward cannot tell these apart, a process rubric can.
--   mean_searches:          search calls per trajectory;
--   repeated_query_share:   share of trajectories that issue the same query (case and spaces folded) twice;
--   *_all_correct:          the same two figures on all-correct groups only (null when there is none).
create or replace view search_behaviour as
with t as (
    select run_id, step, "group", f1, format_valid, search_calls,
           len(search_queries) > len(list_distinct(list_transform(search_queries,
               lambda q: lower(regexp_replace(trim(q), '\s+', ' ', 'g'))))) as repeated
    from trajectories
),
g as (
    select run_id, step, "group", min(f1) >= 1 - 1e-9 and bool_and(format_valid) as all_correct
    from t group by run_id, step, "group"
)
select t.run_id, t.step,
       count(*) as n_trajectories,
       avg(t.search_calls) as mean_searches,
       avg(t.repeated::int) as repeated_query_share,
       count(*) filter (where g.all_correct) as n_all_correct,
       avg(t.search_calls) filter (where g.all_correct) as mean_searches_all_correct,
       avg(t.repeated::int) filter (where g.all_correct) as repeated_query_share_all_correct
from t join g using (run_id, step, "group")
group by t.run_id, t.step;
