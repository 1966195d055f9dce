-- judge_health: per run, step and judge role (role 'all': every role of the step), what became of the judge's calls
-- (llm/health.py classifies the same way): answered (a reply that parsed and passed the answer filter),
-- cache_hits (answered from the cache or by an identical call in flight), failed (no reply: a timeout, a stall, a
-- refused connection, an error status after the retries), refused (a reply that was no answer: unparseable,
-- truncated, hollow; the rules backend's Refusal), skipped (never sent: the cost cap). The shares divide by the calls
-- sent (all but skipped). top_error / top_refusal: the commonest error of the failed calls and reason of the refused
-- ones (ties: alphabetical). judged_groups: the step's rollout groups the judge answered about (one answered or cached
-- call with that group), judged_group_share their share of the steps row's n_groups. degraded: refused_share above
-- the run's judge.warn_refused_share (default 0.5), the rule that marks a steps row's judge_degraded.
create or replace view judge_health as
with calls as (
    select run_id, step, coalesce(role, '?') as role, "group", error,
           case when error is null or error = '' then
                    case when coalesce(cache_hit, false) then 'cache_hit' else 'answered' end
                when split_part(error, ':', 1) in ('InvalidAnswer', 'InvalidOutput', 'Truncated')
                     or backend = 'rules' then 'refused'
                when split_part(error, ':', 1) = 'CostCapExceeded' then 'skipped'
                else 'failed' end as outcome,
           coalesce(nullif(refusal, ''), case split_part(error, ':', 1) when 'InvalidAnswer' then 'hollow'
                                                    when 'InvalidOutput' then 'unparseable'
                                                    when 'Truncated' then 'truncated'
                                                    else error end) as reason
    from judge_calls
),
rollout_groups as (select distinct run_id, step, "group" from trajectories),
tallied as (
    select c.run_id, c.step,
           case when grouping(c.role) = 1 then 'all' else c.role end as role,
           count(*) as calls,
           count(*) filter (where outcome = 'answered') as answered,
           count(*) filter (where outcome = 'cache_hit') as cache_hits,
           count(*) filter (where outcome = 'failed') as failed,
           count(*) filter (where outcome = 'refused') as refused,
           count(*) filter (where outcome = 'skipped') as skipped,
           count(distinct g."group") filter (where outcome in ('answered', 'cache_hit')) as judged_groups
    from calls c
    left join rollout_groups g on g.run_id = c.run_id and g.step = c.step and g."group" = c."group"
    group by grouping sets ((c.run_id, c.step, c.role), (c.run_id, c.step))
),
counted as (  -- each failed call's error and each refused call's reason, counted per role and over the step
    select run_id, step, case when grouping(role) = 1 then 'all' else role end as role, outcome,
           case when outcome = 'failed' then error else reason end as why, count(*) as n
    from calls where outcome in ('failed', 'refused')
    group by grouping sets ((run_id, step, role, outcome, why), (run_id, step, outcome, why))
),
top as (
    select run_id, step, role,
           max(why) filter (where outcome = 'failed' and rank = 1) as top_error,
           max(why) filter (where outcome = 'refused' and rank = 1) as top_refusal
    from (select *, row_number() over (partition by run_id, step, role, outcome order by n desc, why) as rank
          from counted)
    group by run_id, step, role
)
select t.run_id, t.step, t.role, t.calls, t.answered, t.cache_hits, t.failed, t.refused, t.skipped,
       t.failed / nullif(t.calls - t.skipped, 0) as failed_share,
       t.refused / nullif(t.calls - t.skipped, 0) as refused_share,
       p.top_error, p.top_refusal,
       t.judged_groups, s.n_groups,
       t.judged_groups / nullif(s.n_groups, 0) as judged_group_share,
       coalesce(t.refused / nullif(t.calls - t.skipped, 0)
                > coalesce(try_cast(json_extract_string(r.config_json, '$.judge.warn_refused_share') as double), 0.5),
                false) as degraded
from tallied t
left join top p on p.run_id = t.run_id and p.step = t.step and p.role = t.role
left join steps s on s.run_id = t.run_id and s.step = t.step
left join runs r on r.run_id = t.run_id;
