-- run_status: one row per run with its last completed step, its owning process and a status (used by `arbor runs`).
-- status: 'completed' when the run's stage 'run' finished with status 'completed'; 'failed' when the flow recorded
-- its end as 'failed' (stage 'run') or its most recent stage_runs row (by started_at, then finished_at) has status
-- 'failed'; 'stopped' when the flow recorded that it was asked to stop (a signal: arbor.runtime.stop); 'created' when no
-- stage ran yet;
-- otherwise the run was started and has not ended: 'crashed' when its owner process (runs.host / pid, with a
-- heartbeat_at rewritten every 10 s while the flow runs) stopped beating more than 120 s ago, or its flow ended
-- (runs.flow_ended_at) without recording an end; else 'running'. A run recorded before owners were recorded has
-- none and shows 'running'. `arbor runs` refines this for runs owned by a process of this host: 'crashed' as soon
-- as that pid is gone (or reused by another process), 'running' while it lives (storage/heartbeat.py).
-- degraded: 'degraded N/M steps' when N of its M completed steps had a judge role whose answers were mostly refused
-- (steps.judge_degraded, judge.warn_refused_share): the run ran partly without its judge. Null otherwise.
create or replace view run_status as
with last_step as (
    select run_id, max(step) as last_completed_step, max(completed_at) as last_step_at,
           count(*) filter (where judge_degraded is not null) as degraded_steps, count(*) as n_steps
    from steps group by run_id
),
stage as (
    select run_id,
           arg_max(status, coalesce(started_at, finished_at)) as last_status,
           bool_or(stage = 'run' and status = 'completed') as run_completed,
           bool_or(stage = 'run' and status = 'failed') as run_failed,
           bool_or(stage = 'run' and status = 'stopped') as run_stopped,
           max(coalesce(finished_at, started_at)) as last_activity_at
    from stage_runs group by run_id
)
select r.run_id, r.profile, r.method, r.created_at, l.last_completed_step,
       case when s.run_completed then 'completed'
            when s.run_stopped then 'stopped'
            when s.run_failed or s.last_status = 'failed' then 'failed'
            when s.run_id is null then 'created'
            when r.flow_ended_at is not null or r.heartbeat_at < now() - interval 120 second then 'crashed'
            else 'running' end as status,
       greatest(l.last_step_at, s.last_activity_at) as last_activity_at,
       r.host, r.pid, r.heartbeat_at,
       case when l.degraded_steps > 0 then 'degraded ' || l.degraded_steps || '/' || l.n_steps || ' steps' end
           as degraded
from runs r
left join last_step l using (run_id)
left join stage s using (run_id);
