-- bank_reuse: one row per rubric bank item of a RubricEM run: its question, when it was written, its
-- utility, whether a later reflection replaced it, and how often rollouts retrieved it, by mode (within-episode:
-- its own question replayed; cross-episode: a related question), over how many steps and groups.
create or replace view bank_reuse as
with items as (
    select run_id, item_id, any_value(question_id) as question_id, any_value(question) as question,
           min(step) as written_step, any_value(utility) as utility, any_value(source_traj_id) as source_traj_id
    from rubric_bank
    group by run_id, item_id
), replaced as (
    select run_id, replaced_item_id as item_id, min(step) as replaced_step
    from rubric_bank
    where replaced_item_id is not null
    group by run_id, replaced_item_id
), used as (
    select run_id, item_id,
           count(*) as retrievals,
           count(*) filter (where mode = 'within') as within_retrievals,
           count(*) filter (where mode = 'cross') as cross_retrievals,
           count(distinct step) as steps_used,
           avg(similarity) filter (where mode = 'cross') as mean_cross_similarity
    from bank_retrievals
    group by run_id, item_id
)
select i.run_id, i.item_id, i.question_id, i.question, i.written_step, i.utility, i.source_traj_id,
       r.replaced_step, r.replaced_step is null as current,
       coalesce(u.retrievals, 0) as retrievals, coalesce(u.within_retrievals, 0) as within_retrievals,
       coalesce(u.cross_retrievals, 0) as cross_retrievals, coalesce(u.steps_used, 0) as steps_used,
       u.mean_cross_similarity
from items i
left join replaced r using (run_id, item_id)
left join used u using (run_id, item_id);
