-- turn_advantage_summary: per ARCO step and position bucket, the distribution of the per-turn advantage the
-- policy trained on (and of the reward-to-go and baseline behind it).
create or replace view turn_advantage_summary as
select run_id, step, phase, bucket,
       count(*) as turns,
       avg(advantage) as mean_advantage,
       stddev_pop(advantage) as sd_advantage,
       min(advantage) as min_advantage,
       max(advantage) as max_advantage,
       avg(reward_to_go) as mean_reward_to_go,
       avg(baseline) as mean_baseline
from turn_advantages
group by run_id, step, phase, bucket;
