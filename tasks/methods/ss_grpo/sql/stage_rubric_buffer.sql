-- stage_rubric_buffer: one row per stage rubric of a RubricEM / SS-GRPO run: its stage, text, weight
-- and polarity, when it was generated, how often it was kept after a group's grading, its mean and last grade
-- variance, and when (and at which variance) it was dropped; status 'active' until dropped.
create or replace view stage_rubric_buffer as
select run_id, rubric_id,
       any_value(question_id) as question_id,
       any_value(stage) as stage,
       any_value(title) filter (where event = 'generated') as title,
       any_value(description) filter (where event = 'generated') as description,
       any_value(weight) as weight,
       any_value(polarity) as polarity,
       bool_or(persistent) as persistent,
       min(step) filter (where event = 'generated') as generated_step,
       count(*) filter (where event = 'kept') as times_kept,
       avg(variance) filter (where event in ('kept', 'dropped')) as mean_variance,
       arg_max(variance, step) filter (where event in ('kept', 'dropped')) as last_variance,
       min(step) filter (where event = 'dropped') as dropped_step,
       any_value(variance) filter (where event = 'dropped') as dropped_variance,
       case when bool_or(event = 'dropped') then 'dropped' else 'active' end as status
from stage_rubrics
group by run_id, rubric_id;
