-- judge_signal_quality: is my judge helping? One row per ARBOR step and active rubric (rubric_id null for a step
-- that activated none).
--   mixed groups (base reward varies): the rubric's pairwise verdicts against the outcome order, over judged edges
--     whose two base rewards differ: agree (the higher-reward trajectory wins), disagree, tie, failed;
--     agreement_rate = agree / (agree + disagree) (ties and failed edges counted apart, not in the rate)
--   zero-variance groups (base reward constant): the rubric's activations there and how many passed the shaping
--     filter (kept); for the step, the share of those groups that shaping gave a signal (total reward varies) and
--     the mean |A_total - A_base| over their trajectories, A = reward minus its group mean (before any
--     normalisation by the group's spread; A_base is 0 in such a group)
--   the step's drafts: induced, admitted, rejected by reason (eq. 2: variance < delta_v, pearson < rho_min; other)
create or replace view judge_signal_quality as
with grp as (
    select run_id, step, "group",
           max(base_reward) - min(base_reward) > 1e-9 as mixed,
           max(coalesce(shaped_reward, base_reward)) - min(coalesce(shaped_reward, base_reward)) > 1e-9 as shaped_varies,
           avg(coalesce(shaped_reward, base_reward)) as mean_total
    from trajectories
    group by run_id, step, "group"
),
zero_var as (
    select g.run_id, g.step,
           count(distinct g."group") as zero_var_groups,
           count(distinct case when g.shaped_varies then g."group" end) as zero_var_groups_shaped,
           avg(abs(coalesce(t.shaped_reward, t.base_reward) - g.mean_total)) as zero_var_mean_abs_shift
    from grp g
    join trajectories t on t.run_id = g.run_id and t.step = g.step and t."group" = g."group"
    where not g.mixed
    group by g.run_id, g.step
),
drafts as (
    select run_id, step,
           count(*) filter (where event = 'induced') as drafts_induced,
           count(*) filter (where event = 'admitted') as drafts_admitted,
           count(*) filter (where event = 'rejected') as drafts_rejected,
           count(*) filter (where event = 'rejected' and reason = 'variance < delta_v') as rejected_variance,
           count(*) filter (where event = 'rejected' and reason = 'pearson < rho_min') as rejected_pearson,
           count(*) filter (where event = 'rejected' and reason is distinct from 'variance < delta_v'
                                                     and reason is distinct from 'pearson < rho_min') as rejected_other,
           count(*) filter (where event = 'judge_error' and kind = 'draft') as drafts_judge_error
    from rubric_events
    group by run_id, step
),
verdicts as (
    select run_id, step, rubric_id,
           count(*) filter (where base_i <> base_j and outcome is not null) as decisive_edges_judged,
           count(*) filter (where (outcome = 1 and base_i > base_j) or (outcome = 0 and base_i < base_j)) as agree,
           count(*) filter (where (outcome = 1 and base_i < base_j) or (outcome = 0 and base_i > base_j)) as disagree,
           count(*) filter (where outcome = 0.5 and base_i <> base_j) as ties,
           count(*) filter (where outcome is null and base_i <> base_j) as failed,
           count(*) filter (where base_i = base_j) as equal_outcome_edges
    from rubric_verdicts
    group by run_id, step, rubric_id
),
acts as (
    select a.run_id, a.step, a.rubric_id,
           count(*) filter (where g.mixed) as mixed_groups,
           count(*) filter (where not g.mixed) as zero_var_activations,
           count(*) filter (where not g.mixed and a.kept) as zero_var_kept
    from rubric_activations a
    join grp g on g.run_id = a.run_id and g.step = a.step and g."group" = a."group"
    group by a.run_id, a.step, a.rubric_id
),
steps_seen as (
    select distinct run_id, step from grp
)
select s.run_id, s.step, a.rubric_id,
       a.mixed_groups,
       coalesce(v.agree, 0) as agree, coalesce(v.disagree, 0) as disagree, coalesce(v.ties, 0) as ties,
       coalesce(v.failed, 0) as failed,
       case when coalesce(v.agree, 0) + coalesce(v.disagree, 0) > 0
            then v.agree::double / (v.agree + v.disagree) end as agreement_rate,
       a.zero_var_activations, a.zero_var_kept,
       coalesce(z.zero_var_groups, 0) as zero_var_groups,
       coalesce(z.zero_var_groups_shaped, 0) as zero_var_groups_shaped,
       case when z.zero_var_groups > 0 then z.zero_var_groups_shaped::double / z.zero_var_groups end
           as zero_var_shaped_share,
       z.zero_var_mean_abs_shift,
       coalesce(d.drafts_induced, 0) as drafts_induced, coalesce(d.drafts_admitted, 0) as drafts_admitted,
       coalesce(d.drafts_rejected, 0) as drafts_rejected, coalesce(d.rejected_variance, 0) as rejected_variance,
       coalesce(d.rejected_pearson, 0) as rejected_pearson, coalesce(d.rejected_other, 0) as rejected_other,
       coalesce(d.drafts_judge_error, 0) as drafts_judge_error
from steps_seen s
left join acts a on a.run_id = s.run_id and a.step = s.step
left join verdicts v on v.run_id = s.run_id and v.step = s.step and v.rubric_id = a.rubric_id
left join zero_var z on z.run_id = s.run_id and z.step = s.step
left join drafts d on d.run_id = s.run_id and d.step = s.step;
