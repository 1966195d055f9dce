-- judge_health_of_run: per step and judge role of run $run_id, what became of its calls (answered, cached, failed in
-- transport, refused as no answer, skipped under the cost cap), the commonest failure and refusal, the groups the
-- judge answered about, and whether the role's answers were mostly refused (view judge_health)?
select step, role, calls, answered, cache_hits, failed, refused, skipped, failed_share, refused_share, top_error,
       top_refusal, judged_groups, n_groups, judged_group_share, degraded
from judge_health
where run_id = $run_id and role <> 'all'
order by step, role
