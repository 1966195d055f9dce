-- judge_cost_by_role: how many judge calls, cache hits, errors, tokens and dollars did a run spend per judge role
-- (the 'all' row last)?
select role, sum(n_calls) as n_calls, sum(n_cache_hits) as n_cache_hits, sum(n_errors) as n_errors,
       sum(prompt_tokens) as prompt_tokens, sum(completion_tokens) as completion_tokens,
       sum(cost_usd) as cost_usd
from judge_cost_per_step
where run_id = $run_id
group by role
order by role = 'all', role
